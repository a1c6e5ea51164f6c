"""`python -m gpu_operator.testenv build|up|down|status|load-image` (wrapped by `hack/testenv`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from kubernetes import client

from . import binaries, nodeconfig, nodes, realnodes, releases
from .cluster import TestenvError, default_state_dir, load, start, stop
from .processes import alive


def _say(msg: str) -> None:
    print(f"testenv: {msg}", file=sys.stderr, flush=True)


def cmd_build(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    bin_dir = binaries.ensure_binaries()
    # The chaos suite's fault proxy: built here, once, rather than by parallel test workers.
    binaries.ensure_toxiproxy(bin_dir)
    _say(f"control-plane, kubelet and toxiproxy binaries ready in {time.monotonic() - t0:.1f}s")
    print(bin_dir)
    if args.no_nodes:
        return 0
    reason = realnodes.why_unavailable()
    if reason and not binaries.in_ci():
        _say(f"real nodes unavailable, their runtime not built: {reason}")
        return 0
    if reason:
        _say(f"error: CI is set and real nodes are unavailable: {reason}")
        return 1
    t0 = time.monotonic()
    node_dir = binaries.ensure_node_runtime()
    _say(f"real nodes' containerd and images ready in {time.monotonic() - t0:.1f}s")
    print(node_dir)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    existing = load(state_dir)
    if existing and existing.healthy():
        _say(f"already running at {existing.api_url} (`hack/testenv down` to recreate)")
    else:
        gpus = nodeconfig.parse_gpus(args.real_node_gpus, realnodes.known_gpu_profiles())
        bin_dir = binaries.ensure_binaries()
        t0 = time.monotonic()
        existing = start(
            state_dir, gpu_nodes=args.gpu_nodes, cpu_nodes=args.cpu_nodes,
            real_nodes=args.real_nodes, real_node_gpus=gpus, bin_dir=bin_dir, detach=True,
        )  # fmt: skip
        _say(
            f"up in {time.monotonic() - t0:.1f}s at {existing.api_url} with "
            f"{args.gpu_nodes} GPU + {args.cpu_nodes} CPU kwok nodes and {args.real_nodes} "
            f"real nodes; logs in {state_dir / 'logs'}"
        )
        if existing.real:
            for node in existing.real.nodes:
                _say(f"real node {node.name} ({node.ip}, GPUs {node.gpus}): {node.dir}")
        _say("ready after: " + ", ".join(f"{k} {v:.1f}s" for k, v in existing.timings.items()))
    print(existing.kubeconfig)
    print(f"export KUBECONFIG={existing.kubeconfig}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stop(args.state_dir)
    _say(f"stopped (state dir {args.state_dir})")
    return 0


def cmd_load_image(args: argparse.Namespace) -> int:
    cluster = load(args.state_dir)
    if cluster is None or not cluster.running():
        _say(f"not running (state dir {args.state_dir}); `hack/testenv up --real-nodes N` first")
        return 1
    for archive in args.archives:
        t0 = time.monotonic()
        cluster.load_image(archive)
        _say(f"{archive} imported into {', '.join(cluster.real_nodes)} in "
             f"{time.monotonic() - t0:.1f}s")  # fmt: skip
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
        for name in cluster.real_nodes:
            print(f"real node  {name} {cluster.real_node_dir(name)}")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/testenv",
        description="A real local Kubernetes control plane (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler; kwok as simulated kubelets, and real "
        "kubelet nodes with containerd) for tests and demos.",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="default: $TESTENV_STATE_DIR or .testenv/"
    )
    parser.add_argument(
        "--kubernetes",
        metavar="vX.Y.Z",
        default=None,
        help="the Kubernetes release to build and run, each cached apart (default: "
        f"$K8S_VERSION or {binaries.versions()['K8S_VERSION']}; the oldest the project claims "
        f"is {releases.OLDEST})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser(
        "build",
        help="build (or find cached) etcd, kube-*, kwok, kubelet, toxiproxy, containerd, images",
    )
    build.add_argument(
        "--no-nodes", action="store_true", help="skip the real nodes' containerd and images"
    )
    up = sub.add_parser("up", help="start a fresh cluster in the background")
    up.add_argument("--gpu-nodes", type=int, default=2, help="kwok (simulated) GPU nodes")
    up.add_argument("--cpu-nodes", type=int, default=1, help="kwok (simulated) CPU nodes")
    up.add_argument(
        "--real-nodes", type=int, default=0, help="real kubelet+containerd nodes (needs root)"
    )
    up.add_argument(
        "--real-node-gpus",
        default=None,
        help="simulated GPUs per real node, cycled: PROFILE:COUNT[,...] "
        f"(default {','.join(nodeconfig.DEFAULT_GPUS)}; '+' joins models on one node)",
    )
    load_image = sub.add_parser(
        "load-image", help="import OCI/docker image archives into every real node's containerd"
    )
    load_image.add_argument("archives", type=Path, nargs="+")
    sub.add_parser("down", help="stop the cluster and every process it started")
    sub.add_parser("status", help="show processes, readiness and nodes")
    args = parser.parse_args(argv)
    if args.kubernetes is not None:
        if not re.fullmatch(r"v1\.\d+\.\d+", args.kubernetes):
            _say(f"error: --kubernetes {args.kubernetes!r}: give a release as vX.Y.Z, e.g. "
                 f"{releases.OLDEST}")  # fmt: skip
            return 2
        os.environ["K8S_VERSION"] = args.kubernetes  # read by binaries.versions()
    args.state_dir = (args.state_dir or default_state_dir()).resolve()
    handlers = {
        "build": cmd_build,
        "up": cmd_up,
        "down": cmd_down,
        "status": cmd_status,
        "load-image": cmd_load_image,
    }
    try:
        return handlers[args.command](args)
    except (
        TestenvError,
        binaries.BinariesError,
        nodeconfig.NodeConfigError,
        realnodes.RealNodesError,
    ) as exc:
        _say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
