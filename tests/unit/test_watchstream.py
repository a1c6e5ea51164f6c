"""Watch events lose managedFields before they are parsed, and nothing else; a Node report
that repeats the last one is not parsed at all."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_operator.watchstream import Repeats, WatchStream, _parsed, without_managed_fields


def parse_event(line: bytes, compact: bool) -> Any:
    """One event as a stream parses it; ``compact``: without managedFields."""
    return _parsed(line, without_managed_fields(line) if compact else line)


FIELDS_V1 = {
    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
    "f:spec": {"f:containers": {'k:{"name":"driver"}': {".": {}, "f:env": {}}}},
    "f:status": {"f:conditions": {'k:{"type":"Ready"}': {"f:status": {}}}},
}


def pod(annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    """A pod laid out as the API server writes it: ObjectMeta in Go field order."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "nvidia-driver-daemonset-x",
            "namespace": "gpu-operator",
            "uid": "u-1",
            "labels": {"app": "nvidia-driver-daemonset"},
            "annotations": annotations or {},
            "ownerReferences": [{"kind": "DaemonSet", "name": "d", "uid": "ds-1"}],
            **meta,
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-27T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": FIELDS_V1,
                },
                {"manager": "kubelet", "fieldsV1": FIELDS_V1, "subresource": "status"},
            ],
        },
        "spec": {"nodeName": "gpu-node-0", "containers": [{"name": "driver"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def line(obj: dict[str, Any], kind: str = "MODIFIED") -> bytes:
    """One event as the API server streams it (Go's encoding: no spaces)."""
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode()


def without(obj: dict[str, Any]) -> dict[str, Any]:
    kept = copy.deepcopy(obj)
    kept["metadata"].pop("managedFields", None)
    return kept


def test_managed_fields_are_cut_and_everything_else_is_kept() -> None:
    obj = pod()
    cut = without_managed_fields(line(obj))
    assert len(cut) < len(line(obj)) / 2
    assert json.loads(cut) == {"type": "MODIFIED", "object": without(obj)}


def test_look_alikes_inside_strings_change_nothing() -> None:
    # Quotes inside a string are escaped, so these can never read as the keys they mimic.
    sneaky = ',"managedFields":[1]},"spec":{"nodeName":"elsewhere"}'
    obj = pod({"note": sneaky, "x": ']},"spec":'}, finalizers=["a"])
    event = {"type": "MODIFIED", "object": without(obj)}
    assert json.loads(without_managed_fields(line(obj))) == event
    obj["metadata"].pop("managedFields")
    assert without_managed_fields(line(obj)) == line(obj)  # only look-alikes: unchanged


def test_events_of_other_shapes_come_back_unchanged_and_parse_whole() -> None:
    config_map = {
        "kind": "ConfigMap",
        "metadata": {"name": "c", "managedFields": [{"manager": "m"}]},
        "data": {"spec": "x"},
    }
    assert without_managed_fields(line(config_map)) == line(config_map)
    # A spec further on that is not the object's: the cut would not parse, so it parses whole.
    revision = {
        "kind": "ControllerRevision",
        "metadata": {"name": "r", "managedFields": [{"manager": "m"}]},
        "data": {"spec": {"template": {"metadata": {"finalizers": ["f"]}, "spec": {}}}},
    }
    assert parse_event(line(revision), compact=True)["object"] == revision
    assert parse_event(line(pod()), compact=False)["object"] == pod()


def test_a_stream_parses_compacted_events_across_chunks() -> None:
    events = [line(pod()), line(pod({"a": "b"}), "ADDED")]
    data = b"\n".join(events) + b"\n"

    class Response:
        def stream(self, amt: Any, decode_content: bool) -> Any:
            yield from (data[i : i + 37] for i in range(0, len(data), 37))

        def shutdown(self) -> None: ...
        def close(self) -> None: ...
        def release_conn(self) -> None: ...

    got = [e for batch in WatchStream(Response(), compact=True).batches() for e in batch]
    assert [e["object"] for e in got] == [without(pod()), without(pod({"a": "b"}))]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12), st.text(max_size=40), max_size=4),
    st.lists(st.text(max_size=20), max_size=3),
)
def test_any_annotations_and_finalizers_survive_the_cut(
    annotations: dict[str, str], finalizers: list[str]
) -> None:
    obj = pod(annotations, finalizers=finalizers)
    assert parse_event(line(obj), compact=True) == {"type": "MODIFIED", "object": without(obj)}


# -- Node status reports that repeat the last one -----------------------------------------------


def node(rv: str, beat: str, labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    """A Node as the API server writes it: Go field order, map keys sorted."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "gpu-node-1",
            "uid": "6b1c",
            "resourceVersion": rv,
            "creationTimestamp": "2026-11-27T10:00:00Z",
            "labels": dict(sorted((labels or {"nvidia.com/gpu.present": "true"}).items())),
            "managedFields": [{"manager": "kwok", "time": beat, "fieldsV1": FIELDS_V1}],
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": status.get("ready", "True"),
                    "lastHeartbeatTime": beat,
                    "lastTransitionTime": "2026-11-27T10:00:05Z",
                    "reason": "KubeletReady",
                }
            ],
        },
    }


def report(obj: dict[str, Any], kind: str = "MODIFIED") -> bytes:
    """An event as :class:`Repeats` sees it: without managedFields (whose times move too)."""
    return without_managed_fields(line(obj, kind))


def bookmark(rv: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": rv}}}


def test_a_report_that_repeats_the_last_but_its_times_is_a_bookmark_not_a_parse() -> None:
    repeats = Repeats()
    assert repeats.bookmark(report(node("10", "T1"))) is None  # first
    assert repeats.bookmark(report(node("11", "T2"))) == bookmark("11")
    # What the operator reads changed: parsed, and the new report is the one to repeat.
    assert repeats.bookmark(report(node("12", "T3", ready="False"))) is None
    assert repeats.bookmark(report(node("13", "T4", ready="False"))) == bookmark("13")
    assert repeats.bookmark(report(node("14", "T5", {"team": "a"}))) is None


def test_added_and_deleted_events_are_parsed_and_a_forgotten_node_is_parsed_again() -> None:
    repeats = Repeats()
    assert repeats.bookmark(report(node("1", "T1"), "ADDED")) is None
    assert repeats.bookmark(report(node("2", "T2"), "ADDED")) is None  # never skipped
    assert repeats.bookmark(report(node("3", "T3"))) == bookmark("3")
    assert repeats.bookmark(report(node("4", "T4"), "DELETED")) is None
    assert repeats.bookmark(report(node("5", "T5"))) is None  # deleted: nothing to repeat
    repeats.forget()
    assert repeats.bookmark(report(node("6", "T6"))) is None
    assert repeats.bookmark(report(pod(), "MODIFIED")) is None  # not a node's shape: parsed


@settings(max_examples=300, deadline=None)
@example({"a": "v", "lastHeartbeatTime": "x"}, {"a": "v", "lastHeartbeatTime": "y"})
@example({"lastHeartbeatTime": "x", "status": "s"}, {"lastHeartbeatTime": "y", "status": "s"})
@given(
    st.dictionaries(
        st.sampled_from(["uid", "resourceVersion", "status", "lastHeartbeatTime", "a"]),
        st.text(max_size=30),
        max_size=4,
    ),
    st.dictionaries(
        st.sampled_from(["uid", "resourceVersion", "status", "lastHeartbeatTime", "a"]),
        st.text(max_size=30),
        max_size=4,
    ),
)
def test_no_change_to_labels_is_taken_for_a_repeat(
    before: dict[str, str], after: dict[str, str]
) -> None:
    """Labels that spell the masked fields' names, or hold their JSON, are not masked: Go
    sorts map keys, and quotes inside values are escaped."""
    repeats = Repeats()
    repeats.bookmark(report(node("1", "T1", before)))
    got = repeats.bookmark(report(node("2", "T2", after)))
    assert (got == bookmark("2")) == (dict(sorted(before.items())) == dict(sorted(after.items())))


TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "a", ",", ":", "T"]), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(TEXT, TEXT, TEXT), min_size=1, max_size=3),
    st.lists(st.tuples(TEXT, TEXT, TEXT), min_size=1, max_size=3),
)
def test_only_heartbeat_times_are_left_out_whatever_the_conditions_hold(
    before: list[tuple[str, str, str]], after: list[tuple[str, str, str]]
) -> None:
    """Conditions as (status, lastHeartbeatTime, reason), any of them holding quotes or
    escapes: a report taken for a repeat differs from the last in heartbeat times alone; and
    one that does is taken for a repeat when its statuses and times are plain strings, as the
    API server's are (one with a quote or an escape is parsed: costlier, never wrong)."""

    def reported(rv: str, conditions: list[tuple[str, str, str]]) -> bytes:
        obj = node(rv, "T")
        obj["status"]["conditions"] = [
            {"type": "Ready", "status": st_, "lastHeartbeatTime": beat, "reason": why}
            for st_, beat, why in conditions
        ]
        return report(obj)

    repeats = Repeats()
    repeats.bookmark(reported("1", before))
    got = repeats.bookmark(reported("2", after))
    same = [(s, r) for s, _, r in before] == [(s, r) for s, _, r in after]
    plain = not any(c in text for s, b, _ in before + after for text in (s, b) for c in '"\\')
    if got == bookmark("2"):
        assert same
    else:
        assert got is None
        assert not (same and plain)


def test_a_stream_with_repeats_yields_bookmarks_for_repeated_reports() -> None:
    data = b"\n".join(line(node(str(rv), f"T{rv}")) for rv in (1, 2, 3)) + b"\n"

    class Response:
        def stream(self, amt: Any, decode_content: bool) -> Any:
            yield data

        def shutdown(self) -> None: ...
        def close(self) -> None: ...
        def release_conn(self) -> None: ...

    repeats = Repeats()
    (got,) = list(WatchStream(Response(), compact=True, repeats=repeats).batches())
    assert got[0]["object"] == without(node("1", "T1"))
    assert got[1:] == [bookmark("2"), bookmark("3")]
    # The next request of the same watch goes on from there.
    (again,) = list(WatchStream(Response(), compact=True, repeats=repeats).batches())
    assert again == [bookmark("1"), bookmark("2"), bookmark("3")]


# -- Pacing: events that trickle in are read together -------------------------------------------


class ChunkedServer:
    """A local HTTP server that answers one request with a chunked body, an event a chunk,
    sending each part when the test says."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._parts: queue.Queue[bytes | None] = queue.Queue()
        self.sent = threading.Event()  # every part given so far is in the sockets
        threading.Thread(target=self._serve, daemon=True).start()

    def response(self) -> Any:
        url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/api/v1/nodes?watch=true"
        return urllib3.PoolManager().request("GET", url, preload_content=False)

    def send(self, *events: bytes) -> None:
        self.sent.clear()
        self._parts.put(b"".join(b"%x\r\n%s\n\r\n" % (len(e) + 1, e) for e in events))

    def end(self) -> None:
        self._parts.put(None)

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn, self._listener:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while (part := self._parts.get()) is not None:
                conn.sendall(part)
                self.sent.set()
            conn.sendall(b"0\r\n\r\n")
            with contextlib.suppress(OSError):
                conn.recv(1)  # until the client hangs up


class Pause:
    """Stands in for the stream's paced wait: records how many events were read by then."""

    def __init__(self, read: list[Any], then: Callable[[], None]) -> None:
        self.read, self.then, self.waits = read, then, list[tuple[float, int]]()

    def wait(self, timeout: float) -> bool:
        self.waits.append((timeout, len(self.read)))
        self.then()
        return False

    def set(self) -> None: ...


def test_a_paced_stream_waits_after_each_event_that_came_alone() -> None:
    server, read = ChunkedServer(), list[dict[str, Any]]()
    reports = [line(node(str(rv), f"T{rv}")) for rv in range(5)]
    stream = WatchStream(server.response(), pace_s=0.5)
    sent = iter(reports[1:])
    stream._closed = pause = Pause(
        read, lambda: server.send(next(sent)) if len(read) < 5 else server.end()
    )
    server.send(reports[0])
    for batch in stream.batches():
        read.extend(batch)
    assert [e["object"]["metadata"]["resourceVersion"] for e in read] == ["0", "1", "2", "3", "4"]
    assert pause.waits == [(0.5, 1), (0.5, 2), (0.5, 3), (0.5, 4), (0.5, 5)]


def test_a_paced_stream_does_not_wait_while_the_socket_holds_events() -> None:
    """Everything the server sent is read before the stream waits, but for what one buffer of
    the HTTP client had taken off the socket already (read a pace later)."""
    server, read = ChunkedServer(), list[dict[str, Any]]()
    reports = [line(node(str(rv), f"T{rv}")) for rv in range(10)]  # 44 KB: fits the sockets
    stream = WatchStream(server.response(), pace_s=0.5)
    stream._closed = pause = Pause(read, server.end)
    server.send(*reports)
    assert server.sent.wait(30), "the server could not send 10 reports"
    for batch in stream.batches():
        read.extend(batch)
    assert len(read) == 10
    buffered = io.DEFAULT_BUFFER_SIZE // len(reports[0]) + 1
    assert pause.waits[0][1] >= 10 - buffered, pause.waits


def test_closing_a_paced_stream_ends_its_wait() -> None:
    server, read = ChunkedServer(), list[dict[str, Any]]()
    stream = WatchStream(server.response(), pace_s=600)
    server.send(line(node("1", "T1")))

    def consume() -> None:
        for batch in stream.batches():
            read.extend(batch)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not read and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(read) == 1, "the first event was not read"
    stream.close()  # from another thread, as the informer's stop does
    reader.join(30)
    assert not reader.is_alive(), "the stream still waited its pace after close()"
    server.end()


def test_a_stream_whose_socket_cannot_be_seen_is_never_paced() -> None:
    data = b"\n".join(line(node(str(rv), f"T{rv}")) for rv in (1, 2)) + b"\n"

    class Response:  # no connection to look into
        def stream(self, amt: Any, decode_content: bool) -> Any:
            yield from (data[:100], data[100:])

        def shutdown(self) -> None: ...
        def close(self) -> None: ...
        def release_conn(self) -> None: ...

    read: list[dict[str, Any]] = []
    stream = WatchStream(Response(), pace_s=600)
    stream._closed = pause = Pause(read, lambda: None)
    for batch in stream.batches():
        read.extend(batch)
    assert len(read) == 2 and pause.waits == []
