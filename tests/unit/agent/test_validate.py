"""The operator validator: status files appear as checks pass, the marker only when all do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpu_operator.agent import validate
from gpu_operator.agent.nodeapi import NodeView
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.validate import READY_MARKER, Validator, run_validator

from .conftest import Simulate

DEVNULL = Path(os.devnull)  # a character device that opens, standing in for /dev/nvidia-uvm
CONTAINERD_V2 = """
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""
CONTAINERD_V1_RUNC_ONLY = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""
CRIO = """
[crio.runtime.runtimes.nvidia]
runtime_path = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""


def read_inventory():  # type: ignore[no-untyped-def]
    with Nvml() as nvml:
        return nvml.inventory()


def node(capacity: dict[str, str]) -> NodeView:
    return NodeView("gpu-node-1", capacity=capacity, allocatable=capacity)


def files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


@pytest.mark.parametrize(
    ("text", "ok"),
    [(CONTAINERD_V2, True), (CONTAINERD_V1_RUNC_ONLY, False), (CRIO, True), ("not = [toml", False)],
)
def test_runtime_detection(text: str, ok: bool) -> None:
    assert validate.runtime_configured(text) is ok


@pytest.mark.parametrize(
    ("capacity", "ok"),
    [
        ({"cpu": "8", "nvidia.com/gpu": "8"}, True),
        ({"nvidia.com/mig-1g.5gb": "14", "nvidia.com/gpu": "0"}, True),
        ({"nvidia.com/gpu.shared": "32"}, True),
        ({"cpu": "8", "nvidia.com/gpu": "0"}, False),
        ({}, False),
    ],
)
def test_plugin_check(capacity: dict[str, str], ok: bool) -> None:
    assert validate.check_plugin(node(capacity)).ok is ok


def test_plugin_check_passes_where_no_device_plugin_is_deployed() -> None:
    """A node whose GPUs are DRA's (or opted out): it advertises nothing, and need not."""
    node = NodeView("gpu-node-1", labels={"nvidia.com/gpu.deploy.device-plugin": "false"})
    result = validate.check_plugin(node)
    assert result.ok and "no device plugin" in result.message


def test_all_checks_pass_write_every_file_and_the_marker(
    simulate: Simulate, tmp_path: Path
) -> None:
    simulate("a100-40gb:8")
    (tmp_path / "containerd.toml").write_text(CONTAINERD_V2)
    out = tmp_path / "validations"
    validator = Validator(
        read_inventory=read_inventory,
        read_node=lambda: node({"nvidia.com/gpu": "8"}),
        runtime_configs=[str(tmp_path / "*.toml")],
        directory=out,
        uvm_device=DEVNULL,
    )
    results = validator.validate_once()
    assert [(r.name, r.ok) for r in results] == [
        ("driver", True),
        ("toolkit", True),
        ("cuda", True),
        ("plugin", True),
    ]
    assert files(out) == {
        "driver-ready",
        "toolkit-ready",
        "cuda-ready",
        "plugin-ready",
        READY_MARKER,
    }
    assert (out / "driver-ready").read_text() == (
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/\n"
    )
    assert str(validate.READY_MARKER_PATH) == "/run/nvidia/validations/.ready"
    assert run_validator(validator, oneshot=True) == 0


def test_a_failing_check_stops_the_chain_and_withholds_the_marker(
    simulate: Simulate, tmp_path: Path
) -> None:
    simulate("t4:1")
    conf = tmp_path / "config.toml"
    conf.write_text(CONTAINERD_V1_RUNC_ONLY)
    out = tmp_path / "v"
    validator = Validator(
        read_inventory, lambda: node({"nvidia.com/gpu": "1"}), [str(conf)], out, uvm_device=DEVNULL
    )
    results = validator.validate_once()
    assert [(r.name, r.ok) for r in results] == [("driver", True), ("toolkit", False)]
    assert "not configured" in results[1].message and str(conf) in results[1].message
    assert files(out) == {"driver-ready"}
    assert run_validator(validator, oneshot=True) == 1
    conf.write_text(CONTAINERD_V2)  # the toolkit finished installing
    validator.validate_once()
    assert READY_MARKER in files(out)


def test_a_regression_removes_files_and_marker(simulate: Simulate, tmp_path: Path) -> None:
    sim = simulate("h100-80gb:1")
    conf = tmp_path / "crio.conf"
    conf.write_text(CRIO)
    out = tmp_path / "v"
    validator = Validator(
        read_inventory, lambda: node({"nvidia.com/gpu": "1"}), [str(conf)], out, uvm_device=DEVNULL
    )
    validator.validate_once()
    assert READY_MARKER in files(out)
    sim.fail("nvmlInitWithFlags", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    results = validator.validate_once()
    assert results[0].ok is False and "driver is not loaded" in results[0].message
    assert files(out) == set()


def test_no_gpu_no_driver_ready(simulate: Simulate, tmp_path: Path) -> None:
    simulate([])
    out = tmp_path / "v"
    validator = Validator(read_inventory, None, [], out, components=["driver"])
    (result,) = validator.validate_once()
    assert not result.ok and "sees no GPU" in result.message
    assert files(out) == set()


def test_selected_components_only(simulate: Simulate, tmp_path: Path) -> None:
    simulate("l4:1")
    out = tmp_path / "v"
    validator = Validator(
        read_inventory, None, [], out, components=["driver", "cuda"], uvm_device=DEVNULL
    )
    assert [r.name for r in validator.validate_once()] == ["driver", "cuda"]
    assert files(out) == {"driver-ready", "cuda-ready", READY_MARKER}


def test_plugin_without_api_access_fails(simulate: Simulate, tmp_path: Path) -> None:
    simulate("l4:1")
    validator = Validator(read_inventory, None, [], tmp_path, components=["driver", "plugin"])
    assert validator.validate_once()[-1].message.startswith("cannot read the Node")


def test_without_nvml_the_validator_waits_in_its_container_for_the_driver(
    simulate: Simulate, tmp_path: Path
) -> None:
    """NVML is loaded by path from the mounted driver root, where the driver's files appear when
    it is installed: the same container validates once they are there (an init container with
    until_ready then exits 0)."""
    from gpu_operator.agent.nvml import NvmlUnavailable

    calls: list[int] = []

    def driver_later() -> Any:
        calls.append(1)
        if len(calls) < 3:
            raise NvmlUnavailable(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "load")
        return read_inventory()

    simulate("l4:1")
    validator = Validator(driver_later, None, [], tmp_path / "v", components=["driver"])
    assert run_validator(validator, interval_s=0.01, until_ready=True) == 0
    assert len(calls) == 3
    assert files(tmp_path / "v") == {"driver-ready", READY_MARKER}


def test_runtime_configs_are_read_from_the_host_root() -> None:
    """In its pod the validator sees the host's / at /host; its own /etc is the image's."""
    configs = validate.host_runtime_configs("/host")
    assert configs[0] == "/host/etc/containerd/config.toml"
    assert "/host/etc/containerd/conf.d/*.toml" in configs
    assert validate.host_runtime_configs("/") == list(validate.RUNTIME_CONFIGS)


def test_cuda_needs_a_usable_nvidia_uvm_device(simulate: Simulate, tmp_path: Path) -> None:
    """NVIDIA issue 2685: the driver answers NVML but nvidia-uvm is not loaded: not validated."""
    simulate("l4:1")
    out = tmp_path / "v"
    missing = tmp_path / "nvidia-uvm"
    validator = Validator(
        read_inventory, None, [], out, components=["driver", "cuda"], uvm_device=missing
    )
    results = validator.validate_once()
    assert [(r.name, r.ok) for r in results] == [("driver", True), ("cuda", False)]
    assert str(missing) in results[1].message and "nvidia-modprobe -u" in results[1].message
    assert files(out) == {"driver-ready"}
    missing.write_text("")  # a plain file where the device node should be
    assert "not a character device" in validator.validate_once()[1].message
    assert READY_MARKER not in files(out)
    validator.uvm_device = DEVNULL  # the module loaded: the node validates
    assert all(r.ok for r in validator.validate_once())
    assert READY_MARKER in files(out)
    assert validate.check_uvm(Path("/dev/nvidia-uvm")).ok is Path("/dev/nvidia-uvm").exists()
