"""Simulated capacity (``gpu-operator agent device-plugin --kwok-capacity``) on the real local
control plane: how soon a kwok node advertises its GPUs, how soon a config-label switch changes
them, and what the process costs.

    .venv/bin/python benchmarks/bench_kwok_capacity.py [--switches 20] [--nodes 8]

Prints: start-up (process start to the node's allocatable written, and the CPU seconds it
took) for one node and for ``--nodes`` processes started together; label switch to allocatable
changed (median, p95, max, CPU per switch); the peak RSS of one process. Wall times depend on
the machine's load (note it with the figures). Figures only; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import summarize  # benchmarks/ is on sys.path when a benchmark runs

from gpu_operator import testenv
from gpu_operator.kube import Kube

LABEL = "nvidia.com/device-plugin.config"
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
    "    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"
)


def allocatable(kube: Kube, node: str) -> dict[str, str]:
    status = (kube.get("Node", node) or {}).get("status") or {}
    return {k: v for k, v in (status.get("allocatable") or {}).items() if k.startswith("nvidia.")}


def wait_until(probe: object, timeout: float = 60.0) -> float:
    """Seconds until ``probe()`` is truthy (polled every 5 ms)."""
    start = time.perf_counter()
    while not probe():  # type: ignore[operator]
        if time.perf_counter() - start > timeout:
            raise SystemExit("timed out")
        time.sleep(0.005)
    return time.perf_counter() - start


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (wall time on a loaded machine says little)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kwok-cap-"))
    (work / "configs").mkdir()
    (work / "configs" / "default").write_text("version: v1\n")
    (work / "configs" / "shared").write_text(SHARED)
    names = [f"gpu-{i}" for i in range(args.nodes)]
    cluster = testenv.start(work / "testenv", bin_dir=testenv.ensure_binaries())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cluster.create_nodes([testenv.node_manifest(n, gpu=True) for n in names])
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_OPERATOR_SIMULATE")}
        env |= {
            "KUBECONFIG": str(cluster.kubeconfig),
            "GPU_OPERATOR_SIMULATE": "a100-40gb:8",
            "CONFIG_FILE_SRCDIR": str(work / "configs"),
            "DEFAULT_CONFIG": "default",
        }

        def start(node: str) -> subprocess.Popen[bytes]:
            argv = [sys.executable, "-m", "gpu_operator", "agent", "device-plugin",
                    "--kwok-capacity"]  # fmt: skip
            proc = subprocess.Popen(argv, env={**env, "NODE_NAME": node}, stderr=subprocess.DEVNULL)
            procs.append(proc)
            return proc

        with cluster.api_client() as api:
            kube = Kube(api)
            first = start(names[0])
            one = wait_until(lambda: allocatable(kube, names[0]) == {"nvidia.com/gpu": "8"})
            one_cpu = cpu_seconds(first.pid)
            t0 = time.perf_counter()
            for node in names[1:]:
                start(node)
            for node in names[1:]:
                wait_until(lambda n=node: allocatable(kube, n) == {"nvidia.com/gpu": "8"})
            many = time.perf_counter() - t0

            samples = []
            for i in range(args.switches):
                shared = i % 2 == 0
                want = {"nvidia.com/gpu.shared": "32"} if shared else {"nvidia.com/gpu": "8"}
                label = "shared" if shared else "default"
                kube.merge_patch("Node", names[0], {"metadata": {"labels": {LABEL: label}}})
                samples.append(wait_until(lambda w=want: allocatable(kube, names[0]) == w))
            rss = peak_rss_mib(first.pid)
            switch_cpu = cpu_seconds(first.pid) - one_cpu
        s = summarize(samples)
        print("Simulated kwok capacity (A100 x8; python", sys.version.split()[0], ")")
        print(f"  start-up, 1 node: process start -> allocatable written   {one * 1000:8.0f} ms"
              f"  ({one_cpu:.2f} CPU-s)")  # fmt: skip
        print(f"  start-up, {len(names) - 1} more processes together -> all written   "
              f"{many * 1000:8.0f} ms")  # fmt: skip
        print(f"  label switch -> allocatable changed   median {s.median:7.1f} ms  "
              f"p95 {s.p95:7.1f} ms  max {s.max:7.1f} ms  (n={s.n}; "
              f"{switch_cpu / max(1, s.n) * 1000:.0f} CPU-ms each)")  # fmt: skip
        print(f"  peak RSS of one --kwok-capacity process: {rss:.1f} MiB")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        cluster.stop(remove_state=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
