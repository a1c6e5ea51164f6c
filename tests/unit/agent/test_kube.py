"""The agents' Kubernetes I/O through the real kubernetes client, against a recording HTTP
server (the request shapes: merge patch content type, field selectors; no API semantics)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest
from kubernetes import client

from gpu_operator.agent import kube

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
            self._reply(PODS if "/pods" in self.path else NODE)

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
    yield client.CoreV1Api(client.ApiClient(config)), seen
    server.shutdown()
    server.server_close()


def test_read_node(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, _ = api
    node = kube.read_node(core, "gpu-node-1")
    assert node.labels == {"nvidia.com/gpu.present": "true"}
    assert node.annotations == {"a": "b"}
    assert node.capacity == {"nvidia.com/gpu": "8"}
    assert node.resource_version == "42"


def test_patch_is_one_json_merge_patch(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, seen = api
    kube.patch_node_metadata(
        core, "gpu-node-1", labels={"x": "1", "y": None}, annotations={"z": None}
    )
    (patch,) = [s for s in seen if s["method"] == "PATCH"]
    assert patch["path"].startswith("/api/v1/nodes/gpu-node-1")
    assert patch["type"] == "application/merge-patch+json"
    assert patch["body"] == {
        "metadata": {"labels": {"x": "1", "y": None}, "annotations": {"z": None}}
    }
    kube.patch_node_metadata(core, "gpu-node-1")  # nothing to change: no request
    assert len([s for s in seen if s["method"] == "PATCH"]) == 1


def test_pods_on_node_uses_a_field_selector(api: tuple[Any, list[dict[str, Any]]]) -> None:
    core, seen = api
    (pod,) = kube.pods_on_node(core, "gpu-node-1", "gpu-operator")
    assert (pod.name, pod.namespace, pod.labels, pod.phase) == (
        "gfd-1",
        "gpu-operator",
        {"app": "gpu-feature-discovery"},
        "Running",
    )
    assert seen[-1]["path"].startswith("/api/v1/namespaces/gpu-operator/pods?")
    assert "fieldSelector=spec.nodeName%3Dgpu-node-1" in seen[-1]["path"]
