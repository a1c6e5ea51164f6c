"""From the objects the operator watches to the planner's :class:`Fleet` (pure).

Everything comes from the operator's indexes except the workload pods, which are listed only
for nodes that are being emptied (see :data:`EMPTYING`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_operator.labels import COMPONENT, VALIDATOR_APP
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade.model import Fleet, Node, is_emptying
from gpu_operator.views import NodeView, daemonset_owners, derived, newest_revision_hash

POD_VIEW = Pod.from_k8s  # one function object: the key its views are remembered under
DRIVER_COMPONENT = "driver"
# The component label of driver DaemonSets: the ClusterPolicy's, and NVIDIADrivers' (NVIDIA's
# values, for the GPU driver and the vGPU host manager).
DRIVER_COMPONENTS = frozenset({DRIVER_COMPONENT, "nvidia-driver", "nvidia-vgpu-host-manager"})


def emptying_nodes(nodes: Iterable[NodeView]) -> list[str]:
    """Nodes whose workload pods the planner needs to see this pass."""
    return [n.name for n in nodes if is_emptying(n.labels)]


def fleet_from_objects(
    nodes: Sequence[NodeView],
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    revisions: Iterable[Mapping[str, Any]],
    workload_pods: Iterable[Mapping[str, Any]] = (),
) -> Fleet:
    """The fleet as the planner sees it: driver and validator pods, and each driver
    DaemonSet's newest revision hash (what an up-to-date driver pod carries)."""
    daemonsets = tuple(daemonsets)
    drivers = {
        d["metadata"]["uid"]: d["metadata"]["name"]
        for d in daemonsets
        if (d["metadata"].get("labels") or {}).get(COMPONENT) in DRIVER_COMPONENTS
    }
    driver_pods, validators = [], []
    for p in pods:
        if any(u in drivers for u in daemonset_owners(p)):
            driver_pods.append(p)
        elif (p["metadata"].get("labels") or {}).get("app") == VALIDATOR_APP:
            validators.append(p)
    revisions_of: dict[str, list[Mapping[str, Any]]] = {}
    for rev in revisions:
        for uid in daemonset_owners(rev):
            if uid in drivers:
                revisions_of.setdefault(uid, []).append(rev)
    newest = {
        name: hash_
        for uid, name in drivers.items()
        if (hash_ := newest_revision_hash(revisions_of.get(uid, ())))
    }
    driver_views = tuple(derived(p, POD_VIEW) for p in driver_pods)
    validator_views = tuple(derived(p, POD_VIEW) for p in validators)
    return Fleet(
        nodes=tuple(Node(n.name, n.labels, n.annotations, n.unschedulable, n.ready) for n in nodes),
        driver_pods=driver_views,
        workload_pods=tuple(Pod.from_k8s(p) for p in workload_pods),
        validator_pods=validator_views,
        newest_hash=newest,
        unobserved=unobserved(
            daemonsets, (*driver_views, *validator_views), {n.name for n in nodes}
        ),
    )


def unobserved(
    daemonsets: Iterable[Mapping[str, Any]], pods: Iterable[Pod], nodes: set[str]
) -> frozenset[str]:
    """The DaemonSets whose status counts fewer of ``nodes`` with a pod than ``pods`` are on
    (pods on a node that is gone count nowhere in its status, as in the controller's).

    The DaemonSet controller counts each pod it creates as expected until its own watch shows
    it; while any is, it only writes status and creates nothing. A pod it created and someone
    deleted before its watch showed it (the controller's watch down, as after an API server
    restart) is never shown, and that DaemonSet creates no pod for 5 minutes, when
    kube-controller-manager gives up waiting (seen in a chaos run: 3 driver pods deleted for an
    upgrade, none recreated for 4 minutes). Its status, counted from its own cache, says
    whether it has seen the pods this observation has: until it counts them, they are not
    deleted.
    """
    on: dict[str, set[str]] = {}
    for pod in pods:
        if pod.is_daemonset_pod and pod.node in nodes and not pod.deleting:
            on.setdefault(pod.owner, set()).add(pod.node)
    behind = set()
    for ds in daemonsets:
        name = ds["metadata"]["name"]
        if name not in on:
            continue
        status = ds.get("status") or {}
        counted = int(status.get("currentNumberScheduled") or 0)
        counted += int(status.get("numberMisscheduled") or 0)
        if len(on[name]) > counted:
            behind.add(name)
    return frozenset(behind)
