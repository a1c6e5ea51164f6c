"""The simulation's own agent commands (``agent simulate-driver``, ``simulate-toolkit``,
``simulate-fault``), as the command line adds them to ``gpu-operator agent``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agent.nvml import current_driver_root, use_driver_root
from gpu_operator.cli import build_parser, main
from gpu_operator.sim import operands
from gpu_operator.sim.nvml import uninstall_simulated_nvml
from tests import prerequisites

SIMULATION_ONLY = {"simulate-driver", "simulate-toolkit", "simulate-fault"}


@pytest.fixture(autouse=True)
def _clean_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("CONTAINER_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    yield
    uninstall_simulated_nvml()
    use_driver_root(None)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["agent", *argv])


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


def agent_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    def sub(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        return dict(action.choices)

    return sub(sub(parser)["agent"])


def test_the_command_line_adds_them_to_the_agents_with_the_agents_options() -> None:
    found = agent_commands(build_parser())
    assert set(found) >= SIMULATION_ONLY
    for name in sorted(SIMULATION_ONLY):
        options = {o for a in found[name]._actions for o in a.option_strings}
        assert options >= {"--log-format", "--debug"}, name


def test_simulate_driver_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    def record(name: str) -> Any:
        return lambda *a, **kw: calls.append((name, (a, kw))) or 0

    monkeypatch.setattr(operands, "run_driver", record("driver"))
    monkeypatch.setattr(operands, "run_manager", record("manager"))
    driver = Path("/run/nvidia/driver")
    # Where it writes is never a default: the stand-in image's command passes it.
    root = ["--driver-root", str(driver)]
    assert run(["agent", "simulate-driver", *root, "--host-root", str(tmp_path)]) == 0
    profile = tmp_path / "run" / "gpu-operator-sim" / "profile"
    assert calls.pop() == ("driver", ((profile, driver), {"driver_version": None}))
    argv = ["agent", "simulate-driver", "init", "--driver-root", "/d", "--driver-version", "1.2"]
    assert run([*argv, "--host-root", str(tmp_path)]) == 0
    assert calls.pop() == ("driver", ((profile, Path("/d")), {"driver_version": "1.2"}))
    # k8s-driver-manager's entrypoint passes its own step word after the action
    assert run(["agent", "simulate-driver", *root, "manager", "uninstall_driver"]) == 0
    assert calls.pop() == ("manager", ((driver,), {}))
    for action in ("init", "manager"):
        assert main(["agent", "simulate-driver", action]) == 2
    assert not calls
    with pytest.raises(SystemExit):
        parse("simulate-driver", "smi")  # the stub driver has a real nvidia-smi


def test_simulate_driver_install_and_uninstall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    prerequisites.gcc()
    root = tmp_path / "driver"
    install = ["agent", "simulate-driver", "install", "--root", str(root), "--seed", "node-3"]
    assert (
        run([*install, "--spec", "a100-40gb:2", "--style", "rhel", "--driver-version", "1.2"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("SIMULATED: driver 1.2 installed in"), out
    assert (root / "usr/lib64/libnvidia-ml.so.1.2").is_file()
    assert run(["agent", "simulate-driver", "uninstall", "--root", str(root)]) == 0
    assert not (root / "usr/lib64").exists()
    assert capsys.readouterr().out.startswith("SIMULATED:")
    assert run([*install, "--spec", "no-such-gpu:2"]) == 1
    assert "no-such-gpu" in capsys.readouterr().err
    assert main(["agent", "simulate-driver", "install", "--root", str(root)]) == 2
    assert "needs --spec, --seed" in capsys.readouterr().err


def test_simulate_driver_install_lays_out_the_pci_bus_when_asked(tmp_path: Path) -> None:
    """The harness's preinstalled driver on a real node: the GPUs' PCI bus beside it, at the
    bus ids NVML reports for that node, every GPU on nvidia (the VFIO manager's starting point)."""
    prerequisites.gcc()
    root = tmp_path / "driver"
    install = ["agent", "simulate-driver", "install", "--root", str(root), "--seed", "node-3"]
    assert run([*install, "--spec", "h100-80gb:2", "--style", "gke", "--pci"]) == 0
    devices = sorted((root / "sys/bus/pci/devices").iterdir())
    assert len(devices) == 2
    assert {(d / "device").read_text() for d in devices} == {"0x2330\n"}
    assert {os.readlink(d / "driver") for d in devices} == {"../../drivers/nvidia"}
    assert (root / "sys/bus/pci/SIMULATED").is_file() and (root / "dev/vfio/vfio").exists()


def test_simulate_toolkit_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CDI_ENABLED", "DRIVER_ROOT_CTR_PATH"):
        monkeypatch.delenv(name, raising=False)
    args = parse("simulate-toolkit")
    assert (args.cdi_dir, args.driver_root, args.host_driver_root) == (
        None,
        "/driver-root",
        "/run/nvidia/driver",
    )
    monkeypatch.setenv("CDI_ENABLED", "true")
    monkeypatch.setenv("DRIVER_ROOT_CTR_PATH", "/mnt/driver")
    monkeypatch.setenv("NVIDIA_DRIVER_ROOT", "/home/kubernetes/bin/nvidia")
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(operands, "run_toolkit", lambda *a: calls.append(a) or 0)
    assert run(["agent", "simulate-toolkit", "--containerd-config", "/etc/c/config.toml"]) == 0
    assert calls == [
        (
            Path("/etc/c/config.toml"),
            "nvidia",
            Path("/var/run/cdi"),
            "/mnt/driver",
            "/home/kubernetes/bin/nvidia",
        )
    ]
    assert current_driver_root() == "/mnt/driver"  # the CDI spec's GPUs come from there
