"""Never alive but deaf: notice when the operator can no longer hear or act, and say so.

kopf (watching the CRDs) retries a failing API request a fixed number of times
(``error_backoffs``) and then lets that watch's task end, logging it; the process would live
on, answering its liveness probe, with a store that never changes again (the fleets NVIDIA's
users report stalled). The informer's watch threads (the built-in kinds) never give up, but one
could still end on a bug. The watchdog keeps the names of kopf's watcher tasks once the stores
are filled, and judges, at each look (every 10 s, and on each ``/healthz``): a kopf watcher or
a watch thread gone, or a pass running for longer than ``stall_s``, is *deaf* (``/healthz``
answers 503 with the reason and the operator exits non-zero, for its Deployment to restart
it); failing passes with every watch alive is *retrying* (200: it recovers on its own when the
API server is back). The judgement is a pure function; the task only gathers what it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpu_operator.controller.runtime.loop import Loop

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
    threads: Mapping[str, bool] | None = None,
) -> Verdict:
    """What the operator's state means for its liveness (times: monotonic seconds).

    ``watchers``: kopf's watcher tasks once the stores were filled, ``running`` those running
    now; ``threads``: the informer's watch threads, by name, and whether each still runs.
    """
    threads = threads or {}
    gone = sorted(watchers - set(running)) + sorted(n for n, alive in threads.items() if not alive)
    if gone:
        total = len(watchers) + len(threads)
        return Verdict("deaf", f"{gone[0]} ended ({len(gone)} of {total} watches dead)")
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


ThreadsAlive = Callable[[], Mapping[str, bool]]


class Watchdog:
    """Watches a loop, kopf's watchers and the informer's threads; ``run`` returns once the
    operator is deaf."""

    def __init__(
        self,
        loop: Loop,
        *,
        interval_s: float = 10.0,
        stall_s: float = 900.0,
        threads: ThreadsAlive = dict,
    ) -> None:
        self.loop = loop
        self.threads = threads
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.watchers: frozenset[str] = frozenset()
        self.verdict = OK
        self._deaf = asyncio.Event()

    def look(self) -> Verdict:
        """Judge now (on the loop: ``/healthz`` asks for a fresh verdict on each probe). Deaf
        stays deaf: the run is ending, and a stall that clears meanwhile must not leave
        :meth:`run` waking at once, forever, on the event already set."""
        if self._deaf.is_set():
            return self.verdict
        self.verdict = judge(
            self.watchers,
            running_watchers(),
            now=time.monotonic(),
            pass_started=self.loop.pass_started,
            failing_since=self.loop.failing_since,
            stall_s=self.stall_s,
            threads=self.threads(),
        )
        if not self.verdict.alive:
            self._deaf.set()
        return self.verdict

    async def run(self) -> str:
        """The reason the operator is deaf, once it is: found by a look of its own every
        ``interval_s``, or at once by a probe's. An idle operator's event loop wakes for little
        else, so the interval is the kubelet's default probe period rather than seconds."""
        await self.loop.ready.wait()  # every kind is listed: all watchers and threads run
        self.watchers = frozenset(running_watchers())
        while self.look().alive:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._deaf.wait(), timeout=self.interval_s)
        return self.verdict.reason
