"""Node-agent timings on simulated GPUs (the real pynvml wrappers over the simulated library).

    .venv/bin/python benchmarks/bench_agents.py [--runs 200]

Prints: one feature-discovery pass and one exporter collection + scrape on 8 GPUs (median and
max), a full MIG reconfiguration of 8 A100s (all-disabled -> all-1g.5gb -> all-balanced), and the
peak RSS of a ``discover --oneshot`` process. Figures only; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpu_operator.agent import discovery, exporter, migparted
from gpu_operator.agent.deviceplugin.config_file import MigStrategy
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml

REFERENCE = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference" / "nvidia"
MIG_CONFIGMAP = REFERENCE / "mig-parted-default-configmap.yaml"
COUNTERS = REFERENCE / "dcgm-exporter-default-counters.csv"

RUNNER = (
    "import argparse, sys\n"
    "from gpu_operator.agent.cli import add_agent_commands\n"
    "from gpu_operator.sim import registration\n"
    "registration.register()\n"
    "p = argparse.ArgumentParser(prog='gpu-operator')\n"
    "add_agent_commands(p.add_subparsers(dest='command', required=True))\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.func(a))\n"
)


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median, max) in milliseconds."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), max(samples)


def row(name: str, median: float, worst: float) -> None:
    print(f"  {name:<48} median {median:8.2f} ms   max {worst:8.2f} ms")


def bench_discovery(runs: int) -> None:
    print("feature discovery, one pass (NVML inventory + labels), 8 GPUs:")
    cases: tuple[tuple[str, str | None, MigStrategy], ...] = (
        ("a100-40gb:8", None, "none"),
        ("h100-80gb:8", None, "none"),
        ("a100-40gb:8", "all-1g.5gb", "single"),
        ("a100-40gb:8", "all-balanced", "mixed"),
    )
    for spec, config, strategy in cases:
        install_simulated_nvml(spec, seed="bench")
        with Nvml() as nvml:
            if config:
                migparted.apply_config(nvml, migparted.load_mig_config(MIG_CONFIGMAP), config)

            def one_pass(nvml: Nvml = nvml, strategy: MigStrategy = strategy) -> dict[str, str]:
                return discovery.labels_for(nvml.inventory(), strategy, None, "bench", timestamp=0)

            labels = one_pass()
            median, worst = timed(one_pass, runs)
        uninstall_simulated_nvml()
        row(f"{spec} {config or 'no MIG'} ({strategy}, {len(labels)} labels)", median, worst)


def bench_exporter(runs: int) -> None:
    print("exporter, 8 GPUs (NVIDIA's default counters CSV):")
    counters = exporter.parse_counters(COUNTERS.read_text())
    for spec, config in (("a100-40gb:8", None), ("a100-40gb:8", "all-1g.5gb")):
        install_simulated_nvml(spec, seed="bench")
        with Nvml() as nvml:
            if config:
                migparted.apply_config(nvml, migparted.load_mig_config(MIG_CONFIGMAP), config)
            ex = exporter.Exporter(nvml, counters, hostname="bench", pod_resources_socket=None)
            ex.collect_once()
            samples = sum(1 for line in ex.render().splitlines() if not line.startswith("#"))
            label = f"{spec} {config or 'no MIG'}"
            row(f"collection  {label}", *timed(ex.collect_once, runs))
            row(f"scrape      {label} ({samples} samples)", *timed(ex.render, runs))

            def both(ex: exporter.Exporter = ex) -> str:
                ex.collect_once()
                return ex.render()

            row(f"collect+scrape {label}", *timed(both, runs))
        uninstall_simulated_nvml()


def bench_mig(rounds: int) -> None:
    print("MIG reconfiguration, 8 x A100-SXM4-40GB (plan + apply + read back):")
    config = migparted.load_mig_config(MIG_CONFIGMAP)
    steps = ("all-disabled", "all-1g.5gb", "all-balanced", "all-disabled")
    results: dict[str, list[float]] = {s: [] for s in steps[1:]}
    calls: dict[str, int] = {}
    for _ in range(rounds):
        sim = install_simulated_nvml("a100-40gb:8", seed="bench")
        with Nvml() as nvml:
            migparted.apply_config(nvml, config, steps[0])
            for name in steps[1:]:
                sim.calls.clear()
                start = time.perf_counter()
                migparted.apply_config(nvml, config, name)
                results[name].append((time.perf_counter() - start) * 1000)
                calls[name] = sum(sim.calls.values())
            start = time.perf_counter()
            migparted.apply_config(nvml, config, "all-disabled")  # already applied: a no-op
            noop = (time.perf_counter() - start) * 1000
        uninstall_simulated_nvml()
    previous = steps[0]
    for name in steps[1:]:
        row(
            f"{previous} -> {name} ({calls[name]} NVML calls)",
            statistics.median(results[name]),
            max(results[name]),
        )
        previous = name
    print(f"  re-apply of an applied config: {noop:.2f} ms, no NVML changes")


HWM = (
    "import atexit, os\n"
    "def _hwm():\n"
    "    status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
    "    open(os.environ['HWM_OUT'], 'w').write(status)\n"
    "atexit.register(_hwm)\n"
)


def peak_rss_mib(code: str, args: list[str], out: Path) -> float:
    """The process's own peak RSS (VmHWM at exit): the spawn's inherited pages, which
    ``ru_maxrss`` would count, are not part of it."""
    env = {**os.environ, "NODE_NAME": "bench", "HWM_OUT": str(out)}
    subprocess.run(
        [sys.executable, "-c", HWM + code, *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return int(out.read_text()) / 1024  # kB


def bench_rss() -> None:
    print("peak RSS of one process (VmHWM at exit):")
    out = Path(tempfile.mkdtemp()) / "hwm"
    base = peak_rss_mib("pass", [], out)
    imports = peak_rss_mib("import gpu_operator.agent.cli", [], out)
    discover = peak_rss_mib(
        RUNNER,
        ["agent", "discover", "--simulate", "a100-40gb:8", "--oneshot", "--output-file", "-"],
        out,
    )
    print(f"  python -c pass                                   {base:8.1f} MiB")
    print(f"  import gpu_operator.agent.cli                    {imports:8.1f} MiB")
    with_client = peak_rss_mib(
        "import gpu_operator.kube\n" + RUNNER,
        ["agent", "discover", "--simulate", "a100-40gb:8", "--oneshot", "--output-file", "-"],
        out,
    )
    print(f"  agent discover --oneshot, 8 simulated A100s      {discover:8.1f} MiB")
    print(f"  the same + gpu_operator.kube (patching a Node)   {with_client:8.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mig-rounds", type=int, default=10)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {args.runs} runs each\n")
    bench_discovery(args.runs)
    bench_exporter(args.runs)
    bench_mig(args.mig_rounds)
    bench_rss()


if __name__ == "__main__":
    main()
