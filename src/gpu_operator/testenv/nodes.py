"""Simulated Nodes that look like what NFD and a kubelet leave on real GPU and CPU machines.

kwok plays the kubelet for every Node annotated `kwok.x-k8s.io/node=fake`; the status set here
(capacity, nodeInfo, addresses) is kept by kwok, which only adds conditions and heartbeats.
`nvidia.com/gpu` capacity is deliberately absent: the device plugin is what advertises it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from gpu_operator.labels import KWOK_NODE, KWOK_NODE_FAKE

from . import binaries

KWOK_ANNOTATION = KWOK_NODE
GPU_PRESENT_LABEL = "feature.node.kubernetes.io/pci-10de.present"
NFD_PREFIX = "feature.node.kubernetes.io/"

# (os_release ID, VERSION_ID) -> (osImage as a kubelet reports it, a kernel that release ships)
OS_RELEASES: dict[tuple[str, str], tuple[str, str]] = {
    ("ubuntu", "20.04"): ("Ubuntu 20.04.6 LTS", "5.15.0-126-generic"),
    ("ubuntu", "22.04"): ("Ubuntu 22.04.5 LTS", "5.15.0-131-generic"),
    ("ubuntu", "24.04"): ("Ubuntu 24.04.2 LTS", "6.8.0-55-generic"),
    ("rhel", "8.10"): ("Red Hat Enterprise Linux 8.10 (Ootpa)", "4.18.0-553.el8_10.x86_64"),
    ("rhel", "9.4"): ("Red Hat Enterprise Linux 9.4 (Plow)", "5.14.0-427.13.1.el9_4.x86_64"),
    ("rhcos", "4.16"): (
        "Red Hat Enterprise Linux CoreOS 416.94.202410211619-0",
        "5.14.0-427.40.1.el9_4.x86_64",
    ),
}
CONTAINER_RUNTIME = "containerd://1.7.27"
KUBELET_VERSION = binaries.versions()["K8S_VERSION"]  # Cluster.create_nodes: the cluster's


def _internal_ip(name: str) -> str:
    """A stable loopback address (127.16.0.1-127.31.255.255) derived from the node name.

    Loopback on purpose: the API server prefers InternalIP when it dials a kubelet (the real
    nodes need that), so `kubectl logs` on a kwok pod must not send anything off the machine.
    Collisions are harmless."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:3], "big") & 0x0FFFFF
    return f"127.{16 + (h >> 16)}.{(h >> 8) & 0xFF}.{max(h & 0xFF, 1)}"


def node_manifest(
    name: str,
    *,
    gpu: bool,
    os_id: str = "ubuntu",
    os_version: str = "22.04",
    kernel: str | None = None,
    cpu: str = "32",
    memory: str = "257650964Ki",
    extra_labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The v1 Node a kubelet plus NFD would produce; GPU nodes carry the NVIDIA PCI label."""
    os_image, default_kernel = OS_RELEASES.get(
        (os_id, os_version), (f"{os_id} {os_version}", "5.15.0-131-generic")
    )
    kernel = kernel or default_kernel
    major, minor = [*kernel.split("."), "0", "0"][:2]
    revision = kernel.split(".")[2].split("-")[0] if kernel.count(".") >= 2 else "0"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        f"{NFD_PREFIX}system-os_release.ID": os_id,
        f"{NFD_PREFIX}system-os_release.VERSION_ID": os_version,
        f"{NFD_PREFIX}system-os_release.VERSION_ID.major": os_version.split(".")[0],
        f"{NFD_PREFIX}kernel-version.full": kernel,
        f"{NFD_PREFIX}kernel-version.major": major,
        f"{NFD_PREFIX}kernel-version.minor": minor,
        f"{NFD_PREFIX}kernel-version.revision": revision,
    }
    if "." in os_version:
        labels[f"{NFD_PREFIX}system-os_release.VERSION_ID.minor"] = os_version.split(".")[1]
    if gpu:
        labels[GPU_PRESENT_LABEL] = "true"
    labels.update(extra_labels or {})
    capacity = {
        "cpu": cpu,
        "memory": memory,
        "pods": "110",
        "ephemeral-storage": "1966736004Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    allocatable = dict(capacity, **{"ephemeral-storage": "1812538027587"})
    digest = hashlib.sha256(name.encode()).hexdigest()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_ANNOTATION: KWOK_NODE_FAKE,
                "node.alpha.kubernetes.io/ttl": "0",
                **(annotations or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": [
                {"type": "InternalIP", "address": _internal_ip(name)},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": os_image,
                "kernelVersion": kernel,
                "containerRuntimeVersion": CONTAINER_RUNTIME,
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "machineID": digest[:32],
                "systemUUID": f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}",
                "bootID": digest[32:64],
            },
        },
    }


def create_node(api: client.ApiClient, manifest: Mapping[str, Any]) -> None:
    """Create a Node (status included, as a kubelet registering itself does)."""
    client.CoreV1Api(api).create_node(body=client.V1Node.model_validate(dict(manifest)))


def create_gpu_node(
    api: client.ApiClient,
    name: str,
    os_id: str = "ubuntu",
    os_version: str = "22.04",
    extra_labels: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Create a GPU node (NFD labels incl. pci-10de.present) managed by kwok; returns it."""
    manifest = node_manifest(
        name, gpu=True, os_id=os_id, os_version=os_version, extra_labels=extra_labels, **kwargs
    )
    create_node(api, manifest)
    return manifest


def create_cpu_node(
    api: client.ApiClient,
    name: str,
    extra_labels: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Create a node without any NVIDIA PCI label; the operator must leave it alone."""
    manifest = node_manifest(name, gpu=False, extra_labels=extra_labels, **kwargs)
    create_node(api, manifest)
    return manifest


def with_kubelet_version(manifest: Mapping[str, Any], release: str) -> Mapping[str, Any]:
    """``manifest`` with ``release`` as its kubelet and kube-proxy versions (a copy, where it
    says another)."""
    info = (manifest.get("status") or {}).get("nodeInfo") or {}
    if info.get("kubeletVersion") in (None, release):
        return manifest
    status = {**manifest["status"], "nodeInfo": {**info, "kubeletVersion": release,
                                                   "kubeProxyVersion": release}}  # fmt: skip
    return {**manifest, "status": status}


def create_nodes(
    api: client.ApiClient, manifests: Iterable[Mapping[str, Any]], workers: int = 16
) -> list[str]:
    """Create many Nodes concurrently (hundreds take a few seconds); returns their names."""
    items = list(manifests)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        list(pool.map(lambda m: create_node(api, m), items))
    return [str(m["metadata"]["name"]) for m in items]


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def is_ready(node: client.V1Node) -> bool:
    """Whether the Node's Ready condition is True (what kwok's heartbeat maintains)."""
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def is_settled(node: client.V1Node) -> bool:
    """Ready, and kube-controller-manager has caught up with it: no not-ready taint left
    (kcm adds one to a node it sees before the kubelet readies it, and removes it seconds
    later on a busy machine; a test that starts before then sees kcm write the node)."""
    taints = (node.spec.taints if node.spec else None) or []
    return is_ready(node) and not any(t.key == NOT_READY_TAINT for t in taints)


def node_name(node: client.V1Node) -> str:
    return (node.metadata.name if node.metadata else None) or ""


def wait_nodes_ready(api: client.ApiClient, names: Iterable[str], timeout: float = 60.0) -> None:
    """Block until every named Node is Ready and settled (``is_settled``); raises TimeoutError
    naming the rest."""
    pending = set(names)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while pending:
        for node in core.list_node().items:
            if node_name(node) in pending and is_settled(node):
                pending.discard(node_name(node))
        if not pending:
            return
        if time.monotonic() > deadline:
            shown = ", ".join(sorted(pending)[:5])
            raise TimeoutError(
                f"{len(pending)} node(s) not Ready (or still tainted {NOT_READY_TAINT}) after "
                f"{timeout}s: {shown}"
            )
        time.sleep(0.2)


def delete_node(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_node(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
