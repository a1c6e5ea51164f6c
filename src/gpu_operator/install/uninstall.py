"""``gpu-operator uninstall``: what the Helm chart's pre-delete hook runs.

Helm deletes a release's objects in an order of its own, does not wait, and never deletes the
CRDs of ``crds/``: the hook removes every resource of the operator's three kinds while the
operator still runs (its finalizers clean the nodes and tear a GPUCluster's DRA stack down in
order), then cleans the nodes of what is left, and, with ``--delete-crd``, the three CRDs once
garbage collection has removed what those resources owned. ``uninstall_plan`` decides each
step from one look at the cluster; this module looks and writes, nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.install.rbac import CREATED_CLUSTER_RULES, CREATED_NAMESPACE_RULES, Rule
from gpu_operator.install.uninstall_plan import (
    CRDS,
    RESOURCE_KINDS,
    Delete,
    Observed,
    Step,
    plan_uninstall,
)
from gpu_operator.kinds import KINDS
from gpu_operator.kube import Kube
from gpu_operator.labels import OPERATOR_NAME
from gpu_operator.views import NodeView

_KIND_BY_RESOURCE = {(kind.group, kind.plural): name for name, kind in KINDS.items()}
# Conflicts with a write of the operator's (or anyone's) since the look: the next look decides.
_RETRIED = frozenset({409, 422})


class UninstallError(RuntimeError):
    """Something did not go in time; the message says what holds it."""


def _kinds(rules: tuple[Rule, ...]) -> list[str]:
    return [_KIND_BY_RESOURCE[(r.api_group, plural)] for r in rules for plural in r.resources]


def _listed(kube: Kube, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every object of ``kind``; none when its CRD is not installed (404)."""
    try:
        return kube.list_objects(kind, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return []


def operator_running(kube: Kube, namespace: str) -> bool:
    """Whether the operator's Deployment has a ready replica to handle its finalizers."""
    deployment = kube.get("Deployment", OPERATOR_NAME, namespace) or {}
    return int((deployment.get("status") or {}).get("readyReplicas") or 0) > 0


def observe(kube: Kube, namespace: str, *, delete_crds: bool) -> Observed:
    """One look at what uninstalling decides from (the CRDs and the children only when they
    are to be deleted: the hook may read them only then)."""
    resources = tuple((kind, obj) for kind in RESOURCE_KINDS for obj in _listed(kube, kind))
    children: list[tuple[str, dict[str, Any]]] = []
    crds: list[dict[str, Any]] = []
    if delete_crds:
        scopes: list[tuple[str, str | None]] = [(k, None) for k in _kinds(CREATED_CLUSTER_RULES)]
        scopes += [(k, namespace) for k in _kinds(CREATED_NAMESPACE_RULES)]
        children = [(kind, obj) for kind, where in scopes for obj in _listed(kube, kind, where)]
        crds = [crd for name in CRDS if (crd := kube.get("CustomResourceDefinition", name))]
    return Observed(
        resources=resources,
        nodes=tuple(NodeView.from_k8s(n) for n in kube.list_objects("Node")),
        operator_running=operator_running(kube, namespace),
        children=tuple(children),
        crds=tuple(crds),
    )


def execute(kube: Kube, step: Step, out: IO[str]) -> None:
    """Make the step's writes, saying each; one refused for a conflict waits for the next look."""
    for action in step.actions:
        try:
            if isinstance(action, Delete):
                if not kube.delete(action.kind, action.name):
                    continue  # already gone
            elif action.patch_type == "json":
                kube.json_patch(action.kind, action.name, action.body)
            else:
                kube.merge_patch(action.kind, action.name, action.body)
        except ApiException as exc:
            if exc.status in _RETRIED or exc.status == 404:
                continue
            raise
        out.write(f"{action.says}\n")
    out.flush()


def uninstall(
    kube: Kube,
    out: IO[str],
    *,
    wait: bool,
    timeout: float,
    delete_crd: bool,
    namespace: str,
    every: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Delete every ClusterPolicy, NVIDIADriver and GPUCluster; with ``wait``, until they are
    gone and the nodes are clean (then, with ``delete_crd``, the three CRDs once garbage
    collection is done); without, only the deletions (and the CRDs)."""
    deadline = time.monotonic() + timeout
    said, polls = "", 0
    while True:
        step = plan_uninstall(
            observe(kube, namespace, delete_crds=delete_crd), delete_crds=delete_crd, wait=wait
        )
        execute(kube, step, out)
        if not wait or step.done:
            break
        if time.monotonic() >= deadline:
            raise UninstallError(f"after {timeout:.0f}s still {step.waiting}")
        polls += 1
        # Say what is awaited when it changes, and again about every 10 s.
        if step.waiting != said or polls % max(1, round(10 / every)) == 0:
            out.write(f"waiting: {step.waiting}\n")
            out.flush()
            said = step.waiting
        sleep(every)
    if wait:
        crds = ", nor their CRDs" if delete_crd else ""
        out.write(
            f"uninstalled: no ClusterPolicy, NVIDIADriver or GPUCluster is left{crds}; the "
            "nodes are clean\n"
        )
