"""The SIMULATED MPS control daemon: which resources get one, and the files it leaves where
the plugin's Allocate points pods (``<root>/<resource>/pipe``, ``.started``, ``<root>/shm``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_operator.agent.deviceplugin import device_map, mps
from gpu_operator.agent.deviceplugin_config import parse_device_plugin_config

from .conftest import Simulate, inventory_with

MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4%s}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MPS % "", ["nvidia.com/gpu"]),
        (MPS % ", rename: gpu.mps", ["nvidia.com/gpu.mps"]),
        (MPS.replace("mps:", "timeSlicing:") % "", []),
        ("version: v1\n", []),
    ],
)
def test_only_mps_shared_resources_get_a_daemon(
    simulate: Simulate, text: str, expected: list[str]
) -> None:
    config = parse_device_plugin_config(text)
    devices = device_map(inventory_with(simulate, "a100-40gb:2"), config)
    assert mps.mps_resources(devices, config.sharing.strategy) == expected


def test_lay_out_starts_and_stops_resources(tmp_path: Path) -> None:
    started = mps.lay_out(tmp_path, ["nvidia.com/gpu", "nvidia.com/gpu.mps"])
    assert started == ["nvidia.com/gpu", "nvidia.com/gpu.mps"]
    for resource in started:
        assert (tmp_path / resource / "pipe").is_dir()
        assert (tmp_path / resource / "log").is_dir()
        assert (tmp_path / resource / ".started").is_file()
    assert (tmp_path / "shm").is_dir()
    assert mps.lay_out(tmp_path, ["nvidia.com/gpu.mps"], started) == ["nvidia.com/gpu.mps"]
    assert not (tmp_path / "nvidia.com/gpu" / ".started").exists()
    assert (tmp_path / "nvidia.com/gpu.mps" / ".started").exists()


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_operator", "agent", "mps-control-daemon", *args]


def test_without_simulated_the_command_refuses_and_says_what_to_use(tmp_path: Path) -> None:
    done = subprocess.run(
        _command("--simulate", "a100-40gb:1", "--mps-root", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--simulated" in done.stderr and "NVIDIA's device-plugin image" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_simulated_daemon_lays_out_the_files_and_removes_started_on_sigterm(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(MPS % "")
    root = tmp_path / "mps"
    started = root / "nvidia.com/gpu" / ".started"
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "CONFIG_FILE_SRCDIR")}
    proc = subprocess.Popen(
        _command("--simulated", "--simulate", "a100-40gb:2", "--mps-root", str(root),
                 "--config-file", str(config)),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # a condition: the log line saying it is ready
            if "SIMULATED MPS control daemon for nvidia.com/gpu:" in line:
                break
        assert started.is_file() and (root / "nvidia.com/gpu" / "pipe").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not started.exists()
