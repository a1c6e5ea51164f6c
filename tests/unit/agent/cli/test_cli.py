"""``gpu-operator agent ...`` wired into a parser, in-process and as separate processes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpu_operator.agent.cli import MODULES, add_agent_commands, monitor
from gpu_operator.agent.nvml import NvmlUnavailable, current_driver_root, use_driver_root
from gpu_operator.cli import main
from gpu_operator.sim.nvml import uninstall_simulated_nvml
from tests.unit.agent.conftest import mig_configmap

RUNNER = (
    "import argparse, sys\n"
    "from gpu_operator.agent.cli import add_agent_commands\n"
    "from gpu_operator.sim import registration\n"
    "registration.register()\n"
    "p = argparse.ArgumentParser(prog='gpu-operator')\n"
    "add_agent_commands(p.add_subparsers(dest='command', required=True))\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.func(a))\n"
)


ROOT_ENV = ("CONTAINER_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT")
# Every command that reads the GPUs, with the arguments it needs to parse.
NVML_COMMANDS = (
    ("discover",),
    ("mig-manager",),
    ("mig-parted", "plan"),
    ("exporter",),
    ("device-plugin",),
    ("mps-control-daemon",),
    ("dra-plugin",),
    ("compute-domain-plugin",),
    ("validate",),
    ("nvml-info",),
    ("cdi", "generate"),
    ("cdi", "list"),
    ("compute-domain-daemon", "run"),
)


@pytest.fixture(autouse=True)
def _clean_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ROOT_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    uninstall_simulated_nvml()
    use_driver_root(None)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-operator")
    add_agent_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["agent", *argv])


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu-operator")
    add_agent_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def agent_process(
    *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, "agent", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "NODE_NAME": "sim-node", **(env or {})},
        timeout=120,
    )


def test_discover_prints_labels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    product = tmp_path / "product_name"
    product.write_text("PowerEdge R750xa\n")
    assert (
        run(
            [
                "agent",
                "discover",
                "--simulate",
                "t4:2",
                "--output-file",
                "-",
                "--oneshot",
                "--machine-type-file",
                str(product),
            ]
        )
        == 0
    )
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["nvidia.com/gpu.product"] == "Tesla-T4"
    assert lines["nvidia.com/gpu.count"] == "2"
    assert lines["nvidia.com/gpu.machine"] == "PowerEdge-R750xa"
    assert "nvidia.com/gfd.timestamp" in lines


def test_nvml_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["agent", "nvml-info", "--simulate", "h100-80gb:2"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["driverVersion"] == "580.95.05"
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert doc["gpus"][0]["pciDeviceId"] == "0x233010DE"


def test_mig_parted_plan_and_generate(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(
            [
                "agent",
                "mig-parted",
                "plan",
                "all-balanced",
                "-f",
                str(mig_configmap()),
                "--simulate",
                "a100-40gb:1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "GPU 0 (NVIDIA A100-SXM4-40GB): mig on [3g.20gb@4, 2g.10gb@0, 1g.5gb@2, 1g.5gb@3] to apply"
        in out
    )
    assert (
        main(
            [
                "agent",
                "mig-parted",
                "apply",
                "all-7g.80gb",
                "-f",
                str(mig_configmap()),
                "--simulate",
                "a100-40gb:1",
            ]
        )
        == 1
    )
    assert "'7g.80gb' is not supported" in capsys.readouterr().err
    assert run(["agent", "mig-parted", "generate", "--simulate", "a100-80gb:1"]) == 0
    generated = yaml.safe_load(capsys.readouterr().out)
    assert "all-1g.10gb" in generated["mig-configs"]


def test_separate_agents_share_one_simulated_node(tmp_path: Path) -> None:
    """The MIG manager's change (one process) is what discovery sees (another process)."""
    env = {
        "GPU_OPERATOR_SIMULATE": "a100-40gb:2",
        "GPU_OPERATOR_SIMULATE_STATE": str(tmp_path / "state.json"),
    }
    applied = agent_process(
        "mig-parted", "apply", "all-1g.5gb", "-f", str(mig_configmap()), env=env
    )
    assert applied.returncode == 0, applied.stderr
    labels = agent_process(
        "discover", "--oneshot", "--output-file", "-", "--mig-strategy", "single", env=env
    )
    assert labels.returncode == 0, labels.stderr
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.5gb" in labels.stdout
    assert "nvidia.com/gpu.count=14" in labels.stdout


def test_validate_oneshot_exit_status(tmp_path: Path) -> None:
    conf = tmp_path / "config.toml"
    conf.write_text('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n')
    out = tmp_path / "validations"
    assert (
        run(
            [
                "agent",
                "validate",
                "--simulate",
                "l4:1",
                "--oneshot",
                "--components",
                "driver,toolkit,cuda",
                "--runtime-config",
                str(conf),
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert (out / ".ready").exists()
    assert (out / "driver-ready").read_text() == (
        "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/\n"
    )
    argv = ["agent", "validate", "--simulate", "l4:1", "--oneshot", "--components", "driver"]
    assert run([*argv, "--output-dir", str(out), "--host-driver-root", "/run/nvidia/driver"]) == 0
    assert (out / "driver-ready").read_text() == (
        "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/\n"
    )
    assert main(["agent", "validate", "--components", "driver,bogus"]) == 2


def test_validate_says_in_one_line_when_it_cannot_write_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the DRA validator's init container did, nonroot, with /run/nvidia/validations: one
    line naming the directory and the option, no traceback, and nothing checked."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    argv = ["agent", "validate", "--simulate", "l4:1", "--with-wait", "--components", "cuda"]
    assert main([*argv, "--output-dir", str(blocked / "validations")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"error: {blocked / 'validations'}: cannot write the validation files there" in err
    assert "--output-dir" in err


def test_exporter_reads_dcgm_exporter_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's env turns the pod attribution off; unset, the agent keeps it on."""

    def parsed(*argv: str) -> argparse.Namespace:
        return parse("exporter", *argv)

    monkeypatch.delenv("DCGM_EXPORTER_KUBERNETES", raising=False)
    assert parsed().kubernetes is True
    monkeypatch.setenv("DCGM_EXPORTER_KUBERNETES", "false")
    assert parsed().kubernetes is False
    assert parsed("--kubernetes").kubernetes is True


def test_each_module_registers_its_commands_and_imports_only_what_is_light() -> None:
    parser = argparse.ArgumentParser(prog="gpu-operator")
    agent = add_agent_commands(parser.add_subparsers(dest="command", required=True))
    commands = next(a for a in agent._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {
        "discover",
        "nvml-info",
        "mig-manager",
        "mig-parted",
        "exporter",
        "validate",
        "device-plugin",
        "mps-control-daemon",
        "dra-plugin",
        "compute-domain-plugin",
        "mps-claim-daemon",
        "cdi",
        "compute-domain-daemon",
    }  # and the simulation's own, which the command line adds (tests/unit/sim/test_commands.py)
    assert all(callable(module.register) for module in MODULES)
    heavy = (
        "prometheus_client",
        "pydantic",
        "gpu_operator.agent.exporter",
        "gpu_operator.agent.mig_manager",
        "gpu_operator.agent.migparted",
        "gpu_operator.agent.deviceplugin.agent",
        "gpu_operator.agent.dra",
        "gpu_operator.sim",
        "gpu_operator.agent.driver_cdi",
    )
    probe = (
        "import sys\n"
        "import gpu_operator.agent.cli\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("command", NVML_COMMANDS, ids=" ".join)
def test_every_nvml_command_takes_the_driver_root(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse(*command).driver_root == "/"
    monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
    assert parse(*command).driver_root == "/run/nvidia/driver"
    monkeypatch.setenv("CONTAINER_DRIVER_ROOT", "/driver-root")
    assert parse(*command).driver_root == "/driver-root"
    assert parse(*command, "--driver-root", "/elsewhere").driver_root == "/elsewhere"


def test_nvml_comes_from_the_driver_root_unless_simulated(tmp_path: Path) -> None:
    # Raised for gpu_operator.cli.main to report (exit 4: no usable driver).
    with pytest.raises(NvmlUnavailable, match=f"not found under driver root {tmp_path}"):
        run(["agent", "nvml-info", "--driver-root", str(tmp_path)])
    assert current_driver_root() == str(tmp_path)
    use_driver_root(None)
    assert run(["agent", "nvml-info", "--simulate", "t4:1", "--driver-root", str(tmp_path)]) == 0
    assert current_driver_root() == "/"  # the simulated NVML: the root is not used


def test_validate_host_driver_root_and_uvm_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = parse("validate")
    assert (args.host_driver_root, args.driver_root) == ("/", "/")
    monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")
    assert parse("validate").host_driver_root == "/run/nvidia/driver"
    assert parse("validate", "--host-driver-root", "/h").host_driver_root == "/h"

    def uvm(*argv: str) -> Path | None:
        found = monitor.uvm_device(parse("validate", "--driver-root", str(tmp_path), *argv))
        return found() if callable(found) else found

    assert uvm("--simulate", "t4:1") is None
    assert uvm("--uvm-device", "") is None
    assert uvm("--uvm-device", "/x/nvidia-uvm") == Path("/x/nvidia-uvm")
    if Path("/dev/nvidiactl").exists():
        assert uvm() == Path("/dev/nvidia-uvm")
        return
    assert uvm() == Path("/dev/nvidia-uvm")  # no driver loaded anywhere: the host's /dev
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    assert uvm() == tmp_path / "dev" / "nvidia-uvm"  # the driver root's own device nodes
    # Asked at each check: a driver container lays its nodes out after the validator starts.
    later = monitor.uvm_device(parse("validate", "--driver-root", str(tmp_path / "later")))
    assert callable(later) and later() == Path("/dev/nvidia-uvm")
    (tmp_path / "later" / "dev").mkdir(parents=True)
    (tmp_path / "later" / "dev" / "nvidiactl").touch()
    assert later() == tmp_path / "later" / "dev" / "nvidia-uvm"


def test_dra_plugin_refuses_gates_nvidias_driver_refuses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before NVML is opened or anything published: nothing half-configured runs."""
    monkeypatch.setenv("FEATURE_GATES", "DynamicMIG=true,MPSSupport=true")
    assert main(["agent", "dra-plugin", "--node-name", "n1"]) == 2
    err = capsys.readouterr().err
    assert "DynamicMIG and MPSSupport cannot both be on" in err
    assert "FEATURE_GATES" in err
    assert main(["agent", "dra-plugin", "--node-name", "n1", "--feature-gates", "Nope=true"]) == 2
    assert "unknown feature gate(s) Nope" in capsys.readouterr().err
