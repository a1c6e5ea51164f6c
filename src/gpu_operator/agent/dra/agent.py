"""``gpu-operator agent dra-plugin``: publish the node's pool and serve the kubelet.

Observe (the NVML inventory, this driver's slices of the node), decide (:func:`slices.plan`),
execute (server-side apply, delete): every ``interval`` seconds, so a MIG reconfiguration by the
MIG manager is published within seconds, with the pool generation bumped. The same publisher
serves simulated kwok nodes (:func:`gpu_operator.sim.dra.publish_simulated`), which have no
kubelet to serve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra import partitions, slices
from gpu_operator.agent.dra.health import taint_devices
from gpu_operator.agent.dra.mig_control import MigControl, MigDevices
from gpu_operator.agent.dra.mps import DaemonPod
from gpu_operator.agent.dra.mps_control import MpsControl
from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.dra.sharing import NvidiaSmi
from gpu_operator.agent.dra.vfio import PassthroughError, VfioControl, pci_bus
from gpu_operator.agent.driver_cdi import HostDriver, find_host_driver
from gpu_operator.agent.gpuhealth.state import GpuHealth
from gpu_operator.agent.inventory import Gpu, Inventory
from gpu_operator.agent.nvml import current_driver_root
from gpu_operator.api.dragates import Gates

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


def existing_slices(
    kube: Kube, node: str, driver: str = dra_devices.DRIVER
) -> list[dict[str, Any]]:
    """``driver``'s slices of ``node`` (the GPUs' by default)."""
    return kube.list_objects("ResourceSlice", field_selector=slices.field_selector(node, driver))


def node_owner(kube: Kube, node: str) -> dict[str, str] | None:
    obj = kube.get("Node", node)
    return {"name": node, "uid": obj["metadata"]["uid"]} if obj else None


def execute(kube: Kube, plan: slices.SlicePlan) -> None:
    for obj in plan.apply:
        kube.apply(obj)
    for name in plan.delete:
        kube.delete("ResourceSlice", name)


@dataclass(frozen=True)
class Pool:
    """What a node publishes: its devices and, under DynamicMIG, the counter sets they consume,
    in slices of the ``shape`` the API server wants (:mod:`.slices`)."""

    devices: list[dict[str, Any]]
    counter_sets: list[dict[str, Any]] = field(default_factory=list)
    shape: str = slices.CHUNKS


@dataclass
class Passthrough:
    """What PassthroughSupport publishes from: the PCI bus, the GPUs NVML has shown (one on
    ``vfio-pci`` is no longer in NVML's inventory but still published as its VFIO device), and
    the GPUs claims hold on ``vfio-pci``."""

    control: VfioControl
    held: Callable[[], list[str]]
    seen: dict[str, Gpu] = field(default_factory=dict)

    def gpus(self, inventory: Inventory) -> list[dra_devices.VfioGpu]:
        self.seen.update({dra_devices.bus_id(g.pci_bus_id): g for g in inventory.gpus})
        return dra_devices.vfio_gpus(self.seen.values(), self.control.bus.nvidia_functions())


def pool_of(
    inventory: Inventory, dynamic_shape: str | None = None, passthrough: Passthrough | None = None
) -> Pool:
    """The node's pool: its devices as they are (with PassthroughSupport, each GPU's VFIO device
    too), or (with the DynamicMIG slice shape) every partition they could be cut into."""
    if passthrough is not None:
        vfio = passthrough.gpus(inventory)
        held = passthrough.held()
        iommufd = passthrough.control.bus.iommufd()
        return Pool(dra_devices.devices(inventory, vfio, held, iommufd))
    if dynamic_shape is None:
        return Pool(dra_devices.devices(inventory))
    devices, counter_sets = partitions.pool(inventory)
    return Pool(devices, counter_sets, dynamic_shape)


def publish(
    kube: Kube,
    node: str,
    inventory: Inventory,
    owner: Mapping[str, str] | None = None,
    existing: list[dict[str, Any]] | None = None,
    pool: Pool | None = None,
) -> slices.SlicePlan:
    """One observe-decide-execute pass for ``node``; the plan says what was written.
    ``pool``: the inventory's, already computed (tainted by health)."""
    current = existing_slices(kube, node) if existing is None else existing
    wanted = pool_of(inventory) if pool is None else pool
    plan = slices.plan(node, current, wanted.devices, owner, wanted.counter_sets, wanted.shape)
    execute(kube, plan)
    if plan.writes:
        log.info("published %s generation %d (%d writes)", node, plan.generation, plan.writes)
    return plan


def same_pool(published: list[dict[str, Any]], pool: Pool) -> bool:
    """Whether ``published`` slices already carry exactly ``pool``."""
    wanted = slices.desired_slices("", pool.devices, 0, None, pool.counter_sets, pool.shape)
    return slices.published_devices(published) == slices.published_devices(wanted)


@dataclass
class PluginOptions:
    node: str
    paths: PluginPaths
    interval_s: float = 2.0
    serve_kubelet: bool = True
    resync_s: float = 300.0  # re-read the node's slices this often even when nothing changed
    gates: Gates = field(default_factory=Gates.defaults)  # what claims' configs may ask for
    namespace: str = ""  # where claims' MPS control daemons run (the plugin's own)
    image: str = ""  # what they run (the plugin's own image)
    pull_policy: str = "IfNotPresent"
    pci_root: str = "/"  # where the host's /sys and /dev are (PassthroughSupport)


def find_driver(paths: PluginPaths) -> HostDriver:
    """The driver prepared claims hand to containers: found where this container has the
    driver root (where NVML is loaded from), named by its host paths."""
    driver, missing = find_host_driver(
        current_driver_root(), paths.host_driver_root, paths.dev_root
    )
    if missing is not None:
        log.warning("claims' CDI specs carry no driver files: %s", missing)
    return driver


def _mps_control(
    kube: Kube, options: PluginOptions, driver: Callable[[], HostDriver]
) -> MpsControl:
    def pod() -> DaemonPod:
        return DaemonPod(
            node=options.node,
            namespace=options.namespace,
            image=options.image,
            host_driver_root=driver().host_root,
            pull_policy=options.pull_policy,
        )

    return MpsControl(kube, options.paths.plugin_dir, pod, lambda: NvidiaSmi(driver()))


def run(
    kube: Kube,
    read_inventory: Callable[[], Inventory],
    options: PluginOptions,
    stop: threading.Event,
    health: Callable[[], Mapping[str, GpuHealth]] | None = None,
    nvml: MigDevices | None = None,
) -> int:
    """Serve the kubelet (unless told not to) and keep the pool published until ``stop``;
    with ``health`` (the GPUs' health now), unhealthy GPUs' devices are published tainted.
    With DynamicMIG, ``nvml`` creates and destroys claims' MIG devices."""
    latest: dict[str, Inventory] = {"inventory": read_inventory()}
    dynamic_mig = options.gates.on("DynamicMIG")
    mig = None
    if dynamic_mig:
        if nvml is None:
            raise ValueError("DynamicMIG needs the NVML session that creates MIG devices")
        mig = MigControl(nvml)
    shape = slices.dynamic_layout(kube.server_version()) if dynamic_mig else None
    vfio = None
    if options.gates.on("PassthroughSupport"):
        root = Path(options.pci_root)
        bus = pci_bus(root)
        if not bus.iommu_enabled():  # as NVIDIA's plugin, which will not start without it
            raise PassthroughError(
                f"PassthroughSupport needs the IOMMU on: {root / 'sys/kernel/iommu_groups'} "
                "has no groups (boot with intel_iommu=on or amd_iommu=on)"
            )
        vfio = VfioControl(bus, root / "dev")
    passthrough: Passthrough | None = None

    def refs() -> Mapping[str, dra_devices.DeviceRef]:
        if dynamic_mig:
            return partitions.refs_by_name(latest["inventory"])
        if passthrough is not None:
            inventory = latest["inventory"]
            return dra_devices.refs_by_name(
                inventory, passthrough.gpus(inventory), passthrough.held()
            )
        return dra_devices.refs_by_name(latest["inventory"])

    def read_claim(namespace: str, name: str) -> Mapping[str, Any] | None:
        return kube.get("ResourceClaim", name, namespace)

    def driver() -> HostDriver:
        return find_driver(options.paths)

    plugin = DraPlugin(
        options.node,
        options.paths,
        refs,
        read_claim,
        driver,
        options.gates,
        mps=_mps_control(kube, options, driver) if options.gates.on("MPSSupport") else None,
        mig=mig,
        vfio=vfio,
    )
    if vfio is not None:
        passthrough = Passthrough(vfio, plugin.held_vfio)
    if options.serve_kubelet:
        try:  # before the kubelet can send a claim
            plugin.restore_time_slices()
            plugin.restore_mps()
            plugin.restore_migs()
            plugin.restore_vfio()
        except (PrepareError, PassthroughError) as exc:  # claims will say so too
            log.error("putting GPU settings back on free GPUs: %s", exc)
        latest["inventory"] = read_inventory()  # what putting back changed
        plugin.start()
    owner = node_owner(kube, options.node)
    published: list[dict[str, Any]] | None = None  # what the last pass left on the server
    resync_at = 0.0
    registered = 0  # the kubelet's successful registrations of this plugin seen so far
    try:
        while True:
            pool = pool_of(latest["inventory"], shape, passthrough)
            if health is not None:
                pool = replace(pool, devices=taint_devices(pool.devices, health()))
            now = time.monotonic()
            # The kubelet deletes a driver's slices on its node 30 s after the driver went
            # away, and all of them when it starts: a (re)registration may follow such a wipe,
            # so the slices are read and published again at once rather than at the resync.
            accepted = sum(1 for ok, _ in plugin.registrations.statuses if ok)
            if accepted > registered:
                registered, resync_at = accepted, now
            if published is None or now >= resync_at or not same_pool(published, pool):
                try:
                    # Read the slices only when the devices changed (or to resync): at 1,000
                    # nodes a list every pass would be hundreds of requests a second.
                    existing = None if published is None or now >= resync_at else published
                    plan = publish(kube, options.node, latest["inventory"], owner, existing, pool)
                    published = list(plan.apply) if plan.apply else published
                    if published is None or now >= resync_at:
                        published = existing_slices(kube, options.node)
                        resync_at = now + options.resync_s
                except Exception:  # the API server restarts; next pass reads again
                    log.exception("publishing the ResourceSlices of %s", options.node)
                    published = None
            if stop.wait(options.interval_s):
                return 0
            try:
                latest["inventory"] = read_inventory()
            except Exception:  # NVML hiccup: keep publishing what was last read
                log.exception("reading the GPU inventory")
    finally:
        if options.serve_kubelet:
            plugin.stop()
