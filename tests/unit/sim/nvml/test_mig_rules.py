"""The MIG rules as plain functions over one simulated GPU, without ctypes or pynvml."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.sim.nvml import mig
from gpu_operator.sim.nvml.devices import NvmlFault, SimGi, SimGpu, new_gpus
from gpu_operator.sim.nvml.profiles import GiProfileSpec, load_model

A100 = load_model("a100-40gb")
H100 = load_model("h100-80gb")
T4 = load_model("t4")


def gpu_of(model_key: str, *, mig_on: bool = True) -> SimGpu:
    gpu = new_gpus([load_model(model_key)], "rules")[0]
    gpu.mig_current = gpu.mig_pending = mig_on
    return gpu


def profile(gpu: SimGpu, name: str) -> GiProfileSpec:
    return next(p for p in gpu.model.gi_profiles if p.name == name)


@contextmanager
def refused(code: int) -> Iterator[None]:
    with pytest.raises(NvmlFault) as caught:
        yield
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("model", "enable", "after", "reset_needed"),
    [
        ("a100-40gb", True, (False, True), True),  # stays pending until a reset
        ("h100-80gb", True, (True, True), False),  # applies at once
        ("a100-40gb", False, (False, False), False),
    ],
)
def test_mig_mode_follows_the_model(
    model: str, enable: bool, after: tuple[bool, bool], reset_needed: bool
) -> None:
    gpu = gpu_of(model, mig_on=False)
    assert mig.set_mig_mode(gpu, enable) is reset_needed
    assert (gpu.mig_current, gpu.mig_pending) == after


def test_mig_off_is_refused_while_instances_exist() -> None:
    gpu = gpu_of("h100-80gb")
    mig.create_gpu_instance(gpu, profile(gpu, "7g.80gb"), None)
    with refused(pynvml.NVML_ERROR_IN_USE):
        mig.set_mig_mode(gpu, False)
    assert (gpu.mig_current, gpu.mig_pending, len(gpu.gis)) == (True, True, 1)


def test_reset_applies_the_pending_mode_and_destroys_every_instance() -> None:
    gpu = gpu_of("a100-40gb")
    gi = mig.create_gpu_instance(gpu, profile(gpu, "3g.20gb"), 4)
    mig.create_compute_instance(gpu, gi.id, 2)
    gpu.mig_pending = False
    mig.reset(gpu)
    assert (gpu.mig_current, gpu.gis) == (False, [])


def test_non_mig_gpus_refuse_mig() -> None:
    with refused(pynvml.NVML_ERROR_NOT_SUPPORTED):
        mig.require_mig_capable(gpu_of("t4", mig_on=False))
    mig.require_mig_capable(gpu_of("a100-40gb", mig_on=False))


@pytest.mark.parametrize(
    ("placed", "name", "start", "fits"),
    [
        ([], "7g.40gb", 0, True),
        ([("3g.20gb", 4)], "7g.40gb", 0, False),  # memory slices overlap
        ([("3g.20gb", 4)], "1g.5gb", 5, False),  # inside the 3g
        ([("3g.20gb", 4)], "1g.5gb", 3, True),
        ([("3g.20gb", 4)], "4g.20gb", 0, True),  # 3 + 4 = all 7 compute slices
        ([("3g.20gb", 0), ("3g.20gb", 4)], "1g.5gb", 0, False),  # all memory taken
        ([("1g.5gb+me", 0)], "1g.5gb+me", 1, False),  # at most one
        ([("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4)], "1g.5gb", 6, True),  # 6 + 1 = 7
        # memory slice 7 is free, but no compute slice is left
        ([("2g.10gb", 0), ("2g.10gb", 2), ("2g.10gb", 4), ("1g.5gb", 6)], "1g.5gb", 7, False),
    ],
)
def test_placement_rules_on_an_a100(
    placed: list[tuple[str, int]], name: str, start: int, fits: bool
) -> None:
    gpu = gpu_of("a100-40gb")
    for placed_name, placed_start in placed:
        mig.create_gpu_instance(gpu, profile(gpu, placed_name), placed_start)
    assert mig.fits(gpu.model, gpu.gis, profile(gpu, name), start) is fits


@pytest.mark.parametrize(
    ("placed", "name", "remaining"),
    [
        ([], "1g.5gb", 7),
        ([], "3g.20gb", 2),
        ([("3g.20gb", 4)], "1g.5gb", 4),
        ([("3g.20gb", 4)], "3g.20gb", 1),
        ([("7g.40gb", 0)], "1g.5gb", 0),
        ([("1g.5gb+me", 3)], "1g.5gb+me", 0),
        ([("1g.10gb", 0)], "2g.10gb", 2),
    ],
)
def test_remaining_capacity(placed: list[tuple[str, int]], name: str, remaining: int) -> None:
    gpu = gpu_of("a100-40gb")
    for placed_name, placed_start in placed:
        mig.create_gpu_instance(gpu, profile(gpu, placed_name), placed_start)
    before = [(gi.id, gi.start) for gi in gpu.gis]
    assert mig.remaining_gpu_instances(gpu, profile(gpu, name)) == remaining
    assert [(gi.id, gi.start) for gi in gpu.gis] == before  # asking changes nothing


@pytest.mark.parametrize(
    ("size", "start", "expected"),
    [(8, 0, 0), (4, 0, 1), (4, 4, 2), (2, 0, 3), (2, 6, 6), (1, 0, 7), (1, 6, 13)],
)
def test_gpu_instance_ids_are_hardware_like(size: int, start: int, expected: int) -> None:
    assert mig.gpu_instance_id([], size, start) == expected


def test_a_taken_id_falls_back_to_the_first_free_from_16() -> None:
    taken = [SimGi(7, 0, 0, 1), SimGi(16, 0, 1, 1)]
    assert mig.gpu_instance_id(taken, 1, 0) == 17


def test_create_without_a_placement_takes_the_first_that_fits() -> None:
    gpu = gpu_of("a100-40gb")
    mig.create_gpu_instance(gpu, profile(gpu, "3g.20gb"), 0)
    gi = mig.create_gpu_instance(gpu, profile(gpu, "1g.5gb"), None)
    assert (gi.start, gi.size, gi.id) == (4, 1, 11)


@pytest.mark.parametrize(
    ("mig_on", "name", "start", "code"),
    [
        (False, "1g.5gb", 0, pynvml.NVML_ERROR_NOT_SUPPORTED),
        (True, "3g.20gb", 2, pynvml.NVML_ERROR_INVALID_ARGUMENT),  # not a 3g placement
        (True, "7g.40gb", 0, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
        (True, "7g.40gb", None, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
    ],
)
def test_create_refusals_change_nothing(
    mig_on: bool, name: str, start: int | None, code: int
) -> None:
    gpu = gpu_of("a100-40gb")
    mig.create_gpu_instance(gpu, profile(gpu, "1g.5gb"), 6)
    gpu.mig_current = mig_on
    before = list(gpu.gis)
    with refused(code):
        mig.create_gpu_instance(gpu, profile(gpu, name), start)
    assert gpu.gis == before


def test_destroying_instances() -> None:
    gpu = gpu_of("h100-80gb")
    gi = mig.create_gpu_instance(gpu, profile(gpu, "3g.40gb"), 4)
    ci = mig.create_compute_instance(gpu, gi.id, 2)
    with refused(pynvml.NVML_ERROR_IN_USE):
        mig.destroy_gpu_instance(gpu, gi.id)
    with refused(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        mig.destroy_gpu_instance(gpu, 99)
    with refused(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        mig.destroy_compute_instance(gpu, 99, ci.id)
    mig.destroy_compute_instance(gpu, gi.id, ci.id)
    mig.destroy_gpu_instance(gpu, gi.id)
    assert gpu.gis == []


def test_compute_instances_split_their_gpu_instance() -> None:
    gpu = gpu_of("a100-40gb")
    gi = mig.create_gpu_instance(gpu, profile(gpu, "3g.20gb"), 0)
    with refused(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        mig.compute_slices(gpu, gi, 42)  # no such compute-instance profile
    with refused(pynvml.NVML_ERROR_NOT_SUPPORTED):
        mig.compute_slices(gpu, gi, 3)  # 4c does not fit a 3g
    first = mig.create_compute_instance(gpu, gi.id, 1)  # 2c
    second = mig.create_compute_instance(gpu, gi.id, 0)  # 1c
    assert (first.id, second.id) == (0, 1)
    assert mig.free_compute_slices(gpu, gi) == 0
    assert [mig.compute_instance_start(gi, c) for c in gi.cis] == [0, 2]
    with refused(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES):
        mig.create_compute_instance(gpu, gi.id, 0)
    mig.destroy_compute_instance(gpu, gi.id, first.id)
    assert mig.create_compute_instance(gpu, gi.id, 0).id == 0  # the lowest free id again
    with refused(pynvml.NVML_ERROR_INVALID_ARGUMENT):
        mig.create_compute_instance(gpu, 99, 0)


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(["a100-40gb", "a100-80gb", "h100-80gb"]),
    steps=st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 7)))),
)
def test_any_sequence_of_creates_keeps_the_hardware_invariants(
    model: str, steps: list[tuple[int, int | None]]
) -> None:
    """Whatever is asked, placed instances never share a memory slice, never take more compute
    slices than the GPU has or more of a profile than its maximum, and the remaining capacity
    says whether one more create succeeds."""
    gpu = gpu_of(model)
    profiles = gpu.model.gi_profiles
    for choice, start in steps:
        wanted = profiles[choice % len(profiles)]
        can = mig.remaining_gpu_instances(gpu, wanted) > 0
        try:
            mig.create_gpu_instance(gpu, wanted, start)
        except NvmlFault:
            assert start is not None or not can
        else:
            assert can
        slices = [s for gi in gpu.gis for s in range(gi.start, gi.start + gi.size)]
        assert len(slices) == len(set(slices))
        assert max(slices, default=0) < gpu.model.memory_slices
        assert sum(gpu.profile_of(gi).slices for gi in gpu.gis) <= gpu.model.compute_slices
        for p in profiles:
            assert sum(1 for gi in gpu.gis if gi.profile_index == p.index) <= p.max
        assert len({gi.id for gi in gpu.gis}) == len(gpu.gis)
