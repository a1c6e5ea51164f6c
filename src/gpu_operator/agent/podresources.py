"""The kubelet PodResources API (``v1.PodResourcesLister/List``): which pod holds which GPU.

Spoken with the generated ``podresources.v1`` code (:mod:`gpu_operator.kubelet_api`), imported
on first use so agents that never ask the kubelet do not load protobuf. The messages become
plain data here (:class:`PodResources`); attribution is a pure function of that data. A tiny
server (:class:`PodResourcesServer`) serves the same API on a unix socket for tests and demos.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True)
class Attribution:
    pod: str
    namespace: str
    container: str


# -- the generated messages <-> plain data --------------------------------------------------------
def list_response(pods: Iterable[PodResources]) -> Any:
    """The ``ListPodResourcesResponse`` message for these pods."""
    from gpu_operator.kubelet_api.podresources.v1 import api_pb2 as pb

    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name=pod.name,
                namespace=pod.namespace,
                containers=[
                    pb.ContainerResources(
                        name=container.name,
                        devices=[
                            pb.ContainerDevices(
                                resource_name=d.resource_name, device_ids=list(d.device_ids)
                            )
                            for d in container.devices
                        ],
                    )
                    for container in pod.containers
                ],
            )
            for pod in pods
        ]
    )


def pods_from(response: Any) -> list[PodResources]:
    """Plain data from a ``ListPodResourcesResponse``; CPUs, memory and DRA claims are not
    needed for GPU attribution and are left out."""
    return [
        PodResources(
            pod.name,
            pod.namespace,
            tuple(
                ContainerResources(
                    container.name,
                    tuple(
                        ContainerDevices(d.resource_name, tuple(d.device_ids))
                        for d in container.devices
                    ),
                )
                for container in pod.containers
            ),
        )
        for pod in response.pod_resources
    ]


# -- attribution (pure) --------------------------------------------------------------------------
def attributions(
    pods: Sequence[PodResources], resource_prefix: str = "nvidia.com/"
) -> dict[str, list[Attribution]]:
    """Device id -> the containers holding it. Time-sliced replica ids (``GPU-x::2``) map to
    the GPU itself; several pods on one shared GPU all appear."""
    found: dict[str, list[Attribution]] = {}
    for pod in pods:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(resource_prefix):
                    continue
                for device_id in devices.device_ids:
                    base = device_id.split("::", 1)[0]
                    who = Attribution(pod.name, pod.namespace, container.name)
                    holders = found.setdefault(base, [])
                    if who not in holders:
                        holders.append(who)
    return found


# -- gRPC ----------------------------------------------------------------------------------------
def list_pod_resources(
    socket_path: str = KUBELET_SOCKET, timeout_s: float = 5.0
) -> list[PodResources]:
    """Ask the kubelet which devices each container holds."""
    import grpc

    from gpu_operator.kubelet_api.podresources.v1 import api_pb2 as pb
    from gpu_operator.kubelet_api.podresources.v1 import api_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        return pods_from(stub.List(pb.ListPodResourcesRequest(), timeout=timeout_s))


@dataclass
class PodResourcesServer:
    """Serve ``v1.PodResourcesLister/List`` on a unix socket with a fixed answer (tests, demos)."""

    socket_path: str
    pods: list[PodResources] = field(default_factory=list)
    _server: Any = None

    def start(self) -> PodResourcesServer:
        import grpc

        from gpu_operator.kubelet_api.podresources.v1 import api_pb2_grpc as pb_grpc

        served = self

        class Lister(pb_grpc.PodResourcesListerServicer):
            def List(self, request: Any, context: Any) -> Any:
                return list_response(served.pods)

        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def attributions_from_kubelet(
    socket_path: str = KUBELET_SOCKET,
) -> Mapping[str, list[Attribution]] | None:
    """Attributions when the kubelet socket exists; ``None`` (no pod labels) otherwise."""
    if not os.path.exists(socket_path):
        return None
    try:
        return attributions(list_pod_resources(socket_path))
    except Exception as exc:  # a kubelet restart must not take the exporter down
        log.warning("PodResources List on %s failed: %s", socket_path, exc)
        return None
