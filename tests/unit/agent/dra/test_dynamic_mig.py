"""DynamicMIG at Prepare and Unprepare, on simulated NVML (which refuses an overlapping
placement as a GPU does): the MIG device is created where the scheduler placed it, handed out
by its UUID, destroyed after; a refused or interrupted Prepare leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.dra import partitions
from gpu_operator.agent.dra.devices import DeviceRef, Partition
from gpu_operator.agent.dra.mig_control import MigControl
from gpu_operator.agent.dra.prepare import CreatedMig, PrepareError, spec_file_name
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.agent.inventory import Gpu, Placement
from gpu_operator.agent.nvml import Nvml
from gpu_operator.api.dragates import resolve
from tests.unit.agent.conftest import Simulate
from tests.unit.agent.dra.test_plugin import NODE, Api, claim, no_driver

DYNAMIC = resolve({"DynamicMIG": True})


class Killed(BaseException):
    """The plugin process dying mid-call: nothing after it runs, no handler sees it."""


class KilledBeforeComputeInstance:
    """NVML, with the process killed once a GPU instance exists and before its compute one."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml

    def __getattr__(self, name: str) -> Any:
        return getattr(self.nvml, name)

    def create_compute_instance(self, index: int, gi_id: int, slices: int) -> int:
        raise Killed


def paths_in(tmp_path: Path) -> PluginPaths:
    return PluginPaths(tmp_path / "plugin", tmp_path / "registry", tmp_path / "cdi")


def plugin(nvml: Any, paths: PluginPaths, api: Api) -> DraPlugin:
    def refs() -> dict[str, DeviceRef]:
        return partitions.refs_by_name(nvml.inventory())

    return DraPlugin(NODE, paths, refs, api.read, no_driver, DYNAMIC, mig=MigControl(nvml))


def partition(nvml: Nvml, profile: str, start: int) -> str:
    """The published name of ``profile``'s partition of GPU 0 at ``start``."""
    for name, ref in partitions.refs_by_name(nvml.inventory()).items():
        part = ref.partition
        if part and ref.minor == 0 and part.profile == profile and part.placement.start == start:
            return name
    raise AssertionError(f"no {profile} partition at {start}")


def gpu0(nvml: Nvml) -> Gpu:
    return nvml.inventory().gpus[0]


def instances(nvml: Nvml) -> list[tuple[str, Placement, int]]:
    """GPU 0's GPU instances: profile, placement, compute instances."""
    return [
        (gi.profile, gi.placement, len(gi.compute_instances)) for gi in gpu0(nvml).gpu_instances
    ]


@pytest.fixture
def nvml(simulate: Simulate, tmp_path: Path) -> Any:
    simulate("h100-80gb:1", state_file=tmp_path / "nvml.json")
    with Nvml() as session:
        yield session


def test_a_partition_is_created_where_it_was_placed_handed_out_and_destroyed(
    nvml: Nvml, tmp_path: Path
) -> None:
    api, paths = Api(), paths_in(tmp_path)
    dra = plugin(nvml, paths, api)
    device = partition(nvml, "3g.40gb", 4)
    assert device == "gpu-0-mig-3g40gb-9-4"  # NVIDIA's name: profile, GI profile id, start
    assert not gpu0(nvml).mig_current

    (prepared,) = dra.prepare(*api.add(claim("uid-1", device)))

    assert gpu0(nvml).mig_current, "an H100 switches MIG on without a reset"
    assert instances(nvml) == [("3g.40gb", Placement(4, 4), 1)]
    (mig,) = gpu0(nvml).mig_devices
    assert prepared.mig is not None and prepared.mig.uuid == mig.uuid
    assert (prepared.mig.gi_id, prepared.mig.ci_id) == (mig.gi_id, mig.ci_id)
    spec = json.loads((paths.cdi_dir / spec_file_name("uid-1")).read_text())
    (entry,) = spec["devices"]
    assert entry["containerEdits"]["env"] == [f"NVIDIA_DRA_GPU_0_MIG_3G40GB_9_4={mig.uuid}"]

    dra.unprepare("uid-1")
    assert instances(nvml) == []
    assert not gpu0(nvml).mig_current, "MIG off again once no instance is left"
    assert not (paths.cdi_dir / spec_file_name("uid-1")).exists()


def test_an_overlapping_partition_is_refused_and_changes_nothing(
    nvml: Nvml, tmp_path: Path
) -> None:
    api, paths = Api(), paths_in(tmp_path)
    dra = plugin(nvml, paths, api)
    dra.prepare(*api.add(claim("uid-1", partition(nvml, "3g.40gb", 4))))
    before = instances(nvml)

    with pytest.raises(PrepareError, match=r"creating a 1g\.10gb MIG device at placement 5"):
        dra.prepare(*api.add(claim("uid-2", partition(nvml, "1g.10gb", 5))))

    assert instances(nvml) == before
    assert not (paths.cdi_dir / spec_file_name("uid-2")).exists()
    assert dra.checkpoint.get("uid-2") is None
    dra.prepare(*api.add(claim("uid-3", partition(nvml, "1g.10gb", 0))))  # a free slice fits
    assert len(instances(nvml)) == 2


def test_a_plugin_killed_between_gpu_and_compute_instance_leaves_nothing_once_back(
    nvml: Nvml, tmp_path: Path
) -> None:
    api, paths = Api(), paths_in(tmp_path)
    plugin(nvml, paths, api).prepare(*api.add(claim("held", partition(nvml, "1g.10gb", 0))))
    held = instances(nvml)
    dying = plugin(KilledBeforeComputeInstance(nvml), paths, api)
    with pytest.raises(Killed):
        dying.prepare(*api.add(claim("uid-2", partition(nvml, "3g.40gb", 4))))
    assert ("3g.40gb", Placement(4, 4), 0) in instances(nvml), "a half-made device is left"

    back = plugin(nvml, paths, api)
    gone = back.restore_migs()

    assert len(gone) == 1 and gone[0].startswith(gpu0(nvml).uuid)
    assert instances(nvml) == held, "the checkpointed claim's device stays"
    (again,) = back.prepare(*api.add(claim("uid-2", partition(nvml, "3g.40gb", 4))))
    assert again.mig is not None and again.mig.created  # the kubelet's retry succeeds


def test_a_whole_gpu_claim_takes_the_gpu_out_of_mig_mode(nvml: Nvml, tmp_path: Path) -> None:
    api, paths = Api(), paths_in(tmp_path)
    nvml.set_mig_mode(0, True)
    (prepared,) = plugin(nvml, paths, api).prepare(*api.add(claim("uid-1", "gpu-0")))
    assert prepared.mig is None
    assert not gpu0(nvml).mig_current


def test_an_ampere_gpu_stays_in_mig_mode_it_cannot_leave_without_a_reset(
    simulate: Simulate, tmp_path: Path
) -> None:
    simulate("a100-40gb:1", state_file=tmp_path / "nvml.json")
    with Nvml() as nvml:
        nvml.set_mig_mode(0, True)
        nvml.reset_gpu(0)  # the reset an A100 needs, done beforehand (the MIG manager's)
        assert "gpu-0" not in partitions.refs_by_name(nvml.inventory()), "partitions only"
        api, paths = Api(), paths_in(tmp_path)
        dra = plugin(nvml, paths, api)
        dra.prepare(*api.add(claim("uid-1", partition(nvml, "2g.10gb", 2))))
        assert instances(nvml) == [("2g.10gb", Placement(2, 2), 1)]
        dra.unprepare("uid-1")
        assert instances(nvml) == []
        assert gpu0(nvml).mig_current


def test_an_ampere_gpu_out_of_mig_mode_refuses_a_partition_it_cannot_make(
    simulate: Simulate, tmp_path: Path
) -> None:
    """Its partitions are not published then; a stale allocation still gets a clear answer."""
    simulate("a100-40gb:1", state_file=tmp_path / "nvml.json")
    with Nvml() as nvml:
        gpu = nvml.inventory().gpus[0]
        profile = next(p for p in gpu.mig_profiles if p.name == "1g.5gb")
        stale = Partition("1g.5gb", profile.index, profile.placements[0], 1)
        control = MigControl(nvml)
        with pytest.raises(PrepareError, match="needs a reset to switch"):
            control.create(CreatedMig(gpu.uuid, gpu.minor_number, stale))
        assert nvml.inventory().gpus[0].gpu_instances == ()
