"""What a loop's ``observe`` reads: the values of the watches' stores, and the one list a pass
asks the API server for, the pods on the nodes being emptied (workload pods are not watched:
a fleet's would fill the operator's memory, and only an emptied node's matter)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_operator.controller.runtime.execute import Executor
from gpu_operator.controller.runtime.watch import ObjectKey


def stored(indexes: Mapping[str, Mapping[ObjectKey, Any]], index: str) -> list[Any]:
    """What one store holds (nothing for a kind that is not served)."""
    return list((indexes.get(index) or {}).values())


def configmap_keys(
    indexes: Mapping[str, Mapping[ObjectKey, Any]], namespace: str
) -> dict[str, tuple[str, ...]]:
    """The keys of ``namespace``'s ConfigMaps, by name (their files, once mounted)."""
    return {
        cm["metadata"]["name"]: tuple(cm.get("keys") or ())
        for cm in stored(indexes, "configmaps")
        if cm["metadata"].get("namespace") == namespace
    }


async def pods_on(executor: Executor, nodes: Iterable[str]) -> tuple[Mapping[str, Any], ...]:
    """Every pod on ``nodes``, in their order: one list call per node, side by side within the
    executor's concurrency."""
    listed = await asyncio.gather(
        *(
            executor.call(executor.kube.list_objects, "Pod", field_selector=f"spec.nodeName={name}")
            for name in nodes
        )
    )
    return tuple(p for pods in listed for p in pods)
