"""The kubelet PodResources API (``v1.PodResourcesLister/List``): which pod holds which GPU.

The few protobuf messages involved are encoded and decoded here by hand (the wire format is
small: varints and length-delimited fields), so no generated code or protobuf runtime is
needed; grpcio carries the bytes. Unknown fields are skipped, as protobuf requires.
A tiny server (:class:`PodResourcesServer`) serves the same API on a unix socket for tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"


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


# -- protobuf wire format ------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, payload) of each length-delimited field; other wire types skipped."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = _read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            yield number, data[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(data):
        raise ValueError("truncated message")


def encode_list_request() -> bytes:
    return b""  # ListPodResourcesRequest has no fields


def encode_list_response(pods: Iterable[PodResources]) -> bytes:
    out = bytearray()
    for pod in pods:
        body = _field(1, pod.name.encode()) + _field(2, pod.namespace.encode())
        for container in pod.containers:
            cbody = _field(1, container.name.encode())
            for devices in container.devices:
                dbody = _field(1, devices.resource_name.encode())
                for device_id in devices.device_ids:
                    dbody += _field(2, device_id.encode())
                cbody += _field(2, dbody)
            body += _field(3, cbody)
        out += _field(1, body)
    return bytes(out)


def _decode_devices(data: bytes) -> ContainerDevices:
    name, ids = "", []
    for number, payload in _fields(data):
        if number == 1:
            name = payload.decode()
        elif number == 2:
            ids.append(payload.decode())
    return ContainerDevices(name, tuple(ids))


def _decode_container(data: bytes) -> ContainerResources:
    name, devices = "", []
    for number, payload in _fields(data):
        if number == 1:
            name = payload.decode()
        elif number == 2:
            devices.append(_decode_devices(payload))
    return ContainerResources(name, tuple(devices))


def _decode_pod(data: bytes) -> PodResources:
    name = namespace = ""
    containers = []
    for number, payload in _fields(data):
        if number == 1:
            name = payload.decode()
        elif number == 2:
            namespace = payload.decode()
        elif number == 3:
            containers.append(_decode_container(payload))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(data: bytes) -> list[PodResources]:
    return [_decode_pod(payload) for number, payload in _fields(data) if number == 1]


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

    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda _req: encode_list_request(),
            response_deserializer=decode_list_response,
        )
        result: list[PodResources] = call(None, timeout=timeout_s)
        return result


@dataclass
class PodResourcesServer:
    """Serve ``v1.PodResourcesLister/List`` on a unix socket with a fixed answer (tests, demos)."""

    socket_path: str
    pods: list[PodResources] = field(default_factory=list)
    _server: Any = None

    def start(self) -> PodResourcesServer:
        import grpc

        def list_handler(_request: bytes, _context: Any) -> list[PodResources]:
            return self.pods

        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    list_handler,
                    request_deserializer=lambda data: data,
                    response_serializer=encode_list_response,
                )
            },
        )
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
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
