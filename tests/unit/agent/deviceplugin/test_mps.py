"""The SIMULATED MPS control daemon: which resources get one, and the files it leaves where
the plugin's Allocate points pods (``<root>/<resource>/pipe``, ``.started``, ``<root>/shm``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpu_operator.agent.deviceplugin import mps
from gpu_operator.agent.deviceplugin.agent import DevicePluginAgent, HealthOptions, Paths
from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config
from gpu_operator.agent.deviceplugin.kubelet import LocalKubelet
from gpu_operator.agent.deviceplugin.resources import device_map
from gpu_operator.agent.nvml import Nvml
from tests.unit.agent.conftest import Simulate, inventory_with

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


def test_without_simulated_gpus_the_command_says_why_it_cannot_run(tmp_path: Path) -> None:
    """No driver root with a driver here: the daemon says where it looked (on real GPUs it
    refuses and names NVIDIA's image instead: tests/gpu)."""
    env = {k: v for k, v in os.environ.items() if k != "GPU_OPERATOR_SIMULATE"}
    env["CONTAINER_DRIVER_ROOT"] = str(tmp_path / "no-driver")
    done = subprocess.run(
        _command("--mps-root", str(tmp_path / "mps")),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 4  # no usable GPU driver
    assert "libnvidia-ml.so.1 (64-bit x86_64) not found under driver root" in done.stderr
    assert str(tmp_path / "no-driver") in done.stderr
    assert not (tmp_path / "mps").exists()


def test_simulated_daemon_lays_out_the_files_and_removes_started_on_sigterm(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(MPS % "")
    root = tmp_path / "mps"
    started = root / "nvidia.com/gpu" / ".started"
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "CONFIG_FILE_SRCDIR")}
    # Simulated GPUs alone make it the simulated daemon (as the node's runtime sets them).
    env["GPU_OPERATOR_SIMULATE"] = "a100-40gb:2"
    proc = subprocess.Popen(
        _command("--mps-root", str(root), "--config-file", str(config)),
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


def test_mps_replicas_are_unhealthy_until_the_daemon_is_ready(simulate: Simulate) -> None:
    """The plugin waits for the daemon as NVIDIA's does: over the kubelet socket, every replica
    is Unhealthy until ``<root>/<resource>/.started`` exists, then Healthy on the same stream."""
    simulate("a100-40gb:2")
    root = Path(tempfile.mkdtemp(prefix="gpuop-mps-", dir="/tmp"))  # short socket paths
    try:
        with Nvml() as nvml, LocalKubelet(root / "device-plugins") as kubelet:
            agent = DevicePluginAgent(
                nvml,
                paths=Paths(kubelet.socket_path, root / "cdi", root / "sys", mps_dir=root / "mps"),
                health_options=HealthOptions(poll_s=0.02),
                kubelet_poll_s=0.05,
            )
            agent.apply(parse_device_plugin_config(MPS % ""))
            agent.start()
            try:
                kubelet.wait_for_registration("nvidia.com/gpu")
                with kubelet.client("nvidia.com/gpu") as client:
                    stream = client.list_and_watch(20.0)
                    first = next(stream).devices
                    assert len(first) == 8
                    assert {d.health for d in first} == {"Unhealthy"}
                    mps.lay_out(root / "mps", ["nvidia.com/gpu"])
                    assert {d.health for d in next(stream).devices} == {"Healthy"}
                    stream.cancel()  # type: ignore[attr-defined]
            finally:
                agent.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
