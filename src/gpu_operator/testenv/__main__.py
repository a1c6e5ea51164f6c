"""`python -m gpu_operator.testenv build|up|down|status` (wrapped by `hack/testenv`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kubernetes import client

from . import binaries, nodes
from .cluster import TestenvError, default_state_dir, load, start, stop
from .processes import alive


def _say(msg: str) -> None:
    print(f"testenv: {msg}", file=sys.stderr, flush=True)


def cmd_build(_: argparse.Namespace) -> int:
    t0 = time.monotonic()
    bin_dir = binaries.ensure_binaries()
    _say(f"binaries ready in {time.monotonic() - t0:.1f}s")
    print(bin_dir)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    existing = load(state_dir)
    if existing and existing.healthy():
        _say(f"already running at {existing.api_url} (`hack/testenv down` to recreate)")
    else:
        bin_dir = binaries.ensure_binaries()
        t0 = time.monotonic()
        existing = start(
            state_dir, gpu_nodes=args.gpu_nodes, cpu_nodes=args.cpu_nodes, bin_dir=bin_dir,
            detach=True,
        )  # fmt: skip
        _say(
            f"up in {time.monotonic() - t0:.1f}s at {existing.api_url} with "
            f"{args.gpu_nodes} GPU + {args.cpu_nodes} CPU nodes; logs in {state_dir / 'logs'}"
        )
        _say("ready after: " + ", ".join(f"{k} {v:.1f}s" for k, v in existing.timings.items()))
    print(existing.kubeconfig)
    print(f"export KUBECONFIG={existing.kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stop(args.state_dir)
    _say(f"stopped (state dir {args.state_dir})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = load(args.state_dir)
    if cluster is None:
        print(f"not running (no state in {args.state_dir})")
        return 1
    for proc in cluster.processes:
        print(f"{proc.name:<24} pid {proc.pid:<8} {'running' if alive(proc) else 'DEAD'}")
    healthy = cluster.healthy()
    print(f"apiserver  {cluster.api_url} {'ready' if healthy else 'NOT READY'}")
    print(f"kubeconfig {cluster.kubeconfig}")
    print(f"audit log  {cluster.audit_log}")
    if healthy:
        with cluster.api_client() as api:
            items = client.CoreV1Api(api).list_node().items
        ready = sum(1 for n in items if nodes.is_ready(n))
        print(f"nodes      {ready}/{len(items)} Ready")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/testenv",
        description="A real local Kubernetes control plane (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler; kwok as the kubelets) for tests and demos.",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="default: $TESTENV_STATE_DIR or .testenv/"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find cached) etcd, kube-* and kwok binaries")
    up = sub.add_parser("up", help="start a fresh cluster in the background")
    up.add_argument("--gpu-nodes", type=int, default=2)
    up.add_argument("--cpu-nodes", type=int, default=1)
    sub.add_parser("down", help="stop the cluster and every process it started")
    sub.add_parser("status", help="show processes, readiness and nodes")
    args = parser.parse_args(argv)
    args.state_dir = (args.state_dir or default_state_dir()).resolve()
    handlers = {"build": cmd_build, "up": cmd_up, "down": cmd_down, "status": cmd_status}
    try:
        return handlers[args.command](args)
    except (TestenvError, binaries.BinariesError) as exc:
        _say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
