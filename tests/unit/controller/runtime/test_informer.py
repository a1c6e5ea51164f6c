"""The informer: stores that report only what changed, and a watch that always comes back
(backoff, Retry-After, 410 Gone lists again)."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator import testenv
from gpu_operator.controller.runtime.informer import (
    ABSENT_FIRST_S,
    ABSENT_RETRY_S,
    KIND_KEY,
    PACE_S,
    REPORTED_PACE_S,
    Informer,
)
from gpu_operator.controller.runtime.watch import INFORMED, ObjectKey, Stores, Watched, index_value
from gpu_operator.kinds import KINDS
from gpu_operator.kube import Retry

NODES = next(w for w in INFORMED if w.kind is KINDS["Node"])
PODS = next(w for w in INFORMED if w.kind is KINDS["Pod"])
KEY = ("", "gpu-node-0")


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, ObjectKey]] = []

    def on_change(self, watched: Watched, key: ObjectKey) -> None:
        self.changes.append((watched.index, key))


def informer(
    watched: tuple[Watched, ...] = (NODES, PODS), kube: Any = None
) -> tuple[Informer, Recorder, Stores]:
    seen = Recorder()
    stores: Stores = {"clusterpolicies": {}}  # kopf's share of the same stores
    inf = Informer(kube, "gpu-operator", watched, stores, seen.on_change)
    return inf, seen, stores


def node(name: str = "gpu-node-0", **labels: str) -> dict[str, Any]:
    body = testenv.node_manifest(name, gpu=True, extra_labels=labels)
    body["metadata"]["resourceVersion"] = "1"
    body["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"}]
    return body


def pod(ip: str = "10.0.0.1", ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "gpu-operator", "resourceVersion": "5"},
        "spec": {"nodeName": "gpu-node-0", "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": ready}],
        },
    }


def on_a_loop(fn: Any) -> None:
    async def call() -> None:
        fn()

    asyncio.run(call())


def test_ready_once_every_kind_is_listed_and_listing_reports_nothing() -> None:
    inf, seen, stores = informer()

    def feed() -> None:
        inf._replace(NODES, {KEY: index_value("nodes", node())})
        assert not inf.ready.is_set()
        inf._replace(PODS, {})
        assert inf.ready.is_set()

    on_a_loop(feed)
    assert seen.changes == []
    assert set(stores["nodes"]) == {KEY} and stores["pods"] == {}
    assert "clusterpolicies" in stores  # one set of stores, shared with kopf


def test_heartbeats_and_unread_fields_are_dropped_before_any_work() -> None:
    inf, seen, stores = informer()

    def feed() -> None:
        inf._replace(NODES, {KEY: index_value("nodes", node())})
        inf._replace(PODS, {("gpu-operator", "p"): index_value("pods", pod())})
        beat = copy.deepcopy(node())
        beat["metadata"]["resourceVersion"] = "2"
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = "t1"
        inf._update(NODES, [(KEY, index_value("nodes", beat))])
        # The view that was read stays: a node patch planned from it is not seen yet.
        assert stores["nodes"][KEY].resource_version == "1"
        inf._update(PODS, [(("gpu-operator", "p"), index_value("pods", pod(ip="10.0.0.2")))])
        assert seen.changes == []
        inf._update(NODES, [(KEY, index_value("nodes", node(team="ml")))])
        inf._update(PODS, [(("gpu-operator", "p"), index_value("pods", pod(ready="False")))])
        inf._update(PODS, [(("gpu-operator", "p"), None)])

    on_a_loop(feed)
    assert seen.changes == [
        ("nodes", KEY),
        ("pods", ("gpu-operator", "p")),
        ("pods", ("gpu-operator", "p")),
    ]
    assert stores["pods"] == {}


def test_a_relist_reports_what_differs() -> None:
    inf, seen, stores = informer((NODES,))
    b = ("", "gpu-node-1")

    def feed() -> None:
        inf._replace(NODES, {KEY: index_value("nodes", node())})
        inf._replace(NODES, {b: index_value("nodes", node("gpu-node-1"))})

    on_a_loop(feed)
    assert sorted(seen.changes) == [("nodes", KEY), ("nodes", b)]
    assert set(stores["nodes"]) == {b}


# -- the watch thread -------------------------------------------------------------------------


def gone(code: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=code, reason="x")
    exc.headers = {"Retry-After": retry_after} if retry_after else {}
    return exc


class Stream:
    def __init__(self, batches: list[list[dict[str, Any]]]) -> None:
        self._batches = batches

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        yield from self._batches

    def close(self) -> None:
        pass


class ScriptedKube:
    """Answers lists and watches from a script: an exception raised, or events streamed."""

    retry = Retry(first_delay_s=0.25, max_delay_s=8.0)

    def __init__(self, watches: list[Any]) -> None:
        self.watches = watches
        self.calls: list[str] = []
        self.paces: list[float] = []

    def list_with_version(self, kind: str, namespace: Any, query: Any, keep: Any = None) -> Any:
        self.calls.append("list")
        return [keep(node()) if keep else node()], "10"

    def watch(self, kind: str, namespace: Any, version: str, timeout_s: int, **kw: Any) -> Any:
        self.calls.append(f"watch@{version}")
        self.paces.append(kw.get("pace_s", 0.0))
        answer = self.watches.pop(0) if self.watches else []
        if isinstance(answer, Exception):
            raise answer
        return Stream(answer)


class Waits(threading.Event):
    """The informer's stop flag: records each backoff instead of sleeping; set once the
    script is spent."""

    def __init__(self, kube: ScriptedKube) -> None:
        super().__init__()
        self.kube = kube
        self.delays: list[float] = []

    def is_set(self) -> bool:
        return super().is_set() or not self.kube.watches

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(timeout or 0.0)
        return self.is_set()


def follow(watches: list[Any], watched: Watched = NODES) -> tuple[ScriptedKube, Waits]:
    kube = ScriptedKube(watches)
    inf, _, _ = informer((watched,), kube)
    inf._stop = waits = Waits(kube)
    inf._follow(watched)
    return kube, waits


def test_node_watches_are_paced_longest_and_every_watch_is_paced() -> None:
    """A fleet's node reports trickle in all the time; pods move upgrades and wait less."""
    nodes, _ = follow([[], []])
    pods, _ = follow([[]], PODS)
    assert nodes.paces == [REPORTED_PACE_S, REPORTED_PACE_S]
    assert pods.paces == [PACE_S]
    assert 0 < PACE_S < REPORTED_PACE_S


def test_a_watch_resumes_from_the_last_version_it_saw() -> None:
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}
    kube, waits = follow([[[bookmark]], []])
    assert kube.calls == ["list", "watch@10", "watch@12"]  # one list: a quiet kind resumes
    assert waits.delays == []


def test_the_thread_hands_the_loop_only_what_changed_what_is_kept() -> None:
    beat = node()
    beat["metadata"]["resourceVersion"] = "11"
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "t1"
    other = {"metadata": {"name": "unknown", "resourceVersion": "14"}}
    events = [
        {"type": "MODIFIED", "object": beat},
        {"type": "MODIFIED", "object": {**node(team="ml"), "metadata": {
            **node(team="ml")["metadata"], "resourceVersion": "12"}}},
        {"type": "DELETED", "object": node()},
        {"type": "DELETED", "object": other},
    ]  # fmt: skip
    kube = ScriptedKube([[events], []])
    inf, _, _ = informer((NODES,), kube)
    inf._stop = Waits(kube)
    posted: list[Any] = []
    inf._post = lambda fn, w, arg: posted.append((fn.__name__, arg))  # type: ignore[method-assign]
    inf._follow(NODES)
    assert [name for name, _ in posted] == ["_replace", "_update"]
    updates = posted[1][1]
    assert [(key, value is None) for key, value in updates] == [(KEY, False), (KEY, True)]
    assert updates[0][1].labels["team"] == "ml"


def test_a_node_watch_skips_repeated_reports_across_requests_until_it_lists_again() -> None:
    """One ``Repeats`` for all of a Node watch thread's requests (a resumed watch continues
    the same story), forgotten when it lists again; other kinds parse every event."""
    from tests.unit.test_watchstream import node as reported
    from tests.unit.test_watchstream import report

    answers: list[Any] = []

    def following(w: Watched, script: list[Any]) -> ScriptedKube:
        """A node report fed to the ``repeats`` each watch request is given, then the script."""
        kube = ScriptedKube(script)
        scripted = kube.watch

        def watch(*args: Any, repeats: Any = None, **kw: Any) -> Any:
            rv = str(len(answers) + 1)
            answers.append(repeats and repeats.bookmark(report(reported(rv, f"T{rv}"))))
            return scripted(*args, **kw)

        kube.watch = watch  # type: ignore[method-assign]
        inf, _, _ = informer((w,), kube)
        inf._stop = Waits(kube)
        inf._follow(w)
        return kube

    expired = {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
    kube = following(NODES, [[], [[expired]], []])
    assert kube.calls == ["list", "watch@10", "watch@10", "list", "watch@10"]
    first, resumed, relisted = answers
    assert first is None and relisted is None  # parsed: nothing to repeat yet
    assert resumed == {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}}

    answers.clear()
    following(PODS, [[], []])
    assert answers == [None, None]  # no Repeats given


def test_410_gone_lists_again_at_once_then_backs_off_if_it_keeps_coming() -> None:
    expired = {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
    kube, waits = follow([[[expired]], gone(410), gone(410), []])
    assert kube.calls == ["list", "watch@10"] * 4
    assert len(waits.delays) == 2  # the first 410 relisted at once, the next ones waited


def test_a_429_waits_what_retry_after_says_and_other_failures_back_off() -> None:
    kube, waits = follow([gone(429, "3"), gone(503), RuntimeError("reset"), []])
    assert waits.delays[0] == 3.0
    assert 0 < waits.delays[1] <= waits.delays[2] * 2 <= 2 * 8.0
    assert kube.calls.count("list") == 1  # only a 410 makes it list again


def test_threads_alive_names_each_watch_thread() -> None:
    inf, _, _ = informer()
    alive = threading.Thread(target=threading.Event().wait, args=(5,), name="watch-nodes")
    dead = threading.Thread(target=lambda: None, name="watch-pods")
    alive.daemon = True
    for t in (alive, dead):
        t.start()
    dead.join()
    inf.threads = (alive, dead)
    assert inf.threads_alive() == {"watch-nodes": True, "watch-pods": False}


GPUCLUSTERS = next(w for w in INFORMED if w.kind is KINDS["GPUCluster"])


class OptionalKube(ScriptedKube):
    """Lists of the kind, and lists and watches of its CRD, answer from scripts of their own:
    an exception raised, else (the kind) its objects or (the CRD) its resourceVersion or None
    for no CRD, and the batches of a CRD watch."""

    def __init__(
        self,
        watches: list[Any],
        kind: Sequence[Any],
        crd: Sequence[Any] = (),
        crd_watches: Sequence[Any] = (),
    ) -> None:
        super().__init__(watches)
        self.kind, self.crd, self.crd_watches = list(kind), list(crd), list(crd_watches)

    def list_with_version(self, kind: str, namespace: Any, query: Any, keep: Any = None) -> Any:
        is_crd = kind == "CustomResourceDefinition"
        self.calls.append("list crd" if is_crd else "list")
        answer = (self.crd if is_crd else self.kind).pop(0)
        if isinstance(answer, Exception):
            raise answer
        if is_crd:
            assert query == {"fieldSelector": "metadata.name=gpuclusters.nvidia.com"}
            return ([answer] if answer else []), "50"
        return answer, "10"

    def watch(self, kind: str, namespace: Any, version: str, timeout_s: int, **kw: Any) -> Any:
        if kind != "CustomResourceDefinition":
            return super().watch(kind, namespace, version, timeout_s, **kw)
        assert kw["field_selector"] == "metadata.name=gpuclusters.nvidia.com"
        self.calls.append(f"watch crd@{version}")
        answer = self.crd_watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Stream(answer)


def crd_event(kind: str, version: str) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"resourceVersion": version}}}


def follow_optional(kube: OptionalKube) -> tuple[list[Any], Waits]:
    """The GPUCluster thread on ``kube`` until its watches are spent: what it posted."""
    inf, _, _ = informer((GPUCLUSTERS,), kube)
    inf._stop = waits = Waits(kube)
    posted: list[Any] = []
    inf._post = lambda fn, w, arg: posted.append(arg)  # type: ignore[method-assign]
    inf._follow(GPUCLUSTERS)
    return posted, waits


def test_a_kind_not_served_has_no_store_and_is_listed_again_when_its_crd_changes() -> None:
    """Nothing polled while it is absent: its CRD is watched by name. Just created, the CRD is
    not served yet (404 again): its next change (Established) is awaited, not its presence."""
    kube = OptionalKube(
        [[]],
        kind=[gone(404), gone(404), []],
        crd=[None, "7"],
        crd_watches=[
            [[crd_event("ADDED", "7")]],
            [[crd_event("BOOKMARK", "8")], [crd_event("MODIFIED", "9")]],
        ],
    )
    posted, waits = follow_optional(kube)
    assert posted == [None, None, {}]  # no store until it is listed: the loops do not wait
    assert kube.calls == [
        "list", "list crd", "watch crd@50",  # not served, no CRD: watch for one
        "list", "list crd", "watch crd@50",  # not served yet, the CRD as it was: watch on
        "list", "watch@10",
    ]  # fmt: skip
    assert waits.delays == []
    # A kind the operator cannot run without just backs off.
    _, waits = follow([gone(404), []])
    assert waits.delays[0] < ABSENT_RETRY_S


def test_a_kind_whose_crd_may_not_be_watched_is_looked_for_now_and_then() -> None:
    kube = OptionalKube([[]], kind=[gone(404), gone(404), []], crd=[gone(403)])
    posted, waits = follow_optional(kube)
    assert kube.calls == ["list", "list crd", "list", "list", "watch@10"]
    assert waits.delays == [ABSENT_FIRST_S]
    assert posted == [None, None, {}]


def test_a_kind_not_granted_is_looked_for_less_and_less_often_until_it_is() -> None:
    """Soon at first, then at most every ABSENT_RETRY_S; refused again after it was listed,
    the looks start from soon."""
    script: list[Any] = [gone(403)] * 9 + [[], gone(403), []]
    kube = OptionalKube([gone(410), []], kind=script)  # the served kind's watch ends: relist
    _, waits = follow_optional(kube)
    first = ABSENT_FIRST_S
    assert waits.delays == [first, 2 * first, 4 * first, 8 * first, 16 * first, 32 * first,
                            ABSENT_RETRY_S, ABSENT_RETRY_S, ABSENT_RETRY_S, first]  # fmt: skip
    assert 32 * first < ABSENT_RETRY_S < 64 * first
    assert "list crd" not in kube.calls  # a 403: the CRD is there


def test_an_optional_kind_coming_and_going_is_reported_and_its_store_follows() -> None:
    inf, seen, stores = informer((NODES, GPUCLUSTERS))
    cluster = {"metadata": {"name": "c"}, "spec": {}}
    c_key = ("", "c")

    def feed() -> None:
        inf._replace(NODES, {})
        inf._replace(GPUCLUSTERS, None)  # not served at start: ready all the same
        assert inf.ready.is_set() and "gpuclusters" not in stores
        inf._replace(GPUCLUSTERS, {c_key: index_value("gpuclusters", cluster)})
        assert set(stores["gpuclusters"]) == {c_key}
        inf._replace(GPUCLUSTERS, {c_key: index_value("gpuclusters", cluster)})  # a relist
        inf._replace(GPUCLUSTERS, None)  # the CRD deleted
        assert "gpuclusters" not in stores
        inf._replace(GPUCLUSTERS, {})  # back, empty

    on_a_loop(feed)
    assert seen.changes == [
        ("gpuclusters", c_key), ("gpuclusters", KIND_KEY),  # came, with one object
        ("gpuclusters", c_key), ("gpuclusters", KIND_KEY),  # went, and the object with it
        ("gpuclusters", KIND_KEY),  # came, empty
    ]  # fmt: skip


def test_posts_reach_the_loop_in_order_with_one_wake_up_per_drain() -> None:
    inf, _, _ = informer()
    order: list[int] = []
    wakes: list[Any] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        inf._loop = loop
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda fn, *a: (wakes.append(fn), real(fn, *a))  # type: ignore[method-assign]

        async def drained(expected: list[int]) -> None:
            for _ in range(100):  # loop iterations, not time
                if order == expected:
                    return
                await asyncio.sleep(0)
            raise AssertionError(order)

        inf.drain_delay_s = 0.0
        for i in range(50):  # while the loop is busy (here: posting), nothing is drained
            inf._post(order.append, i)
        assert order == []
        await drained(list(range(50)))
        inf._post(order.append, 50)
        await drained(list(range(51)))

    asyncio.run(run())
    assert wakes.count(inf._drain_soon) == 2  # one wake-up for the 50, one for the one after
