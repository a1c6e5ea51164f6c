"""A lean list-and-watch of the built-in kinds the operator reads, into the shared stores.

One thread per kind lists it, then follows a watch from the list's resourceVersion (with
bookmarks), parses and trims each event to what decisions read (:func:`watch.index_value`) and
wakes the event loop only when that trimmed value changed; kopf's per-event machinery cost too
much CPU at fleet scale for these kinds. The thread never gives up: failures back off, a 410
lists again, an optional kind that is not served or not granted has no store (its key
``KIND_KEY`` reports it coming or going); ``docs/reliability.md`` says how, and the liveness
watchdog calls a thread that ends anyway deaf (:meth:`Informer.threads_alive`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.process import (
    fewer_collections,
    name_os_thread,
    one_malloc_arena,
)
from gpu_operator.controller.runtime.watch import ObjectKey, OnChange, Stores, Watched
from gpu_operator.kinds import Kind
from gpu_operator.kube import Kube, Repeats, WatchStream

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
DRAIN_DELAY_S = 0.05  # from a watch thread's first queued change to the loop taking them
# An optional kind that is not granted (403), or not served (404) where its CRD may not be
# watched, is looked for again after ABSENT_FIRST_S, doubling up to ABSENT_RETRY_S.
ABSENT_FIRST_S = 5.0
ABSENT_RETRY_S = 300.0
# The key an optional kind's coming (its first list) or going (a 404 or 403) is reported under.
KIND_KEY: ObjectKey = ("", "")
CRD = "CustomResourceDefinition"
# Kinds whose spec follows their metadata: their watch events lose managedFields unparsed.
COMPACT_KINDS = frozenset({"Pod", "Node", "DaemonSet", "Service"})
# Kinds whose status is reported periodically whether it changed or not: a report that repeats
# the last one is not parsed (``watchstream.Repeats``).
REPORTED_KINDS = frozenset({"Node"})
# Once a watch has read all there was, it waits this long before reading on, so that events
# which trickle in are read together: one thread wake-up for a second of a fleet's node reports
# instead of one each (``WatchStream`` pace_s). Node changes wait for a pass anyway; pods, which
# move upgrades on at once, wait less.
PACE_S = 0.25
REPORTED_PACE_S = 1.0


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


@dataclass
class Absence:
    """How an optional kind's thread looks for it while it is not there."""

    awaiting_crd: bool = False  # it answered 404: list it again once its CRD changes
    crd_version: str | None = None  # the CRD's resourceVersion then (None: no CRD)
    crd_watchable: bool = True  # False once watching the CRD was refused: look now and then
    looks: int = 0  # timed looks in a row (each waits twice as long as the last)

    def next_delay(self) -> float:
        delay: float = min(ABSENT_FIRST_S * 2**self.looks, ABSENT_RETRY_S)
        self.looks += 1
        return delay


class Informer:
    """Keeps ``stores[plural]`` current for each watched kind; ``ready`` once all are listed."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        watched: Iterable[Watched],
        stores: Stores,
        on_change: OnChange,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.watched = tuple(watched)
        self.stores = stores
        self.on_change = on_change
        for w in self.watched:
            if not w.optional:  # an optional kind's store is made by its first list
                stores.setdefault(w.index, {})
        self.ready = asyncio.Event()  # every kind listed once
        self.threads: tuple[threading.Thread, ...] = ()
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self._streams: set[WatchStream] = set()
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[..., None], tuple[Any, ...]]] = []  # for the loop
        self._drain_due = False  # a drain of the queue is scheduled on the loop
        self.drain_delay_s = DRAIN_DELAY_S
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        """Follow every kind until cancelled."""
        self._loop = asyncio.get_running_loop()
        one_malloc_arena()
        fewer_collections()
        self.threads = tuple(
            threading.Thread(target=self._follow, args=(w,), name=f"watch-{w.index}", daemon=True)
            for w in self.watched
        )
        for thread in self.threads:
            thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.stop()
            await asyncio.to_thread(_join, self.threads)

    def threads_alive(self) -> dict[str, bool]:
        """Each watch thread by name: whether it still runs (for the liveness watchdog)."""
        return {t.name: t.is_alive() for t in self.threads}

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()

    # -- in each kind's thread -----------------------------------------------------------------

    def _follow(self, w: Watched) -> None:
        name_os_thread(f"watch-{w.index}")
        failures = 0
        version = ""
        sent: dict[ObjectKey, Any] = {}  # the last value handed to the loop, per object
        repeats = Repeats() if w.kind.kind in REPORTED_KINDS else None
        absence = Absence()
        while not self._stop.is_set():
            try:
                if absence.awaiting_crd:
                    absence.crd_version = self._await_crd(w.kind, absence.crd_version)
                    absence.awaiting_crd = False
                if not version:
                    version, sent = self._list(w)
                    if repeats is not None:
                        repeats.forget()  # the list may differ from the last events seen
                absence.looks = 0
                version = self._watch(w, version, sent, repeats)
                failures = 0
            except Exception as exc:
                if self._stop.is_set():
                    return
                status = exc.status if isinstance(exc, ApiException) else None
                if absence.awaiting_crd and status == 403:
                    log.info("%s: watching its CRD refused (403); looking for it now and then",
                             w.index)  # fmt: skip
                    absence.awaiting_crd = absence.crd_watchable = False
                    continue
                if w.optional and status in (403, 404) and not absence.awaiting_crd:
                    # Nothing of it to act on: no store, looked for again later.
                    version, failures = "", 0
                    self._post(self._replace, w, None)
                    first = absence.looks == 0 and absence.crd_version is None
                    if status == 404 and absence.crd_watchable:
                        absence.awaiting_crd = True
                        (log.info if first else log.debug)(
                            "%s not served; listing it again when its CRD changes", w.index
                        )
                        continue
                    delay = absence.next_delay()
                    (log.info if first else log.debug)(
                        "%s not served or not granted (%s); looking again in %.0fs",
                        w.index, status, delay,
                    )  # fmt: skip
                    self._stop.wait(delay)
                    continue
                gone = isinstance(exc, Gone) or (
                    isinstance(exc, ApiException) and exc.status == 410
                )
                if gone:
                    version = ""
                    if failures == 0:  # list again at once; back off if it keeps happening
                        failures = 1
                        continue
                headers = getattr(exc, "headers", None) or {}
                failures += 1
                delay = self.kube.retry.delay(failures, headers.get("Retry-After"))
                log.warning("watching %s failed (%s); again in %.1fs", w.index, exc, delay)
                self._stop.wait(delay)

    def _list(self, w: Watched) -> tuple[str, dict[ObjectKey, Any]]:
        """The list's resourceVersion, and what it handed to the loop."""
        query = {"labelSelector": w.selector} if w.selector else None
        kept, version = self.kube.list_with_version(
            w.kind.kind, self._ns(w), query, keep=lambda obj: (_key(obj), w.kept(obj))
        )
        listed = dict(kept)
        self._post(self._replace, w, listed)
        return version, dict(listed)

    def _watch(
        self, w: Watched, version: str, sent: dict[ObjectKey, Any], repeats: Repeats | None
    ) -> str:
        """Follow one watch request; the resourceVersion to resume from. ``sent`` (this
        thread's own) is kept to what was handed to the loop; ``repeats``, this thread's too,
        spans its watch requests."""
        stream = self.kube.watch(
            w.kind.kind,
            self._ns(w),
            version,
            WATCH_TIMEOUT_S,
            label_selector=w.selector,
            compact=w.kind.kind in COMPACT_KINDS,
            repeats=repeats,
            pace_s=REPORTED_PACE_S if w.kind.kind in REPORTED_KINDS else PACE_S,
        )
        for events in self._batches(stream):
            changes: list[tuple[ObjectKey, Any]] = []
            for event in events:
                kind, obj = _checked(event)
                version = _resource_version(obj) or version
                if kind == "BOOKMARK":
                    continue
                key = _key(obj)
                value = None if kind == "DELETED" else w.kept(obj)
                if sent.get(key) == value:
                    continue  # nothing kept changed (or an unknown object deleted)
                if value is None:
                    del sent[key]
                else:
                    sent[key] = value
                changes.append((key, value))
            if changes:
                self._post(self._update, w, changes)
        return version

    def _await_crd(self, kind: Kind, known: str | None) -> str | None:
        """Wait until the CRD that serves ``kind`` differs from ``known`` (its resourceVersion
        when the kind answered 404; None: there was none), watching it by name; its
        resourceVersion then. A CRD just created is not served at once: the kind then answers
        404 again, and the next change (Established) is awaited from this one."""
        selector = f"metadata.name={kind.plural}.{kind.group}"
        while not self._stop.is_set():
            found, version = self.kube.list_with_version(
                CRD, None, {"fieldSelector": selector}, keep=_resource_version
            )
            if found and found[0] != known:
                return str(found[0])
            try:
                while not self._stop.is_set():  # watch again from where the last one ended
                    stream = self.kube.watch(
                        CRD, None, version, WATCH_TIMEOUT_S, field_selector=selector
                    )
                    with contextlib.closing(self._batches(stream)) as batches:
                        for events in batches:  # closed on return: the stream with them
                            for event in events:
                                type_, obj = _checked(event)
                                version = _resource_version(obj) or version
                                if type_ in ("ADDED", "MODIFIED"):
                                    return version
            except Gone:
                continue  # list again
        return known

    def _batches(self, stream: WatchStream) -> Generator[list[dict[str, Any]]]:
        """``stream``'s batches of events, ended by :meth:`stop` from any thread."""
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._streams.add(stream)
        try:
            yield from stream.batches()
        finally:
            with self._lock:
                self._streams.discard(stream)

    def _ns(self, w: Watched) -> str | None:
        return self.namespace if w.kind.namespaced and not w.cluster_wide else None

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)`` for the event loop, which takes the queue ``drain_delay_s``
        after the first of them: a rollout's ten thousand pod events then wake it a few
        hundred times, not once each (nothing waits on a change for less: a pass lets changes
        settle for longer)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._lock:
            self._queue.append((fn, args))
            if self._drain_due:
                return
            self._drain_due = True
        loop.call_soon_threadsafe(self._drain_soon)

    # -- on the event loop ---------------------------------------------------------------------

    def _drain_soon(self) -> None:
        asyncio.get_running_loop().call_later(self.drain_delay_s, self._drain)

    def _drain(self) -> None:
        with self._lock:
            queued, self._queue = self._queue, []
            self._drain_due = False
        for fn, args in queued:
            fn(*args)

    def _replace(self, w: Watched, listed: dict[ObjectKey, Any] | None) -> None:
        """A (re)list: report what differs from what was stored. ``listed`` None: an optional
        kind that is not served (its store goes)."""
        served = w.index in self.stores
        if listed is None:
            store = self.stores.pop(w.index, {})
        else:
            store = self.stores.setdefault(w.index, {})
        new = listed or {}
        changed = [k for k in store.keys() | new.keys() if store.get(k) != new.get(k)]
        if served != (listed is not None):
            changed.append(KIND_KEY)
        store.clear()
        store.update(new)
        self._listed.add(w.index)
        if not self.ready.is_set():
            if len(self._listed) == len(self.watched):
                self.ready.set()
            return
        for key in changed:
            self.on_change(w, key)

    def _update(self, w: Watched, changes: list[tuple[ObjectKey, Any]]) -> None:
        store = self.stores[w.index]
        for key, value in changes:
            old = store.pop(key, None) if value is None else store.get(key)
            if value is not None and old != value:
                store[key] = value
            if old != value and self.ready.is_set():
                self.on_change(w, key)


def _checked(event: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """A watch event's type and object; an ERROR event raised (410: :class:`Gone`)."""
    kind, obj = event.get("type"), event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise Gone(obj.get("message") or "410 Gone")
        raise RuntimeError(f"watch error: {obj.get('message') or obj}")
    return kind, obj


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _key(obj: Any) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _join(threads: Iterable[threading.Thread]) -> None:
    for thread in threads:
        thread.join(10)
