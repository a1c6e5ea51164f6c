"""``gpu-operator uninstall``: what the Helm chart's pre-delete hook runs.

The operator's finalizers remove the node labels and taint it added when a ClusterPolicy is
deleted, and tear a GPUCluster's DRA stack down in order (the pods holding ResourceClaims before
the kubelet plugin that releases them), so both must go while the operator still runs. Helm
deletes a release's objects in an order of its own and does not wait, so the chart deletes them
in a hook first and waits here until the finalizers have let each one go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.install.rbac import CLUSTER_RULES, CRD, NAMESPACE_RULES, Rule, listing
from gpu_operator.kinds import KINDS
from gpu_operator.kube import Kube

_KIND_BY_RESOURCE = {(kind.group, kind.plural): name for name, kind in KINDS.items()}


class UninstallError(RuntimeError):
    """The policies (or the CRD) did not go in time; the message says what holds them."""


HELD_KINDS = ("ClusterPolicy", "GPUCluster")  # what the operator's finalizers hold


def waiting_on(held: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """What still holds each object, for a user whose uninstall is stuck."""
    parts = []
    for kind, obj in held:
        meta = obj.get("metadata") or {}
        finalizers = ", ".join(meta.get("finalizers") or []) or "no finalizer"
        parts.append(f"{kind} {meta.get('name')} ({finalizers})")
    return (
        "; ".join(parts) + ": the operator removes its node labels and taint, and a GPUCluster's "
        "DRA stack in order, before letting each go, so it must still be running (kubectl get "
        "deployment -A -l app.kubernetes.io/name=gpu-operator)"
    )


def _held(kube: Kube) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for kind in HELD_KINDS:
        try:
            found += [(kind, obj) for obj in kube.list_objects(kind)]
        except ApiException as exc:
            if exc.status != 404:  # 404: no such CRD, so nothing of that kind
                raise
    return found


def _kinds(rules: tuple[Rule, ...]) -> list[str]:
    return [_KIND_BY_RESOURCE[(r.api_group, plural)] for r in rules for plural in r.resources]


def dependents(kube: Kube, owners: set[str], namespace: str) -> list[str]:
    """Objects the operator made that still name one of ``owners`` (policy uids) as owner."""
    found = []
    scopes: list[tuple[str, str | None]] = [(k, None) for k in _kinds(listing(CLUSTER_RULES))]
    scopes += [(kind, namespace) for kind in _kinds(listing(NAMESPACE_RULES))]
    for kind, where in scopes:
        try:
            objects = kube.list_objects(kind, where)
        except ApiException as exc:
            if exc.status == 404:  # e.g. no ServiceMonitor CRD in this cluster
                continue
            raise
        for obj in objects:
            refs = obj["metadata"].get("ownerReferences") or ()
            if any(ref.get("uid") in owners for ref in refs):
                found.append(f"{kind} {obj['metadata']['name']}")
    return found


def _until(
    done: Callable[[], bool],
    timeout: float,
    every: float,
    sleep: Callable[[float], None],
    waiting: Callable[[], None] = lambda: None,
) -> bool:
    """Poll ``done``; ``waiting`` says what is awaited about every 10 s."""
    deadline = time.monotonic() + timeout
    polls = 0
    while not done():
        if time.monotonic() >= deadline:
            return False
        polls += 1
        if polls % max(1, round(10 / every)) == 0:
            waiting()
        sleep(every)
    return True


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
    """Delete every ClusterPolicy and GPUCluster (then the ClusterPolicy CRD with
    ``delete_crd``), waiting when asked.

    Before the CRD goes, garbage collection must have removed what the policies owned (in
    ``namespace``, the operand namespace, and cluster-wide): without the CRD it cannot resolve
    their owner references and would keep them.
    """
    held = _held(kube)
    owners = {obj["metadata"]["uid"] for kind, obj in held if kind == "ClusterPolicy"}
    for kind, obj in held:
        name = obj["metadata"]["name"]
        if kube.delete(kind, name):
            out.write(f"deleted {kind} {name}\n")
    if wait:

        def say() -> None:
            out.write(f"waiting: {waiting_on(_held(kube))}\n")
            out.flush()

        if not _until(lambda: not _held(kube), timeout, every, sleep, say):
            raise UninstallError(f"after {timeout:.0f}s still there: {waiting_on(_held(kube))}")
        out.write(
            "every ClusterPolicy and GPUCluster is gone; the operator has cleaned the nodes\n"
        )
    if not delete_crd:
        return
    if wait and owners:

        def say_dependents() -> None:
            left = ", ".join(dependents(kube, owners, namespace))
            out.write(f"waiting for garbage collection: {left}\n")
            out.flush()

        if not _until(
            lambda: not dependents(kube, owners, namespace), timeout, every, sleep, say_dependents
        ):
            left = ", ".join(dependents(kube, owners, namespace))
            raise UninstallError(f"after {timeout:.0f}s garbage collection left: {left}")
        out.write("garbage collection has removed what the policies owned\n")
    if kube.delete("CustomResourceDefinition", CRD):
        out.write(f"deleted CustomResourceDefinition {CRD}\n")
    if wait and not _until(
        lambda: kube.get("CustomResourceDefinition", CRD) is None, timeout, every, sleep
    ):
        raise UninstallError(f"after {timeout:.0f}s CustomResourceDefinition {CRD} is still there")
