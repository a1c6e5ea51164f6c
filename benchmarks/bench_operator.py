"""Operator at fleet scale on the local control plane: 500 GPU + 100 CPU kwok nodes.

Measures, for NVIDIA's Helm-default ClusterPolicy: time from creating the policy to every GPU
node labelled and to ``state: ready``, the operator's write requests per node while converging,
its peak RSS, and its reads and writes per minute once converged. The operator runs as its own
process (``python -m gpu_operator run``) under a ServiceAccount token, so the apiserver's audit
log attributes every request to it. kube-controller-manager runs with --kube-api-qps 200 /
--kube-api-burst 400 (testenv's setting), which bounds how fast DaemonSet pods appear.

    python benchmarks/bench_operator.py [--gpu-nodes 500] [--cpu-nodes 100] [--steady 60]
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_operator import testenv  # noqa: E402
from gpu_operator.kube import Kube  # noqa: E402
from tests.e2e.support import (  # noqa: E402
    audit_writes,
    now,
    service_account_config,
    token_kubeconfig,
)

NS = "gpu-operator"
USER = f"system:serviceaccount:{NS}:gpu-operator"
POLICY = REPO.parent / "shared" / "reference" / "nvidia" / "clusterpolicy-helm-default.yaml"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def requests_by_verb(cluster: testenv.Cluster, since: object) -> collections.Counter[str]:
    import json
    from datetime import datetime

    counts: collections.Counter[str] = collections.Counter()
    with cluster.audit_log.open() as log:
        for line in log:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            if event.get("user", {}).get("username") != USER:
                continue
            stamp = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if stamp >= since:  # type: ignore[operator]
                resource = event["objectRef"].get("resource", "")
                counts[f"{event['verb']} {resource}"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu-nodes", type=int, default=500)
    parser.add_argument("--cpu-nodes", type=int, default=100)
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of idle measured")
    args = parser.parse_args()

    state = testenv.default_state_dir() / f"bench-{uuid.uuid4().hex[:6]}"
    t = time.monotonic()
    cluster = testenv.start(state)
    print(f"control plane up: {time.monotonic() - t:.1f}s")
    proc = None
    try:
        t = time.monotonic()
        manifests = [
            testenv.node_manifest(f"gpu-node-{i}", gpu=True) for i in range(args.gpu_nodes)
        ]
        manifests += [
            testenv.node_manifest(f"cpu-node-{i}", gpu=False) for i in range(args.cpu_nodes)
        ]
        cluster.create_nodes(manifests, timeout=600)
        print(f"{len(manifests)} nodes created and Ready: {time.monotonic() - t:.1f}s")

        with (
            tempfile.TemporaryDirectory() as tmp,
            cluster.api_client(pool_size=8) as api,
            (Path(tmp) / "operator.log").open("w") as oplog,
        ):
            kube = Kube(api)
            kubeconfig = Path(tmp) / "kubeconfig"
            token_kubeconfig(
                cluster, service_account_config(cluster, NS, "gpu-operator"), kubeconfig
            )
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpu_operator",
                    "run",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--namespace",
                    NS,
                    "--health-port",
                    "0",
                    "--metrics-port",
                    "0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=oplog,
            )
            time.sleep(3)
            start_wall, start = now(), time.monotonic()
            kube.create(yaml.safe_load(POLICY.read_text()))
            labelled_at = ready_at = None
            while ready_at is None and time.monotonic() - start < 900:
                if labelled_at is None:
                    got = kube.list_objects("Node", label_selector="nvidia.com/gpu.present=true")
                    if len(got) == args.gpu_nodes:
                        labelled_at = time.monotonic() - start
                status = (kube.get("ClusterPolicy", "cluster-policy") or {}).get("status") or {}
                if status.get("state") == "ready" and labelled_at is not None:
                    ready_at = time.monotonic() - start
                time.sleep(0.5)
            if ready_at is None:
                print("did not converge within 900 s")
                return 1
            time.sleep(2)
            converge_writes = audit_writes(cluster, USER, start_wall)
            by_kind = collections.Counter(w["objectRef"]["resource"] for w in converge_writes)
            print(f"all {args.gpu_nodes} GPU nodes labelled: {labelled_at:.1f}s after apply")
            print(f"state ready: {ready_at:.1f}s after apply")
            print(
                f"operator writes while converging: {len(converge_writes)} "
                f"({len(converge_writes) / args.gpu_nodes:.2f} per GPU node) {dict(by_kind)}"
            )

            steady_from = now()
            time.sleep(args.steady)
            counts = requests_by_verb(cluster, steady_from)
            minutes = args.steady / 60
            writes = sum(
                v
                for k, v in counts.items()
                if k.split()[0] in {"create", "update", "patch", "delete"}
            )
            reads = sum(v for k, v in counts.items() if k.split()[0] in {"get", "list", "watch"})
            print(
                f"steady state: {reads / minutes:.1f} reads/min, {writes / minutes:.1f} writes/min "
                f"({dict(counts)})"
            )
            print(f"operator peak RSS: {peak_rss_mib(proc.pid):.0f} MiB")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        cluster.stop(remove_state=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
