"""The kubelet's side of DRA plugin registration and the DRA service, for tests and benchmarks.

:class:`LocalDraKubelet` does what the kubelet's plugin watcher does with a registry directory:
finds each registration socket, calls ``GetInfo``, checks the type and the service versions it
speaks, dials the endpoint and answers ``NotifyRegistrationStatus``. :class:`DraClient` then calls
``NodePrepareResources``/``NodeUnprepareResources`` in the version chosen, as the kubelet does
(v1 when offered). Real kubelets are used where pods must run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from gpu_operator.kubelet_api.dra.v1 import api_pb2 as v1
from gpu_operator.kubelet_api.dra.v1 import api_pb2_grpc as v1_grpc
from gpu_operator.kubelet_api.dra.v1beta1 import api_pb2 as v1beta1
from gpu_operator.kubelet_api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2 as reg
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

# What a 1.34 kubelet accepts, best first.
KUBELET_VERSIONS = {"v1.DRAPlugin": (v1, v1_grpc), "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc)}


@dataclass(frozen=True)
class Registered:
    name: str
    endpoint: str
    version: str  # the service version the kubelet chose


class DraClient:
    """The kubelet's connection to a registered DRA plugin, in one API version."""

    def __init__(self, endpoint: str, version: str = "v1.DRAPlugin") -> None:
        self.pb: ModuleType
        self.pb, stubs = KUBELET_VERSIONS[version]
        self.channel = grpc.insecure_channel(f"unix://{endpoint}")
        self.stub: Any = stubs.DRAPluginStub(self.channel)

    def prepare(self, *claims: tuple[str, str, str], timeout: float = 10.0) -> Any:
        """``claims``: (namespace, name, uid); the response's ``claims`` map by uid."""
        request = self.pb.NodePrepareResourcesRequest(
            claims=[self.pb.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        )
        return self.stub.NodePrepareResources(request, timeout=timeout)

    def unprepare(self, *claims: tuple[str, str, str], timeout: float = 10.0) -> Any:
        request = self.pb.NodeUnprepareResourcesRequest(
            claims=[self.pb.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        )
        return self.stub.NodeUnprepareResources(request, timeout=timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> DraClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalDraKubelet:
    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir

    def register(self, socket: Path) -> Registered:
        """One plugin watcher pass over one registration socket."""
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub: Any = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(reg.InfoRequest(), timeout=5)
            version = next((v for v in KUBELET_VERSIONS if v in info.supported_versions), None)
            problem = ""
            if info.type != "DRAPlugin":
                problem = f"unexpected plugin type {info.type!r}"
            elif version is None:
                problem = f"no supported DRA service among {list(info.supported_versions)}"
            elif not Path(info.endpoint).exists():
                problem = f"endpoint {info.endpoint} does not exist"
            stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=not problem, error=problem), timeout=5
            )
            if problem:
                raise ValueError(problem)
            assert version is not None
            return Registered(name=info.name, endpoint=info.endpoint, version=version)

    def wait_for_plugin(self, name: str, timeout_s: float = 10.0) -> Registered:
        """Poll the registry directory (as the kubelet's fsnotify watch would see it) until a
        socket registers ``name``."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            for socket in sorted(self.registry_dir.glob("*.sock")):
                try:
                    found = self.register(socket)
                except (grpc.RpcError, ValueError) as exc:
                    last = exc
                    continue
                if found.name == name:
                    return found
            time.sleep(0.05)
        raise TimeoutError(f"no DRA plugin {name} registered in {self.registry_dir} ({last})")
