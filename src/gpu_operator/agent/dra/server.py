"""The kubelet's DRA gRPC service (v1, and v1beta1 for 1.32/1.33 kubelets) and the plugin
registration socket the kubelet's plugin watcher finds.

The kubelet watches ``plugins_registry/`` for sockets, calls ``GetInfo`` on each, dials the
endpoint it names and reports back with ``NotifyRegistrationStatus``. Prepare and unprepare are
idempotent: a claim already prepared (in the checkpoint) gets the same answer without reading
the API again, and unpreparing an unknown claim succeeds.

:class:`KubeletServer` serves any driver's :class:`Preparer` (the GPUs' :class:`DraPlugin`, the
compute-domain plugin), each under its own name, sockets and plugin directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from gpu_operator.agent.dra.checkpoint import Checkpoint
from gpu_operator.agent.dra.devices import DRIVER, DeviceRef
from gpu_operator.agent.dra.mig_control import MigControl
from gpu_operator.agent.dra.mps import MpsDaemon
from gpu_operator.agent.dra.mps_control import MpsControl
from gpu_operator.agent.dra.prepare import (
    PreparedDevice,
    PrepareError,
    TimeSlice,
    cdi_spec,
    prepare_claim,
    spec_file_name,
)
from gpu_operator.agent.dra.sharing import (
    GpuSettings,
    NvidiaSmi,
    apply_time_slices,
    reset_time_slices,
    set_time_slices,
)
from gpu_operator.agent.dra.vfio import PassthroughError, VfioControl
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.api.dragates import Gates
from gpu_operator.kubelet_api.dra.v1 import api_pb2 as v1
from gpu_operator.kubelet_api.dra.v1 import api_pb2_grpc as v1_grpc
from gpu_operator.kubelet_api.dra.v1beta1 import api_pb2 as v1beta1
from gpu_operator.kubelet_api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2 as reg
from gpu_operator.kubelet_api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
PLUGIN_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"  # the GPUs'; each driver's is <driver>-reg.sock

ClaimReader = Callable[[str, str], Mapping[str, Any] | None]


@dataclass
class PluginPaths:
    """Where the plugin serves and writes: the kubelet's directories on the host."""

    plugin_dir: Path  # /var/lib/kubelet/plugins/gpu.nvidia.com
    registry_dir: Path  # /var/lib/kubelet/plugins_registry
    cdi_dir: Path  # /var/run/cdi
    host_driver_root: str = "/"  # the driver root on the host (NVIDIA_DRIVER_ROOT)
    dev_root: str | None = None  # where /dev/nvidia* are on the host; None: with the driver
    # The plugin socket as the kubelet names it, when the kubelet sees the directories under
    # other paths than this process (a node in its own mount namespace); default: the same.
    kubelet_plugin_dir: Path | None = None
    driver: str = DRIVER  # the DRA driver served from here (its registration socket's name)

    @property
    def plugin_socket(self) -> Path:
        return self.plugin_dir / PLUGIN_SOCKET

    @property
    def kubelet_endpoint(self) -> Path:
        return (self.kubelet_plugin_dir or self.plugin_dir) / PLUGIN_SOCKET

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"


@dataclass
class Registrations:
    """What the kubelet said about our registration."""

    statuses: list[tuple[bool, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def record(self, registered: bool, error: str) -> None:
        with self.cond:
            self.statuses.append((registered, error))
            self.cond.notify_all()


class Prepared(Protocol):
    """One prepared device as the kubelet is told of it."""

    @property
    def requests(self) -> tuple[str, ...]: ...
    @property
    def pool(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def cdi_ids(self) -> tuple[str, ...]: ...


class Preparer(Protocol):
    """What a driver does with the kubelet's two calls, independent of the wire version."""

    def prepare(self, namespace: str, name: str, uid: str) -> Sequence[Prepared]: ...
    def unprepare(self, uid: str) -> None: ...


class KubeletServer:
    """One driver's DRA service on its plugin socket, then its registration socket (so the
    kubelet never finds a registration whose endpoint is not there yet)."""

    def __init__(
        self, paths: PluginPaths, preparer: Preparer, registrations: Registrations
    ) -> None:
        self.paths = paths
        self.preparer = preparer
        self.registrations = registrations
        self._servers: list[Any] = []

    def start(self) -> KubeletServer:
        for path in (self.paths.plugin_socket, self.paths.registration_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        plugin = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        v1_grpc.add_DRAPluginServicer_to_server(_Service(self.preparer, v1), plugin)  # type: ignore[no-untyped-call]
        v1beta1_grpc.add_DRAPluginServicer_to_server(_Service(self.preparer, v1beta1), plugin)  # type: ignore[no-untyped-call]
        plugin.add_insecure_port(f"unix://{self.paths.plugin_socket}")
        plugin.start()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)  # type: ignore[no-untyped-call]
        registration.add_insecure_port(f"unix://{self.paths.registration_socket}")
        registration.start()
        self._servers = [registration, plugin]
        log.info("DRA plugin %s serving %s", self.paths.driver, self.paths.plugin_socket)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=None).wait()
        self._servers = []
        for path in (self.paths.registration_socket, self.paths.plugin_socket):
            path.unlink(missing_ok=True)


class DraPlugin:
    """Prepares and unprepares claims; :meth:`start` serves it to the kubelet."""

    def __init__(
        self,
        node: str,
        paths: PluginPaths,
        devices: Callable[[], Mapping[str, DeviceRef]],
        read_claim: ClaimReader,
        driver: Callable[[], HostDriver],
        gates: Gates | None = None,
        settings: Callable[[], GpuSettings] | None = None,
        mps: MpsControl | None = None,
        mig: MigControl | None = None,
        vfio: VfioControl | None = None,
    ) -> None:
        self.node = node
        self.vfio = vfio  # PassthroughSupport: None publishes no VFIO devices
        self.mps = mps  # None: claims asking for MPS are refused at Prepare
        self.mig = mig  # DynamicMIG: None publishes no partitions, so none reaches Prepare
        self.gates = gates or Gates.defaults()
        # What sets a GPU's time-slice: the driver's nvidia-smi unless told otherwise.
        self.settings = settings or (lambda: NvidiaSmi(self.driver()))
        self.paths = paths
        self.devices = devices
        self.read_claim = read_claim
        self.driver = driver
        self.checkpoint = Checkpoint(paths.plugin_dir)
        self.registrations = Registrations()
        self._lock = threading.Lock()
        self._server = KubeletServer(paths, self, self.registrations)

    # -- the two calls, independent of the wire version -----------------------------------
    def prepare(self, namespace: str, name: str, uid: str) -> tuple[PreparedDevice, ...]:
        with self._lock:
            done = self.checkpoint.get(uid)
            if done is not None:
                self._write_spec(uid, done)  # a lost spec file comes back
                return done
            claim = self.read_claim(namespace, name)
            if claim is None:
                raise PrepareError(f"ResourceClaim {namespace}/{name} not found")
            prepared = prepare_claim(claim, uid, self.node, self.devices(), self.gates)
            # The GPUs first: a setting that fails leaves no spec and no checkpointed claim,
            # and the kubelet's retry sets it again; MIG devices made for it are destroyed,
            # GPUs moved to vfio-pci for it go back to nvidia.
            prepared = self._bind_vfio(prepared)
            try:
                prepared = self._create_migs(prepared)
            except Exception:
                self._release_vfio(prepared)
                raise
            try:
                apply_time_slices(self.settings, prepared)
                self._start_mps(prepared)
                self._write_spec(uid, prepared)
                self.checkpoint.put(uid, namespace, name, prepared)
            except Exception:
                self._destroy_migs(prepared)
                self._release_vfio(prepared)
                raise
            return prepared

    def unprepare(self, uid: str) -> None:
        with self._lock:
            done = self.checkpoint.get(uid)
            if done is not None:  # put back first: a failure keeps the claim for the retry
                reset_time_slices(self.settings, done)
                for daemon in _daemons(done):
                    self._mps_control().stop(daemon)
                for p in done:
                    if p.mig is not None:
                        self._mig_control().destroy(p.mig)
                    if p.vfio is not None:
                        self._vfio_control().to_nvidia(p.vfio.address)
            (self.paths.cdi_dir / spec_file_name(uid)).unlink(missing_ok=True)
            self.checkpoint.remove(uid)

    def restore_time_slices(self) -> list[str]:
        """Put Default back on every full GPU no checkpointed claim holds a time-slice on: a
        plugin killed between setting one and checkpointing its claim, or a claim the kubelet
        let go of while the plugin was down, left it set. With TimeSlicingSettings only (the
        plugin sets nothing otherwise); returns the UUIDs put back."""
        if not self.gates.on("TimeSlicingSettings"):
            return []
        with self._lock:
            held = {p.time_slice.uuid for p in self._checkpointed() if p.time_slice is not None}
            free = sorted({r.uuid for r in self.devices().values() if not r.is_mig} - held)
            set_time_slices(self.settings, [TimeSlice(uuid, "Default") for uuid in free])
            return free

    def restore_mps(self) -> list[str]:
        """Stop every MPS daemon of this node no checkpointed claim holds and put compute mode
        DEFAULT back on the GPUs none holds (what a plugin killed mid-Prepare, or down while a
        claim went, left). With MPSSupport only; returns the daemons stopped."""
        if self.mps is None:
            return []
        with self._lock:
            held = _daemons(self._checkpointed())
            gpus = {r.gpu_uuid for r in self.devices().values()}
            return self.mps.stop_unheld(held, gpus)

    def restore_migs(self) -> list[str]:
        """Destroy every MIG device on a partitioned GPU that no checkpointed claim holds (a
        plugin killed between creating a GPU instance and its compute instance, or down while
        a claim went, left it). With DynamicMIG only; returns what went."""
        if self.mig is None:
            return []
        with self._lock:
            return self.mig.destroy_unheld(p.mig for p in self._checkpointed() if p.mig)

    def restore_vfio(self) -> list[str]:
        """Bind back to ``nvidia`` every GPU on ``vfio-pci`` that no checkpointed claim holds (a
        plugin killed between binding it and checkpointing its claim, or down while a claim
        went). With PassthroughSupport only; returns their PCI addresses."""
        if self.vfio is None:
            return []
        with self._lock:
            return self.vfio.release_unheld(self.held_vfio())

    def held_vfio(self) -> list[str]:
        """The PCI addresses of the GPUs checkpointed claims hold on ``vfio-pci``: their other
        devices are not published until they are back."""
        return sorted({p.vfio.address for p in self._checkpointed() if p.vfio is not None})

    def _vfio_control(self) -> VfioControl:
        if self.vfio is None:
            raise PrepareError("VFIO devices need the PassthroughSupport feature gate")
        return self.vfio

    def _bind_vfio(self, prepared: tuple[PreparedDevice, ...]) -> tuple[PreparedDevice, ...]:
        """``prepared`` with its VFIO devices' GPUs on ``vfio-pci``, or none of them moved. A
        GPU another prepared claim uses (its whole GPU or a MIG device of it) is refused."""
        if not any(p.vfio is not None for p in prepared):
            return prepared
        control = self._vfio_control()
        refs = self.devices()
        in_use = {
            refs[p.device].minor
            for p in self._checkpointed()
            if p.vfio is None and p.device in refs
        }
        done: list[PreparedDevice] = []
        try:
            for p in prepared:
                if p.vfio is None:
                    done.append(p)
                    continue
                if p.vfio.minor in in_use:
                    raise PrepareError(
                        f"GPU {p.vfio.address} is in use by another prepared claim: it is "
                        "handed to vfio-pci once that claim is unprepared"
                    )
                try:
                    done.append(dataclasses.replace(p, vfio=control.to_vfio(p.vfio)))
                except PassthroughError as err:
                    raise PrepareError(str(err)) from None
        except Exception:
            self._release_vfio(tuple(done))
            raise
        return tuple(done)

    def _release_vfio(self, prepared: tuple[PreparedDevice, ...]) -> None:
        for p in prepared:
            if p.vfio is not None and p.vfio.group and self.vfio is not None:
                try:
                    self.vfio.to_nvidia(p.vfio.address)
                except Exception:  # the failure that matters is the one being raised
                    log.exception("binding GPU %s back after a failed Prepare", p.vfio.address)

    def _checkpointed(self) -> tuple[PreparedDevice, ...]:
        """Every device of every claim the checkpoint holds: what must stay as it is."""
        return tuple(p for uid in self.checkpoint.uids() for p in self.checkpoint.get(uid) or ())

    def _mig_control(self) -> MigControl:
        if self.mig is None:
            raise PrepareError("MIG devices on demand need the DynamicMIG feature gate")
        return self.mig

    def _create_migs(self, prepared: tuple[PreparedDevice, ...]) -> tuple[PreparedDevice, ...]:
        """``prepared`` with its MIG devices created (whole GPUs out of MIG mode), or none of
        them left behind."""
        if self.mig is None:
            if any(p.mig is not None for p in prepared):
                self._mig_control()
            return prepared
        refs = self.devices()
        done: list[PreparedDevice] = []
        try:
            for p in prepared:
                if p.mig is None:
                    self.mig.whole_gpu(refs[p.device].uuid)
                    done.append(p)
                else:
                    done.append(dataclasses.replace(p, mig=self.mig.create(p.mig)))
        except Exception:
            self._destroy_migs(tuple(done))
            raise
        return tuple(done)

    def _destroy_migs(self, prepared: tuple[PreparedDevice, ...]) -> None:
        for p in prepared:
            if p.mig is not None and p.mig.created and self.mig is not None:
                try:
                    self.mig.destroy(p.mig)
                except Exception:  # the failure that matters is the one being raised
                    log.exception("destroying MIG device %s after a failed Prepare", p.mig.uuid)

    def _mps_control(self) -> MpsControl:
        if self.mps is None:
            raise PrepareError("MPS sharing needs the MPSSupport feature gate on this plugin")
        return self.mps

    def _start_mps(self, prepared: tuple[PreparedDevice, ...]) -> None:
        """Each MPS daemon of the claim Ready, or none left behind."""
        started: list[MpsDaemon] = []
        try:
            for daemon in _daemons(prepared):
                started.append(daemon)
                self._mps_control().start(daemon)
        except Exception:
            for daemon in started:
                try:
                    self._mps_control().stop(daemon)
                except Exception:  # the failure that matters is the one being raised
                    log.exception("stopping MPS daemon %s after a failed Prepare", daemon.name)
            raise

    def _write_spec(self, uid: str, prepared: tuple[PreparedDevice, ...]) -> None:
        refs = self.devices()
        missing = sorted(
            p.device for p in prepared if p.mig is None and p.vfio is None and p.device not in refs
        )
        if missing:
            raise PrepareError(f"prepared devices {missing} are not on this node any more")
        known = {p.device: refs[p.device] for p in prepared if p.device in refs}
        iommufd = self.vfio is not None and self.vfio.bus.iommufd()
        spec = cdi_spec(uid, prepared, known, self.driver(), self.paths.plugin_dir, iommufd)
        directory = self.paths.cdi_dir
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / spec_file_name(uid)
        tmp = directory / f".{path.name}.tmp"
        tmp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    # -- serving ------------------------------------------------------------------------
    def start(self) -> DraPlugin:
        """Serve the DRA service and the registration socket (:class:`KubeletServer`)."""
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> DraPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _daemons(prepared: tuple[PreparedDevice, ...] | None) -> list[MpsDaemon]:
    """A claim's distinct MPS daemons, in the order its devices name them."""
    found: dict[str, MpsDaemon] = {}
    for p in prepared or ():
        if p.mps is not None:
            found.setdefault(p.mps.id, p.mps)
    return list(found.values())


class _Service:
    """``DRAPlugin`` for one generated API version (v1 and v1beta1 have the same messages)."""

    def __init__(self, plugin: Preparer, pb: ModuleType) -> None:
        self.plugin = plugin
        self.pb = pb

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        pb = self.pb
        response = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                prepared = self.plugin.prepare(claim.namespace, claim.name, claim.uid)
            except PrepareError as exc:
                response.claims[claim.uid].CopyFrom(pb.NodePrepareResourceResponse(error=str(exc)))
                continue
            except Exception as exc:  # an API or disk error: the kubelet retries
                log.exception("preparing claim %s/%s", claim.namespace, claim.name)
                response.claims[claim.uid].CopyFrom(pb.NodePrepareResourceResponse(error=str(exc)))
                continue
            devices = [
                pb.Device(
                    request_names=list(p.requests),
                    pool_name=p.pool,
                    device_name=p.device,
                    cdi_device_ids=list(p.cdi_ids),
                )
                for p in prepared
            ]
            response.claims[claim.uid].CopyFrom(pb.NodePrepareResourceResponse(devices=devices))
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        pb = self.pb
        response = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                self.plugin.unprepare(claim.uid)
                response.claims[claim.uid].CopyFrom(pb.NodeUnprepareResourceResponse())
            except Exception as exc:
                log.exception("unpreparing claim %s", claim.uid)
                response.claims[claim.uid].CopyFrom(
                    pb.NodeUnprepareResourceResponse(error=str(exc))
                )
        return response


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, server: KubeletServer) -> None:
        self.server = server

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.server.paths.driver,
            endpoint=str(self.server.paths.kubelet_endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        driver = self.server.paths.driver
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s", driver)
        else:
            log.error("the kubelet refused DRA driver %s: %s", driver, request.error)
        self.server.registrations.record(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()
