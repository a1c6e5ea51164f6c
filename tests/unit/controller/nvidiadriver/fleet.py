"""A simulated cluster for the NVIDIADriver decision: nodes, drivers, DaemonSets and pods."""

from __future__ import annotations

from typing import Any

from gpu_operator.controller.nvidiadriver.decide import DriverDecision, DriverSnapshot
from gpu_operator.controller.runtime.actions import Apply
from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.controller.snapshot import Snapshot
from gpu_operator.labels import COMPONENT, OS_ID, OS_VERSION, REVISION_HASH
from gpu_operator.render.driver import KERNEL_LABEL, POOL_LABEL
from gpu_operator.views import NodeView

NOW = 1_800_000_000.0
STAMP = "2027-01-15T08:00:00Z"


def node(name: str, gpu: str, os_id: str, version: str, **labels: str) -> NodeView:
    return NodeView(
        name,
        labels={
            "nvidia.com/gpu.present": "true",
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.product": gpu,
            OS_ID: os_id,
            OS_VERSION: version,
            KERNEL_LABEL: "5.14.0-427.13.1.el9_4.x86_64" if os_id == "rhel" else "6.8.0-45",
            **labels,
        },
    )


def twelve_nodes(**pools: str) -> list[NodeView]:
    """4 A100 ubuntu22.04, 4 H100 rhel9.4, 4 T4 ubuntu24.04; ``pools``: node -> pool label."""
    nodes = []
    for i in range(4):
        nodes.append(node(f"a100-{i}", "A100", "ubuntu", "22.04"))
        nodes.append(node(f"h100-{i}", "H100", "rhel", "9.4"))
        nodes.append(node(f"t4-{i}", "T4", "ubuntu", "24.04"))
    return [
        NodeView(n.name, {**n.labels, POOL_LABEL: pools[n.name]}) if n.name in pools else n
        for n in nodes
    ]


def driver(name: str, uid: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "generation": 1},
        "spec": {"driverType": "gpu", "image": "driver", "repository": "nvcr.io/nvidia",
                 **spec},
    }  # fmt: skip


THREE_POOLS = (
    driver("a100", version="570.172.08", nodeSelector={"nvidia.com/gpu.product": "A100"}),
    driver(
        "h100", version="570", usePrecompiled=True,
        nodeSelector={"nvidia.com/gpu.product": "H100"},
    ),
    driver("t4", version="535.261.03", nodeSelector={"nvidia.com/gpu.product": "T4"}),
)  # fmt: skip


def policy(**driver_section: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "uid": "cp", "creationTimestamp": "2027-01-01"},
        "spec": {"driver": {"useNvidiaDriverCRD": True, **driver_section}},
    }


def snapshot(
    nodes: list[NodeView],
    drivers: tuple[dict[str, Any], ...] = THREE_POOLS,
    *,
    cluster_policy: dict[str, Any] | None = None,
    daemonsets: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
    revisions: list[dict[str, Any]] = (),  # type: ignore[assignment]
    managed: tuple[Observed, ...] = (),
) -> DriverSnapshot:
    base = Snapshot(
        now=NOW,
        stamp=STAMP,
        policies=(cluster_policy or policy(),),
        nodes=tuple(nodes),
        daemonsets=tuple(daemonsets),
        pods=tuple(pods),
        revisions=tuple(revisions),
    )
    return DriverSnapshot(base, tuple(drivers), managed)


def applied(decision: DriverDecision, kind: str) -> list[dict[str, Any]]:
    return [dict(a.obj) for a in decision.actions if isinstance(a, Apply) and a.obj["kind"] == kind]


def running(daemonset: dict[str, Any], nodes: list[str], revision: str) -> list[dict[str, Any]]:
    """A Ready pod of ``daemonset`` on each node, on template ``revision``."""
    meta = daemonset["metadata"]
    return [
        {
            "metadata": {
                "name": f"{meta['name']}-{n}",
                "namespace": meta["namespace"],
                "labels": {**daemonset["spec"]["template"]["metadata"]["labels"],
                           REVISION_HASH: revision},
                "ownerReferences": [{"kind": "DaemonSet", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True}],
            },
            "spec": {"nodeName": n},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for n in nodes
    ]  # fmt: skip


def revision(daemonset: dict[str, Any], hash_: str, number: int) -> dict[str, Any]:
    meta = daemonset["metadata"]
    return {
        "metadata": {
            "name": f"{meta['name']}-{hash_}",
            "labels": {REVISION_HASH: hash_, COMPONENT: "driver"},
            "ownerReferences": [{"kind": "DaemonSet", "name": meta["name"], "uid": meta["uid"]}],
        },
        "revision": number,
    }


def on_server(daemonset: dict[str, Any], desired: int) -> dict[str, Any]:
    """``daemonset`` as the API server holds it: a uid and a status."""
    ds = {**daemonset, "metadata": {**daemonset["metadata"],
                                    "uid": "ds-" + daemonset["metadata"]["name"],
                                    "generation": 1}}  # fmt: skip
    ds["status"] = {"desiredNumberScheduled": desired, "numberReady": desired,
                    "observedGeneration": 1}  # fmt: skip
    return ds
