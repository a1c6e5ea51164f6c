"""Real nodes behave like a real cluster's nodes in the ways the stack relies on: Ready and
labelled, privileged pods with hostPath mounts that are per node, the `kubernetes` Service and
ServiceAccount tokens from inside a pod, `kubectl logs/exec`, CDI devices named through the CRI
by a device plugin, and the kubelet's PodResources socket."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from kubernetes.stream import stream

from gpu_operator import testenv
from gpu_operator.agent import podresources
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from gpu_operator.testenv import nodeconfig, releases

from .support import NotYet, wait_for

pytestmark = pytest.mark.real_nodes

SHELL = testenv.binaries.node_image_name("shell")


@pytest.fixture
def rkube(real_cluster: testenv.Cluster) -> Iterator[testenv.Clients]:
    """Clients for the real-node cluster, bound to a fresh namespace (deleted afterwards)."""
    with real_cluster.api_client() as api:
        kube = testenv.Clients.for_api(api, f"real-{uuid.uuid4().hex[:8]}")
        kube.core.create_namespace({"metadata": {"name": kube.namespace}})
        try:
            yield kube
        finally:
            kube.core.delete_namespace(kube.namespace)


def _pod(name: str, node: str, command: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": SHELL, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", command]}  # fmt: skip
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1, "containers": [container], **spec},
    }  # fmt: skip


def _phase(kube: testenv.Clients, name: str, *phases: str) -> str | NotYet:
    """The pod's phase once one of ``phases``; else the phase it is in."""
    pod = kube.core.read_namespaced_pod(name, kube.namespace)
    phase: str | None = pod.status.phase if pod.status else None
    if phase is not None and phase in phases:
        return phase
    return NotYet({"phase": phase})


def _logs(kube: testenv.Clients, name: str) -> str:
    return str(kube.core.read_namespaced_pod_log(name, kube.namespace))


def test_real_nodes_are_ready_labelled_and_told_their_gpus(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    assert real_cluster.real_nodes == ["real-node-0", "real-node-1"]
    assert real_cluster.api_url.startswith(f"https://{real_cluster.real.network.gateway}:")  # type: ignore[union-attr]
    by_name = {n.metadata.name: n for n in rkube.core.list_node().items}
    assert set(by_name) == {"real-node-0", "real-node-1", "gpu-node-0"}
    for planned in real_cluster.real.nodes:  # type: ignore[union-attr]
        node = by_name[planned.name]
        assert testenv.nodes.is_ready(node)
        labels = node.metadata.labels
        assert labels[nodeconfig.REAL_NODE_LABEL] == "true"
        assert labels[testenv.GPU_PRESENT_LABEL] == "true"
        annotation = node.metadata.annotations[nodeconfig.SIMULATED_GPUS_ANNOTATION]
        assert annotation == planned.gpus
        marker = real_cluster.real_node_dir(planned.name) / "gpu-operator-sim" / "profile"
        assert marker.read_text().strip() == planned.gpus
        info = node.status.node_info
        assert info.container_runtime_version == "containerd://2.4.2"
        assert info.kubelet_version == releases.release_of(real_cluster.bin_dir)
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == planned.ip
    kwok = by_name["gpu-node-0"].metadata.labels
    assert nodeconfig.REAL_NODE_LABEL not in kwok


def test_privileged_daemonset_with_host_paths_runs_on_each_real_node(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    """hostPath /run/nvidia, /var/lib/kubelet/device-plugins and the simulated-GPU marker are
    each node's own: what a pod writes there lands in that node's directory only."""
    name = "hostpaths"
    marker = f"{nodeconfig.SIM_DIR_ON_NODE}/{nodeconfig.SIM_PROFILE_FILE}"
    script = (
        'echo "$NODE_NAME" > /host/run/nvidia/written-by; '
        f"cat /host/sim/{nodeconfig.SIM_PROFILE_FILE}; "
        "ls /host/device-plugins/ | grep -qx kubelet.sock && echo device-plugins-ok; sleep 3600"
    )
    volumes = [
        ("run-nvidia", "/run/nvidia", "/host/run/nvidia"),
        ("device-plugins", "/var/lib/kubelet/device-plugins", "/host/device-plugins"),
        ("sim", nodeconfig.SIM_DIR_ON_NODE, "/host/sim"),
    ]
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {nodeconfig.REAL_NODE_LABEL: "true"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": SHELL,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {
                                "fieldPath": "spec.nodeName"}}}],
                            "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": v, "mountPath": m} for v, _, m in volumes],
                        }
                    ],
                    "volumes": [
                        {"name": v, "hostPath": {"path": p, "type": "Directory"}}
                        for v, p, _ in volumes
                    ],
                },
            },
        },
    }  # fmt: skip
    rkube.apps.create_namespaced_daemon_set(rkube.namespace, ds)

    def all_ready() -> bool | NotYet:
        status = rkube.apps.read_namespaced_daemon_set(name, rkube.namespace).status
        desired, ready = status.desired_number_scheduled, status.number_ready
        return (desired == 2 and ready == 2) or NotYet({"desired": desired, "ready": ready})

    def written_by(path: Path) -> str | NotYet:
        if not path.is_file():
            return NotYet("no such file")
        return path.read_text().strip() or NotYet("an empty file")

    def plugin_logs(pod: str) -> str | NotYet:
        log = _logs(rkube, pod)
        return log if "device-plugins-ok" in log else NotYet({"log": log[-500:]})

    wait_for("the DaemonSet Ready on both real nodes", all_ready, timeout=90)
    pods = rkube.core.list_namespaced_pod(rkube.namespace, label_selector=f"app={name}").items
    assert sorted(p.spec.node_name for p in pods) == real_cluster.real_nodes
    for pod in pods:
        node = pod.spec.node_name
        written = real_cluster.real_node_dir(node) / "nvidia" / "written-by"
        wait_for(f"{written}", lambda w=written: written_by(w))
        assert written.read_text().strip() == node
        planned = next(n for n in real_cluster.real.nodes if n.name == node)  # type: ignore[union-attr]
        logs = wait_for(f"{pod.metadata.name} logs", lambda p=pod: plugin_logs(p.metadata.name))
        assert logs.splitlines()[0] == planned.gpus, f"{marker} on {node}"
        assert container_privileged(pod)


def container_privileged(pod: client.V1Pod) -> bool:
    return bool(pod.spec.containers[0].security_context.privileged)


def test_pod_lists_objects_through_the_kubernetes_service_with_its_token(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    """In-cluster config, the normal way: KUBERNETES_SERVICE_HOST (the Service IP, DNATed by
    kube-proxy to the API server), the ServiceAccount token, TLS verified with its ca.crt."""
    rkube.core.create_namespaced_config_map(
        rkube.namespace, {"metadata": {"name": "seen-from-a-pod"}, "data": {"k": "v"}}
    )
    rbac = client.RbacAuthorizationV1Api(rkube.api)
    rbac.create_namespaced_role(
        rkube.namespace,
        {"metadata": {"name": "read-cm"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]},
    )  # fmt: skip
    rbac.create_namespaced_role_binding(
        rkube.namespace,
        {
            "metadata": {"name": "read-cm"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cm"},
            "subjects": [{"kind": "ServiceAccount", "name": "default",
                          "namespace": rkube.namespace}],
        },
    )  # fmt: skip
    wait_for("the default ServiceAccount", lambda: rkube.core.list_namespaced_service_account(
        rkube.namespace).items)  # fmt: skip
    command = (
        'echo "host=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; '
        f"incluster-get /api/v1/namespaces/{rkube.namespace}/configmaps"
    )
    for node in real_cluster.real_nodes:
        rkube.core.create_namespaced_pod(rkube.namespace, _pod(f"lister-{node}", node, command))
    for node in real_cluster.real_nodes:
        name = f"lister-{node}"
        phase = wait_for(
            f"{name} to finish", lambda n=name: _phase(rkube, n, "Succeeded", "Failed")
        )
        logs = _logs(rkube, name)
        assert phase == "Succeeded", logs
        first, body = logs.split("\n", 1)
        assert first == "host=10.96.0.1:443"
        names = [item["metadata"]["name"] for item in json.loads(body)["items"]]
        assert "seen-from-a-pod" in names


def test_logs_and_exec_reach_a_real_node_pod(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    node = real_cluster.real_nodes[1]
    rkube.core.create_namespaced_pod(
        rkube.namespace, _pod("talker", node, "echo hello from $(hostname); sleep 3600")
    )
    wait_for("talker Running", lambda: _phase(rkube, "talker", "Running"))
    assert wait_for("talker logs", lambda: _logs(rkube, "talker")) == "hello from talker\n"
    out = stream(
        rkube.core.connect_get_namespaced_pod_exec, "talker", rkube.namespace,
        command=["sh", "-c", "echo $((6 * 7)); cat /etc/hostname; ls /nonexistent 2>&1; true"],
        stderr=True, stdin=False, stdout=True, tty=False,
    )  # fmt: skip
    lines = out.splitlines()
    assert lines[:2] == ["42", "talker"]
    assert "No such file or directory" in lines[2]


# -- CDI through the CRI, via a device plugin ---------------------------------------------------
RESOURCE = "testenv.example/cdi-gpu"
CDI_KIND = "testenv.example/gpu"


class _CdiPlugin(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    """A device plugin whose Allocate names a CDI device instead of listing mounts and env."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.allocated: list[list[str]] = []

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID="gpu0", health="Healthy")])
        self.stopped.wait()

    def Allocate(self, request: Any, context: Any) -> Any:
        ids = [list(r.devices_ids) for r in request.container_requests]
        self.allocated.extend(ids)
        return dp.AllocateResponse(
            container_responses=[
                dp.ContainerAllocateResponse(
                    cdi_devices=[dp.CDIDevice(name=f"{CDI_KIND}={i}") for i in r]
                )
                for r in ids
            ]
        )


@contextmanager
def _short_links(**targets: Path) -> Iterator[dict[str, str]]:
    """Unix socket paths are limited to 107 bytes: reach long ones through short symlinks."""
    with tempfile.TemporaryDirectory(prefix="rn", dir="/tmp") as tmp:
        links = {}
        for name, target in targets.items():
            os.symlink(target, f"{tmp}/{name}")
            links[name] = f"{tmp}/{name}"
        links["dir"] = tmp
        yield links


@contextmanager
def _device_plugin(node_dir: Path) -> Iterator[_CdiPlugin]:
    plugins = node_dir / "kubelet" / "device-plugins"
    with _short_links(kubelet=plugins / "kubelet.sock") as links:
        plugin = _CdiPlugin()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{links['dir']}/plugin.sock")
        server.start()
        os.symlink(f"{links['dir']}/plugin.sock", plugins / "testenv-cdi.sock")
        try:
            with grpc.insecure_channel(f"unix://{links['kubelet']}") as channel:
                dp_grpc.RegistrationStub(channel).Register(
                    dp.RegisterRequest(
                        version="v1beta1", endpoint="testenv-cdi.sock", resource_name=RESOURCE
                    ),
                    timeout=10,
                )
            yield plugin
        finally:
            plugin.stopped.set()
            server.stop(grace=None)
            (plugins / "testenv-cdi.sock").unlink(missing_ok=True)


def test_cdi_device_named_by_a_device_plugin_reaches_the_container(
    real_cluster: testenv.Cluster, rkube: testenv.Clients
) -> None:
    """The kubelet passes the plugin's CDI name through the CRI; containerd v2 resolves it from
    the spec in the node's /var/run/cdi: the env and the device node reach the container. The
    PodResources socket then reports which container holds the device."""
    node = real_cluster.real_nodes[0]
    node_dir = real_cluster.real_node_dir(node)
    spec = {
        "cdiVersion": "0.6.0",
        "kind": CDI_KIND,
        "devices": [
            {
                "name": "gpu0",
                "containerEdits": {
                    "env": ["TESTENV_CDI_DEVICE=gpu0"],
                    "deviceNodes": [{"path": "/dev/testenv-gpu0", "hostPath": "/dev/zero"}],
                },
            }
        ],
    }
    (node_dir / "cdi" / "testenv.json").write_text(json.dumps(spec))
    try:
        with _device_plugin(node_dir) as plugin:

            def advertised() -> bool | NotYet:
                status = rkube.core.read_node(node).status
                got = (status.allocatable or {}).get(RESOURCE)
                return got == "1" or NotYet({RESOURCE: got})

            def cdi_logs() -> str | NotYet:
                log = _logs(rkube, "cdi")
                return log if log.count("\n") >= 2 else NotYet({"log": log})

            wait_for(f"{node} to advertise {RESOURCE}", advertised)
            pod = _pod(
                "cdi", node,
                'echo "env=$TESTENV_CDI_DEVICE"; head -c 4 /dev/testenv-gpu0 | od -An -tx1; '
                "sleep 3600",
                container={"resources": {"limits": {RESOURCE: "1"}}},
            )  # fmt: skip
            rkube.core.create_namespaced_pod(rkube.namespace, pod)
            wait_for("cdi Running", lambda: _phase(rkube, "cdi", "Running", "Failed"))
            logs = wait_for("cdi logs", cdi_logs)
            assert logs.splitlines() == ["env=gpu0", " 00 00 00 00"], logs
            assert plugin.allocated == [["gpu0"]]

            sockets = node_dir / "kubelet" / "pod-resources" / "kubelet.sock"
            with _short_links(podresources=sockets) as links:
                pods = podresources.list_pod_resources(links["podresources"])
            held = [
                (p.name, c.name, d.resource_name, d.device_ids)
                for p in pods
                if p.namespace == rkube.namespace
                for c in p.containers
                for d in c.devices
            ]
            assert held == [("cdi", "main", RESOURCE, ("gpu0",))]
    finally:
        (node_dir / "cdi" / "testenv.json").unlink(missing_ok=True)


def _renamed_archive(source: Path, dest: Path, name: str) -> Path:
    """A copy of an OCI archive whose image is called `name` (its index annotation rewritten)."""
    with tarfile.open(source) as src, tarfile.open(dest, "w") as out:
        for member in src.getmembers():
            data = src.extractfile(member) if member.isfile() else None
            if member.name == "index.json" and data is not None:
                index = json.loads(data.read())
                for manifest in index["manifests"]:
                    manifest["annotations"]["org.opencontainers.image.ref.name"] = name
                raw = json.dumps(index).encode()
                member.size = len(raw)
                data = io.BytesIO(raw)
            out.addfile(member, data)
    return dest


def test_load_image_imports_an_archive_into_every_node(
    real_cluster: testenv.Cluster, rkube: testenv.Clients, tmp_path: Path
) -> None:
    """An image no node has yet runs on every real node once loaded (nothing is pulled)."""
    name = f"localhost/testenv/loaded:{uuid.uuid4().hex[:8]}"
    archive = _renamed_archive(
        testenv.binaries.node_dir() / "images" / "shell.oci.tar", tmp_path / "x.tar", name
    )
    t0 = time.monotonic()
    real_cluster.load_image(archive)
    elapsed = time.monotonic() - t0
    for node in real_cluster.real_nodes:
        pod = _pod(f"loaded-{node}", node, "echo loaded", container={"image": name})
        rkube.core.create_namespaced_pod(rkube.namespace, pod)
    for node in real_cluster.real_nodes:
        pod_name = f"loaded-{node}"
        phase = wait_for(pod_name, lambda n=pod_name: _phase(rkube, n, "Succeeded", "Failed"))
        assert phase == "Succeeded"
        assert _logs(rkube, pod_name) == "loaded\n"
    print(f"\nload_image ({archive.stat().st_size >> 10} KiB) into 2 nodes: {elapsed:.2f}s")
