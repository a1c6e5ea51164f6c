"""The agents' Kubernetes I/O through gpu_operator.kube and the real kubernetes client, against a
recording HTTP server (the request shapes: merge patch content type, field selectors, the watch;
no API semantics, which the e2e tests cover on a real API server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from kubernetes import client

from gpu_operator.agent import nodeapi
from gpu_operator.cli_errors import USAGE, explain
from gpu_operator.kube import Kube

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-node-1",
        "resourceVersion": "42",
        "labels": {"nvidia.com/gpu.present": "true"},
        "annotations": {"a": "b"},
    },
    "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
}
PODS = {
    "apiVersion": "v1",
    "kind": "PodList",
    "metadata": {},
    "items": [
        {
            "metadata": {
                "name": "gfd-1",
                "namespace": "gpu-operator",
                "labels": {"app": "gpu-feature-discovery"},
            },
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        }
    ],
}


@pytest.fixture
def api() -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            seen.append({"method": "GET", "path": self.path})
            if "watch=true" in self.path:
                self._watch()
            else:
                self._reply(PODS if "/pods" in self.path else NODE)

        def _watch(self) -> None:
            """One event when the watch starts from resourceVersion 41 (the node moved on),
            none (an empty stream: timed out) from 42, an error status from 0."""
            if "resourceVersion=0" in self.path:
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = b""
            if "resourceVersion=41" in self.path:
                data = json.dumps({"type": "MODIFIED", "object": NODE}).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PATCH(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(
                {
                    "method": "PATCH",
                    "path": self.path,
                    "type": self.headers["Content-Type"],
                    "body": body,
                }
            )
            self._reply(NODE)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    yield Kube(client.ApiClient(config)), seen
    server.shutdown()
    server.server_close()


def test_read_node(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, _ = api
    node = nodeapi.read_node(core, "gpu-node-1")
    assert node.labels == {"nvidia.com/gpu.present": "true"}
    assert node.annotations == {"a": "b"}
    assert node.capacity == {"nvidia.com/gpu": "8"}
    assert node.resource_version == "42"


def test_patch_is_one_json_merge_patch(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, seen = api
    nodeapi.patch_node_metadata(
        core, "gpu-node-1", labels={"x": "1", "y": None}, annotations={"z": None}
    )
    (patch,) = [s for s in seen if s["method"] == "PATCH"]
    assert patch["path"] == "/api/v1/nodes/gpu-node-1?fieldManager=gpu-operator"
    assert patch["type"] == "application/merge-patch+json"
    assert patch["body"] == {
        "metadata": {"labels": {"x": "1", "y": None}, "annotations": {"z": None}}
    }
    nodeapi.patch_node_metadata(core, "gpu-node-1")  # nothing to change: no request
    assert len([s for s in seen if s["method"] == "PATCH"]) == 1


def test_pods_on_node_uses_a_field_selector(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, seen = api
    (pod,) = nodeapi.pods_on_node(core, "gpu-node-1", "gpu-operator")
    assert (pod.name, pod.namespace, pod.labels, pod.phase) == (
        "gfd-1",
        "gpu-operator",
        {"app": "gpu-feature-discovery"},
        "Running",
    )
    assert seen[-1]["path"].startswith("/api/v1/namespaces/gpu-operator/pods?")
    assert "fieldSelector=spec.nodeName%3Dgpu-node-1" in seen[-1]["path"]


def test_wait_for_node_change_is_one_watch(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, seen = api
    seen.clear()
    assert core.wait_for_change("Node", "gpu-node-1", "41", 5) is True  # an event came
    assert core.wait_for_change("Node", "gpu-node-1", "42", 5) is False  # timed out, no event
    for path, version in zip([s["path"] for s in seen], ("41", "42"), strict=True):
        assert path.startswith("/api/v1/nodes?watch=true&")
        assert "fieldSelector=metadata.name%3Dgpu-node-1" in path and "timeoutSeconds=5" in path
        assert f"resourceVersion={version}" in path
    # The agents' wrapper: True after an event or a quiet timeout, False when watching failed
    # (the MIG manager then backs off and polls).
    assert nodeapi.wait_for_node_change(core, "gpu-node-1", "42", 5) is True
    assert nodeapi.wait_for_node_change(core, "gpu-node-1", "0", 5) is False


def test_read_node_names_a_missing_node() -> None:
    class Missing:
        def get(self, kind: str, name: str) -> None:
            return None

    with pytest.raises(LookupError, match="node gpu-node-9 not found: is NODE_NAME"):
        nodeapi.read_node(Missing(), "gpu-node-9")  # type: ignore[arg-type]
    assert explain(nodeapi.NodeNotFound("gpu-node-9"))[0] == USAGE
