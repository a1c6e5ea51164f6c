"""One resource's device-plugin gRPC server (kubelet API v1beta1) and its registration.

The kubelet wants one plugin endpoint per resource name, so each advertised resource gets its
own server on ``<socket dir>/nvidia-<name>.sock``. Every answer is computed by the pure
functions in :mod:`allocation` from one :class:`ResourceState` snapshot; this module only
moves messages of the generated ``deviceplugin.v1beta1`` code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import grpc

from gpu_operator.agent.deviceplugin.allocation import (
    AllocationError,
    ContainerAllocation,
    container_allocation,
    preferred_allocation,
)
from gpu_operator.agent.deviceplugin.config_file import RESOURCE_PREFIX, Sharing
from gpu_operator.agent.deviceplugin.resources import Device
from gpu_operator.agent.deviceplugin.settings import PluginSettings
from gpu_operator.agent.deviceplugin.topology import Locality
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2 as pb
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
REGISTER_TIMEOUT_S = 5.0


def socket_name(resource: str) -> str:
    """``nvidia.com/gpu.shared`` -> ``nvidia-gpu.shared.sock`` (NVIDIA's names)."""
    return f"nvidia-{resource.removeprefix(RESOURCE_PREFIX + '/')}.sock"


@dataclass(frozen=True)
class Advertised:
    """Everything one resource's answers depend on, replaced as a whole on a change."""

    resource: str
    devices: tuple[Device, ...]
    settings: PluginSettings
    sharing: Sharing
    locality: Mapping[str, Locality] = field(default_factory=dict)


class ResourceState:
    """The advertised devices of one resource and which are unhealthy. ListAndWatch streams
    wait on it and send the list again whenever health changes."""

    def __init__(self, advertised: Advertised, unhealthy: frozenset[str] = frozenset()) -> None:
        self.advertised = advertised
        self._unhealthy = unhealthy
        self._version = 0
        self._stopped = False
        self._cond = threading.Condition()

    def set_unhealthy(self, ids: frozenset[str]) -> bool:
        """Returns True when the health of some device changed (streams are woken)."""
        ids = ids & {d.id for d in self.advertised.devices}
        with self._cond:
            if ids == self._unhealthy:
                return False
            self._unhealthy = ids
            self._version += 1
            self._cond.notify_all()
            return True

    @property
    def unhealthy(self) -> frozenset[str]:
        with self._cond:
            return self._unhealthy

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def next_list(self, seen: int, active: Callable[[], bool]) -> tuple[int, frozenset[str]] | None:
        """Block until the version passes ``seen``; None once stopped or the stream ended."""
        with self._cond:
            while self._version == seen and not self._stopped and active():
                self._cond.wait(timeout=5.0)
            if self._stopped or not active():
                return None
            return self._version, self._unhealthy


def device_message(device: Device, unhealthy: frozenset[str], locality: Locality) -> pb.Device:
    message = pb.Device(ID=device.id, health=UNHEALTHY if device.id in unhealthy else HEALTHY)
    if locality.numa_node is not None:
        message.topology.nodes.append(pb.NUMANode(ID=locality.numa_node))
    return message


def allocate_message(allocation: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.device_nodes
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=n) for n in allocation.cdi_devices],
    )


def _refuse(context: Any, exc: AllocationError) -> NoReturn:
    """Abort the call with INVALID_ARGUMENT: the kubelet shows the message on the pod."""
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("grpc context.abort returned")  # it raises; keeps types honest


class DevicePluginService(pb_grpc.DevicePluginServicer):
    def __init__(self, state: ResourceState, driver: Callable[[], HostDriver]) -> None:
        self.state = state
        self.driver = driver  # the driver and its device nodes, read at Allocate

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        state = self.state
        context.add_callback(state.wake)
        seen = -1
        while True:
            update = state.next_list(seen, context.is_active)
            if update is None:
                return
            seen, unhealthy = update
            advertised = state.advertised
            yield pb.ListAndWatchResponse(
                devices=[
                    device_message(d, unhealthy, advertised.locality.get(d.gpu_uuid, Locality()))
                    for d in advertised.devices
                ]
            )

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        advertised = self.state.advertised
        responses = []
        for container in request.container_requests:
            try:
                ids = preferred_allocation(
                    advertised.devices,
                    advertised.locality,
                    list(container.available_deviceIDs),
                    list(container.must_include_deviceIDs),
                    container.allocation_size,
                )
            except AllocationError as exc:
                _refuse(context, exc)
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        advertised = self.state.advertised
        driver = self.driver()
        responses = []
        for container in request.container_requests:
            try:
                allocation = container_allocation(
                    advertised.resource,
                    advertised.devices,
                    list(container.devices_ids),
                    advertised.settings,
                    advertised.sharing,
                    response_id=str(uuid.uuid4()),
                    driver=driver,
                )
            except AllocationError as exc:
                log.warning("refused Allocate of %s: %s", advertised.resource, exc)
                _refuse(context, exc)
            responses.append(allocate_message(allocation))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class PluginServer:
    """Serves one resource on its socket; :meth:`register` announces it to the kubelet."""

    def __init__(
        self, state: ResourceState, socket_dir: Path, driver: Callable[[], HostDriver]
    ) -> None:
        self.state = state
        self.socket_path = socket_dir / socket_name(state.advertised.resource)
        self.driver = driver
        self.registered = False
        self._server: Any = None

    @property
    def resource(self) -> str:
        return self.state.advertised.resource

    def start(self) -> PluginServer:
        if self.socket_path.exists() or self.socket_path.is_symlink():
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
            DevicePluginService(self.state, self.driver), server
        )
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self.registered = False
        log.info("serving %s on %s", self.resource, self.socket_path)
        return self

    @property
    def serving(self) -> bool:
        """Running, with its socket still there (a restarting kubelet deletes plugin sockets)."""
        return self._server is not None and self.socket_path.exists()

    def register(self, kubelet_socket: Path) -> None:
        """Raises grpc.RpcError when the kubelet is not there or refuses."""
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(  # type: ignore[no-untyped-call]
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket_path.name,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=REGISTER_TIMEOUT_S,
            )
        self.registered = True
        log.info("registered %s with the kubelet", self.resource)

    def stop(self) -> None:
        self.state.stop()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.registered = False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        log.info("stopped serving %s", self.resource)
