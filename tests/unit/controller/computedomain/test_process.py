"""What the ComputeDomain controller's process keeps of what it watches, and how it reads its
Deployment's environment."""

from __future__ import annotations

import pytest

from gpu_operator.api.computedomain import channel_config, claim_domain_id
from gpu_operator.cli import main
from gpu_operator.cli_errors import BAD_INPUT
from gpu_operator.controller.computedomain.process import settings_from_env
from gpu_operator.controller.computedomain.reconciler import WATCHED, channel_claim
from gpu_operator.render.computedomain import NVIDIA_DAEMON_COMMAND, STANDIN_DAEMON_COMMAND


def claim(config: dict[str, object] | None, reserved: bool = True) -> dict[str, object]:
    devices: dict[str, object] = {"requests": [{"name": "channel"}]}
    if config is not None:
        devices["config"] = [{"requests": ["channel"], "opaque": config}]
    return {
        "metadata": {"name": "job-0-channel", "namespace": "team-a", "uid": "c-1",
                     "labels": {"x": "y"}, "annotations": {"big": "x" * 1000}},
        "spec": {"devices": devices},
        "status": {"reservedFor": [{"resource": "pods", "name": "job-0", "uid": "p-1"}]}
        if reserved else {},
    }  # fmt: skip


def test_a_channel_claim_keeps_its_domain_and_holders_and_nothing_else() -> None:
    config = {"driver": "compute-domain.nvidia.com", "parameters": channel_config("uid-1", "All")}
    kept = channel_claim(claim(config))
    assert claim_domain_id(kept) == "uid-1"
    assert kept["status"]["reservedFor"][0]["name"] == "job-0"
    assert kept["metadata"] == {"name": "job-0-channel", "namespace": "team-a", "uid": "c-1"}


def test_any_other_claim_keeps_its_name_only() -> None:
    gpu = {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}
    for body in (claim(None), claim(gpu)):
        kept = channel_claim(body)
        assert set(kept) == {"metadata"} and claim_domain_id(kept) is None


def test_domains_and_claims_are_watched_in_every_namespace_daemons_in_its_own() -> None:
    wide = {w.index: w.cluster_wide for w in WATCHED}
    assert wide["computedomains"] and wide["resourceclaims"] and wide["resourceclaimtemplates"]
    assert not wide["daemonsets"] and not wide["pods"]


def test_the_daemon_is_the_stand_in_unless_nvidias_image_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("IMEX_DAEMON_IMAGE", raising=False)
    monkeypatch.setenv("CD_DAEMON_IMAGE_PULL_SECRET_NAMES", "one,two")
    monkeypatch.setenv("MAX_NODES_PER_IMEX_DOMAIN", "9")
    ours = settings_from_env("gpu", "example.com/op:1")
    assert (ours.image, ours.command) == ("example.com/op:1", STANDIN_DAEMON_COMMAND)
    assert ours.image_pull_secrets == ("one", "two") and ours.max_nodes_per_imex_domain == 9
    monkeypatch.setenv("IMEX_DAEMON_IMAGE", "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0")
    theirs = settings_from_env("gpu", "example.com/op:1")
    assert theirs.command == NVIDIA_DAEMON_COMMAND and theirs.image.startswith("nvcr.io")


def test_a_bad_number_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOG_VERBOSITY_CD_DAEMON", "loud")
    assert main(["compute-domain-controller", "--health-port", "0"]) == BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "LOG_VERBOSITY_CD_DAEMON='loud'" in err and "Traceback" not in err
