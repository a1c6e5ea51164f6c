"""The SIMULATED driver and toolkit leave on the node what NVIDIA's leave: a driver root with
the stub driver (libraries, nvidia-smi, firmware, device nodes), a containerd drop-in naming the
`nvidia` runtime (what the validator's toolkit check reads) and, with CDI on, the node's CDI spec.

The stub is built with gcc (skipped without it, failed in CI). Device nodes are made only as
root; the tests that need them skip otherwise. The toolkit runs in a subprocess: its CDI spec
opens NVML from the driver root, and the stub library loaded into this process would be what
later tests' pynvml finds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_operator import labels
from gpu_operator.agent import validate
from gpu_operator.agent.driverroot import char_device_majors
from gpu_operator.sim import operands as sim
from gpu_operator.sim.nvml import build_simulated_nvml
from gpu_operator.sim.stubdriver import PROC_DEVICES, build_stubs
from tests import prerequisites

LIB = "usr/lib/x86_64-linux-gnu"
NOT_ROOT = "device nodes are made only as root (mknod)"
TOOLKIT = (
    "import sys, threading\n"
    "from pathlib import Path\n"
    "from gpu_operator.sim import operands as sim, registration\n"
    "from gpu_operator.agent.nvml import use_driver_root\n"
    "registration.register()  # the stub driver's NVML, as gpu-operator's command line has it\n"
    "config, cdi, root = sys.argv[1:4]\n"
    "use_driver_root(root)\n"
    "sys.exit(sim.run_toolkit(Path(config), 'nvidia', Path(cdi), root, '/run/nvidia/driver',\n"
    "                         threading.Event(), 0.05))\n"
)


@pytest.fixture(scope="module")
def artefacts() -> Path:
    prerequisites.gcc()
    return build_stubs()


@pytest.fixture
def stub(artefacts: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The built stub driver, which install_driver lays out (as the stand-in images do)."""
    monkeypatch.setenv(sim.ENV_ARTEFACTS, str(artefacts))
    return artefacts


def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def profile(tmp_path: Path, spec: str = "a100-40gb:2") -> Path:
    sim_dir = tmp_path / "host" / labels.SIMULATED_GPUS_DIR.lstrip("/")
    sim_dir.mkdir(parents=True)
    path = sim_dir / labels.SIMULATED_GPUS_PROFILE
    path.write_text(spec + "\n")
    return path


def test_install_lays_out_the_stub_driver_and_a_manifest(stub: Path, tmp_path: Path) -> None:
    root = tmp_path / "driver"
    info = sim.install_driver("a100-40gb:2", root, seed="node-1", driver_version="595.91.07")
    assert info == {"spec": "a100-40gb:2", "driver_version": "595.91.07", "gpus": "2"}
    assert (root / LIB / "libnvidia-ml.so.595.91.07").is_file()
    assert os.readlink(root / LIB / "libnvidia-ml.so.1") == "libnvidia-ml.so.595.91.07"
    assert os.access(root / "usr/bin/nvidia-smi", os.X_OK)
    manifest = json.loads((root / sim.MANIFEST).read_text())
    assert f"{LIB}/libcuda.so.595.91.07" in manifest
    if os.geteuid() == 0:
        assert {"dev/nvidia0", "dev/nvidia1", "dev/nvidiactl"} <= set(manifest)
        assert (root / "dev/nvidia1").is_char_device()
    # The table carries the GPUs the simulated NVML names for this node (the seed).
    uuid = build_simulated_nvml("a100-40gb:2", seed="node-1").node.gpus[1].uuid
    assert uuid.encode() in (root / LIB / "libnvidia-ml.so.595.91.07").read_bytes()
    assert sim.uninstall_driver(root)
    assert not (root / LIB).exists() and not (root / sim.MANIFEST).exists()
    assert not sim.uninstall_driver(root)  # nothing there: nothing to undo


@pytest.mark.parametrize(("spec", "imex"), [("gb200:4", True), ("h100-80gb:2", False)])
def test_install_gives_imex_channels_only_to_gpus_with_an_nvlink_fabric(
    stub: Path, tmp_path: Path, spec: str, imex: bool
) -> None:
    root = tmp_path / "driver"
    sim.install_driver(spec, root, seed="node-1")
    manifest = set(json.loads((root / sim.MANIFEST).read_text()))
    majors = char_device_majors((root / PROC_DEVICES).read_text())
    assert ("nvidia-caps-imex-channels" in majors) is imex
    assert PROC_DEVICES in manifest
    if os.geteuid() == 0:
        channel0 = root / "dev/nvidia-caps-imex-channels/channel0"
        assert channel0.is_char_device() is imex
        assert ("dev/nvidia-caps-imex-channels/channel0" in manifest) is imex
    assert sim.uninstall_driver(root)


def test_driver_installs_then_unloads_when_stopped(
    stub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "real-node-7")
    root = tmp_path / "driver"
    stop = threading.Event()
    done: list[int] = []
    thread = threading.Thread(
        target=lambda: done.append(sim.run_driver(profile(tmp_path), root, stop, "595.91.07"))
    )
    thread.start()
    library = root / LIB / "libnvidia-ml.so.595.91.07"
    try:
        wait_for(lambda: (root / sim.MANIFEST).exists())
        assert library.is_file() and (root / "usr/bin/nvidia-smi").is_file()
        nodes = [
            entry for entry in json.loads((root / sim.MANIFEST).read_text()) if "dev/" in entry
        ]
    finally:
        stop.set()
        thread.join(30)
    assert done == [0]
    assert not library.exists() and not (root / "usr/bin/nvidia-smi").exists()
    assert not (root / sim.MANIFEST).exists()
    assert all((root / node).exists() for node in nodes if node.startswith("dev/nvidia"))
    out = capsys.readouterr().out
    assert all(line.startswith("SIMULATED") for line in out.splitlines()), out
    assert "driver 595.91.07 'installed' with 2 simulated GPU(s) (a100-40gb:2)" in out
    assert "driver 'unloaded'" in out


def test_the_driver_keeps_its_device_nodes_when_unloaded(stub: Path, tmp_path: Path) -> None:
    """A container may still use /dev/nvidia*, and a real driver's unload leaves them too."""
    as_root()
    root = tmp_path / "driver"
    sim.install_driver("t4:1", root, seed="n")
    sim.uninstall_driver(root)
    assert (root / "dev/nvidia0").is_char_device() and (root / "dev/nvidiactl").is_char_device()
    assert not (root / LIB).exists()


def test_a_bad_profile_fails_the_driver_saying_why(
    stub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "driver"
    assert sim.run_driver(profile(tmp_path, "no-such-gpu:2"), root, threading.Event()) == 1
    out = capsys.readouterr().out
    assert "SIMULATED: driver not installed:" in out and "no-such-gpu" in out
    assert not (root / sim.MANIFEST).exists()
    with pytest.raises(ValueError, match="no-such-gpu"):
        sim.install_driver("no-such-gpu:2", root, seed="n")


def test_without_a_profile_the_driver_fails_saying_where_it_runs(tmp_path: Path) -> None:
    with pytest.raises(sim.SimulationError, match="--real-nodes"):
        sim.read_profile(tmp_path / "none")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(sim.SimulationError, match="is empty"):
        sim.read_profile(tmp_path / "empty")


def test_manager_unloads_the_previous_driver_and_succeeds_without_one(
    stub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "driver"
    sim.install_driver("a100-40gb:1", root, seed="n")
    assert sim.run_manager(root) == 0
    assert not (root / sim.MANIFEST).exists() and not (root / LIB).exists()
    assert "previous driver 'unloaded'" in capsys.readouterr().out
    assert sim.run_manager(root) == 0  # nothing loaded: nothing to do, still success
    assert "nothing to unload" in capsys.readouterr().out


def test_toolkit_drop_in_is_what_the_validator_recognises(tmp_path: Path) -> None:
    config = tmp_path / "etc-containerd" / "config.toml"
    stop = threading.Event()
    stop.set()  # declare, then undo at once
    text = sim.toolkit_drop_in("nvidia", "/x/nvidia-container-runtime")
    assert validate.runtime_configured(text, "nvidia")
    assert not validate.runtime_configured(text, "other")
    assert sim.run_toolkit(config, "nvidia", stop=stop) == 0
    assert not (config.parent / "conf.d" / sim.TOOLKIT_DROP_IN).exists()


def test_toolkit_writes_the_cdi_spec_once_the_driver_is_there(stub: Path, tmp_path: Path) -> None:
    as_root()
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    config, cdi, root = tmp_path / "containerd/config.toml", tmp_path / "cdi", tmp_path / "driver"
    drop_in, spec_file = config.parent / "conf.d" / sim.TOOLKIT_DROP_IN, cdi / sim.CDI_SPEC
    toolkit = subprocess.Popen(
        [sys.executable, "-c", TOOLKIT, str(config), str(cdi), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(drop_in.exists)
        assert 'BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"' in (
            drop_in.read_text()
        )
        time.sleep(0.2)  # a few rounds without a driver: no spec
        assert not spec_file.exists()
        sim.install_driver("a100-40gb:2", root, seed="node-2")
        wait_for(spec_file.exists)
        spec = json.loads(spec_file.read_text())
    finally:
        toolkit.send_signal(signal.SIGTERM)
        out, _ = toolkit.communicate(timeout=30)
    assert toolkit.returncode == 0, out
    assert not spec_file.exists() and not drop_in.exists()
    uuids = [g.uuid for g in build_simulated_nvml("a100-40gb:2", seed="node-2").node.gpus]
    assert [d["name"] for d in spec["devices"]] == ["0", uuids[0], "1", uuids[1], "all"]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts["/usr/lib64/libnvidia-ml.so.1"].startswith("/run/nvidia/driver/usr/lib/")
    assert mounts["/dev/gpu-operator-sim"] == "/run/nvidia/driver/dev/gpu-operator-sim"
    assert all(line.startswith("SIMULATED") for line in out.splitlines()), out
    assert "CDI spec for the driver written to" in out


def test_no_cdi_spec_is_read_from_a_driver_still_being_laid_out(stub: Path, tmp_path: Path) -> None:
    """The toolkit polls while the driver installs: until the install's manifest (its last
    file) is there, the files already laid out are not a driver to describe."""
    root = tmp_path / "driver"
    sim.install_driver("a100-40gb:2", root, seed="node-2")
    manifest = root / sim.MANIFEST
    manifest.unlink()  # as the install looks just before its last step
    assert (root / "dev" / "nvidia0").exists()
    assert sim.node_cdi_spec(str(root), "/run/nvidia/driver") is None
