"""GetPreferredAllocation and Allocate answers (pure): topology-aware choices, every device list
strategy, MPS, failRequestsGreaterThanOne, and the CDI spec containerd reads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_operator.agent.deviceplugin import cdi
from gpu_operator.agent.deviceplugin.allocation import (
    AllocationError,
    ContainerAllocation,
    DeviceNode,
    Mount,
    container_allocation,
    preferred_allocation,
)
from gpu_operator.agent.deviceplugin.config_file import Replicated, Sharing
from gpu_operator.agent.deviceplugin.resources import Device, MigPart
from gpu_operator.agent.deviceplugin.settings import PluginSettings
from gpu_operator.agent.deviceplugin.topology import Locality, pci_root, read_locality
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.agent.driverroot import DeviceNodes


def gpu(index: int) -> Device:
    return Device(
        id=f"GPU-{index}",
        uuid=f"GPU-{index}",
        index=str(index),
        gpu_uuid=f"GPU-{index}",
        gpu_index=index,
        minor=index,
        pci_bus_id=f"00000000:{index:02X}:00.0",
        memory_mib=40960,
    )


def replicas(device: Device, count: int) -> list[Device]:
    return [
        replace(device, id=f"{device.uuid}::{n}", replica=n, replicas=count) for n in range(count)
    ]


def mig(parent: Device, position: int, gi: int) -> Device:
    return replace(
        parent,
        id=f"MIG-{parent.gpu_index}-{position}",
        uuid=f"MIG-{parent.gpu_index}-{position}",
        index=f"{parent.gpu_index}:{position}",
        mig=MigPart(gi, 0, "1g.5gb"),
        memory_mib=4864,
    )


EIGHT = [gpu(i) for i in range(8)]
# A two-socket machine: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, pairs behind one root port each
DGX = {f"GPU-{i}": Locality(i // 4, f"pci0000:{i // 4:02x}/root{i // 2}") for i in range(8)}
ALL = [d.id for d in EIGHT]


@pytest.mark.parametrize(
    ("available", "required", "size", "expected"),
    [
        (ALL, [], 2, ["GPU-0", "GPU-1"]),
        (ALL, [], 4, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]),
        # GPU 0 gone: a pair stays whole, the 1 request takes the lone GPU 1 (best fit)
        (ALL[1:], [], 1, ["GPU-1"]),
        (ALL[1:], [], 2, ["GPU-2", "GPU-3"]),
        # 3 fit NUMA 0 exactly (GPUs 1-3): they beat the 4 of NUMA 1
        (ALL[1:], [], 3, ["GPU-2", "GPU-3", "GPU-1"]),
        # required GPU 5: its root-port sibling first, then its NUMA node
        (ALL, ["GPU-5"], 2, ["GPU-5", "GPU-4"]),
        (ALL, ["GPU-5"], 3, ["GPU-5", "GPU-4", "GPU-6"]),
        # nothing on one NUMA node is enough: spill over from the fuller one
        (["GPU-0", "GPU-4", "GPU-5", "GPU-6"], [], 4, ["GPU-4", "GPU-5", "GPU-6", "GPU-0"]),
        (ALL, ["GPU-1", "GPU-2"], 2, ["GPU-1", "GPU-2"]),
    ],
)
def test_preferred_allocation_keeps_requests_close(
    available: list[str], required: list[str], size: int, expected: list[str]
) -> None:
    assert preferred_allocation(EIGHT, DGX, available, required, size) == expected


def test_unknown_locality_is_index_order() -> None:
    assert preferred_allocation(EIGHT, {}, ALL[::-1], [], 3) == ["GPU-0", "GPU-1", "GPU-2"]


def test_mig_devices_of_one_gpu_go_together() -> None:
    devices = [mig(gpu(0), 0, 7), mig(gpu(1), 0, 7), mig(gpu(0), 1, 8), mig(gpu(1), 1, 8)]
    assert preferred_allocation(devices, {}, [d.id for d in devices], ["MIG-1-0"], 2) == [
        "MIG-1-0",
        "MIG-1-1",
    ]


def test_replicas_spread_over_the_least_used_gpus() -> None:
    devices = replicas(gpu(0), 4) + replicas(gpu(1), 4) + replicas(gpu(2), 4)
    # GPU 0 has 3 replicas in use, GPU 1 one, GPU 2 none
    available = ["GPU-0::3", "GPU-1::1", "GPU-1::2", "GPU-1::3"] + [f"GPU-2::{n}" for n in range(4)]
    assert preferred_allocation(devices, {}, available, [], 3) == [
        "GPU-2::0",
        "GPU-1::1",
        "GPU-2::1",
    ]


@pytest.mark.parametrize(
    ("available", "required", "size", "message"),
    [
        (["GPU-0"], [], 2, "not enough available devices: 2 requested, 1 available"),
        (["GPU-9"], [], 1, "unknown devices GPU-9"),
    ],
)
def test_preferred_allocation_refusals(
    available: list[str], required: list[str], size: int, message: str
) -> None:
    with pytest.raises(AllocationError, match=message):
        preferred_allocation(EIGHT, {}, available, required, size)


# -- Allocate -----------------------------------------------------------------------------------
DEFAULTS = PluginSettings()
UNSHARED = Sharing()


def allocate(
    request: list[str],
    settings: PluginSettings = DEFAULTS,
    sharing: Sharing = UNSHARED,
    devices: list[Device] = EIGHT,
    driver: HostDriver | None = None,
    resource: str = "nvidia.com/gpu",
) -> ContainerAllocation:
    return container_allocation(
        resource, devices, request, settings, sharing, response_id="r1", driver=driver
    )


def driver_with(present: set[str], host_dev_root: str = "/") -> HostDriver:
    """A driver without files whose device nodes are ``present`` (container paths)."""
    gpus = {int(p.removeprefix("/dev/nvidia")): p for p in present if p[11:].isdigit()}
    control = tuple(sorted(p for p in present if p not in gpus.values() and "caps" not in p))
    caps = tuple(sorted(p for p in present if "caps" in p))
    devices = DeviceNodes(host_dev_root, gpus, control, caps)
    return HostDriver(None, devices, host_root=host_dev_root, host_dev_root=host_dev_root)


def test_envvar_strategy_lists_the_uuids() -> None:
    assert allocate(["GPU-3", "GPU-1"]) == ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-3,GPU-1"}
    )


def test_index_strategy_lists_indexes() -> None:
    devices = [*EIGHT, mig(gpu(2), 1, 9)]
    got = allocate(
        ["GPU-3", "MIG-2-1"], PluginSettings(device_id_strategy="index"), devices=devices
    )
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "3,2:1"}


def test_volume_mounts_strategy() -> None:
    got = allocate(["GPU-0", "GPU-5"], PluginSettings(device_list_strategies=("volume-mounts",)))
    assert got == ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
        mounts=(
            Mount("/var/run/nvidia-container-devices/GPU-0", "/dev/null"),
            Mount("/var/run/nvidia-container-devices/GPU-5", "/dev/null"),
        ),
    )


def test_cdi_annotations_strategy() -> None:
    settings = PluginSettings(device_list_strategies=("cdi-annotations",))
    assert allocate(["GPU-2", "GPU-4"], settings) == ContainerAllocation(
        annotations={
            "cdi.k8s.io/nvidia-device-plugin_r1": (
                "k8s.device-plugin.nvidia.com/gpu=GPU-2,k8s.device-plugin.nvidia.com/gpu=GPU-4"
            )
        }
    )


def test_cdi_cri_with_envvar_gives_both() -> None:
    settings = PluginSettings(device_list_strategies=("cdi-cri", "envvar"))
    assert allocate(["GPU-2", "GPU-4"], settings) == ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-2,GPU-4"},
        cdi_devices=(
            "k8s.device-plugin.nvidia.com/gpu=GPU-2",
            "k8s.device-plugin.nvidia.com/gpu=GPU-4",
        ),
    )


def test_device_specs_only_for_nodes_that_exist() -> None:
    settings = PluginSettings(pass_device_specs=True)
    driver = driver_with({"/dev/nvidiactl", "/dev/nvidia1"}, "/run/nvidia/driver")
    got = allocate(["GPU-1", "GPU-2"], settings, driver=driver)
    assert got.device_nodes == (
        DeviceNode("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl"),
        DeviceNode("/dev/nvidia1", "/run/nvidia/driver/dev/nvidia1"),
    )


def test_replicas_map_back_to_their_gpu() -> None:
    devices = replicas(gpu(0), 4) + replicas(gpu(1), 4)
    sharing = Sharing("time-slicing", (Replicated("nvidia.com/gpu", 4),))
    got = allocate(["GPU-0::1", "GPU-0::3", "GPU-1::0"], sharing=sharing, devices=devices)
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-0,GPU-1"}


@pytest.mark.parametrize(("strategy", "section"), [("time-slicing", "timeSlicing"), ("mps", "mps")])
def test_fail_requests_greater_than_one(strategy: str, section: str) -> None:
    devices = replicas(gpu(0), 4)
    sharing = Sharing(strategy, (Replicated("nvidia.com/gpu", 4),), True)  # type: ignore[arg-type]
    with pytest.raises(AllocationError) as error:
        allocate(["GPU-0::0", "GPU-0::1"], sharing=sharing, devices=devices)
    assert str(error.value) == (
        "request for 'nvidia.com/gpu: 2' too large: maximum request size for shared resources "
        f"is 1 (sharing.{section}.failRequestsGreaterThanOne)"
    )
    assert allocate(["GPU-0::2"], sharing=sharing, devices=devices).envs


def test_unknown_device_is_refused() -> None:
    with pytest.raises(AllocationError, match="unknown device: GPU-42"):
        allocate(["GPU-42"])


def test_mps_gives_the_pipe_and_shm_of_the_resource() -> None:
    devices = replicas(gpu(0), 2)
    sharing = Sharing("mps", (Replicated("nvidia.com/gpu", 2, "nvidia.com/gpu.shared"),), True)
    got = allocate(["GPU-0::1"], sharing=sharing, devices=devices, resource="nvidia.com/gpu.shared")
    assert got == ContainerAllocation(
        envs={
            "CUDA_MPS_PIPE_DIRECTORY": "/mps/nvidia.com/gpu.shared/pipe",
            "NVIDIA_VISIBLE_DEVICES": "GPU-0",
        },
        mounts=(
            Mount("/mps/nvidia.com/gpu.shared/pipe", "/run/nvidia/mps/nvidia.com/gpu.shared/pipe"),
            Mount("/dev/shm", "/run/nvidia/mps/shm"),
        ),
    )
    # an unshared resource on an MPS node does not use the daemon
    assert allocate(["GPU-1"], sharing=sharing).envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}


# -- CDI spec -----------------------------------------------------------------------------------
def test_cdi_spec_names_devices_by_uuid_and_index() -> None:
    devices = [*replicas(gpu(0), 2), mig(gpu(1), 0, 7)]
    spec = cdi.cdi_spec(devices, driver_with({"/dev/nvidia0", "/dev/nvidiactl"}))
    # NVIDIA's plugin's kind: the toolkit's node-wide spec holds nvidia.com/gpu
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    assert [d["name"] for d in spec["devices"]] == ["GPU-0", "0", "MIG-1-0", "1:0"]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert by_name["GPU-0"] == {
        "env": ["NVIDIA_GPU_0=GPU-0"],
        "deviceNodes": [{"path": "/dev/nvidia0"}],
    }
    assert by_name["1:0"] == {"env": ["NVIDIA_GPU_1_0=MIG-1-0"]}  # /dev/nvidia1 is absent
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
    }


def test_cdi_spec_file_is_written_whole(tmp_path: Path) -> None:
    spec = cdi.cdi_spec([gpu(0)], driver_with(set(), "/run/nvidia/driver"))
    path = cdi.write_spec(tmp_path / "cdi", spec)
    assert json.loads(path.read_text()) == spec
    assert [p.name for p in path.parent.iterdir()] == [cdi.SPEC_FILE]


# -- topology from sysfs ------------------------------------------------------------------------
def test_locality_from_sysfs(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    device = sysfs / "devices" / "pci0000:40" / "0000:40:01.1" / "0000:41:00.0" / "0000:47:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:47:00.0").symlink_to(device)
    assert read_locality("00000000:47:00.0", sysfs) == Locality(1, "pci0000:40/0000:40:01.1")
    assert read_locality("00000000:07:00.0", sysfs) == Locality()
    (device / "numa_node").write_text("-1\n")
    assert read_locality("00000000:47:00.0", sysfs).numa_node is None


@pytest.mark.parametrize(
    ("path", "root"),
    [
        ("/pci0000:00/0000:00:01.0/0000:01:00.0", "pci0000:00/0000:00:01.0"),
        ("/pci0000:00/0000:00:02.0", "pci0000:00"),
        ("/platform/thing", None),
    ],
)
def test_pci_root(path: str, root: str | None) -> None:
    assert pci_root(path) == root


def test_a_mig_device_gets_its_gpu_and_capability_nodes() -> None:
    """gpu1/gi7/access and gpu1/gi7/ci0/access (the kernel's mig-minors: 3 + 135 g + 9 i, +1+c
    for a compute instance): what a container needs to open a MIG device."""
    gi_access, ci_access = 3 + 135 + 9 * 7, 3 + 135 + 9 * 7 + 1
    caps = {f"/dev/nvidia-caps/nvidia-cap{m}" for m in (gi_access, ci_access)}
    driver = driver_with({"/dev/nvidia1", "/dev/nvidiactl", *caps}, "/run/nvidia/driver")
    spec = cdi.cdi_spec([mig(gpu(1), 0, 7)], driver)
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == [
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{gi_access}",
        f"/dev/nvidia-caps/nvidia-cap{ci_access}",
    ]
    assert nodes[0]["hostPath"] == "/run/nvidia/driver/dev/nvidia1"
    got = allocate(
        ["MIG-1-0"],
        PluginSettings(pass_device_specs=True),
        devices=[mig(gpu(1), 0, 7)],
        driver=driver,
    )
    assert [n.container_path for n in got.device_nodes] == [
        "/dev/nvidiactl",
        *(n["path"] for n in nodes),
    ]
