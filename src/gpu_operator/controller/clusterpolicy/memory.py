"""What the operator process learned from its own writes, passed explicitly into each decision.

Nothing here must survive a restart (everything that must is in the cluster): a fresh process
starts from an empty :class:`Memory` and at worst makes one extra check. Memory only saves
writes: the generation seen right after an apply (a later one means someone edited the object),
the node policy last applied to every node, the last apply failure for status, and the node
patches the watch has not shown yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpu_operator.controller.runtime.actions import Apply, Key, Outcome, Patch, Prune, describe
from gpu_operator.node_labels import NodePolicy


@dataclass(frozen=True)
class Memory:
    applied_generations: Mapping[Key, int] = field(default_factory=dict)
    # The node policy every GPU node was last brought to; ``known`` False means "check all".
    node_policy: NodePolicy | None = None
    node_policy_known: bool = False
    apply_error: str | None = None  # the last pass's apply failures, for status
    # Nodes patched, by the resourceVersion the patch was planned from: while the watch still
    # shows that version, the write is not seen yet and planning it again would repeat it.
    patched_nodes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Aftermath:
    """Memory after a pass, and what the loop should do about the outcomes."""

    memory: Memory
    retry_nodes: frozenset[str] = frozenset()  # label patches refused (changed under us, gone)
    look_again: bool = False  # something status reports changed: pass again soon


def summarize_errors(errors: list[tuple[str, str]], shown: int = 3) -> str | None:
    """One line per distinct reason, naming a few of the objects it hit (a missing namespace
    fails every object the same way; the user needs to read that once)."""
    if not errors:
        return None
    by_reason: dict[str, list[str]] = {}
    for what, reason in errors:
        by_reason.setdefault(reason, []).append(what)
    lines = []
    for reason, objects in by_reason.items():
        names = ", ".join(sorted(objects)[:shown])
        more = f" and {len(objects) - shown} more" if len(objects) > shown else ""
        lines.append(f"{reason} ({names}{more})")
    return "; ".join(lines)


def remember(memory: Memory, outcomes: Iterable[Outcome], *, reconciled: bool) -> Aftermath:
    """Fold a pass's outcomes into memory. ``reconciled``: the pass decided the active policy's
    objects, so its apply failures (or their absence) are the news for status."""
    generations = dict(memory.applied_generations)
    errors: list[tuple[str, str]] = []
    retry: set[str] = set()
    for outcome in outcomes:
        action = outcome.action
        if isinstance(action, Apply):
            if outcome.ok:
                generations[action.key] = outcome.generation
            elif not outcome.skipped:
                errors.append((describe(action), outcome.reason))
        elif isinstance(action, Prune):
            if outcome.ok or outcome.status == 404:
                generations.pop(action.key, None)
            elif not outcome.skipped:
                errors.append((describe(action), outcome.reason))
        elif (
            isinstance(action, Patch) and action.purpose in ("labels", "health") and not outcome.ok
        ):
            retry.add(action.name)
    apply_error = summarize_errors(errors) if reconciled else memory.apply_error
    new = replace(
        memory,
        applied_generations=generations,
        apply_error=apply_error,
        patched_nodes={k: v for k, v in memory.patched_nodes.items() if k not in retry},
    )
    return Aftermath(new, frozenset(retry), look_again=apply_error != memory.apply_error)
