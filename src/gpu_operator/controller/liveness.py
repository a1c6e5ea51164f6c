"""Never alive but deaf: notice when the operator can no longer hear or act, and say so.

kopf retries a failing API request a fixed number of times (``error_backoffs``) and then lets
that watch's task end, logging it; the process lives on, answering its liveness probe, with an
index that never changes again (the fleets NVIDIA's users report stalled). The watchdog keeps
the names of kopf's watcher tasks once the indexes are filled, and judges, at each look:
a watcher gone or a pass running for longer than ``stall_s`` is *deaf* (``/healthz`` answers
503 with the reason and the operator exits non-zero, for its Deployment to restart it); failing
passes with every watcher alive is *retrying* (200: it recovers on its own when the API server
is back). The judgement is a pure function; the task only gathers what it reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_operator.controller.loop import Loop

WATCHER_PREFIX = "watcher for "  # how kopf names the task of each watch-stream


@dataclass(frozen=True)
class Verdict:
    state: str  # "ok", "retrying" (failing, recovers by itself) or "deaf" (must be restarted)
    reason: str = ""

    @property
    def alive(self) -> bool:
        return self.state != "deaf"


OK = Verdict("ok")


def judge(
    watchers: frozenset[str],
    running: Iterable[str],
    *,
    now: float,
    pass_started: float | None,
    failing_since: float | None,
    stall_s: float,
) -> Verdict:
    """What the operator's state means for its liveness (times: monotonic seconds)."""
    gone = sorted(watchers - set(running))
    if gone:
        return Verdict("deaf", f"{gone[0]} ended ({len(gone)} of {len(watchers)} watches dead)")
    if pass_started is not None and now - pass_started > stall_s:
        return Verdict("deaf", f"reconcile pass running for {now - pass_started:.0f}s")
    if failing_since is not None:
        return Verdict("retrying", f"reconcile passes failing for {now - failing_since:.0f}s")
    return OK


def running_watchers() -> set[str]:
    return {
        name
        for task in asyncio.all_tasks()
        if (name := task.get_name()).startswith(WATCHER_PREFIX) and not task.done()
    }


class Watchdog:
    """Watches a loop and kopf's watchers; ``run`` returns once the operator is deaf."""

    def __init__(self, loop: Loop, *, interval_s: float = 2.0, stall_s: float = 900.0) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.watchers: frozenset[str] = frozenset()
        self.verdict = OK

    def look(self) -> Verdict:
        self.verdict = judge(
            self.watchers,
            running_watchers(),
            now=time.monotonic(),
            pass_started=self.loop.pass_started,
            failing_since=self.loop.failing_since,
            stall_s=self.stall_s,
        )
        return self.verdict

    async def run(self) -> str:
        """The reason the operator is deaf, once it is."""
        await self.loop.ready.wait()  # every watch has listed: all watchers run
        self.watchers = frozenset(running_watchers())
        while self.look().alive:
            await asyncio.sleep(self.interval_s)
        return self.verdict.reason
