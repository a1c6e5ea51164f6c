"""Against a real API server: the Node status reports that ``watchstream.Repeats`` takes for
repeats are exactly those that differ from the node's last event only in resourceVersion,
managedFields and heartbeat times. Its masks rely on how the server lays out JSON (Go field
order, sorted map keys), which only the real server can confirm."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from kubernetes import client

from gpu_operator.watchstream import Repeats, without_managed_fields

LABEL = "e2e.gpu-operator/watch-repeats"


def reported(t: str) -> dict[str, Any]:
    """A kubelet's status report: nothing changed but the heartbeat time."""
    ready = {
        "type": "Ready",
        "status": "True",
        "lastHeartbeatTime": t,
        "lastTransitionTime": "2026-11-29T00:00:00Z",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
    }
    return {"status": {"conditions": [ready], "capacity": {"nvidia.com/gpu": "8"}}}


def unimportant(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what a repeat may change."""
    meta = {
        k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")
    }
    status = dict(obj.get("status") or {})
    status["conditions"] = [
        {k: v for k, v in c.items() if k != "lastHeartbeatTime"}
        for c in status.get("conditions") or ()
    ]
    return {**obj, "metadata": meta, "status": status}


def lines(response: Any) -> Iterator[bytes]:
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        *complete, pending = (pending + chunk).split(b"\n")
        yield from filter(None, complete)


def test_repeated_node_reports_are_recognised_in_the_servers_own_json(
    core_v1: client.CoreV1Api,
) -> None:
    name = f"watch-repeats-{uuid.uuid4().hex[:6]}"
    selector = f"{LABEL}={name}"
    node = client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={LABEL: name}))
    created = core_v1.create_node(node)
    version = created.metadata.resource_version
    try:
        for second in range(1, 4):  # a change (the first report), then two repeats
            core_v1.patch_node_status(name, reported(f"2026-11-29T00:00:0{second}Z"))
        core_v1.patch_node(name, {"metadata": {"labels": {"team": "ml"}}})  # a change
        core_v1.patch_node_status(name, reported("2026-11-29T00:00:05Z"))  # a repeat
    finally:
        core_v1.delete_node(name)
    stream = core_v1.list_node(
        watch=True,
        label_selector=selector,
        resource_version=version,
        timeout_seconds=60,
        _preload_content=False,
    )
    repeats = Repeats()
    verdicts: list[tuple[str, bool, bool]] = []  # (type, taken for a repeat, is one)
    last: dict[str, Any] | None = None
    try:
        for line in lines(stream):
            event = json.loads(line)
            taken = repeats.bookmark(without_managed_fields(line)) is not None
            truth = last is not None and unimportant(event["object"]) == unimportant(last)
            verdicts.append((event["type"], taken, truth))
            if not taken:  # a repeat stands for a bookmark: the last event parsed stays last
                last = event["object"]
            if event["type"] == "DELETED":
                break
    finally:
        stream.release_conn()
    assert verdicts and verdicts[-1][0] == "DELETED", f"the watch ended early; saw {verdicts}"
    assert all(taken == (truth and kind == "MODIFIED") for kind, taken, truth in verdicts), verdicts
    kinds = [(kind, taken) for kind, taken, _ in verdicts]
    assert kinds.count(("MODIFIED", True)) >= 3, f"the heartbeat-only reports: {verdicts}"
    assert kinds.count(("MODIFIED", False)) >= 2, f"the first report and the label: {verdicts}"
