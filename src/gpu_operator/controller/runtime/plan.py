"""What to write: desired objects against observed ones, as a pure diff.

Each applied object carries a hash of its desired content (``APPLIED_HASH``). A pass applies
only objects whose hash differs from what is on the server, or whose generation moved since
this operator applied them (someone edited them), and deletes managed objects no longer
desired. An unchanged world therefore costs no write at all.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, OPERATOR_NAME

Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace") or "", meta["name"])


def content_hash(obj: Mapping[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Owner:
    """The ClusterPolicy every child points at, so GC removes them with it."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


def stamp(objects: Iterable[Mapping[str, Any]], owner: Owner | None) -> list[dict[str, Any]]:
    """Add the owner reference and the content hash to each rendered object. ``owner`` None:
    no reference, for objects in another namespace than their owner, which the garbage
    collector would take for orphans and delete."""
    out = []
    for obj in objects:
        meta = dict(obj["metadata"])
        if owner is not None:
            meta["ownerReferences"] = [owner.reference()]
        meta["labels"] = {**(meta.get("labels") or {}), MANAGED_BY: OPERATOR_NAME}
        body = {**obj, "metadata": meta}
        meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH: content_hash(body)}
        out.append(body)
    return out


@dataclass(frozen=True)
class Observed:
    """The little the plan needs to know about an object on the server."""

    key: Key
    applied_hash: str | None
    generation: int

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any], kind: str | None = None) -> Observed:
        meta = obj.get("metadata") or {}
        full = {**obj, "kind": kind or obj.get("kind", "")}
        return cls(
            key_of(full),
            (meta.get("annotations") or {}).get(APPLIED_HASH),
            int(meta.get("generation") or 0),
        )


@dataclass(frozen=True)
class ObjectChanges:
    apply: list[dict[str, Any]] = field(default_factory=list)
    prune: list[Key] = field(default_factory=list)
    skipped: list[Key] = field(default_factory=list)  # desired, but the API lacks the kind

    @property
    def empty(self) -> bool:
        return not self.apply and not self.prune


def plan_changes(
    desired: Iterable[Mapping[str, Any]],
    observed: Iterable[Observed],
    applied_generations: Mapping[Key, int] | None = None,
    available_kinds: frozenset[str] | None = None,
) -> ObjectChanges:
    """Apply what differs, prune what is no longer desired.

    ``applied_generations`` is what this process saw right after its own applies: a server
    generation beyond it means someone edited the object, and it is applied again.
    """
    applied_generations = applied_generations or {}
    seen = {o.key: o for o in observed}
    apply, skipped = [], []
    wanted: set[Key] = set()
    for obj in desired:
        key = key_of(obj)
        wanted.add(key)
        if available_kinds is not None and key[0] not in available_kinds:
            skipped.append(key)
            continue
        current = seen.get(key)
        want_hash = obj["metadata"]["annotations"][APPLIED_HASH]
        edited = (
            key in applied_generations
            and current is not None
            and (current.generation > applied_generations[key])
        )
        if current is None or current.applied_hash != want_hash or edited:
            apply.append(dict(obj))
    prune = sorted(k for k in seen if k not in wanted)
    return ObjectChanges(apply, prune, skipped)
