"""The kubelet's side of the device-plugin API, for tests, benchmarks and demos without one.

:class:`LocalKubelet` serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock`` with the
generated code, records each registration, and dials a registered plugin back the way the
kubelet does (ListAndWatch, GetPreferredAllocation, Allocate). :meth:`LocalKubelet.restart`
does what a restarting kubelet does to the directory: plugin sockets removed, a new
``kubelet.sock``. It checks what the real kubelet checks of a registration (API version,
resource name) and that the endpoint exists, nothing more: real kubelets are used where pods
must run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2 as pb
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

KUBELET_SOCKET = "kubelet.sock"


@dataclass(frozen=True)
class Registration:
    resource: str
    endpoint: str
    version: str
    preferred_allocation: bool
    at_s: float  # time.monotonic() when it arrived


class _Registrar(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: LocalKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        problem = None
        if request.version != "v1beta1":
            problem = f"unsupported device plugin API version {request.version!r}"
        elif "/" not in request.resource_name:
            problem = f"invalid extended resource name {request.resource_name!r}"
        elif not (self.kubelet.directory / request.endpoint).exists():
            problem = f"endpoint {request.endpoint!r} does not exist"
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.kubelet._record(
            Registration(
                resource=request.resource_name,
                endpoint=request.endpoint,
                version=request.version,
                preferred_allocation=request.options.get_preferred_allocation_available,
                at_s=time.monotonic(),
            )
        )
        return pb.Empty()


class PluginClient:
    """The kubelet's connection to one registered plugin endpoint."""

    def __init__(self, socket_path: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)  # type: ignore[no-untyped-call]

    def options(self) -> pb.DevicePluginOptions:
        options: pb.DevicePluginOptions = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        return options

    def list_and_watch(self, timeout_s: float | None = None) -> Iterator[pb.ListAndWatchResponse]:
        """The stream (ended by DEADLINE_EXCEEDED after ``timeout_s``); ``cancel()`` it or
        close the client when done."""
        stream: Iterator[pb.ListAndWatchResponse] = self.stub.ListAndWatch(
            pb.Empty(), timeout=timeout_s
        )
        return stream

    def allocate(self, *containers: Sequence[str]) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[
                pb.ContainerAllocateRequest(devices_ids=list(c)) for c in containers
            ]
        )
        response: pb.AllocateResponse = self.stub.Allocate(request, timeout=5)
        return response

    def preferred(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(required),
                    allocation_size=size,
                )
            ]
        )
        response = self.stub.GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PluginClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalKubelet:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registrations: list[Registration] = []
        self._cond = threading.Condition()
        self._server: Any = None

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    def start(self) -> LocalKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registrar(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, remove every plugin socket (as the kubelet does on start), start again."""
        self.stop()
        for path in self.directory.glob("*.sock"):
            path.unlink(missing_ok=True)
        self.start()

    def _record(self, registration: Registration) -> None:
        with self._cond:
            self.registrations.append(registration)
            self._cond.notify_all()

    def wait_for_registration(
        self, resource: str, *, after: int = 0, timeout_s: float = 10.0
    ) -> Registration:
        """The first registration of ``resource`` among those after the first ``after``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [r for r in self.registrations[after:] if r.resource == resource]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [r.resource for r in self.registrations[after:]]
                    raise TimeoutError(f"no registration of {resource} (saw {seen})")
                self._cond.wait(left)

    def registered(self) -> dict[str, Registration]:
        """The latest registration of each resource."""
        with self._cond:
            return {r.resource: r for r in self.registrations}

    def client(self, resource: str) -> PluginClient:
        return PluginClient(self.directory / self.registered()[resource].endpoint)

    def __enter__(self) -> LocalKubelet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
