"""The kubelet plugin's gRPC health service (``grpc.health.v1.Health/Check``), what a pod's
``grpc`` liveness probe asks, as NVIDIA's kubelet plugins serve it on their health port.

Serving means both of the plugin's sockets answer: the registration socket's ``GetInfo`` and
the DRA service's ``NodePrepareResources`` with no claims, which NVIDIA's check calls too. The
two messages are small enough to be written here by hand (a string field 1 in, an enum field 1
out), so no generated health module is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from gpu_operator.agent.dra.server import PluginPaths
from gpu_operator.kubelet_api.dra.v1 import api_pb2 as v1
from gpu_operator.kubelet_api.dra.v1 import api_pb2_grpc as v1_grpc
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2 as reg
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

SERVICE = "grpc.health.v1.Health"
SERVING, NOT_SERVING = 1, 2  # HealthCheckResponse.ServingStatus
KNOWN = frozenset({"", "liveness"})  # the services NVIDIA's check answers for
DEFAULT_PORT = 51515  # NVIDIA's chart's, for the compute-domain plugin


def service_name(request: bytes) -> str:
    """``HealthCheckRequest.service`` (field 1, a string) from its wire bytes."""
    at = 0
    while at < len(request):
        tag = request[at]
        at += 1
        length, at = _varint(request, at)
        if tag >> 3 == 1 and tag & 7 == 2:
            return request[at : at + length].decode()
        if tag & 7 != 2:  # nothing else is in the message; stop at what is not a string
            break
        at += length
    return ""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data):
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return value, at


def status_bytes(status: int) -> bytes:
    """``HealthCheckResponse{status}`` on the wire."""
    return bytes((0x08, status))


def plugin_answers(paths: PluginPaths, timeout_s: float = 5.0) -> bool:
    """Whether both sockets of the plugin at ``paths`` answer, as the kubelet would call them."""
    try:
        with grpc.insecure_channel(f"unix://{paths.registration_socket}") as channel:
            registration: Any = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            registration.GetInfo(reg.InfoRequest(), timeout=timeout_s)
        with grpc.insecure_channel(f"unix://{paths.plugin_socket}") as channel:
            dra: Any = v1_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            dra.NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        log.warning("health check: the plugin does not answer: %s", exc)
        return False
    return True


def serve(port: int, healthy: Callable[[], bool]) -> tuple[grpc.Server, int]:
    """Serve the health service on ``port`` (0: any free one) of every address; returns the
    server and the port it has."""

    def check(request: bytes, context: grpc.ServicerContext) -> bytes:
        if service_name(request) not in KNOWN:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return status_bytes(SERVING if healthy() else NOT_SERVING)

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                check, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    bound = 0
    for address in (f"[::]:{port}", f"0.0.0.0:{port}"):  # a host without IPv6: IPv4 alone
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            continue
        if bound:
            break
    if not bound:
        raise OSError(f"cannot listen on health port {port}: is it taken?")
    server.start()
    log.info("health service on port %d", bound)
    return server, bound
