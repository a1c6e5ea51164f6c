"""Emptying a node of its pods: which pods go, and the next step of removing them (pure).

One implementation for every reason a node is emptied (a driver upgrade's pod deletion and
drain, a GPU health quarantine), so the same selectors, timeouts, ``force``, ``deleteEmptyDir``
and PodDisruptionBudget handling apply everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_operator.labels import UPGRADE_DRAIN_SKIP, is_true
from gpu_operator.nodeops.operations import DeletePod, Event, Evict
from gpu_operator.nodeops.pods import Pod
from gpu_operator.selector import Selector

NAMES_SHOWN = 5


def names(items: Iterable[str]) -> str:
    """Up to five names and how many more: node and pod lists in Events and status."""
    items = list(items)
    shown = ", ".join(items[:NAMES_SHOWN])
    more = len(items) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def gpu_pods(pods: Iterable[Pod]) -> list[Pod]:
    """The node's pods that hold GPUs and would not come back by themselves."""
    return [p for p in pods if p.uses_gpu and not p.is_daemonset_pod and p.running]


def drain_pods(pods: Iterable[Pod], selector: Selector | None) -> list[Pod]:
    """What a drain removes: every running pod but DaemonSets' and those labelled to be
    skipped, narrowed by ``selector`` when given."""
    return [
        pod
        for pod in pods
        if pod.running
        and not pod.is_daemonset_pod
        and not is_true(pod.labels.get(UPGRADE_DRAIN_SKIP))
        and (selector is None or selector.matches(pod.labels))
    ]


@dataclass(frozen=True)
class Removal:
    """The next step of removing pods: done, requests to send, or why it failed."""

    done: bool = False
    requests: tuple[Evict | DeletePod | Event, ...] = ()
    failure: str | None = None


def remove(
    pods: Sequence[Pod],
    *,
    node: str,
    stage: str,
    force: bool,
    timeout_s: int,
    empty_dir: bool,
    timed_out: bool,
) -> Removal:
    """Evict ``pods`` until none remain; once ``timed_out``, force-delete them or fail.

    Eviction is asked again every pass while a pod is still there and not terminating: a
    PodDisruptionBudget refusal is simply retried. Pods with emptyDir volumes are never
    removed unless ``deleteEmptyDir`` allows it (force does not override it: their data would
    be lost); they may still finish on their own before the timeout.
    """
    if not pods:
        return Removal(done=True)
    allowed = [p for p in pods if empty_dir or not p.uses_empty_dir]
    kept = [p for p in pods if not (empty_dir or not p.uses_empty_dir)]
    if not timed_out:
        evictions = tuple(Evict(p.name, p.namespace, node) for p in allowed if not p.deleting)
        return Removal(requests=evictions)
    if kept:
        return Removal(
            failure=f"{stage} timed out after {timeout_s}s: pods with emptyDir volumes stay "
            f"(deleteEmptyDir is false): {names(p.name for p in kept)}"
        )
    if force:
        message = f"{stage} timed out after {timeout_s}s; force-deleting {len(allowed)} pods"
        return Removal(
            requests=(
                Event(node, "Warning", "PodsForceDeleted", message),
                *(DeletePod(p.name, p.namespace, True, node) for p in allowed),
            )
        )
    return Removal(
        failure=f"{stage} timed out after {timeout_s}s with pods still on the node (force is "
        f"false): {names(p.name for p in allowed)}"
    )
