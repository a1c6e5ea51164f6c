"""Device-plugin agent timings on simulated GPUs, measured the way the kubelet sees them: over
the plugin's unix sockets, from a local kubelet endpoint (the generated Registration service).

    .venv/bin/python benchmarks/bench_deviceplugin.py [--runs 300] [--events 40]

Prints: Allocate and GetPreferredAllocation round trips (median, p95, max); how long after an
injected XID the ListAndWatch stream carries the unhealthy device, for two health poll
intervals; how long a config switch takes until the kubelet has the new resource registered
and its first device list; the peak RSS of the agent process and of an exporter asking the
kubelet's PodResources API once. Figures only; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from timing import Summary, summarize  # benchmarks/ is on sys.path when a benchmark runs

from gpu_operator.agent import migparted
from gpu_operator.agent.deviceplugin.agent import DevicePluginAgent, HealthOptions, Paths
from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config
from gpu_operator.agent.deviceplugin.configs import ConfigDir
from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import (
    SimulatedNvml,
    install_simulated_nvml,
    uninstall_simulated_nvml,
)

REFERENCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / "nvidia"
MIG_CONFIGMAP = REFERENCE / "mig-parted-default-configmap.yaml"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"
)


def row(name: str, s: Summary) -> None:
    print(
        f"  {name:<52} median {s.median:7.2f} ms  p95 {s.p95:7.2f} ms  max {s.max:7.2f} ms"
        f"  (n={s.n})"
    )


@contextmanager
def running_agent(
    spec: str,
    config: str = "",
    *,
    poll_s: float = 0.5,
    recovery_s: float = 300.0,
    mig_config: str | None = None,
    **overrides: str,
) -> Iterator[tuple[SimulatedNvml, DevicePluginAgent, LocalKubelet, Path]]:
    root = Path(tempfile.mkdtemp(prefix="bench-dp-", dir="/tmp"))
    sim = install_simulated_nvml(spec, seed="bench")
    nvml = Nvml().open()
    if mig_config:
        migparted.apply_config(nvml, migparted.load_mig_config(MIG_CONFIGMAP), mig_config)
    kubelet = LocalKubelet(root / "device-plugins").start()
    agent = DevicePluginAgent(
        nvml,
        paths=Paths(kubelet.socket_path, root / "cdi", root / "sys"),
        overrides=overrides,
        health_options=HealthOptions(poll_s=poll_s, recovery_s=recovery_s),
    )
    try:
        agent.apply(parse_device_plugin_config(config))
        agent.start()
        yield sim, agent, kubelet, root
    finally:
        agent.stop()
        kubelet.stop()
        nvml.close()
        uninstall_simulated_nvml()
        shutil.rmtree(root, ignore_errors=True)


def timed(fn: Callable[[], object], runs: int) -> Summary:
    fn()  # warm the channel
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return summarize(samples)


def bench_rpcs(runs: int) -> None:
    print("kubelet -> plugin round trips over the unix socket (A100 x8):")
    cases: list[tuple[str, str, str, dict[str, str], int]] = [
        ("nvidia.com/gpu", "", "Allocate 1 GPU, envvar", {}, 1),
        ("nvidia.com/gpu", "", "Allocate 8 GPUs, envvar", {}, 8),
        (
            "nvidia.com/gpu",
            "",
            "Allocate 2 GPUs, cdi-cri + cdi-annotations",
            {"DEVICE_LIST_STRATEGY": "cdi-cri,cdi-annotations"},
            2,
        ),
        ("nvidia.com/gpu.shared", SHARED, "Allocate 1 of 32 replicas", {}, 1),
    ]
    for resource, config, name, overrides, size in cases:
        with running_agent("a100-40gb:8", config, **overrides) as (_, _, kubelet, _):
            kubelet.wait_for_registration(resource)
            with kubelet.client(resource) as client:
                stream = client.list_and_watch(30)
                ids = [d.ID for d in next(stream).devices]
                stream.cancel()  # type: ignore[attr-defined]
                row(name, timed(lambda c=client, i=ids[:size]: c.allocate(i), runs))
                if size == 2 and "cdi" in name:
                    row(
                        "GetPreferredAllocation 2 of 8",
                        timed(lambda c=client, i=ids: c.preferred(i, [], 2), runs),
                    )


def bench_xid(events: int) -> None:
    print("XID injected -> ListAndWatch sends the unhealthy device (A100 x8, simulated NVML")
    print("  answers at once, so the health poll bounds it; real NVML wakes on the event):")
    for poll_s in (0.5, 0.05):
        # recovery 1 ms: each fault clears on the next pass, so every XID is a fresh change
        with running_agent("a100-40gb:8", poll_s=poll_s, recovery_s=0.001) as (sim, _, kubelet, _):
            kubelet.wait_for_registration("nvidia.com/gpu")
            samples = []
            with kubelet.client("nvidia.com/gpu") as client:
                stream = client.list_and_watch(120)
                next(stream)
                for n in range(events):
                    gpu = n % 8
                    # an XID comes at any moment of the poll cycle, not just after a pass
                    time.sleep(random.uniform(0, poll_s))
                    start = time.perf_counter()
                    sim.inject_xid(gpu, 79)
                    update = next(stream)
                    samples.append(time.perf_counter() - start)
                    assert update.devices[gpu].health == "Unhealthy"
                    assert {d.health for d in next(stream).devices} == {"Healthy"}
                stream.cancel()  # type: ignore[attr-defined]
        row(f"health poll {poll_s * 1000:.0f} ms", summarize(samples))


def bench_switch(rounds: int) -> None:
    print("config label switch -> new resource registered and listed (A100 x8):")
    with running_agent("a100-40gb:8") as (_, agent, kubelet, root):
        configs_dir = root / "configs"
        configs_dir.mkdir()
        (configs_dir / "default").write_text("version: v1\n")
        (configs_dir / "shared").write_text(SHARED)
        configs = ConfigDir(configs_dir, default="default")
        kubelet.wait_for_registration("nvidia.com/gpu")
        samples = []
        for n in range(rounds):
            label, resource = (
                ("shared", "nvidia.com/gpu.shared")
                if n % 2 == 0
                else (
                    None,
                    "nvidia.com/gpu",
                )
            )
            before = len(kubelet.registrations)
            start = time.perf_counter()
            agent.switch(label, configs, report=lambda *_: None)
            kubelet.wait_for_registration(resource, after=before)
            with kubelet.client(resource) as client:
                stream = client.list_and_watch(30)
                next(stream)
                stream.cancel()  # type: ignore[attr-defined]
            samples.append(time.perf_counter() - start)
        row("none <-> time-slicing x4 renamed (8 <-> 32 devices)", summarize(samples))


def _hwm_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])


def bench_rss() -> None:
    print("peak RSS (VmHWM) of an agent process:")
    for spec, config, resource in (
        ("a100-40gb:8", "", "nvidia.com/gpu"),
        ("a100-40gb:8", SHARED, "nvidia.com/gpu.shared"),
    ):
        root = Path(tempfile.mkdtemp(prefix="bench-rss-", dir="/tmp"))
        config_file = root / "config.yaml"
        config_file.write_text(config or "version: v1\n")
        with LocalKubelet(root / "device-plugins") as kubelet:
            env = {
                **os.environ,
                "GPU_OPERATOR_SIMULATE": spec,
                "KUBELET_SOCKET": str(kubelet.socket_path),
                "CONFIG_FILE": str(config_file),
                "CDI_ROOT": str(root / "cdi"),
                "NODE_NAME": "bench",
            }
            for key in ("CONFIG_FILE_SRCDIR", "GPU_OPERATOR_SIMULATE_STATE", "MIG_STRATEGY"):
                env.pop(key, None)
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "agent", "device-plugin"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                kubelet.wait_for_registration(resource, timeout_s=60)
                with kubelet.client(resource) as client:
                    stream = client.list_and_watch(30)
                    ids = [d.ID for d in next(stream).devices]
                    for _ in range(50):
                        client.allocate(ids[:1])
                    stream.cancel()  # type: ignore[attr-defined]
                hwm = _hwm_kib(proc.pid) / 1024
            finally:
                proc.terminate()
                proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
        label = f"device-plugin {spec} {'time-sliced x4' if config else 'unshared'}"
        print(f"  {label:<52} {hwm:8.1f} MiB  (after registration, 1 stream, 50 Allocates)")
    print(f"  {'exporter + one PodResources List (A100 x8)':<52} {exporter_rss():8.1f} MiB")


EXPORTER = r"""
import atexit, os, sys
def _hwm():
    status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
    open(os.environ["HWM_OUT"], "w").write(status)
atexit.register(_hwm)
from gpu_operator.sim.nvml import install_simulated_nvml
install_simulated_nvml("a100-40gb:8", seed="bench")
from gpu_operator.agent import exporter
from gpu_operator.agent.nvml import Nvml
with Nvml() as nvml:
    ex = exporter.Exporter(nvml, hostname="bench", pod_resources_socket=sys.argv[1])
    ex.collect_once()
    assert 'pod="p0"' in ex.render()
"""


def exporter_rss() -> float:
    """An exporter process that attributes 8 GPUs to pods through PodResources once."""
    from gpu_operator.agent.podresources import (
        ContainerDevices,
        ContainerResources,
        PodResources,
        PodResourcesServer,
    )

    root = Path(tempfile.mkdtemp(prefix="bench-pr-", dir="/tmp"))
    sim = install_simulated_nvml("a100-40gb:8", seed="bench")
    pods = [
        PodResources(
            f"p{i}",
            "ns",
            (ContainerResources("c", (ContainerDevices("nvidia.com/gpu", (g.uuid,)),)),),
        )
        for i, g in enumerate(sim.gpus)
    ]
    uninstall_simulated_nvml()
    out = root / "hwm"
    samples = []
    with PodResourcesServer(str(root / "pr.sock"), pods):
        for _ in range(3):
            subprocess.run(
                [sys.executable, "-c", EXPORTER, str(root / "pr.sock")],
                env={**os.environ, "HWM_OUT": str(out), "NODE_NAME": "bench"},
                check=True,
            )
            samples.append(int(out.read_text()) / 1024)
    shutil.rmtree(root, ignore_errors=True)
    return min(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--switches", type=int, default=20)
    args = parser.parse_args()
    logging.getLogger("gpu_operator").setLevel(logging.ERROR)  # XIDs are expected here
    print(f"python {sys.version.split()[0]}, simulated NVML\n")
    bench_rpcs(args.runs)
    bench_xid(args.events)
    bench_switch(args.switches)
    bench_rss()


if __name__ == "__main__":
    main()
