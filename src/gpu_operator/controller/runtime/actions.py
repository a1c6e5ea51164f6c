"""What a reconcile pass asks the API server to do, as plain data.

``decide`` returns stages of these; ``execute`` performs them and reports an :class:`Outcome`
per action. The vocabulary is the API's (apply, patch, create, evict, delete), so the executor
needs no knowledge of GPUs, policies or upgrades.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name

# Why a patch is made; the executor reports outcomes by purpose so the loop can react
# (a node whose labels could not be written is looked at again).
Purpose = Literal["labels", "upgrade", "health", "finalizer", "status"]
# What a successful write counts: (the PrometheusMetrics counter's attribute, its labels...).
Tally = tuple[str, ...]


@dataclass(frozen=True)
class Apply:
    """Server-side apply of a whole object with the operator's field manager."""

    obj: Mapping[str, Any]

    @property
    def key(self) -> Key:
        meta = self.obj["metadata"]
        return (self.obj["kind"], meta.get("namespace") or "", meta["name"])


@dataclass(frozen=True)
class Prune:
    """Delete a managed object that is no longer desired."""

    key: Key


@dataclass(frozen=True)
class Patch:
    """A JSON merge patch (with a resourceVersion inside when it must not race), or a JSON
    patch (a list of operations, ``test`` ones guarding what must not race)."""

    kind: str
    name: str
    body: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    purpose: Purpose
    subresource: str | None = None
    patch_type: Literal["merge", "json"] = "merge"
    tally: Tally | None = None
    namespace: str | None = None  # for a namespaced object (a ComputeDomain)


@dataclass(frozen=True)
class Create:
    """Create an object (Events)."""

    obj: Mapping[str, Any]
    tally: Tally | None = None


@dataclass(frozen=True)
class Evict:
    """Through the Eviction API, so PodDisruptionBudgets apply."""

    pod: str
    namespace: str


@dataclass(frozen=True)
class DeletePod:
    pod: str
    namespace: str
    force: bool = False  # grace period 0


Action = Apply | Prune | Patch | Create | Evict | DeletePod


@dataclass(frozen=True)
class Stage:
    """Actions run together. ``after_success``: only if every earlier stage fully succeeded
    (a finalizer comes off only once the node cleanup it guards is done). ``groups`` names,
    per action, a group whose later actions are skipped once one of them fails (an upgrade
    step must not run after its node's previous step failed)."""

    actions: tuple[Action, ...]
    concurrent: bool = True
    after_success: bool = False
    groups: tuple[str, ...] = ()

    def group_of(self, index: int) -> str | None:
        return self.groups[index] if index < len(self.groups) else None


@dataclass(frozen=True)
class Outcome:
    """What came of one action: ``status`` None when it succeeded. Of the server's answer only
    an applied object's ``generation`` is kept (memory's record of what was applied): a pass
    that patches every node of a large fleet at once would otherwise hold all their bodies."""

    action: Action
    status: int | None = None
    reason: str = ""
    generation: int = 0
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.status is None and not self.skipped


def refused(outcomes: Iterable[Outcome]) -> list[Outcome]:
    """The actions the API server answered with an error (not those skipped after one)."""
    return [o for o in outcomes if not o.ok and not o.skipped]


def describe(action: Action) -> str:
    """A short name for logs and status messages."""
    if isinstance(action, Apply):
        return f"{action.obj['kind']}/{action.obj['metadata']['name']}"
    if isinstance(action, Prune):
        return f"deleting {action.key[0]}/{action.key[2]}"
    if isinstance(action, Patch):
        return f"patching {action.kind}/{action.name} ({action.purpose})"
    if isinstance(action, Create):
        return f"creating {action.obj['kind']} {action.obj.get('reason', '')}".rstrip()
    if isinstance(action, Evict):
        return f"evicting {action.namespace}/{action.pod}"
    return f"deleting pod {action.namespace}/{action.pod}"
