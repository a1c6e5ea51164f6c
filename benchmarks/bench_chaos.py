"""Reliability under faults, with figures: the chaos suite's scenarios, each run
``--runs`` times (default 3) on one converged 6-GPU-node cluster, with the operator as its own
process behind Toxiproxy and the HTTP fault proxy (tests/chaos/harness.py).

Per fault: the median time from the end of the fault to convergence, the median API writes of a
run (the workload: a policy change, a new GPU node and a driver upgrade) against the fault-free
median, managed objects lost and duplicated, nodes upgraded twice (all must be 0) and, for the
leader's network cut, the hand-over time (cut to the new leader's first write, from the audit
log). Prints a markdown table (docs/reliability.md keeps the last one).

    python benchmarks/bench_chaos.py [--runs 3] [--outage 300] [--only NAME,...]

``--outage S`` adds the API server being down S seconds (5 minutes in the issue; off by default:
3 runs take over 15 minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_operator import testenv  # noqa: E402
from tests.chaos.harness import (  # noqa: E402
    AFTER_OUTAGE_S,
    FAULTS,
    LEASE_SECONDS,
    ChaosEnv,
    Outcome,
    compare,
    kill_at_every_upgrade_state,
    leader_network_cut,
)


def scenarios(env: ChaosEnv, outage_s: float) -> dict[str, Callable[[], Outcome]]:
    runs: dict[str, Callable[[], Outcome]] = {"no fault": lambda: env.run("no fault", None)}
    for name, fault in FAULTS.items():
        runs[name] = lambda name=name, fault=fault: env.run(name, lambda: fault(env))
    runs["operator SIGKILL at every upgrade state"] = lambda: kill_at_every_upgrade_state(env)[0]
    runs["leader network cut, standby healthy"] = lambda: leader_network_cut(env)[0]
    if outage_s:
        name = f"apiserver down {outage_s:.0f}s"
        runs[name] = lambda: env.run(
            name, lambda: env.cluster.restart_apiserver(down_s=outage_s), AFTER_OUTAGE_S
        )
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--outage", type=float, default=0.0)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args()
    bin_dir = testenv.ensure_binaries()
    testenv.binaries.ensure_toxiproxy(bin_dir)
    env = ChaosEnv(bin_dir, Path(tempfile.mkdtemp(prefix="bench-chaos-")))
    results: dict[str, list[Outcome]] = {}
    started = time.monotonic()
    try:
        env.start_operator("a")
        env.converge("the first convergence", timeout=300)
        env.run("warm-up", None)  # the first run's new node exists from now on in every run
        end_state = env.fingerprint()
        runs = scenarios(env, args.outage)
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        for _ in range(args.runs):
            for name, run in runs.items():
                if only and name not in only and name != "no fault":
                    continue
                outcome = compare(run(), end_state, env.fingerprint())
                results.setdefault(name, []).append(outcome)
                print(
                    f"{name}: {outcome.converge_s}s, {outcome.writes} writes, "
                    f"lost {len(outcome.lost)}, duplicated {len(outcome.duplicated)}, "
                    f"upgraded twice {len(outcome.upgraded_twice)}, exits {outcome.exits}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        env.close()
    base = statistics.median(o.writes for o in results["no fault"])
    print(
        f"\n{args.runs} runs per fault, {time.monotonic() - started:.0f}s in all; a run = a "
        "policy change + a new GPU node + a driver upgrade of 7 nodes (kwok), operator Lease "
        f"{LEASE_SECONDS}s\n"
    )
    print(
        "| fault | converged after the fault (median s) | API writes (median, x fault-free) "
        "| objects lost | duplicated | upgraded twice | leader hand-over (median s) "
        "| operator exits (per run) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, outcomes in results.items():
        writes = statistics.median(o.writes for o in outcomes)
        handovers = [o.handover_s for o in outcomes if o.handover_s is not None]
        print(
            f"| {name} | {statistics.median(o.converge_s for o in outcomes):.1f} "
            f"| {writes:.0f} ({writes / base:.2f}x) "
            f"| {sum(len(o.lost) for o in outcomes)} "
            f"| {sum(len(o.duplicated) for o in outcomes)} "
            f"| {sum(len(o.upgraded_twice) for o in outcomes)} "
            f"| {f'{statistics.median(handovers):.1f}' if handovers else '-'} "
            f"| {'; '.join(str(o.exits) for o in outcomes)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
