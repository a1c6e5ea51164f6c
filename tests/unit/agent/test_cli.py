"""``gpu-operator agent ...`` wired into a parser, in-process and as separate processes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_operator.agent.cli import add_agent_commands
from gpu_operator.agent.simulated import uninstall_simulated_nvml

from .conftest import mig_configmap

RUNNER = (
    "import argparse, sys\n"
    "from gpu_operator.agent.cli import add_agent_commands\n"
    "p = argparse.ArgumentParser(prog='gpu-operator')\n"
    "add_agent_commands(p.add_subparsers(dest='command', required=True))\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.func(a))\n"
)


@pytest.fixture(autouse=True)
def _clean_nvml() -> None:
    yield
    uninstall_simulated_nvml()


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
                "--output",
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
        run(
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
        "discover", "--oneshot", "--output", "-", "--mig-strategy", "single", env=env
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
    assert run(["agent", "validate", "--components", "driver,bogus"]) == 2


def test_exporter_reads_dcgm_exporter_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's env turns the pod attribution off; unset, the agent keeps it on."""

    def parsed(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog="gpu-operator")
        add_agent_commands(parser.add_subparsers(dest="command", required=True))
        return parser.parse_args(["agent", "exporter", *argv])

    monkeypatch.delenv("DCGM_EXPORTER_KUBERNETES", raising=False)
    assert parsed().kubernetes is True
    monkeypatch.setenv("DCGM_EXPORTER_KUBERNETES", "false")
    assert parsed().kubernetes is False
    assert parsed("--kubernetes").kubernetes is True
