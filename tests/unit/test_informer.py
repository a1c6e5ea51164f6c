"""The informer's stores: an event that changes nothing the operator keeps reports nothing."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpu_operator import testenv
from gpu_operator.controller.informer import Informer
from gpu_operator.controller.watch import WATCHED, ObjectKey, Watched, index_value
from gpu_operator.kinds import KINDS

NODES = next(w for w in WATCHED if w.kind is KINDS["Node"])
PODS = next(w for w in WATCHED if w.kind is KINDS["Pod"])


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, ObjectKey]] = []
        self.ready = 0

    def on_change(self, watched: Watched, key: ObjectKey) -> None:
        self.changes.append((watched.index, key))

    def on_ready(self, stores: Any) -> None:
        self.ready += 1


def informer(watched: tuple[Watched, ...] = (NODES, PODS)) -> tuple[Informer, Recorder]:
    seen = Recorder()
    inf = Informer(
        None,  # type: ignore[arg-type]  # no I/O here: the stores are fed by hand
        "gpu-operator",
        watched,
        on_change=seen.on_change,
        on_ready=seen.on_ready,
    )
    return inf, seen


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


def run(fn: Any) -> None:
    asyncio.run(_call(fn))


async def _call(fn: Any) -> None:
    fn()


def test_ready_once_every_kind_is_listed_and_listing_reports_nothing() -> None:
    inf, seen = informer()

    def feed() -> None:
        inf._replace(NODES, {("", "gpu-node-0"): index_value("nodes", node())})
        assert not inf.ready.is_set() and seen.ready == 0
        inf._replace(PODS, {})
        assert inf.ready.is_set() and seen.ready == 1

    run(feed)
    assert seen.changes == []
    assert set(inf.stores["nodes"]) == {("", "gpu-node-0")}


KEY = ("", "gpu-node-0")


def test_heartbeats_and_unread_fields_are_dropped_before_any_work() -> None:
    inf, seen = informer()
    key = KEY

    def feed() -> None:
        inf._replace(NODES, {key: index_value("nodes", node())})
        inf._replace(PODS, {("gpu-operator", "p"): index_value("pods", pod())})
        beat = copy.deepcopy(node())
        beat["metadata"]["resourceVersion"] = "2"
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = "t1"
        inf._update(NODES, [(key, index_value("nodes", beat))])
        assert inf.stores["nodes"][key].resource_version == "2"  # stored all the same
        inf._update(PODS, [(("gpu-operator", "p"), index_value("pods", pod(ip="10.0.0.2")))])
        assert seen.changes == []
        inf._update(NODES, [(key, index_value("nodes", node(team="ml")))])
        inf._update(PODS, [(("gpu-operator", "p"), index_value("pods", pod(ready="False")))])
        inf._update(PODS, [(("gpu-operator", "p"), None)])

    run(feed)
    assert seen.changes == [
        ("nodes", KEY),
        ("pods", ("gpu-operator", "p")),
        ("pods", ("gpu-operator", "p")),
    ]
    assert inf.stores["pods"] == {}


def test_a_relist_reports_what_differs() -> None:
    inf, seen = informer((NODES,))
    a, b = ("", "gpu-node-0"), ("", "gpu-node-1")

    def feed() -> None:
        inf._replace(NODES, {a: index_value("nodes", node())})
        inf._replace(NODES, {b: index_value("nodes", node("gpu-node-1"))})

    run(feed)
    assert sorted(seen.changes) == [("nodes", a), ("nodes", b)]
