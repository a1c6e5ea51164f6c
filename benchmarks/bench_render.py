"""Timing of the renderer and of policy loading; prints figures, never fails on them.

    python benchmarks/bench_render.py [--repeat N]

- render: the full stack (every component on, ServiceMonitor, 3 node OSes), templates cached,
  imports excluded; the first (cold) call is reported apart.
  Rendered texts repeat between reconciles, so their parsed form is cached; the uncached
  figure is what a changed policy costs.
- load: YAML load + parse_document of NVIDIA's Helm-default ClusterPolicy, as ``render -f``.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from timing import summarize  # benchmarks/ is on sys.path when a benchmark runs

from gpu_operator.api import parse_spec
from gpu_operator.render import Facts, NodeOS, render
from gpu_operator.render.engine import clear_parse_caches
from gpu_operator.render_cli import parse

NVIDIA_HELM_DEFAULT = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "reference"
    / "nvidia"
    / "clusterpolicy-helm-default.yaml"
)
FULL_STACK = {
    "dcgm": {"enabled": True},
    "devicePlugin": {"config": {"name": "device-plugin-configs", "default": "default"}},
    "dcgmExporter": {"enablePodLabels": True, "serviceMonitor": {"enabled": True}},
    "migManager": {"gpuClientsConfig": {"name": "gpu-clients"}},
    "daemonsets": {"labels": {"team": "gpu"}, "annotations": {"a": "b"}},
}
THREE_OSES = (NodeOS("ubuntu", "22.04"), NodeOS("ubuntu", "24.04"), NodeOS("rhel", "9.4"))


def measure(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def report(name: str, samples: list[float]) -> None:
    s = summarize(samples)
    print(
        f"{name:<40} n={s.n:<5} median={s.median:8.3f} ms  p95={s.p95:8.3f} ms  min={s.min:8.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()

    policy = parse_spec(FULL_STACK)
    facts = Facts(node_oses=THREE_OSES)
    cold = measure(lambda: render(policy, facts), 1)
    objects = render(policy, facts)
    text = NVIDIA_HELM_DEFAULT.read_text()

    def uncached() -> None:
        clear_parse_caches()
        render(policy, facts)

    def load() -> None:
        parse(yaml.safe_load(text))

    daemonsets = sum(o["kind"] == "DaemonSet" for o in objects)
    print(
        f"python {platform.python_version()}, {platform.machine()}, libyaml {yaml.__with_libyaml__}"
    )
    print(f"full stack: {len(objects)} objects, {daemonsets} DaemonSets")
    report("render full stack, first call", cold)
    report("render full stack", measure(lambda: render(policy, facts), args.repeat))
    report("render full stack, YAML parse uncached", measure(uncached, args.repeat))
    report("load+validate NVIDIA helm default", measure(load, args.repeat))


if __name__ == "__main__":
    main()
