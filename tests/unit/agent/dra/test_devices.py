"""ResourceSlice devices from an NVML inventory: NVIDIA's DRA driver names, attributes, types."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.agent import migparted
from gpu_operator.agent.dra import devices as dra
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from tests.unit.agent.conftest import Simulate

MIXED = """
version: v1
mig-configs:
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
"""


def inventory(simulate: Simulate, spec: str, config: str | None = None) -> Inventory:
    simulate(spec)
    with Nvml() as nvml:
        if config:
            migparted.apply_config(nvml, migparted.parse_mig_config(MIXED), config)
        return nvml.inventory()


def by_name(devs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devs}


def test_a_full_gpu_field_by_field(simulate: Simulate) -> None:
    inv = inventory(simulate, "a100-40gb:2")
    gpu = inv.gpus[1]
    device = by_name(dra.devices(inv))["gpu-1"]
    assert device == {
        "name": "gpu-1",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "index": {"int": 1},
            "minor": {"int": 1},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "resource.kubernetes.io/pciBusID": {"string": dra.bus_id(gpu.pci_bus_id)},
        },
        "capacity": {"memory": {"value": "40Gi"}},
    }


def test_a_mig_device_field_by_field(simulate: Simulate) -> None:
    inv = inventory(simulate, "a100-40gb:1", "mixed")
    gpu = inv.gpus[0]
    names = [d["name"] for d in dra.devices(inv)]
    # gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>, sorted.
    assert names == [
        "gpu-0-mig-1g5gb-19-2",
        "gpu-0-mig-1g5gb-19-3",
        "gpu-0-mig-2g10gb-14-0",
        "gpu-0-mig-3g20gb-9-4",
    ]
    mig = next(m for m in gpu.mig_devices if m.profile == "3g.20gb")
    device = by_name(dra.devices(inv))["gpu-0-mig-3g20gb-9-4"]
    attrs = device["attributes"]
    assert attrs["type"] == {"string": "mig"}
    assert attrs["uuid"] == {"string": mig.uuid} and mig.uuid.startswith("MIG-")
    assert attrs["parentUUID"] == {"string": gpu.uuid}
    assert attrs["profile"] == {"string": "3g.20gb"}
    assert attrs["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
    assert "index" not in attrs and "minor" not in attrs
    assert device["capacity"] == {
        "multiprocessors": {"value": "42"},
        "copyEngines": {"value": "3"},
        "decoders": {"value": "2"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "0"},
        "ofaEngines": {"value": "0"},
        "memory": {"value": "19968Mi"},
        **{f"memorySlice{i}": {"value": "1"} for i in range(4, 8)},
    }


def test_a_gpu_in_mig_mode_publishes_only_its_mig_devices(simulate: Simulate) -> None:
    inv = inventory(simulate, "a100-40gb:1", "mixed")
    assert not [d for d in dra.devices(inv) if d["attributes"]["type"]["string"] == "gpu"]
    refs = dra.refs_by_name(inv).values()
    assert {r.uuid for r in refs} == {m.uuid for m in inv.gpus[0].mig_devices}
    assert {r.minor for r in refs} == {0}


@pytest.mark.parametrize(
    ("profile", "product", "arch", "memory"),
    [
        ("h100-80gb:8", "NVIDIA H100 80GB HBM3", "Hopper", "81559Mi"),
        ("t4:1", "Tesla T4", "Turing", "15Gi"),
        ("l4:2", "NVIDIA L4", "Ada Lovelace", None),
    ],
)
def test_products(
    simulate: Simulate, profile: str, product: str, arch: str, memory: str | None
) -> None:
    inv = inventory(simulate, profile)
    devs = dra.devices(inv)
    assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(int(profile.split(":")[1]))]
    attrs = devs[0]["attributes"]
    assert attrs["productName"] == {"string": product}
    assert attrs["architecture"] == {"string": arch}
    if memory:
        assert devs[0]["capacity"]["memory"] == {"value": memory}
    assert len({d["attributes"]["uuid"]["string"] for d in devs}) == len(devs)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (14, "14"),
        (1024, "1Ki"),
        (4864 * dra.MIB, "4864Mi"),
        (40 * 1024 * dra.MIB, "40Gi"),
        (0, "0"),
    ],
)
def test_quantities_are_canonical(n: int, text: str) -> None:
    assert dra.quantity(n) == text


@pytest.mark.parametrize(
    ("text", "version"), [("580.95.05", "580.95.5"), ("8.0", "8.0.0"), ("13.0", "13.0.0")]
)
def test_versions_are_strict_semver(text: str, version: str) -> None:
    assert dra.semver(text) == version
