"""GPU passthrough (PassthroughSupport) on the simulated node's PCI bus: the sysfs the sim lays
out, its stand-in kernel, the plugin's bind/unbind through :class:`PciBus`, the devices it
publishes and Prepare/Unprepare of a ``gpu-vfio-<index>`` claim, as NVIDIA's driver does them."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.dra import agent as dra_agent
from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra.devices import DRIVER
from gpu_operator.agent.dra.prepare import PrepareError, spec_file_name
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.dra.vfio import (
    NVIDIA_DRIVER,
    VFIO_DRIVER,
    PassthroughError,
    SysfsPciBus,
    VfioBinding,
    VfioControl,
    holders,
    pci_bus,
    register_pci_bus,
    vfio_uuid,
)
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DeviceNodes
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.api.draconfig import GROUP_VERSION
from gpu_operator.api.dragates import Gates, resolve
from gpu_operator.sim import registration
from gpu_operator.sim.pci import PciGpu, SimulatedPciBus, apply_writes, lay_out_pci
from tests.unit.agent.conftest import Simulate

NODE = "node-a"
PASSTHROUGH = resolve({"PassthroughSupport": True})


@pytest.fixture
def inventory(simulate: Simulate) -> Inventory:
    simulate("a100-40gb:2")
    with Nvml() as nvml:
        return nvml.inventory()


@pytest.fixture
def root(tmp_path: Path, inventory: Inventory) -> Path:
    node = tmp_path / "node"
    lay_out_pci(node, [PciGpu(g.pci_bus_id, g.name) for g in inventory.gpus])
    for gpu in inventory.gpus:
        (node / "dev" / f"nvidia{gpu.minor_number}").touch()
    return node


def addresses(inventory: Inventory) -> list[str]:
    return sorted(dra_devices.bus_id(g.pci_bus_id) for g in inventory.gpus)


# -- the simulated sysfs and its kernel ----------------------------------------------------------
def test_the_sim_lays_out_each_gpus_pci_function_bound_to_nvidia(
    root: Path, inventory: Inventory
) -> None:
    first = addresses(inventory)[0]
    device = root / "sys/bus/pci/devices" / first
    assert (device / "vendor").read_text() == "0x10de\n"
    assert (device / "device").read_text() == "0x20b0\n"  # A100-SXM4-40GB's, from its profile
    assert os.readlink(device / "driver") == "../../drivers/nvidia"
    assert os.readlink(device / "iommu_group") == "../../../../kernel/iommu_groups/0"
    assert (root / "dev/vfio/0").exists() and (root / "dev/vfio/vfio").exists()
    assert not (root / "dev/iommu").exists()
    bus = pci_bus(root)
    assert isinstance(bus, SimulatedPciBus)
    assert bus.nvidia_functions() == addresses(inventory)
    assert [bus.iommu_group(a) for a in addresses(inventory)] == ["0", "1"]


def test_the_stand_in_kernel_refuses_what_the_kernel_refuses(root: Path) -> None:
    bus = SysfsPciBus(root)  # writes only, applied by hand here
    address = bus.nvidia_functions()[0]
    (root / "sys/bus/pci/drivers/vfio-pci/bind").write_text(address)
    with pytest.raises(PassthroughError, match="already bound to nvidia"):
        apply_writes(root)
    bus.unbind(address)
    apply_writes(root)
    assert bus.driver_of(address) == ""
    (root / "sys/bus/pci/drivers/vfio-pci/bind").write_text(address)
    with pytest.raises(PassthroughError, match="no override"):
        apply_writes(root)  # vfio-pci has no id table entry for a GPU
    bus.bind(address, VFIO_DRIVER)  # driver_override first, as on a real kernel
    apply_writes(root)
    assert bus.driver_of(address) == VFIO_DRIVER


def test_the_iommu_is_on_where_the_kernel_has_groups(root: Path, tmp_path: Path) -> None:
    assert pci_bus(root).iommu_enabled()
    assert not SysfsPciBus(tmp_path / "no-iommu").iommu_enabled()


def test_a_simulated_root_needs_the_simulation_registered(root: Path) -> None:
    register_pci_bus(None)
    try:
        with pytest.raises(PassthroughError, match="registered no simulation"):
            pci_bus(root)
    finally:
        registration.register()
    assert isinstance(pci_bus(root.parent), SysfsPciBus)  # no marker: the kernel's sysfs


def test_device_ids_come_from_the_models_profiles(tmp_path: Path) -> None:
    gpus = [
        PciGpu("00000000:1A:00.0", "NVIDIA H100 80GB HBM3"),
        PciGpu("00000000:3B:00.0", "Tesla T4"),
    ]
    created = lay_out_pci(tmp_path, gpus)
    assert "sys/bus/pci/devices/0000:1a:00.0/device" in created
    devices = tmp_path / "sys/bus/pci/devices"
    assert (devices / "0000:1a:00.0/device").read_text() == "0x2330\n"
    assert (devices / "0000:3b:00.0/device").read_text() == "0x1eb8\n"
    with pytest.raises(PassthroughError, match="no PCI device id"):
        lay_out_pci(tmp_path, [PciGpu("00000000:5E:00.0", "Unknown GPU")])


# -- binding -----------------------------------------------------------------------------------
def test_to_vfio_and_back_and_again_is_the_same(root: Path, inventory: Inventory) -> None:
    control = VfioControl(pci_bus(root), root / "dev", busy=lambda minor: [])
    address = addresses(inventory)[1]
    wanted = VfioBinding(address, "", 1)
    bound = control.to_vfio(wanted)
    assert bound.group == "1" and control.bus.driver_of(address) == VFIO_DRIVER
    assert control.to_vfio(wanted) == bound  # a retry: nothing to do, the same answer
    control.to_nvidia(address)
    assert control.bus.driver_of(address) == NVIDIA_DRIVER
    assert (root / "sys/bus/pci/devices" / address / "driver_override").read_text() == "\n"
    control.to_nvidia(address)  # already back


def test_a_gpu_in_use_is_not_handed_to_vfio(root: Path, inventory: Inventory) -> None:
    control = VfioControl(pci_bus(root), root / "dev")  # the real check: open file descriptors
    address = addresses(inventory)[0]
    minor = next(
        g.minor_number for g in inventory.gpus if dra_devices.bus_id(g.pci_bus_id) == address
    )
    with (root / "dev" / f"nvidia{minor}").open():
        assert holders(root / "dev" / f"nvidia{minor}") == [os.getpid()]
        with pytest.raises(PassthroughError, match=f"in use by process\\(es\\) {os.getpid()}"):
            control.to_vfio(VfioBinding(address, "", minor))
    assert control.bus.driver_of(address) == NVIDIA_DRIVER
    assert control.to_vfio(VfioBinding(address, "", minor)).group == "0"


def test_release_unheld_binds_back_only_what_no_claim_holds(
    root: Path, inventory: Inventory
) -> None:
    control = VfioControl(pci_bus(root), root / "dev", busy=lambda minor: [])
    first, second = addresses(inventory)
    control.to_vfio(VfioBinding(first, "", 0))
    control.to_vfio(VfioBinding(second, "", 1))
    assert control.release_unheld([second]) == [first]
    assert [control.bus.driver_of(a) for a in (first, second)] == [NVIDIA_DRIVER, VFIO_DRIVER]


# -- devices -----------------------------------------------------------------------------------
def test_each_gpu_publishes_nvidias_vfio_device(inventory: Inventory) -> None:
    vfio = dra_devices.vfio_gpus(inventory.gpus)
    published = dra_devices.devices(inventory, vfio, iommufd=False)
    names = [d["name"] for d in published]
    assert names == ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
    device = published[2]
    address = addresses(inventory)[0]
    attributes = device["attributes"]
    assert attributes["type"] == {"string": "vfio"}
    assert attributes["uuid"] == {"string": str(uuid.uuid5(uuid.NAMESPACE_DNS, address))}
    assert attributes["deviceID"] == {"string": "0x20b0"}
    assert attributes["vendorID"] == {"string": "0x10de"}
    assert attributes["iommuFDEnabled"] == {"bool": False}
    assert attributes["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": address}
    assert vfio_uuid(address) == attributes["uuid"]["string"]


def test_a_held_gpu_publishes_its_vfio_device_only(inventory: Inventory) -> None:
    vfio = dra_devices.vfio_gpus(inventory.gpus)
    held = vfio[1]
    names = [d["name"] for d in dra_devices.devices(inventory, vfio, [held.address])]
    assert names == [f"gpu-{1 - held.gpu.minor_number}", "gpu-vfio-0", "gpu-vfio-1"]
    refs = dra_devices.refs_by_name(inventory, vfio, [held.address])
    assert f"gpu-{held.gpu.minor_number}" not in refs
    assert refs["gpu-vfio-1"].vfio == held.address and refs["gpu-vfio-1"].kind == "vfio"


def test_a_gpu_nvml_no_longer_sees_keeps_the_others_indexes(inventory: Inventory) -> None:
    gone = addresses(inventory)[0]
    left = [g for g in inventory.gpus if dra_devices.bus_id(g.pci_bus_id) != gone]
    vfio = dra_devices.vfio_gpus(left, addresses(inventory))
    assert [(v.name, v.address) for v in vfio] == [("gpu-vfio-1", addresses(inventory)[1])]


# -- Prepare and Unprepare -----------------------------------------------------------------------
def vfio_claim(uid: str, device: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    config = []
    if parameters is not None:
        config = [
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": GROUP_VERSION,
                        "kind": "VfioDeviceConfig",
                        **parameters,
                    },
                },
            }
        ]
    return {
        "metadata": {"namespace": "vm", "name": f"claim-{uid}", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ],
                    "config": config,
                }
            }
        },
    }


class Node:
    """A plugin on the simulated node at ``root``, its claims, and what it would publish."""

    def __init__(self, tmp_path: Path, root: Path, inventory: Inventory, gates: Gates) -> None:
        self.root = root
        self.inventory = inventory
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.paths = PluginPaths(
            plugin_dir=tmp_path / "plugins" / DRIVER,
            registry_dir=tmp_path / "registry",
            cdi_dir=tmp_path / "cdi",
        )
        self.gates = gates
        self.plugin = self.start()

    def start(self) -> DraPlugin:
        control = VfioControl(pci_bus(self.root), self.root / "dev")
        plugin = DraPlugin(
            NODE,
            self.paths,
            lambda: dra_devices.refs_by_name(self.inventory, self.vfio(), plugin.held_vfio()),
            lambda ns, name: self.claims.get((ns, name)),
            self.driver,
            self.gates,
            vfio=control,
        )
        self.passthrough = dra_agent.Passthrough(control, plugin.held_vfio)
        return plugin

    def vfio(self) -> list[dra_devices.VfioGpu]:
        return dra_devices.vfio_gpus(self.inventory.gpus)

    def driver(self) -> HostDriver:
        return HostDriver(None, DeviceNodes("/", {}, (), ()), "/", str(self.root))

    def add(self, claim: dict[str, Any]) -> str:
        meta = claim["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = claim
        return str(meta["uid"])

    def published(self) -> list[str]:
        pool = dra_agent.pool_of(self.inventory, None, self.passthrough)
        return [str(d["name"]) for d in pool.devices]

    def spec(self, uid: str) -> dict[str, Any]:
        return dict(json.loads((self.paths.cdi_dir / spec_file_name(uid)).read_text()))


@pytest.fixture
def node(tmp_path: Path, root: Path, inventory: Inventory) -> Iterator[Node]:
    yield Node(tmp_path, root, inventory, PASSTHROUGH)


def test_prepare_binds_to_vfio_gives_the_group_and_drops_the_sibling_until_unprepare(
    node: Node,
) -> None:
    vfio = node.vfio()[0]
    minor = vfio.gpu.minor_number
    assert node.published() == ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
    uid = node.add(vfio_claim("u1", "gpu-vfio-0"))
    (prepared,) = node.plugin.prepare("vm", "claim-u1", uid)
    assert prepared.vfio is not None and prepared.vfio.group == "0"
    assert node.passthrough.control.bus.driver_of(vfio.address) == VFIO_DRIVER
    spec = node.spec(uid)
    (device,) = spec["devices"]
    host = str(node.root)
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/0", "hostPath": f"{host}/dev/vfio/0"}
    ]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/vfio/vfio", "hostPath": f"{host}/dev/vfio/vfio"}],
    }
    assert node.published() == [f"gpu-{1 - minor}", "gpu-vfio-0", "gpu-vfio-1"]
    # a retry (or a restarted plugin) gives the same answer and binds nothing again
    assert node.plugin.prepare("vm", "claim-u1", uid) == (prepared,)
    node.plugin.unprepare(uid)
    assert node.passthrough.control.bus.driver_of(vfio.address) == NVIDIA_DRIVER
    assert not (node.paths.cdi_dir / spec_file_name(uid)).exists()
    assert node.published() == ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]


def test_prepare_is_refused_while_a_process_holds_the_gpu(node: Node) -> None:
    vfio = node.vfio()[0]
    uid = node.add(vfio_claim("u1", "gpu-vfio-0"))
    node_file = node.root / "dev" / f"nvidia{vfio.gpu.minor_number}"
    with node_file.open(), pytest.raises(PrepareError, match="in use by process"):
        node.plugin.prepare("vm", "claim-u1", uid)
    assert node.passthrough.control.bus.driver_of(vfio.address) == NVIDIA_DRIVER
    assert node.plugin.checkpoint.get(uid) is None
    assert node.plugin.prepare("vm", "claim-u1", uid)[0].vfio is not None  # the retry


def test_a_gpu_another_claim_holds_is_not_handed_to_vfio(node: Node) -> None:
    vfio = node.vfio()[0]
    uid = node.add(vfio_claim("u1", f"gpu-{vfio.gpu.minor_number}"))
    node.plugin.prepare("vm", "claim-u1", uid)
    other = node.add(vfio_claim("u2", "gpu-vfio-0"))
    with pytest.raises(PrepareError, match="in use by another prepared claim"):
        node.plugin.prepare("vm", "claim-u2", other)
    assert node.passthrough.control.bus.driver_of(vfio.address) == NVIDIA_DRIVER


def test_iommufd_and_the_api_device_as_the_config_asks(node: Node) -> None:
    (node.root / "dev/iommu").touch()
    address = node.vfio()[1].address
    cdev = node.root / "sys/bus/pci/devices" / address / "vfio-dev" / "vfio7"
    cdev.mkdir(parents=True)
    config = {"iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": True}}
    uid = node.add(vfio_claim("u1", "gpu-vfio-1", config))
    node.plugin.prepare("vm", "claim-u1", uid)
    spec = node.spec(uid)
    host = str(node.root)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/devices/vfio7", "hostPath": f"{host}/dev/vfio/devices/vfio7"}
    ]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        "/dev/vfio/vfio",
        "/dev/iommu",
    ]
    assert dra_agent.pool_of(node.inventory, None, node.passthrough).devices[-1]["attributes"][
        "iommuFDEnabled"
    ] == {"bool": True}


def test_a_sharing_config_for_a_vfio_device_is_refused(node: Node) -> None:
    claim = vfio_claim("u1", "gpu-vfio-0")
    claim["status"]["allocation"]["devices"]["config"] = [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": GROUP_VERSION, "kind": "GpuConfig"},
            },
        }
    ]
    uid = node.add(claim)
    with pytest.raises(PrepareError, match="cannot configure request 'gpu'"):
        node.plugin.prepare("vm", "claim-u1", uid)


def test_without_the_gate_a_vfio_device_is_never_published(inventory: Inventory) -> None:
    assert "gpu-vfio-0" not in [d["name"] for d in dra_agent.pool_of(inventory).devices]
    assert "gpu-vfio-0" not in dra_devices.refs_by_name(inventory)


def test_a_restart_binds_back_what_no_checkpointed_claim_holds(tmp_path: Path, node: Node) -> None:
    first, second = (v.address for v in node.vfio())
    uid = node.add(vfio_claim("u1", "gpu-vfio-1"))
    node.plugin.prepare("vm", "claim-u1", uid)
    # a plugin killed after binding, before checkpointing its claim
    node.passthrough.control.to_vfio(VfioBinding(first, "", 0))
    restarted = Node(tmp_path, node.root, node.inventory, PASSTHROUGH)
    assert restarted.plugin.restore_vfio() == [first]
    bus = restarted.passthrough.control.bus
    assert (bus.driver_of(first), bus.driver_of(second)) == (NVIDIA_DRIVER, VFIO_DRIVER)
    assert Gates.defaults().on("PassthroughSupport") is False
