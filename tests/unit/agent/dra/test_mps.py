"""MPS per claim: the daemon's Deployment and the CDI edits its clients get (pure), and the
daemon's process running the stub driver's control daemon with a claim's defaults."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_operator.agent.dra import mps, mps_daemon
from gpu_operator.agent.dra.mps import DaemonPod, MpsDaemon
from gpu_operator.sim import stubdriver as sd
from tests import prerequisites
from tests.unit.sim.test_operands import wait_for
from tests.unit.sim.test_stubdriver import GPUS, lay_driver

DAEMON = MpsDaemon(
    id="u1-abcde",
    claim_uid="u1",
    devices=(GPUS[1].uuid,),
    gpus=(GPUS[1].uuid,),
    thread_percentage=50,
    pinned_limits={GPUS[1].uuid: "10240M"},
)
POD = DaemonPod("node-a", "gpu-operator", "example.com/gpu-operator:v1", "/run/nvidia/driver")


def test_the_daemon_runs_bound_to_its_node_with_the_claims_defaults_and_directories() -> None:
    where = mps.dirs(Path("/var/lib/kubelet/plugins/gpu.nvidia.com"), DAEMON.id)
    deployment = mps.deployment(DAEMON, where, POD)
    assert deployment["metadata"]["name"] == "mps-control-daemon-u1-abcde"
    assert deployment["metadata"]["labels"][mps.CLAIM_LABEL] == "u1"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeName"] == "node-a" and "affinity" not in pod  # no scheduler involved
    (container,) = pod["containers"]
    assert container["image"] == POD.image
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == GPUS[1].uuid
    assert env[mps.ENV_THREADS] == "50"
    assert mps.parse_limits(env[mps.ENV_LIMITS]) == {GPUS[1].uuid: "10240M"}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["driver-root"] == "/run/nvidia/driver"
    assert volumes["mps-pipe"] == str(where.pipe) and mounts["mps-pipe"] == mps.PIPE_DIR
    assert volumes["mps-shm"] == str(where.shm) and mounts["mps-shm"] == "/dev/shm"
    edits = mps.cdi_edits(where)
    assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert {m["containerPath"]: m["hostPath"] for m in edits["mounts"]} == {
        "/dev/shm": str(where.shm),
        "/tmp/nvidia-mps": str(where.pipe),
    }


def test_the_daemon_process_is_ready_only_once_the_daemon_holds_its_limits(
    tmp_path: Path,
) -> None:
    """``agent mps-claim-daemon``: the driver's control daemon started, given the claim's
    defaults, ``startup.log`` written (the pod's readiness); stopped, it quits the daemon."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    prerequisites.gcc()
    root = lay_driver(tmp_path / "driver", sd.build_stubs())
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_VISIBLE_DEVICES": GPUS[1].uuid,
        mps.ENV_THREADS: "50",
        mps.ENV_LIMITS: mps.limits_text({GPUS[1].uuid: "10240M"}),
    }
    stop = threading.Event()
    done: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        runner = threading.Thread(target=lambda: done.append(mps_daemon.run(str(root), stop)))
        runner.start()
        try:
            wait_for(lambda: (logs / mps.STARTED).exists())
            state = sd.read_mps_state(pipe)
            assert state is not None and state.thread_percentage == "50.0"
            assert state.pinned_limits == {GPUS[1].uuid: "10240M"}
        finally:
            stop.set()
            runner.join(30)
    assert done == [0]
    assert sd.read_mps_state(pipe) is None and not (pipe / "control").exists()
    assert not (logs / mps.STARTED).exists()


def test_a_setting_the_daemon_refuses_fails_the_pod_instead_of_running_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    prerequisites.gcc()
    root = lay_driver(tmp_path / "driver", sd.build_stubs())
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "log"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPUS[1].uuid)
    monkeypatch.setenv(mps.ENV_LIMITS, "GPU-not-this-daemons=1024M")
    assert mps_daemon.run(str(root), threading.Event()) == 1
    assert not (tmp_path / "log" / mps.STARTED).exists()
    assert sd.read_mps_state(tmp_path / "pipe") is None  # told to quit


def test_a_claims_daemon_pipe_replaces_the_node_wide_one_in_its_cdi_spec(tmp_path: Path) -> None:
    """A driver root with an MPS pipe directory of its own (a node-wide daemon's) is mounted
    into every container; a claim shared with MPS gets its own daemon's there instead."""
    from gpu_operator.agent.dra.devices import DeviceRef
    from gpu_operator.agent.dra.prepare import PreparedDevice, cdi_spec
    from gpu_operator.agent.driver_cdi import find_host_driver

    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has /dev/nvidiactl (a real driver): the stub would use /dev")
    prerequisites.gcc()
    root = lay_driver(tmp_path / "driver", sd.build_stubs())
    (root / "tmp" / "nvidia-mps").mkdir(parents=True)
    driver, missing = find_host_driver(str(root), "/")
    assert missing is None
    refs = {"gpu-0": DeviceRef(GPUS[1].uuid, 0)}
    plain = PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=u1-gpu-0",))
    spec = cdi_spec("u1", (plain,), refs, driver, tmp_path)
    pipes = [m for m in spec["containerEdits"]["mounts"] if m["containerPath"] == mps.PIPE_DIR]
    assert [m["hostPath"] for m in pipes] == ["/tmp/nvidia-mps"]  # the driver root is / on the host
    spec = cdi_spec("u1", (replace(plain, mps=DAEMON),), refs, driver, tmp_path)
    common = spec["containerEdits"].get("mounts") or []
    assert mps.PIPE_DIR not in {m["containerPath"] for m in common}
    (device,) = spec["devices"]
    own = {m["containerPath"]: m["hostPath"] for m in device["containerEdits"]["mounts"]}
    assert own[mps.PIPE_DIR] == str(mps.dirs(tmp_path, DAEMON.id).pipe)
