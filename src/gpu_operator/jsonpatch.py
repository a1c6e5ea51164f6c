"""JSON-patch operations on lists and maps the API shares with others (a Node's labels,
annotations and taints): each removal checked in place with a ``test``, so a write planned from
an older read fails rather than removing what someone else put there. And the merge patch of
another shared list, an object's finalizers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def taint_ops(
    read: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Remove the taints no longer wanted (highest index first, each checked in place) and
    append the new ones."""
    ops: list[dict[str, Any]] = []
    for index in reversed([i for i, t in enumerate(read) if t not in new]):
        path = f"/spec/taints/{index}"
        ops += [{"op": "test", "path": path, "value": read[index]}, {"op": "remove", "path": path}]
    added = [dict(t) for t in new if t not in read]
    if added and not read:  # no list yet: create it, unless someone did meanwhile
        ops += [
            {"op": "test", "path": "/spec/taints", "value": None},
            {"op": "add", "path": "/spec/taints", "value": added},
        ]
    else:
        ops += [{"op": "add", "path": "/spec/taints/-", "value": t} for t in added]
    return ops


def map_ops(
    path: str, changes: Mapping[str, str | None], read: Mapping[str, str], *, guard: bool = False
) -> list[dict[str, Any]]:
    """JSON-patch operations setting (value) or removing (None) keys of a string map.

    ``guard``: each key changes only if it still holds what ``read`` saw (a ``test`` of that
    value, null for an absent key, before each operation), so a plan made from an older read
    cannot overwrite or remove what someone else wrote to that key meanwhile; writes to other
    keys (a kubelet's, discovery's) do not make it fail.
    """
    if not changes:
        return []
    if not read:  # the map may be absent: create it, unless someone did meanwhile
        value = {k: v for k, v in changes.items() if v is not None}
        if not value:
            return []
        return [
            {"op": "test", "path": path, "value": None},
            {"op": "add", "path": path, "value": value},
        ]
    ops: list[dict[str, Any]] = []
    for key, new in changes.items():
        if new is None and key not in read:
            continue
        at = f"{path}/{pointer(key)}"
        if guard:
            ops.append({"op": "test", "path": at, "value": read.get(key)})
        if new is None:
            ops.append({"op": "remove", "path": at})
        else:
            ops.append({"op": "add", "path": at, "value": new})
    return ops


def pointer(key: str) -> str:
    """A label key as a JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def merge_patch_to(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``current`` into exactly ``new``: keys that
    are gone are sent as null (a plain ``new`` would leave them, merged, in nested maps)."""
    patch: dict[str, Any] = {k: None for k in current if k not in new}
    for key, value in new.items():
        old = current.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            patch[key] = merge_patch_to(old, value)
        else:
            patch[key] = value
    return patch


def finalizer_body(obj: Mapping[str, Any], finalizer: str, *, add: bool) -> dict[str, Any]:
    """A merge patch adding or removing ``finalizer`` from ``obj``'s list, keeping the others.
    The resourceVersion makes a concurrent edit of the list fail instead of being lost."""
    meta = obj["metadata"]
    current = list(meta.get("finalizers") or ())
    finalizers = [*current, finalizer] if add else [f for f in current if f != finalizer]
    return {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
