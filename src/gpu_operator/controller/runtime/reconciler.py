"""One pass of any loop: observe -> decide -> execute -> remember, and when to look again.

Each loop's shell is a :class:`Reconciler`: what it reads, how it judges (pure), how its
decision is written and what it keeps of the outcomes are its own. :func:`run_pass` is the
rest, the same for every loop: it counts what the writes tally, and asks for a retry soon
after writes were refused (a refused write changes nothing, so no watch event would wake the
loop for it); it returns when to look again, as :class:`~.loop.Loop` expects of a pass.
"""

from __future__ import annotations

import time
from typing import Protocol, TypeVar

from gpu_operator.controller.runtime.actions import Outcome, refused
from gpu_operator.controller.runtime.loop import Loop, earliest
from gpu_operator.controller.runtime.metrics import count_tallies


class Decided(Protocol):
    """What :func:`run_pass` reads of a decision: when to look again even if nothing changes."""

    @property
    def requeue_at(self) -> float | None: ...


SnapshotT = TypeVar("SnapshotT")
DecisionT = TypeVar("DecisionT", bound=Decided)


class Reconciler(Protocol[SnapshotT, DecisionT]):
    """One loop's own part of a pass, which :func:`run_pass` runs for its ``loop``."""

    loop: Loop

    async def observe(self, resync: bool) -> SnapshotT: ...  # the stores (a resync: all of it)
    def decide(self, snapshot: SnapshotT) -> DecisionT: ...  # pure
    async def execute(self, decision: DecisionT) -> list[Outcome]: ...  # the writes' outcomes
    def remember(self, decision: DecisionT, outcomes: list[Outcome]) -> None: ...  # and log


async def run_pass(reconciler: Reconciler[SnapshotT, DecisionT], resync: bool) -> float | None:
    """One pass of ``reconciler``; when to look again even if nothing changes (the decision's
    own time, or sooner to retry refused writes), or None. An exception ends the pass before
    anything is remembered, and the loop retries it."""
    decision = reconciler.decide(await reconciler.observe(resync))
    outcomes = await reconciler.execute(decision)
    reconciler.remember(decision, outcomes)
    count_tallies(reconciler.loop.metrics, outcomes)
    retry = reconciler.loop.refusals.retry_at(bool(refused(outcomes)), time.time())
    return earliest(decision.requeue_at, retry)
