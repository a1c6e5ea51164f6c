"""The stand-ins of a vm-passthrough node (VFIO manager, sandbox validator, KubeVirt's device
plugin) on a simulated PCI bus, through the product's PCI bus code and the stand-in kernel."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.dra.vfio import NVIDIA_DRIVER, VFIO_DRIVER, PassthroughError, pci_bus
from gpu_operator.cli import main
from gpu_operator.sim import sandbox
from gpu_operator.sim.pci import PciGpu, device_ids, lay_out_pci
from gpu_operator.sim.registration import register

A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"
GPUS = [
    PciGpu("00000000:07:00.0", A100),
    PciGpu("00000000:0F:00.0", A100),
    PciGpu("00000000:47:00.0", H100),
]
ADDRESSES = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    register()
    node = tmp_path / "node"
    lay_out_pci(node, GPUS)
    return node


def drivers(root: Path) -> dict[str, str]:
    devices = root / "sys/bus/pci/devices"
    return {a: os.path.basename(os.readlink(devices / a / "driver")) for a in ADDRESSES}


# -- names ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pci_ids", "name"),
    [
        ("GH100 [H100 SXM5 80GB]", "GH100_H100_SXM5_80GB"),
        ("GA100 [A100 SXM4 40GB]", "GA100_A100_SXM4_40GB"),
        ("TU104GL [Tesla T4]", "TU104GL_TESLA_T4"),
        ("GP100GL [Tesla P100 PCIe 12GB/16GB]", "GP100GL_TESLA_P100_PCIE_12GB_16GB"),
        ("GV100GL [Tesla V100S PCIe 32GB]", "GV100GL_TESLA_V100S_PCIE_32GB"),
        ("GA102GL [RTX A6000 1.5]", "GA102GL_RTX_A6000_1_5"),
    ],
)
def test_resource_names_are_kubevirts_spelling_of_the_pci_ids_name(pci_ids: str, name: str) -> None:
    assert sandbox.kubevirt_name(pci_ids) == name


def test_every_simulated_model_has_a_resource_name() -> None:
    names = {product: sandbox.device_name(i) for product, i in device_ids().items()}
    assert names[H100] == "GH100_H100_SXM5_80GB"
    assert names[A100] == "GA100_A100_SXM4_40GB"
    assert names["NVIDIA B200"] == "2901"  # not in the table: named by its id, as KubeVirt does
    assert sandbox.env_key("GH100_H100_SXM5_80GB") == "PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB"


# -- vfio-manage ------------------------------------------------------------------------------
def test_vfio_manage_binds_every_gpu_to_vfio_pci_and_back(root: Path) -> None:
    bus = pci_bus(root)
    assert sandbox.vfio_manage(bus, "bind", root / "dev") == ADDRESSES
    assert set(drivers(root).values()) == {VFIO_DRIVER}
    override = root / "sys/bus/pci/devices" / ADDRESSES[0] / "driver_override"
    assert override.read_text() == "vfio-pci\n"  # how vfio-pci takes a GPU it has no id for
    assert sandbox.vfio_manage(bus, "bind", root / "dev") == []  # already there
    assert sandbox.vfio_manage(bus, "unbind", root / "dev") == ADDRESSES
    assert set(drivers(root).values()) == {NVIDIA_DRIVER}
    assert override.read_text() == "\n"


def test_vfio_manage_fails_where_the_kernel_refuses(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU held by another driver is not taken from it; the stand-in says which and fails."""
    link = root / "sys/bus/pci/devices" / ADDRESSES[1] / "driver"
    link.unlink()
    link.symlink_to("../../drivers/nouveau")
    assert sandbox.run_vfio_manage(pci_bus(root), "bind", root / "dev") == 1
    out = capsys.readouterr().out
    assert f"{ADDRESSES[1]} is bound to 'nouveau'" in out, out
    assert all(line.startswith("SIMULATED") for line in out.splitlines()), out


def test_the_vfio_manage_command_acts_on_the_root_it_is_given(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "simulate-vfio-manager", "bind", "--all"]) == 2  # no root: refused
    assert main(["agent", "simulate-vfio-manager", "bind", "--all", "--pci-root", "/"]) == 2
    argv = ["agent", "simulate-vfio-manager", "bind", "--all", "--pci-root", str(root)]
    assert main(argv) == 0
    assert set(drivers(root).values()) == {VFIO_DRIVER}
    assert f"SIMULATED: {ADDRESSES[2]} bound to vfio-pci" in capsys.readouterr().out


# -- the sandbox validator --------------------------------------------------------------------
def test_the_validator_says_ready_once_every_gpu_is_on_vfio_pci(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "validations"
    bus = pci_bus(root)
    assert sandbox.run_validator("vfio-pci", "vm-passthrough", out, bus, wait=False) == 1
    assert (out / "workload-type").read_text() == "vm-passthrough\n"
    assert not (out / "vfio-pci-ready").exists()
    # With WITH_WAIT: ready as soon as the VFIO manager has bound them.
    done = threading.Event()
    codes: list[int] = []

    def validate() -> None:
        codes.append(
            sandbox.run_validator(
                "vfio-pci", "vm-passthrough", out, bus, wait=True, interval_s=0.05, stop=done
            )
        )

    waiting = threading.Thread(target=validate)
    waiting.start()
    sandbox.vfio_manage(bus, "bind", root / "dev")
    waiting.join(timeout=10)
    done.set()
    assert codes == [0]
    assert (out / "vfio-pci-ready").exists()


@pytest.mark.parametrize(
    ("component", "workload"),
    [("vfio-pci", "container"), ("vgpu-manager", "vm-passthrough"), ("vgpu-devices", "container")],
)
def test_the_validator_skips_what_the_workload_does_not_need(
    root: Path, tmp_path: Path, component: str, workload: str
) -> None:
    out = tmp_path / "validations"
    assert sandbox.run_validator(component, workload, out, pci_bus(root), wait=False) == 0
    assert (out / "workload-type").read_text() == f"{workload}\n"
    assert not (out / "vfio-pci-ready").exists()


def test_the_validator_command_reads_the_bus_for_the_vfio_pci_check_only(
    root: Path, tmp_path: Path
) -> None:
    """NVIDIA's vGPU checks' init containers mount no host root: no bus to read there."""
    out = tmp_path / "validations"
    base = ["agent", "simulate-sandbox-validator", "--output-dir", str(out), "--no-wait"]
    skip = [*base, "--component", "vgpu-devices", "--workload", "vm-passthrough"]
    assert main(skip) == 0
    assert (out / "workload-type").read_text() == "vm-passthrough\n"
    check = [*base, "--component", "vfio-pci", "--workload", "vm-passthrough"]
    assert main(check) == 2  # no bus given: refused
    sandbox.vfio_manage(pci_bus(root), "bind", root / "dev")
    assert main([*check, "--pci-root", str(root)]) == 0
    assert (out / "vfio-pci-ready").exists()


# -- KubeVirt's device plugin -----------------------------------------------------------------
def test_allocate_gives_the_vfio_nodes_and_the_addresses() -> None:
    gpus = [sandbox.PassthroughGpu(ADDRESSES[0], 0x20B0, "0"),
            sandbox.PassthroughGpu(ADDRESSES[1], 0x20B0, "1")]  # fmt: skip
    grant = sandbox.allocate("GA100_A100_SXM4_40GB", gpus, [ADDRESSES[1]], "/var/lib/node")
    assert grant.devices == (
        ("/dev/vfio/vfio", "/var/lib/node/dev/vfio/vfio"),
        ("/dev/vfio/1", "/var/lib/node/dev/vfio/1"),
    )
    assert grant.envs == {"PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB": ADDRESSES[1]}
    both = sandbox.allocate("GA100_A100_SXM4_40GB", gpus, ADDRESSES[:2])
    assert [c for c, _ in both.devices] == ["/dev/vfio/vfio", "/dev/vfio/0", "/dev/vfio/1"]
    assert both.devices[1] == ("/dev/vfio/0", "/dev/vfio/0")
    assert both.envs["PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB"] == ",".join(ADDRESSES[:2])
    with pytest.raises(PassthroughError, match=r"unknown device: 0000:47:00\.0"):
        sandbox.allocate("GA100_A100_SXM4_40GB", gpus, [ADDRESSES[2]])


@pytest.fixture
def kubelet() -> Iterator[LocalKubelet]:
    # A short directory: a Unix socket's path has at most 107 bytes.
    with (
        tempfile.TemporaryDirectory(prefix="kv", dir="/tmp") as short,
        LocalKubelet(Path(short)) as k,
    ):
        yield k


def test_the_device_plugin_advertises_each_pci_device_name_on_vfio_pci(
    root: Path, kubelet: LocalKubelet
) -> None:
    bus = pci_bus(root)
    sandbox.vfio_manage(bus, "bind", root / "dev")
    stop = threading.Event()
    plugin = threading.Thread(
        target=sandbox.run_device_plugin,
        args=(bus, root, kubelet.directory, "/node"),
        kwargs={"stop": stop, "poll_s": 0.05},
    )
    plugin.start()
    try:
        a100 = kubelet.wait_for_registration("nvidia.com/GA100_A100_SXM4_40GB")
        kubelet.wait_for_registration("nvidia.com/GH100_H100_SXM5_80GB")
        assert a100.endpoint == "kubevirt-GA100_A100_SXM4_40GB.sock"
        with kubelet.client("nvidia.com/GA100_A100_SXM4_40GB") as client:
            listed = next(client.list_and_watch(timeout_s=5))
            assert [d.ID for d in listed.devices] == ADDRESSES[:2]
            assert {d.health for d in listed.devices} == {"Healthy"}
            response = client.allocate([ADDRESSES[1]]).container_responses[0]
            assert dict(response.envs) == {
                "PCI_RESOURCE_NVIDIA_COM_GA100_A100_SXM4_40GB": ADDRESSES[1]
            }
            assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
                ("/dev/vfio/vfio", "/node/dev/vfio/vfio", "mrw"),
                ("/dev/vfio/1", "/node/dev/vfio/1", "mrw"),
            ]
            with pytest.raises(grpc.RpcError, match="unknown device"):
                client.allocate([ADDRESSES[2]])
        # A restarted kubelet (its socket anew, the plugins' gone) gets them registered again.
        seen = len(kubelet.registrations)
        kubelet.restart()
        kubelet.wait_for_registration("nvidia.com/GA100_A100_SXM4_40GB", after=seen)
    finally:
        stop.set()
        plugin.join(timeout=10)
    assert not list(kubelet.directory.glob("kubevirt-*.sock"))


def test_the_device_plugin_advertises_nothing_while_no_gpu_is_on_vfio_pci(
    root: Path, kubelet: LocalKubelet, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = threading.Event()
    stop.set()
    assert sandbox.run_device_plugin(pci_bus(root), root, kubelet.directory, "/", stop) == 0
    assert kubelet.registrations == []
    assert "nothing to advertise" in capsys.readouterr().out


def test_the_device_plugin_serves_gpus_bound_after_it_started(
    root: Path, kubelet: LocalKubelet
) -> None:
    bus = pci_bus(root)
    stop = threading.Event()
    plugin = threading.Thread(
        target=sandbox.run_device_plugin,
        args=(bus, root, kubelet.directory, "/"),
        kwargs={"stop": stop, "poll_s": 0.05},
    )
    plugin.start()
    try:
        sandbox.vfio_manage(bus, "bind", root / "dev")
        kubelet.wait_for_registration("nvidia.com/GH100_H100_SXM5_80GB")
    finally:
        stop.set()
        plugin.join(timeout=10)
