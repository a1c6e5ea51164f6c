"""Injected failures, XID event sets, and the state file shared between processes."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from gpu_operator.sim.nvml import hwfaults, mig, persistence
from gpu_operator.sim.nvml.devices import NvmlFault, SimGpu, new_gpus
from gpu_operator.sim.nvml.faults import EventSets, InjectedFailures
from gpu_operator.sim.nvml.hwfaults import GpuFaults
from gpu_operator.sim.nvml.persistence import StateFile
from gpu_operator.sim.nvml.profiles import load_model


def node_gpus(*keys: str) -> list[SimGpu]:
    return new_gpus([load_model(k) for k in keys], "state")


# -- injected failures -----------------------------------------------------------------------
def test_a_failure_lasts_its_count_then_calls_succeed() -> None:
    failures = InjectedFailures()
    failures.add("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_GPU_IS_LOST, times=2)
    taken = [failures.take("nvmlDeviceGetPowerUsage") for _ in range(3)]
    assert taken == [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_GPU_IS_LOST, None]


def test_a_failure_without_a_count_lasts_until_cleared() -> None:
    failures = InjectedFailures()
    failures.add("nvmlDeviceGetName", pynvml.NVML_ERROR_UNKNOWN)
    assert [failures.take("nvmlDeviceGetName") for _ in range(5)] == [pynvml.NVML_ERROR_UNKNOWN] * 5
    assert failures.take("nvmlDeviceGetUUID") is None
    failures.clear()
    assert failures.take("nvmlDeviceGetName") is None


@pytest.mark.parametrize(
    ("injected", "called"),
    [
        ("nvmlInit", "nvmlInit_v2"),
        ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"),
        ("nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceProfileInfoV"),
    ],
)
def test_a_failure_covers_the_versioned_variants(injected: str, called: str) -> None:
    failures = InjectedFailures()
    failures.add(injected, pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert failures.take(called) == pynvml.NVML_ERROR_NOT_SUPPORTED


# -- event sets ------------------------------------------------------------------------------
def xid_logs(*xids: tuple[int, int], gpus: int = 4) -> list[GpuFaults]:
    """Each GPU's faults after logging ``(gpu, xid)`` in order."""
    faults = [GpuFaults()] * gpus
    for gpu, xid in xids:
        faults[gpu] = hwfaults.inject(faults[gpu], "xid", xid)
    return faults


def read_all(events: EventSets, set_id: int, faults: list[GpuFaults]) -> list[tuple[int, int]]:
    def log(gpu: int, seq: int) -> list[tuple[int, int]]:
        return hwfaults.xids_after(faults[gpu], seq)

    read = []
    while (found := events.next_xid(set_id, log)) is not None:
        read.append(found)
    return read


def test_xids_reach_the_sets_their_gpu_is_registered_in_oldest_first() -> None:
    events = EventSets()
    one, other = events.create(), events.create()
    events.register(one, 3, 0)
    events.register(one, 1, 0)
    events.register(other, 0, 0)
    assert read_all(events, one, xid_logs()) == []
    faults = xid_logs((3, 79), (1, 48), (1, 13))
    assert read_all(events, other, faults) == []  # GPU 0 had none
    assert read_all(events, one, faults) == [(1, 48), (1, 13), (3, 79)]
    assert read_all(events, one, faults) == []  # each XID once


def test_every_set_gets_every_xid_after_it_registered() -> None:
    events = EventSets()
    early, late = events.create(), events.create()
    faults = xid_logs((2, 31))
    events.register(early, 2, 0)
    events.register(late, 2, faults[2].xid_seq)  # registered after XID 31
    faults = xid_logs((2, 31), (2, 79))
    assert read_all(events, early, faults) == [(2, 31), (2, 79)]
    assert read_all(events, late, faults) == [(2, 79)]
    events.register(late, 2, faults[2].xid_seq)  # registered again: keeps its place
    assert read_all(events, late, xid_logs((2, 31), (2, 79), (2, 48))) == [(2, 48)]


def test_unknown_event_sets_are_invalid_arguments() -> None:
    events = EventSets()
    set_id = events.create()
    events.free(set_id)
    for call in (lambda: events.free(set_id), lambda: events.register(set_id, 0, 0)):
        with pytest.raises(NvmlFault) as caught:
            call()
        assert caught.value.code == pynvml.NVML_ERROR_INVALID_ARGUMENT


# -- state file ------------------------------------------------------------------------------
def mig_layout(gpus: list[SimGpu]) -> list[tuple[bool, bool, list[tuple[int, int, list[int]]]]]:
    return [
        (g.mig_current, g.mig_pending, [(gi.id, gi.start, [c.id for c in gi.cis]) for gi in g.gis])
        for g in gpus
    ]


def with_instances(gpus: list[SimGpu]) -> list[SimGpu]:
    gpu = gpus[1]
    mig.set_mig_mode(gpu, True)
    gi = mig.create_gpu_instance(gpu, gpu.model.gi_profiles[0], 2)
    mig.create_compute_instance(gpu, gi.id, 0)
    return gpus


def test_dump_and_load_round_trip() -> None:
    source = with_instances(node_gpus("h100-80gb", "h100-80gb"))
    doc = json.loads(json.dumps(persistence.dump(source)))
    target = node_gpus("h100-80gb", "h100-80gb")
    assert persistence.load(target, doc)
    assert mig_layout(target) == mig_layout(source)
    assert mig_layout(target)[1] == (True, True, [(9, 2, [0])])


def test_a_file_for_other_gpus_is_ignored() -> None:
    doc = persistence.dump(with_instances(node_gpus("h100-80gb", "h100-80gb")))
    target = node_gpus("a100-40gb", "a100-40gb")
    assert not persistence.load(target, doc)
    assert mig_layout(target) == [(False, False, [])] * 2


def test_two_handles_on_one_file_see_each_others_changes(tmp_path: Path) -> None:
    path = tmp_path / "node" / "state.json"
    ours, theirs = node_gpus("h100-80gb", "h100-80gb"), node_gpus("h100-80gb", "h100-80gb")
    our_file, their_file = StateFile(path), StateFile(path)
    with our_file.update(ours):
        with_instances(ours)
    their_file.sync(theirs)
    assert mig_layout(theirs) == mig_layout(ours)
    with their_file.update(theirs):
        mig.destroy_compute_instance(theirs[1], 9, 0)
    our_file.sync(ours)
    assert mig_layout(ours)[1] == (True, True, [(9, 2, [])])
    assert not list(path.parent.glob("*.tmp"))  # written by rename, nothing left behind


def test_a_change_that_raises_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    gpus = node_gpus("a100-40gb")
    state = StateFile(path)
    with state.update(gpus):
        gpus[0].mig_pending = True
    written = path.read_text()
    with pytest.raises(NvmlFault), state.update(gpus):
        gpus[0].mig_current = True
        raise NvmlFault(pynvml.NVML_ERROR_UNKNOWN)
    assert path.read_text() == written
    assert json.loads(written)["gpus"][0]["mig_pending"] is True
    assert json.loads(written)["gpus"][0]["mig_current"] is False


def test_a_freed_set_id_is_not_given_to_a_set_still_in_use() -> None:
    events = EventSets()
    first, second = events.create(), events.create()
    events.register(second, 2, 0)
    events.free(first)
    third = events.create()
    assert third not in (first, second)
    faults = xid_logs((2, 31))
    assert read_all(events, second, faults) == [(2, 31)]  # the second set still has its GPU
    assert read_all(events, third, faults) == []
