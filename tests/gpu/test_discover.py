"""``agent discover`` (the node's labels) and ``agent mig-parted generate`` on the real GPU,
against nvidia-smi's view. Both only read: ``--output-file -`` patches no Node, ``generate`` applies
nothing."""

from __future__ import annotations

import re

import pytest
import yaml

from gpu_operator.agent.inventory import Inventory
from tests.gpu.conftest import Driver
from tests.gpu.host import SmiGpu, agent

MEMORY_TOLERANCE = 0.01
FAMILIES = {
    "7.0": "volta",
    "7.5": "turing",
    "8.0": "ampere",
    "8.6": "ampere",
    "8.7": "ampere",
    "8.9": "ada-lovelace",
    "9.0": "hopper",
    "10.0": "blackwell",
    "12.0": "blackwell",
}


def product(name: str) -> str:
    """GFD's product label: characters outside [A-Za-z0-9-_. ] dropped, words joined by -."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def test_discover_labels_are_nvidia_smis(driver: Driver, smi_gpus: list[SmiGpu]) -> None:
    out = agent("discover", "--oneshot", "--output-file", "-", "--driver-root", driver.root)
    labels = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    print("\n" + "\n".join(f"  {k}={v}" for k, v in sorted(labels.items())))
    first = smi_gpus[0]
    same_model = [g for g in smi_gpus if g.name == first.name]
    assert labels["nvidia.com/gpu.product"] == product(first.name)
    assert labels["nvidia.com/gpu.count"] == str(len(same_model))
    memory = int(labels["nvidia.com/gpu.memory"])
    assert abs(memory - first.memory_mib) <= MEMORY_TOLERANCE * first.memory_mib
    major, minor = first.compute_cap.split(".")
    assert labels["nvidia.com/gpu.compute.major"] == major
    assert labels["nvidia.com/gpu.compute.minor"] == minor
    if first.compute_cap in FAMILIES:
        assert labels["nvidia.com/gpu.family"] == FAMILIES[first.compute_cap]
    driver_parts = [*first.driver_version.split("."), "", ""]
    assert labels["nvidia.com/cuda.driver.major"] == driver_parts[0]
    assert labels["nvidia.com/cuda.driver.minor"] == driver_parts[1]
    assert labels["nvidia.com/cuda.driver.rev"] == driver_parts[2]
    assert labels["nvidia.com/cuda.driver-version.full"] == first.driver_version
    cuda_major, cuda_minor = driver.smi.cuda_version().split(".")
    assert labels["nvidia.com/cuda.runtime.major"] == cuda_major
    assert labels["nvidia.com/cuda.runtime.minor"] == cuda_minor
    assert labels["nvidia.com/cuda.runtime-version.full"] == f"{cuda_major}.{cuda_minor}"
    capable = any(g.mig_capable for g in smi_gpus)
    assert labels["nvidia.com/mig.capable"] == str(capable).lower()


def test_mig_parted_generate_lists_the_gpus_profiles(
    driver: Driver, inventory: Inventory, smi_gpus: list[SmiGpu]
) -> None:
    if not any(g.mig_capable for g in inventory.gpus):
        pytest.skip(f"{smi_gpus[0].name}: not MIG-capable (nvidia-smi: {smi_gpus[0].mig_mode})")
    out = agent("mig-parted", "generate", "--driver-root", driver.root)
    configs = yaml.safe_load(out)["mig-configs"]
    print("\nmig-parted generate: " + ", ".join(configs))
    for gpu in inventory.gpus:
        if not gpu.mig_capable:
            continue
        names = [p.name for p in gpu.mig_profiles]
        print(
            f"GPU {gpu.index} ({gpu.name}) profiles: "
            + ", ".join(f"{p.name} x{p.max_count} ({p.memory_mib} MiB)" for p in gpu.mig_profiles)
        )
        assert names, f"GPU {gpu.index} is MIG-capable but NVML lists no GPU-instance profile"
        for name in names:
            config = "all-" + name.replace("+", ".")  # NVIDIA's names: 1g.10gb+me -> .me
            assert config in configs, f"no {config} config for profile {name}"
    assert {"all-disabled", "all-enabled"} <= set(configs)
