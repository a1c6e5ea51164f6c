"""Perform a decision's stages against the API server and report what came of each action.

I/O only: the order, grouping and guards come from the decision's stages; refusals from the
API come back as :class:`Outcome` values for the loop to remember, never as decisions here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.actions import (
    Action,
    Apply,
    Create,
    DeletePod,
    Evict,
    Outcome,
    Patch,
    Prune,
    Stage,
    describe,
)
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

# Refusals that are the normal course of things: gone already, a PodDisruptionBudget says
# not now, changed under us (the next pass sees the new version).
_EXPECTED = {404, 409, 429}


def api_reason(exc: ApiException) -> str:
    """The API server's message for a refusal, else its status line."""
    try:
        return str(json.loads(exc.body or "").get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"


def unapplied(exc: ApiException) -> bool:
    """Whether a JSON patch was refused because it could not apply to the object as it is now
    (a ``test`` found another value, a key to remove was gone): the API server says so with a
    422 that names no field, where a validation error names each field it refuses."""
    if exc.status != 422:
        return False
    try:
        details = json.loads(exc.body or "").get("details") or {}
        return not details.get("causes")
    except (TypeError, ValueError, AttributeError):
        return False


class Executor:
    """Carries out a Decision's stages against the API server, the only place a loop writes:
    stage by stage, concurrently within a stage (at most ``concurrency`` requests) unless it
    is ordered, a stage marked after-success skipped when an earlier one failed. Every write
    gives an Outcome; a refusal is an outcome, never an exception, so the next pass decides."""

    def __init__(self, kube: Kube, concurrency: int, metrics: PrometheusMetrics) -> None:
        self.kube = kube
        self.metrics = metrics
        self._slots = asyncio.Semaphore(concurrency)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A blocking client call in a worker thread, at most ``concurrency`` at a time."""
        async with self._slots:
            return await asyncio.to_thread(fn, *args, **kwargs)

    async def run(self, stages: Sequence[Stage]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        all_ok = True
        for stage in stages:
            if stage.after_success and not all_ok:
                outcomes += [Outcome(a, skipped=True) for a in stage.actions]
                continue
            if stage.concurrent:
                results = list(await asyncio.gather(*(self._one(a) for a in stage.actions)))
            else:
                results = await self._in_order(stage)
            all_ok = all_ok and all(o.ok for o in results)
            outcomes += results
        return outcomes

    async def _in_order(self, stage: Stage) -> list[Outcome]:
        results: list[Outcome] = []
        failed_groups: set[str] = set()
        for index, action in enumerate(stage.actions):
            group = stage.group_of(index)
            if group is not None and group in failed_groups:
                results.append(Outcome(action, skipped=True))
                continue
            outcome = await self._one(action)
            if not outcome.ok and group is not None and isinstance(action, Patch):
                failed_groups.add(group)
            results.append(outcome)
        return results

    async def _one(self, action: Action) -> Outcome:
        verb, kind = _counted_as(action)
        try:
            result = await self.call(self._request, action)
        except ApiException as exc:
            reason = api_reason(exc)
            if isinstance(action, Patch) and action.patch_type == "json" and unapplied(exc):
                # Planned from an older read: the next pass plans from what the watch shows.
                log.debug("%s refused: changed since it was read", describe(action))
            else:
                level = logging.DEBUG if exc.status in _EXPECTED else logging.WARNING
                log.log(level, "%s refused: %s %s", describe(action), exc.status, reason)
            return Outcome(action, exc.status or 0, reason)
        self.metrics.writes.labels(verb, kind).inc()
        meta = (result.get("metadata") or {}) if isinstance(result, dict) else {}
        return Outcome(action, generation=int(meta.get("generation") or 0))

    def _request(self, action: Action) -> Any:
        kube = self.kube
        if isinstance(action, Apply):
            return kube.apply(action.obj)
        if isinstance(action, Prune):
            kind, namespace, name = action.key
            return kube.delete(kind, name, namespace or None)
        if isinstance(action, Patch):
            where = {"namespace": action.namespace} if action.namespace else {}
            if action.patch_type == "json" or not isinstance(action.body, Mapping):
                return kube.json_patch(action.kind, action.name, action.body, **where)
            return kube.merge_patch(
                action.kind, action.name, action.body, subresource=action.subresource, **where
            )
        if isinstance(action, Create):
            return kube.create(action.obj)
        if isinstance(action, Evict):
            return kube.evict(action.pod, action.namespace)
        return kube.delete(
            "Pod",
            action.pod,
            action.namespace,
            grace_period_seconds=0 if action.force else None,
        )


def _counted_as(action: Action) -> tuple[str, str]:
    """(verb, kind) for the writes metric."""
    if isinstance(action, Apply):
        return "apply", str(action.obj["kind"])
    if isinstance(action, Prune):
        return "delete", action.key[0]
    if isinstance(action, Patch):
        kind = f"{action.kind}/{action.subresource}" if action.subresource else action.kind
        return "patch", kind
    if isinstance(action, Create):
        return "create", str(action.obj["kind"])
    if isinstance(action, Evict):
        return "evict", "Pod"
    if isinstance(action, DeletePod):
        return "delete", "Pod"
    raise TypeError(action)
