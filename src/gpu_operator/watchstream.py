"""Watch events read off the wire, with less work than a ``json.loads`` of each as it comes.

Two savings are decided on an event's bytes before any parsing. managedFields, about half of a
pod event and the costliest half to parse, is cut out (nothing reads it). And a Node's status
report that repeats the last one but for its resourceVersion and heartbeat times (a kubelet, or
kwok, sends one per node every few minutes even when nothing changed: 1,000 a minute in a fleet
of 5,000) is not parsed at all: it stands as a bookmark at its resourceVersion. Both rely on how
the API server writes JSON (Go's encoding): struct fields in declaration order, map keys sorted,
no spaces, and every quote inside a string escaped.

A third is in the reading: a paced watch lets events that trickle in wait in the socket and
reads them together, since waking a thread for each costs several times reading and parsing it
(``benchmarks/bench_watch.py``).
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import threading
from collections.abc import Iterator
from typing import Any

_MANAGED_FIELDS = b',"managedFields":['
_METADATA_END = b']},"spec":'


def without_managed_fields(event: bytes) -> bytes:
    """A watch event's JSON with its object's ``metadata.managedFields`` cut out, unparsed.

    The API server writes ObjectMeta in its Go field order, managedFields last, and a Pod's,
    Node's or DaemonSet's ``spec`` right after metadata. An unescaped ``]},"spec":`` can only be
    that: quotes inside strings are escaped, and managedFields' own keys are fixed names or
    ``f:``/``k:``/``v:``/``i:`` prefixed. An event without that shape is returned as it came."""
    start = event.find(_MANAGED_FIELDS)
    if start < 0:
        return event
    end = event.find(_METADATA_END, start)
    if end < 0:
        return event
    return event[:start] + event[end + 1 :]


def _parsed(line: bytes, cut: bytes) -> Any:
    """``cut`` (``line`` less its managedFields) parsed; ``line`` whole when the cut is not
    what it looked like."""
    if cut is not line:
        try:
            return json.loads(cut)
        except ValueError:  # not the shape it looked like: parse it whole
            pass
    return json.loads(line)


# ObjectMeta's name, then (namespace, selfLink absent for Nodes) uid and resourceVersion; a
# NodeCondition's type, status, lastHeartbeatTime. Neither pair can come from a map (labels,
# annotations): Go sorts map keys, and "resourceVersion" < "uid", "lastHeartbeatTime" < "status".
_NAME = re.compile(
    rb'^\{"type":"(MODIFIED|ADDED|DELETED)","object":\{[^{]*"metadata":\{"name":"([^"\\]*)"'
)
_IDENTITY = re.compile(rb'"uid":"[^"\\]*","resourceVersion":"([^"\\]*)"')
_HEARTBEAT = b'","lastHeartbeatTime":"'
_STATUS = b'"status":"'


def _without_heartbeats(line: bytes, start: int) -> list[bytes]:
    """``line[start:]`` in pieces, less the values of NodeConditions' ``lastHeartbeatTime``.

    A condition writes ``"status":"<value>","lastHeartbeatTime":"<time>"``; a map cannot
    (``"lastHeartbeatTime"`` sorts before ``"status"``), nor can a string (its quotes are
    escaped). Found with ``bytes.find``, not a regular expression: this runs for every status
    report of the fleet, and a regex substitution cost twice as much."""
    pieces = []
    pos = start
    while (found := line.find(_HEARTBEAT, pos)) >= 0:
        value = found + len(_HEARTBEAT)
        end = line.find(b'"', value)
        status = line.rfind(_STATUS, pos, found)
        pieces.append(line[pos:value])
        # A condition's, when the nearest "status" before it holds a plain string: its time
        # is left out (up to its first quote, escaped or not: inside the time either way).
        condition = status >= 0 and end >= 0 and not _escaped(line[status + len(_STATUS) : found])
        pos = end if condition else value
    pieces.append(line[pos:])
    return pieces


def _escaped(string: bytes) -> bool:
    """Whether a JSON string's bytes hold a quote or an escape (not a plain value)."""
    return b'"' in string or b"\\" in string


class Repeats:
    """Which of one watch's events repeat the last event about the same object but for its
    resourceVersion, uid and heartbeat times: for Nodes, whose kubelets report their status
    every few minutes whether anything changed or not.

    Kept across the watch requests of one list (a resumed watch continues the same story);
    :meth:`forget` after a list, whose objects may differ from the last events seen.
    """

    def __init__(self) -> None:
        # Object name -> Python's hash of its masked last event: SipHash, keyed at random per
        # process, so 64 bits no report can be made to collide with (blake2b cost five times
        # as much per report, 4 KB).
        self._last: dict[bytes, int] = {}

    def bookmark(self, line: bytes) -> dict[str, Any] | None:
        """A BOOKMARK event at ``line``'s resourceVersion when ``line`` (without managedFields)
        is a MODIFIED event that repeats the last event about its object; else None, and
        ``line`` is remembered (or, DELETED, its object forgotten)."""
        head = _NAME.match(line)
        if head is None:
            return None
        kind, name = head.group(1), head.group(2)
        if kind == b"DELETED":
            self._last.pop(name, None)
            return None
        identity = _IDENTITY.search(line, head.end())
        if identity is None:
            self._last.pop(name, None)
            return None
        digest = hash(
            b"".join(
                (
                    line[head.end() : identity.start()],
                    *_without_heartbeats(line, identity.end()),
                )
            )
        )
        if kind == b"MODIFIED" and self._last.get(name) == digest:
            version = identity.group(1).decode()
            return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}
        self._last[name] = digest
        return None

    def forget(self) -> None:
        self._last.clear()


class WatchStream:
    """The events of one watch request, parsed; :meth:`close` (from any thread) ends it.
    ``compact``: the objects' managedFields are dropped before parsing (objects whose spec
    follows their metadata: see :func:`without_managed_fields`); ``repeats``: events that
    repeat the last about their object come as bookmarks, unparsed (:class:`Repeats`);
    ``pace_s``: events that trickle in are read together (:meth:`batches`)."""

    def __init__(
        self,
        response: Any,
        *,
        compact: bool = False,
        repeats: Repeats | None = None,
        pace_s: float = 0.0,
    ) -> None:
        self._response = response  # urllib3's HTTPResponse, body not yet read
        self._compact = compact
        self._repeats = repeats
        self._pace_s = pace_s
        self._closed = threading.Event()

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        """The events as they arrive, a batch per chunk read from the stream.

        ``pace_s``: when a batch leaves nothing more to read (the socket holds no byte), the
        stream waits ``pace_s`` before reading on. Events that trickle in (a fleet's status
        reports, 60 ms apart at 5,000 nodes) are then read together, ``pace_s`` late at most;
        woken for each, a thread costs several times their reading and parsing. It waits only
        when the socket is empty, so it keeps up as well as without; what the HTTP client had
        already buffered (a few KB at most) is read after the wait."""
        pending = b""
        try:
            for chunk in self.chunks():
                *lines, pending = (pending + chunk).split(b"\n")
                events = [self._event(line) for line in lines if line.strip()]
                if events:
                    yield events
                if self._pace_s and not self._more_to_read() and self._closed.wait(self._pace_s):
                    return  # closed while it waited
        finally:
            self.close()

    def _more_to_read(self) -> bool:
        """Whether the connection holds bytes not read yet (True when it cannot be told)."""
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is None:
            return True
        try:
            pending = getattr(sock, "pending", None)  # TLS: bytes decrypted, not yet taken
            if pending is not None and pending():
                return True
            return bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile: the next read ends the stream
            return True

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives, unparsed: a chunk per flush of the server (an event, or
        several when they came together)."""
        return self._response.stream(amt=None, decode_content=False)  # type: ignore[no-any-return]

    def _event(self, line: bytes) -> Any:
        # Cut once: Repeats needs it too (managedFields' times change with every report).
        cut = without_managed_fields(line) if self._compact or self._repeats else line
        if self._repeats is not None:
            bookmark = self._repeats.bookmark(cut)
            if bookmark is not None:
                return bookmark
        return _parsed(line, cut)

    def close(self) -> None:
        # shutdown() unblocks a read waiting in another thread; a stream that ended on its own
        # has given its connection back already (and shutdown() says so, RuntimeError), and
        # one its reader closed meanwhile has no socket left (OSError).
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            self._response.shutdown()
        self._response.close()
        self._response.release_conn()
        self._closed.set()  # last: a reader in its paced wait then finds the stream closed
