"""Fleet driver upgrade on a simulated cluster: makespan against the ideal, planner time per pass.

    python benchmarks/bench_upgrade.py [--nodes 100 1000] [--restart 120] [--stale-validators]

Each node runs two GPU pods (evicted, 5 s to terminate) and a validator (Ready 10 s after the
driver); a deleted driver pod is replaced and Ready ``--restart`` seconds later. The operator
passes 1 s after it acted or after a world event, at the plan's next deadline, and at least
every 30 s. Makespan is simulated time until the last node is ``upgrade-done``; the ideal is
ceil(N / parallel) x restart, taking parallel = min(maxParallelUpgrades, maxUnavailable).
Planner time is the wall time of ``plan()`` alone (the simulator's bookkeeping excluded).
``--stale-validators``: validators stay Ready through the driver restart, so the operator must
restart each one (5 s to terminate, Ready 10 s later) before the node counts as validated.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

from timing import summarize  # benchmarks/ is on sys.path when a benchmark runs

from gpu_operator.testenv.fleetsim import SimConfig, Simulation, World
from gpu_operator.upgrade import Policy, State, scaled_max_unavailable


def build(nodes: int, config: SimConfig) -> World:
    world = World(config, seed=1)
    for i in range(nodes):
        name = f"gpu-{i:04d}"
        world.add_node(name)
        world.add_pod(name, f"{name}-train", gpu=True)
        world.add_pod(name, f"{name}-infer", gpu=True)
    return world


def scenario(nodes: int, parallel: int, restart: float, stale: bool = False) -> list[float]:
    config = SimConfig(
        restart_s=restart,
        termination_s=5.0,
        validator_s=10.0,
        resync_s=30.0,
        validator_follows_driver=not stale,
    )
    world = build(nodes, config)
    policy = Policy(auto_upgrade=True, max_parallel_upgrades=parallel, max_unavailable="25%")
    started = time.perf_counter()
    result = Simulation(world, policy).run(until=10_000_000)
    wall = time.perf_counter() - started
    done_at = [
        at for history in world.transitions.values() for at, state in history if state == State.DONE
    ]
    assert result.settled and len(done_at) == nodes, result.final.line
    spans = []
    for history in world.transitions.values():
        start = next(at for at, state in history if state == State.CORDON)
        end = next(at for at, state in history if state == State.DONE)
        spans.append(end - start)
    width = scaled_max_unavailable(policy.max_unavailable, nodes)
    if parallel:
        width = min(width, parallel)
    ideal = math.ceil(nodes / width) * restart
    makespan = max(done_at)
    label = f"{nodes} nodes, maxParallel {parallel or 'unlimited'}, maxUnavailable 25%"
    if stale:
        label += ", stale validators"
    print(f"{label}")
    print(
        f"  makespan {makespan:8.0f} s simulated   ideal {ideal:8.0f} s   "
        f"ratio {makespan / ideal:5.3f}   per node {statistics.mean(spans):6.1f} s "
        f"(cordon to done)"
    )
    print(
        f"  {result.passes} passes, {len(world.events)} events, "
        f"{sum(world.driver_deletions.values())} driver restarts, "
        f"simulation wall {wall:.1f} s"
    )
    return result.plan_seconds


def report(name: str, samples: list[float]) -> None:
    s = summarize(samples)
    print(
        f"{name:<44} n={s.n:<6} median={s.median:7.3f} ms  p95={s.p95:7.3f} ms  max={s.max:7.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--restart", type=float, default=120.0)
    parser.add_argument("--stale-validators", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}")
    timings: dict[str, list[float]] = {}
    for nodes in args.nodes:
        parallels = [10, 1] if nodes <= 100 else [10, 0]
        for parallel in parallels:
            key = f"plan() per pass, {nodes} nodes, parallel {parallel or 'unlimited'}"
            timings[key] = scenario(nodes, parallel, args.restart, args.stale_validators)
    print()
    for key, samples in timings.items():
        report(key, samples)


if __name__ == "__main__":
    main()
