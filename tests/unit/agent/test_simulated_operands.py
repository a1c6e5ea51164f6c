"""The SIMULATED driver and toolkit leave what the rest of the stack reads: the simulated NVML's
descriptor in the driver root (what the node's `nvidia` runtime hands to containers), and a
containerd drop-in naming the `nvidia` runtime (what the validator's toolkit check reads)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpu_operator import labels
from gpu_operator.agent import simulated_operands as sim
from gpu_operator.agent import validate
from gpu_operator.agent.simnvml import (
    DEFAULT_DRIVER,
    ENV_DRIVER,
    ENV_SEED,
    ENV_SIMULATE,
    ENV_STATE,
    build_simulated_nvml,
)


def _host(tmp_path: Path, spec: str = "a100-40gb:2") -> Path:
    sim_dir = tmp_path / "host" / labels.SIMULATED_GPUS_DIR.lstrip("/")
    sim_dir.mkdir(parents=True)
    (sim_dir / labels.SIMULATED_GPUS_PROFILE).write_text(spec + "\n")
    return sim_dir


def test_driver_installs_the_descriptor_and_removes_it_when_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "real-node-7")
    sim_dir = _host(tmp_path)
    root = tmp_path / "driver"
    stop = threading.Event()
    done: list[int] = []
    thread = threading.Thread(
        target=lambda: done.append(
            sim.run_driver(
                sim_dir / labels.SIMULATED_GPUS_PROFILE, root, sim_dir, stop, "595.91.07"
            )
        )
    )
    thread.start()
    descriptor = root / labels.SIMULATED_NVML_DESCRIPTOR
    try:
        for _ in range(500):
            if descriptor.exists():
                break
            threading.Event().wait(0.01)
        env = sim.parse_descriptor(descriptor.read_text())
        assert env == {
            ENV_SIMULATE: "a100-40gb:2",
            ENV_STATE: f"{labels.SIMULATED_GPUS_DIR}/{labels.SIMULATED_NVML_STATE}",
            ENV_SEED: "real-node-7",  # every agent on the node sees the same GPU UUIDs
            ENV_DRIVER: "595.91.07",  # the version the driver image installs, as NVML says
        }
        assert (sim_dir / labels.SIMULATED_NVML_STATE).exists()  # the agents' shared MIG state
        assert sim.main_smi(root, sim_dir) == 0
    finally:
        stop.set()
        thread.join(10)
    assert done == [0] and not descriptor.exists()
    out = capsys.readouterr().out
    assert all(line.startswith("SIMULATED") for line in out.splitlines()), out
    assert "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-" in out
    assert "driver 595.91.07 'installed'" in out


def test_agents_report_the_driver_version_of_the_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container the `nvidia` runtime gave the descriptor's env sees the installed version."""
    monkeypatch.delenv(ENV_DRIVER, raising=False)
    assert build_simulated_nvml("t4:1").node.driver_version == DEFAULT_DRIVER
    monkeypatch.setenv(ENV_DRIVER, "595.91.07")
    assert build_simulated_nvml("t4:1").node.driver_version == "595.91.07"
    assert build_simulated_nvml("t4:1", driver_version="1.2.3").node.driver_version == "1.2.3"


def test_without_a_profile_the_driver_fails_saying_where_it_runs(tmp_path: Path) -> None:
    with pytest.raises(sim.SimulationError, match="--real-nodes"):
        sim.install_driver(tmp_path / "none", tmp_path / "driver", tmp_path)


def test_smi_fails_without_a_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main_smi(tmp_path / "driver", tmp_path) == 9
    assert "SIMULATED: NVIDIA-SMI has failed: no driver" in capsys.readouterr().err


def test_toolkit_drop_in_is_what_the_validator_recognises(tmp_path: Path) -> None:
    config = tmp_path / "etc-containerd" / "config.toml"
    stop = threading.Event()
    stop.set()  # declare, then undo at once
    text = sim.toolkit_drop_in("nvidia", "/x/nvidia-container-runtime")
    assert validate.runtime_configured(text, "nvidia")
    assert not validate.runtime_configured(text, "other")
    assert sim.run_toolkit(config, "nvidia", stop) == 0
    assert not (config.parent / "conf.d" / sim.TOOLKIT_DROP_IN).exists()


def test_the_seed_gives_pods_without_node_name_the_node_s_uuids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device plugin's pod has no NODE_NAME: without the seed its GPU UUIDs would be its
    pod's, and the exporter could not match PodResources' device IDs to GPUs."""
    monkeypatch.setenv("NODE_NAME", "real-node-0")
    expected = [g.uuid for g in build_simulated_nvml("t4:2").node.gpus]
    monkeypatch.delenv("NODE_NAME")
    monkeypatch.setenv(ENV_SEED, "real-node-0")
    assert [g.uuid for g in build_simulated_nvml("t4:2").node.gpus] == expected


def test_manager_unloads_the_previous_driver_and_succeeds_without_one(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    root.mkdir()
    descriptor = root / labels.SIMULATED_NVML_DESCRIPTOR
    descriptor.write_text("GPU_OPERATOR_SIMULATE=a100-40gb:2\n")
    assert sim.run_manager(root) == 0
    assert not descriptor.exists()
    assert sim.run_manager(root) == 0  # nothing loaded: nothing to do, still success
