"""SIMULATED stand-ins for the images a ``vm-passthrough`` node runs: NVIDIA's VFIO manager
(``vfio-manage``), the sandbox validator's vfio-pci check (``nvidia-validator``) and KubeVirt's
GPU device plugin. Only the testenv's stand-in images run them; they act on the simulated PCI
bus the stub driver laid out on the node (:mod:`gpu_operator.sim.pci`), through the product's
:class:`~gpu_operator.agent.dra.vfio.PciBus`, so a write the kernel would refuse fails here too.

What they promise, as the real images do:

- ``vfio-manage bind --all``: every NVIDIA GPU function bound to ``vfio-pci`` (its
  ``driver_override`` set, unbound from its driver, bound); ``unbind --all``: every one on
  ``vfio-pci`` handed back to ``nvidia``, where the simulated node had it.
- the validator's ``vfio-pci`` component: the node's workload config in the
  ``workload-type`` status file, and on a ``vm-passthrough`` node ``vfio-pci-ready`` once every
  NVIDIA GPU is on ``vfio-pci``; its vGPU components only write the workload type (there is no
  simulated vGPU).
- the device plugin: one kubelet resource per PCI device name, ``nvidia.com/<NAME>``, whose
  devices are the PCI addresses of the GPUs on ``vfio-pci``; Allocate gives ``/dev/vfio/vfio``
  and ``/dev/vfio/<group>`` and ``PCI_RESOURCE_NVIDIA_COM_<NAME>=<addresses>``, what KubeVirt's
  virt-launcher reads. NAME is KubeVirt's spelling of the device's pci.ids name (a small table
  of the simulated models' entries below; a device id it lacks is named by the id, as KubeVirt
  names a device missing from its pci.ids).

Every line they print starts with SIMULATED.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpu_operator.agent.deviceplugin.server import API_VERSION, REGISTER_TIMEOUT_S
from gpu_operator.agent.dra.vfio import (
    DEVICES,
    NVIDIA_DRIVER,
    VFIO_CONTAINER,
    VFIO_DEV,
    VFIO_DRIVER,
    PassthroughError,
    PciBus,
    VfioBinding,
    VfioControl,
)
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2 as pb
from gpu_operator.kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpu_operator.stopping import stop_on_signals

log = logging.getLogger(__name__)

BANNER = "SIMULATED"
RESOURCE_PREFIX = "nvidia.com"
ENV_PREFIX = "PCI_RESOURCE_NVIDIA_COM"
VM_PASSTHROUGH = "vm-passthrough"
WORKLOAD_TYPE_FILE = "workload-type"
VFIO_READY_FILE = "vfio-pci-ready"
VALIDATOR_COMPONENTS = ("vfio-pci", "vgpu-manager", "vgpu-devices")
# pci.ids names of the simulated models' device ids (sim/profiles), which KubeVirt's plugin
# looks up in its image's /usr/pci.ids.
PCI_IDS_NAMES = {
    0x20B0: "GA100 [A100 SXM4 40GB]",
    0x20B2: "GA100 [A100 SXM4 80GB]",
    0x2330: "GH100 [H100 SXM5 80GB]",
    0x27B8: "AD104GL [L4]",
    0x1EB8: "TU104GL [Tesla T4]",
}


def say(message: str) -> None:
    print(f"{BANNER}: {message}", flush=True)


# -- the pure part: names, devices, answers ----------------------------------------------------
def kubevirt_name(pci_ids_name: str) -> str:
    """A pci.ids device name as KubeVirt's plugin turns it into a resource name: upper case,
    ``/`` and ``.`` and runs of blanks to ``_``, anything else not alphanumeric dropped
    (``GH100 [H100 SXM5 80GB]`` -> ``GH100_H100_SXM5_80GB``)."""
    name = pci_ids_name.strip().upper().replace("/", "_").replace(".", "_")
    name = re.sub(r"\s+", "_", name)
    return re.sub(r"[^A-Z0-9_]+", "", name)


def device_name(device_id: int) -> str:
    """The resource name of a GPU with PCI device id ``device_id`` (its id, ``20b0``, when the
    table has no name for it)."""
    known = PCI_IDS_NAMES.get(device_id)
    return kubevirt_name(known) if known else f"{device_id:04x}"


def env_key(name: str) -> str:
    """The variable naming a resource's allocated addresses, as virt-launcher reads it."""
    return f"{ENV_PREFIX}_{name.upper()}"


@dataclass(frozen=True)
class PassthroughGpu:
    """A GPU on ``vfio-pci``: its PCI address, device id and IOMMU group."""

    address: str
    device_id: int
    group: str

    @property
    def name(self) -> str:
        return device_name(self.device_id)


def by_name(gpus: Sequence[PassthroughGpu]) -> dict[str, tuple[PassthroughGpu, ...]]:
    """The GPUs of each resource name (KubeVirt runs one plugin per PCI device name)."""
    grouped: dict[str, list[PassthroughGpu]] = {}
    for gpu in sorted(gpus, key=lambda g: g.address):
        grouped.setdefault(gpu.name, []).append(gpu)
    return {name: tuple(found) for name, found in sorted(grouped.items())}


@dataclass(frozen=True)
class ContainerGrant:
    """What one container's Allocate gets: device nodes (container path, host path) and env."""

    devices: tuple[tuple[str, str], ...]
    envs: Mapping[str, str]


def allocate(
    name: str, gpus: Sequence[PassthroughGpu], ids: Sequence[str], host_dev_root: str = "/"
) -> ContainerGrant:
    """The grant of ``ids`` (PCI addresses) of resource ``name``: the VFIO container node once,
    each GPU's group node, and the addresses in the resource's variable. ``host_dev_root`` is
    where the node keeps ``/dev`` (``/`` on a real node; the stub driver's root here).
    PassthroughError for an address the resource does not have."""
    known = {g.address: g for g in gpus}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise PassthroughError(f"invalid allocation request: unknown device: {', '.join(unknown)}")
    paths = [VFIO_CONTAINER]
    for address in ids:
        group = f"{VFIO_DEV}/{known[address].group}"
        if group not in paths:
            paths.append(group)
    devices = tuple((p, _join(host_dev_root, p)) for p in paths)
    return ContainerGrant(devices, {env_key(name): ",".join(ids)})


def _join(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def not_on_vfio(bus: PciBus) -> list[str]:
    """The NVIDIA GPU functions that are not on ``vfio-pci`` (``address (driver)``)."""
    return [
        f"{a} ({bus.driver_of(a) or 'no driver'})"
        for a in bus.nvidia_functions()
        if bus.driver_of(a) != VFIO_DRIVER
    ]


# -- the PCI bus: reading it and moving GPUs ---------------------------------------------------
def vfio_gpus(bus: PciBus, root: Path) -> list[PassthroughGpu]:
    """The NVIDIA GPUs on ``vfio-pci`` under ``root``, with the device id sysfs shows."""
    found = []
    for address in bus.nvidia_functions():
        if bus.driver_of(address) != VFIO_DRIVER:
            continue
        device_id = int((root / DEVICES / address / "device").read_text().strip(), 16)
        found.append(PassthroughGpu(address, device_id, bus.iommu_group(address)))
    return found


def vfio_manage(bus: PciBus, action: str, dev_dir: Path) -> list[str]:
    """``bind``: every NVIDIA GPU not on ``vfio-pci`` moved there; ``unbind``: every one on
    ``vfio-pci`` back to ``nvidia``. Returns the addresses moved; PassthroughError when the
    bus refuses a move (the GPU is left where the kernel left it)."""
    if action not in ("bind", "unbind"):
        raise ValueError(f"vfio-manage takes bind or unbind, not {action!r}")
    # NVIDIA's vfio-manage checks no holders: the driver manager has unloaded the driver.
    control = VfioControl(bus, dev_dir, busy=lambda _minor: [])
    moved = []
    for address in bus.nvidia_functions():
        current = bus.driver_of(address)
        if action == "bind" and current != VFIO_DRIVER:
            control.to_vfio(VfioBinding(address, "", -1))
        elif action == "unbind" and current == VFIO_DRIVER:
            control.to_nvidia(address)
        else:
            continue
        moved.append(address)
    return moved


def run_vfio_manage(bus: PciBus, action: str, dev_dir: Path) -> int:
    say(f"NVIDIA VFIO manager stand-in: vfio-manage {action} --all on the simulated PCI bus")
    try:
        moved = vfio_manage(bus, action, dev_dir)
    except PassthroughError as exc:
        say(f"vfio-manage {action} failed: {exc}")
        return 1
    target = VFIO_DRIVER if action == "bind" else NVIDIA_DRIVER
    for address in moved:
        say(f"{address} bound to {target}")
    if not moved:
        say(f"no GPU to move: every NVIDIA GPU is already {'on' if action == 'bind' else 'off'} "
            f"{VFIO_DRIVER}")  # fmt: skip
    return 0


# -- the sandbox validator's checks ------------------------------------------------------------
def run_validator(
    component: str,
    workload: str,
    output_dir: Path,
    bus: PciBus | None,
    *,
    wait: bool,
    interval_s: float = 2.0,
    stop: threading.Event | None = None,
) -> int:
    """One validator component on a node whose workload config is ``workload``: its status
    files in ``output_dir``. ``vfio-pci`` on a ``vm-passthrough`` node: ready once every GPU is
    on ``vfio-pci`` (``wait``: looked at again every ``interval_s`` until then); only that
    check reads ``bus``."""
    stop = stop or threading.Event()
    say(f"NVIDIA sandbox validator stand-in: component {component}, workload {workload}")
    if component not in VALIDATOR_COMPONENTS:
        say(f"unknown component {component!r}; known: {', '.join(VALIDATOR_COMPONENTS)}")
        return 2
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / WORKLOAD_TYPE_FILE).write_text(workload + "\n")
    wanted = VM_PASSTHROUGH if component == "vfio-pci" else "vm-vgpu"
    if workload != wanted:
        say(f"{component} not required on a {workload} node: skipping validation")
        return 0
    if component != "vfio-pci":
        say(f"{component}: there is no simulated vGPU")
        return 1
    if bus is None:
        say("the vfio-pci check needs the simulated PCI bus (--pci-root)")
        return 2
    (output_dir / VFIO_READY_FILE).unlink(missing_ok=True)
    said: list[str] = []
    while True:
        left = not_on_vfio(bus)
        if not left:
            break
        if left != said:  # once per change, not once per look
            say(f"GPUs not bound to {VFIO_DRIVER}: {', '.join(left)}")
            said = left
        if not wait or stop.wait(interval_s):
            return 1
    (output_dir / VFIO_READY_FILE).write_text("")
    say(f"every NVIDIA GPU is bound to {VFIO_DRIVER}")
    return 0


# -- KubeVirt's device plugin ------------------------------------------------------------------
class KubevirtDevicePlugin(pb_grpc.DevicePluginServicer):
    """One resource's kubelet API: its devices listed once (all healthy), Allocate as
    :func:`allocate` answers."""

    def __init__(
        self, name: str, gpus: Sequence[PassthroughGpu], host_dev_root: str, stop: threading.Event
    ) -> None:
        self.name = name
        self.gpus = tuple(gpus)
        self.host_dev_root = host_dev_root
        self.stop = stop

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(
            devices=[pb.Device(ID=g.address, health="Healthy") for g in self.gpus]
        )
        while context.is_active() and not self.stop.wait(1.0):
            pass

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            try:
                grant = allocate(self.name, self.gpus, ids, self.host_dev_root)
            except PassthroughError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise AssertionError("grpc context.abort returned") from exc
            say(f"allocated {', '.join(ids)} of {RESOURCE_PREFIX}/{self.name}")
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=dict(grant.envs),
                    devices=[
                        pb.DeviceSpec(container_path=c, host_path=h, permissions="mrw")
                        for c, h in grant.devices
                    ],
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class _Served:
    """One resource's server on ``kubevirt-<NAME>.sock`` in the kubelet's directory."""

    def __init__(self, plugin: KubevirtDevicePlugin, socket_dir: Path) -> None:
        self.plugin = plugin
        self.socket = socket_dir / f"kubevirt-{plugin.name}.sock"
        self.server: Any = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(self.plugin, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self.server = server

    def register(self, kubelet_socket: Path) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(  # type: ignore[no-untyped-call]
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=f"{RESOURCE_PREFIX}/{self.plugin.name}",
                ),
                timeout=REGISTER_TIMEOUT_S,
            )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()
            self.server = None
        self.socket.unlink(missing_ok=True)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def run_device_plugin(
    bus: PciBus,
    root: Path,
    socket_dir: Path,
    host_dev_root: str,
    stop: threading.Event | None = None,
    poll_s: float = 1.0,
) -> int:
    """Serve every resource of the GPUs on ``vfio-pci`` until ``stop``. The bus is read again
    at each poll (KubeVirt's plugin reads it once, after its init containers waited for the
    validator; here a GPU bound later is served too, whatever order the pods start in); a
    kubelet that restarts (a new ``kubelet.sock``) or removes a socket gets the servers again
    and registered."""
    stop = stop_on_signals(stop)
    say("KubeVirt GPU device plugin stand-in on the simulated PCI bus")
    kubelet = socket_dir / "kubelet.sock"
    served: dict[str, _Served] = {}
    seen: tuple[int, int] | None = None
    empty_said = False
    try:
        while True:
            wanted = by_name(vfio_gpus(bus, root))
            if not wanted and not empty_said:
                say(f"no NVIDIA GPU is bound to {VFIO_DRIVER}: nothing to advertise yet")
            empty_said = not wanted
            for name in [n for n, one in served.items() if one.plugin.gpus != wanted.get(n)]:
                served.pop(name).stop()
            for name, gpus in wanted.items():
                if name not in served:
                    served[name] = _Served(
                        KubevirtDevicePlugin(name, gpus, host_dev_root, stop), socket_dir
                    )
            now = _identity(kubelet)
            restarted = now is not None and now != seen
            for one in served.values():
                if restarted or one.server is None or not one.socket.exists():
                    now = now if _serve(one, kubelet) else None
            seen = now
            if stop.wait(poll_s):
                break
    finally:
        for one in served.values():
            one.stop()
    say("device plugin stopped")
    return 0


def _serve(one: _Served, kubelet: Path) -> bool:
    """(Re)start ``one`` and register it; False when the kubelet did not take it."""
    one.stop()
    one.start()
    try:
        one.register(kubelet)
    except grpc.RpcError as exc:
        say(f"registering {one.plugin.name} failed: {exc.code()}; trying again")
        return False
    names = ", ".join(g.address for g in one.plugin.gpus)
    say(f"advertising {RESOURCE_PREFIX}/{one.plugin.name}: {names}")
    return True
