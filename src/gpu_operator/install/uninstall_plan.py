"""What ``gpu-operator uninstall`` does next, decided from what it observed (pure).

Uninstalling removes everything of the project, in an order that leaves nothing behind:

1. Every ClusterPolicy, NVIDIADriver and GPUCluster is deleted. The operator's finalizers hold
   a ClusterPolicy until its node labels and taint are gone and the GPUCluster until its DRA
   stack is torn down in order, so while the operator runs, uninstall waits for it; once the
   operator is gone nothing would let them go, and uninstall removes those finalizers itself
   (only the operator's own).
2. With none of them left, every node is cleaned of what the operator owns, exactly as its
   finalizer cleans it: the labels, annotation and taint it recorded as added (never one that
   was there before), the labels the rest of the stack wrote (feature discovery, MIG manager,
   upgrades, driver pools), and a GPU health quarantine (only the taint it added; the cordon
   only if it made it). On a cleaned node there is nothing left to do.
3. With ``delete_crds``: garbage collection must first have removed the objects those
   resources owned (DaemonSets, RBAC, DeviceClasses...): without their CRD it could not resolve
   the owner references and would keep them forever. Then the three CRDs are deleted.

Each observation gives one ``Step``: the writes to make now and what is still awaited; the
executor (``uninstall``) repeats observe-decide-execute until nothing is awaited.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpu_operator.install.rbac import CRD, GPUCLUSTER_CRD, NVIDIADRIVER_CRD
from gpu_operator.jsonpatch import finalizer_body
from gpu_operator.labels import (
    DRA_TEARDOWN_FINALIZER,
    HEALTH_EXTERNAL_LABEL,
    NODE_CLEANUP_FINALIZER,
)
from gpu_operator.node_labels import Move, plan_node
from gpu_operator.remediation.model import HealthNode, Release
from gpu_operator.views import NodeView
from gpu_operator.workload_move import MoveStep

RESOURCE_KINDS = ("ClusterPolicy", "NVIDIADriver", "GPUCluster")  # nvidia.com, the operator's
FINALIZERS = {"ClusterPolicy": NODE_CLEANUP_FINALIZER, "GPUCluster": DRA_TEARDOWN_FINALIZER}
CRDS = (CRD, NVIDIADRIVER_CRD, GPUCLUSTER_CRD)
GROUP = "nvidia.com"


@dataclass(frozen=True)
class Observed:
    """One look at the cluster."""

    resources: tuple[tuple[str, Mapping[str, Any]], ...] = ()  # (kind, object), the 3 kinds
    nodes: tuple[NodeView, ...] = ()
    operator_running: bool = True  # its Deployment has a ready replica
    # Objects of the kinds the operator creates, (kind, object): those owned by a resource of
    # RESOURCE_KINDS are what garbage collection has still to remove (with delete_crds only).
    children: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    crds: tuple[Mapping[str, Any], ...] = ()  # those of CRDS still there (with delete_crds)


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str

    @property
    def says(self) -> str:
        return f"deleted {self.kind} {self.name}"


@dataclass(frozen=True)
class Patch:
    kind: str
    name: str
    body: Any  # a merge patch (a mapping) or a JSON patch (a list of operations)
    patch_type: Literal["merge", "json"]
    says: str


Action = Delete | Patch


@dataclass(frozen=True)
class Step:
    actions: tuple[Action, ...] = ()
    waiting: str = ""  # what is still awaited; "" when uninstalling is over

    @property
    def done(self) -> bool:
        return not self.actions and not self.waiting


def waiting_on(held: Sequence[tuple[str, Mapping[str, Any]]], operator_running: bool) -> str:
    """What still holds each resource, for a user whose uninstall is stuck."""
    parts = []
    for kind, obj in held:
        meta = obj.get("metadata") or {}
        finalizers = ", ".join(meta.get("finalizers") or []) or "no finalizer"
        parts.append(f"{kind} {meta.get('name')} ({finalizers})")
    why = (
        "the operator removes its node labels and taint, and a GPUCluster's DRA stack in "
        "order, before letting each go"
        if operator_running
        else "the operator is gone: uninstall removes its finalizers; any other is another "
        "controller's to remove"
    )
    return f"{'; '.join(parts)}: {why}"


def plan_uninstall(observed: Observed, *, delete_crds: bool, wait: bool = True) -> Step:
    """The next step; without ``wait`` only what can be done at once (the deletions)."""
    if not wait:
        crds = _crds(observed).actions if delete_crds else ()
        return Step((*_resources(observed).actions, *crds))
    stages: list[Callable[[Observed], Step]] = [_resources, _nodes]
    if delete_crds:
        stages += [_garbage, _crds]
    for stage in stages:
        step = stage(observed)
        if not step.done:
            return step
    return Step()


def _resources(observed: Observed) -> Step:
    actions: list[Action] = []
    for kind, obj in observed.resources:
        meta = obj["metadata"]
        name = meta["name"]
        finalizer = FINALIZERS.get(kind)
        if not meta.get("deletionTimestamp"):
            actions.append(Delete(kind, name))
        elif (
            finalizer is not None
            and not observed.operator_running
            and finalizer in (meta.get("finalizers") or ())
        ):
            body = finalizer_body(obj, finalizer, add=False)
            says = f"removed the finalizer {finalizer} of {kind} {name}: the operator is gone"
            actions.append(Patch(kind, name, body, "merge", says))
    waiting = waiting_on(observed.resources, observed.operator_running)
    return Step(tuple(actions), waiting if observed.resources else "")


def node_cleanup(node: NodeView) -> Patch | None:
    """The one patch that takes what the operator owns off ``node`` (one at a time: each is
    checked against the read it was planned from, so the next comes from the next look)."""
    move = Move.parse(node.annotations)
    if move is not None:  # first, while the record still says who cordoned the node
        uncordon = not move.was_cordoned and node.unschedulable
        end = MoveStep(node, None, cordon=False if uncordon else None)
        says = f"stopped the workload move of Node {node.name}" + (
            " and uncordoned it" if uncordon else ""
        )
        return Patch("Node", node.name, end.patch(), "json", says)
    patch = plan_node(node, None, uninstall=True)
    if patch is not None:
        says = f"removed the operator's labels and taint from Node {node.name}"
        return Patch("Node", node.name, patch.to_json_patch(), "json", says)
    health = HealthNode(node)
    if health.phase is None:
        return None
    release = Release(node, HEALTH_EXTERNAL_LABEL, not health.was_cordoned, False)
    says = f"lifted the GPU health quarantine of Node {node.name}"
    return Patch("Node", node.name, release.patch(), "json", says)


def _nodes(observed: Observed) -> Step:
    patches = tuple(p for node in observed.nodes if (p := node_cleanup(node)) is not None)
    return Step(patches, f"cleaning {len(patches)} nodes" if patches else "")


def owned_children(observed: Observed) -> list[str]:
    """The objects a resource of the operator's kinds still owns, ``Kind name`` each."""
    found = []
    for kind, obj in observed.children:
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences") or ()
        if any(
            r.get("kind") in RESOURCE_KINDS and str(r.get("apiVersion", "")).startswith(GROUP + "/")
            for r in refs
        ):
            found.append(f"{kind} {meta.get('name')}")
    return found


def _garbage(observed: Observed) -> Step:
    left = owned_children(observed)
    return Step((), f"waiting for garbage collection: {', '.join(left)}" if left else "")


def _crds(observed: Observed) -> Step:
    deletes = tuple(
        Delete("CustomResourceDefinition", crd["metadata"]["name"])
        for crd in observed.crds
        if not crd["metadata"].get("deletionTimestamp")
    )
    names = ", ".join(crd["metadata"]["name"] for crd in observed.crds)
    return Step(deletes, f"waiting for CustomResourceDefinition {names} to go" if names else "")
