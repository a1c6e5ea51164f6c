"""DynamicMIG partitions: NVIDIA's counter set and devices, and that what the counters allow the
(simulated) hardware can create."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_operator.agent.dra import devices as dra
from gpu_operator.agent.dra import partitions
from gpu_operator.agent.inventory import Gpu, Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import install_simulated_nvml, mig, uninstall_simulated_nvml
from gpu_operator.sim.nvml.devices import SimGpu, new_gpus
from gpu_operator.sim.nvml.profiles import GpuModel, load_model

MIG_MODELS = ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "gb200", "gb300")
SLICES = [f"memory-slice-{i}" for i in range(8)]
NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


@cache
def inventory(key: str, mig_on: bool = True) -> Inventory:
    """A one-GPU node of model ``key`` as the NVML adapter reads it, MIG on or off."""
    sim = install_simulated_nvml(f"{key}:1", seed="partitions")
    try:
        sim.gpus[0].mig_current = sim.gpus[0].mig_pending = mig_on
        with Nvml() as nvml:
            return nvml.inventory()
    finally:
        uninstall_simulated_nvml()


def gpu_of(key: str, mig_on: bool = True) -> Gpu:
    return inventory(key, mig_on).gpus[0]


def value(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)?", text).groups("")  # type: ignore[union-attr]
    return int(number) * UNITS[unit]


def values(counters: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    return {name: value(c["value"]) for name, c in counters.items()}


def consumed(device: Mapping[str, Any]) -> dict[str, int]:
    (consumption,) = device["consumesCounters"]
    assert consumption["counterSet"] == "gpu-0-counter-set"
    return values(consumption["counters"])


@cache
def published(key: str) -> tuple[dict[str, int], tuple[dict[str, Any], ...]]:
    """The counter set's values and every device of model ``key``'s GPU, MIG on."""
    gpu = gpu_of(key)
    counter_set = partitions.counter_set(gpu)
    assert counter_set is not None and counter_set["name"] == "gpu-0-counter-set"
    return values(counter_set["counters"]), tuple(partitions.partition_devices(gpu, inventory(key)))


def mig_devices(key: str) -> list[dict[str, Any]]:
    return [d for d in published(key)[1] if d["attributes"]["type"] == {"string": "mig"}]


def fits(total: Mapping[str, int], used: Mapping[str, int], wanted: Mapping[str, int]) -> bool:
    """The scheduler's check: no counter goes past what the set holds."""
    return all(used.get(name, 0) + n <= total[name] for name, n in wanted.items())


def add(used: Mapping[str, int], wanted: Mapping[str, int]) -> dict[str, int]:
    return {name: used.get(name, 0) + wanted.get(name, 0) for name in {*used, *wanted}}


def mig_gpu(model: GpuModel) -> SimGpu:
    gpu = new_gpus([model], "partitions")[0]
    gpu.mig_current = gpu.mig_pending = True
    return gpu


def create(gpu: SimGpu, device: Mapping[str, Any]) -> int:
    """Create ``device``'s GPU instance at its placement (raises where the hardware refuses)."""
    match = NAME.match(device["name"])
    assert match, device["name"]
    profile = gpu.model.gi_profile(id=int(match[3]))
    assert profile is not None and profile.name == device["attributes"]["profile"]["string"]
    return mig.create_gpu_instance(gpu, profile, int(match[4])).id


TABLE = [
    # model, counters except the memory slices, devices, some names,
    # (a device, its consumption except the memory slices, the memory slices it takes)
    (
        "a100-40gb",
        {"multiprocessors": 98, "copy-engines": 7, "decoders": 5, "encoders": 0},
        {"jpeg-engines": 1, "ofa-engines": 1, "memory": 40192 << 20},
        25,  # Ampere in MIG mode: partitions only, MIG cannot be switched off on demand
        ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-me-20-6", "gpu-0-mig-1g10gb-15-6"],
        "gpu-0-mig-3g20gb-9-4",
        {"multiprocessors": 42, "copy-engines": 3, "decoders": 2, "encoders": 0},
        {"jpeg-engines": 0, "ofa-engines": 0, "memory": 19968 << 20},
        range(4, 8),
    ),
    (
        "a100-80gb",
        {"multiprocessors": 98, "copy-engines": 7, "decoders": 5, "encoders": 0},
        {"jpeg-engines": 1, "ofa-engines": 1, "memory": 80640 << 20},
        25,
        ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-me-20-3", "gpu-0-mig-7g80gb-0-0"],
        "gpu-0-mig-1g20gb-15-2",
        {"multiprocessors": 14, "copy-engines": 1, "decoders": 1, "encoders": 0},
        {"jpeg-engines": 0, "ofa-engines": 0, "memory": 19968 << 20},
        range(2, 4),
    ),
    (
        "h100-80gb",
        {"multiprocessors": 132, "copy-engines": 8, "decoders": 7, "encoders": 0},
        {"jpeg-engines": 7, "ofa-engines": 1, "memory": 80896 << 20},
        26,  # Hopper: the whole GPU beside every partition
        ["gpu-0", "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-2g20gb-14-4", "gpu-0-mig-4g40gb-5-0"],
        "gpu-0-mig-3g40gb-9-4",
        {"multiprocessors": 60, "copy-engines": 3, "decoders": 3, "encoders": 0},
        {"jpeg-engines": 3, "ofa-engines": 0, "memory": 40448 << 20},
        range(4, 8),
    ),
    (
        "h200-141gb",
        {"multiprocessors": 132, "copy-engines": 8, "decoders": 7, "encoders": 0},
        {"jpeg-engines": 7, "ofa-engines": 1, "memory": 143360 << 20},
        26,
        ["gpu-0", "gpu-0-mig-1g18gb-19-0", "gpu-0-mig-1g35gb-15-6", "gpu-0-mig-7g141gb-0-0"],
        "gpu-0-mig-1g18gb-me-20-5",
        {"multiprocessors": 16, "copy-engines": 1, "decoders": 1, "encoders": 0},
        {"jpeg-engines": 1, "ofa-engines": 1, "memory": 16384 << 20},
        range(5, 6),
    ),
    (
        "b200-180gb",
        {"multiprocessors": 148, "copy-engines": 16, "decoders": 7, "encoders": 0},
        {"jpeg-engines": 7, "ofa-engines": 1, "memory": 182784 << 20},
        26,
        ["gpu-0", "gpu-0-mig-1g23gb-me-20-0", "gpu-0-mig-1g45gb-15-2", "gpu-0-mig-4g90gb-5-0"],
        "gpu-0-mig-3g90gb-9-0",
        {"multiprocessors": 70, "copy-engines": 6, "decoders": 3, "encoders": 0},
        {"jpeg-engines": 3, "ofa-engines": 0, "memory": 91136 << 20},
        range(0, 4),
    ),
]


@pytest.mark.parametrize(
    ("key", "counts", "more", "n", "names", "device", "takes", "takes_more", "slices"), TABLE
)
def test_counter_set_and_devices_per_model(
    key: str,
    counts: dict[str, int],
    more: dict[str, int],
    n: int,
    names: list[str],
    device: str,
    takes: dict[str, int],
    takes_more: dict[str, int],
    slices: range,
) -> None:
    total, devices = published(key)
    assert total == {**counts, **more, **dict.fromkeys(SLICES, 1)}
    assert len(devices) == n
    by_name = {d["name"]: d for d in devices}
    assert set(names) <= set(by_name)
    assert [d["name"] for d in devices] == sorted(by_name)
    assert consumed(by_name[device]) == {
        **takes,
        **takes_more,
        **{SLICES[i]: 1 for i in slices},
    }
    # 7 + 7 + 4 + 3 + 2 + 1 + 1 placements: one device each
    assert len(mig_devices(key)) == 25


def test_a_partition_device_field_by_field() -> None:
    gpu = gpu_of("h200-141gb")
    device = {d["name"]: d for d in published("h200-141gb")[1]}["gpu-0-mig-1g35gb-15-2"]
    assert device == {
        "name": "gpu-0-mig-1g35gb-15-2",
        "attributes": {
            "type": {"string": "mig"},
            "parentUUID": {"string": gpu.uuid},
            "profile": {"string": "1g.35gb"},
            "productName": {"string": "NVIDIA H200"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "resource.kubernetes.io/pciBusID": {"string": dra.bus_id(gpu.pci_bus_id)},
        },
        "capacity": {
            "multiprocessors": {"value": "26"},
            "copyEngines": {"value": "1"},
            "decoders": {"value": "1"},
            "encoders": {"value": "0"},
            "jpegEngines": {"value": "1"},
            "ofaEngines": {"value": "0"},
            "memory": {"value": "33280Mi"},
        },
        "consumesCounters": [
            {
                "counterSet": "gpu-0-counter-set",
                "counters": {
                    "multiprocessors": {"value": "26"},
                    "copy-engines": {"value": "1"},
                    "decoders": {"value": "1"},
                    "encoders": {"value": "0"},
                    "jpeg-engines": {"value": "1"},
                    "ofa-engines": {"value": "0"},
                    "memory": {"value": "33280Mi"},
                    "memory-slice-2": {"value": "1"},
                    "memory-slice-3": {"value": "1"},
                },
            }
        ],
    }


@pytest.mark.parametrize("key", ["h100-80gb", "h200-141gb", "b200-180gb"])
def test_the_whole_gpu_takes_every_counter_and_excludes_every_partition(key: str) -> None:
    total, devices = published(key)
    whole = next(d for d in devices if d["name"] == "gpu-0")
    assert consumed(whole) == total
    assert whole["attributes"]["type"] == {"string": "gpu"}
    assert values(whole["capacity"]) == {
        dra_name: total[partitions.counter_name(dra_name)] for dra_name in whole["capacity"]
    }
    for device in mig_devices(key):
        assert fits(total, {}, consumed(device)), device["name"]
        assert not fits(total, consumed(whole), consumed(device)), device["name"]
        assert not fits(total, consumed(device), consumed(whole)), device["name"]


@pytest.mark.parametrize("key", ["a100-40gb", "a100-80gb", "t4", "l4"])
def test_a_gpu_offered_whole_only_publishes_as_today(key: str) -> None:
    """Ampere with MIG off (switching it on needs a reset) and GPUs without MIG: no counter
    set, and the whole GPU exactly as without DynamicMIG."""
    inv = inventory(key, mig_on=False)
    gpu = inv.gpus[0]
    assert partitions.counter_set(gpu) is None
    assert partitions.partition_devices(gpu, inv) == [dra.gpu_device(gpu, inv)]


@pytest.mark.parametrize("key", ["h100-80gb", "h200-141gb", "b200-180gb"])
def test_a_gpu_that_switches_mig_at_once_offers_partitions_with_mig_off(key: str) -> None:
    inv = inventory(key, mig_on=False)
    gpu = inv.gpus[0]
    assert partitions.counter_set(gpu) == partitions.counter_set(gpu_of(key))
    assert partitions.partition_devices(gpu, inv) == list(published(key)[1])


def chosen(total: Mapping[str, int], picks: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The picks the scheduler would allocate, in order: each one whose consumption still fits."""
    used: dict[str, int] = {}
    for device in picks:
        if fits(total, used, consumed(device)):
            used = add(used, consumed(device))
            yield device


@pytest.mark.parametrize("key", MIG_MODELS)
@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_what_the_counters_allow_the_hardware_creates(key: str, data: st.DataObject) -> None:
    total, _ = published(key)
    picks = data.draw(st.lists(st.sampled_from(mig_devices(key)), max_size=12))
    gpu = mig_gpu(load_model(key))
    for device in chosen(total, picks):
        create(gpu, device)  # raises NvmlFault where the hardware refuses


@pytest.mark.parametrize("key", MIG_MODELS)
def test_every_set_the_counters_allow_is_creatable(key: str) -> None:
    """The same property, exhaustively: every set of partitions that fits the counter set (each
    set once, in name order) is created on the simulated GPU without a refusal."""
    total, _ = published(key)
    devices = mig_devices(key)
    gpu = mig_gpu(load_model(key))
    sets = 0

    def extend(start: int, used: dict[str, int]) -> None:
        nonlocal sets
        sets += 1
        for i in range(start, len(devices)):
            wanted = consumed(devices[i])
            if fits(total, used, wanted):
                gi = create(gpu, devices[i])
                extend(i + 1, add(used, wanted))
                mig.destroy_gpu_instance(gpu, gi)

    extend(0, {})
    assert sets > 700 and not gpu.gis
