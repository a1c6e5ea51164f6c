"""The stand-ins carry exactly the names the rendered defaults give NVIDIA's images, and the
testenv's `nvidia` runtime hands the simulated driver's NVML to containers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpu_operator import labels
from gpu_operator.cli import main as cli_main
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.testenv import nodeconfig, nvidia_runtime, standins
from tests.paths import REPO
from tests.prerequisites import nvidia

HELM_DEFAULT = "clusterpolicy-helm-default.yaml"


def _rendered(capsys: pytest.CaptureFixture[str], *policy: str) -> dict[str, set[tuple[str, ...]]]:
    """Each image the DaemonSets name (containers and init containers) for the testenv's node
    OS, with the commands they run it with (an empty one: the image's entrypoint)."""
    assert cli_main(["render", *policy, "--node-os", standins.node_os_tag(), "-o", "yaml"]) == 0
    rendered: dict[str, set[tuple[str, ...]]] = {}
    for doc in yaml.safe_load_all(capsys.readouterr().out):
        if doc and doc["kind"] == "DaemonSet":
            pod = doc["spec"]["template"]["spec"]
            for c in pod["containers"] + pod.get("initContainers", []):
                rendered.setdefault(c["image"], set()).add(tuple(c.get("command") or ()))
    return rendered


def _references(rendering: str) -> set[str]:
    return {s.reference for s in standins.standins() if s.rendering == rendering}


@pytest.mark.parametrize("rendering", ["defaults", "helm-default"])
def test_stand_ins_are_named_as_a_rendering_names_nvidias_images(
    capsys: pytest.CaptureFixture[str], rendering: str
) -> None:
    """Every stand-in is an image its rendering names (none is stale), and every command the
    DaemonSets run it with is one the stand-in has."""
    policy = ["-f", str(nvidia(HELM_DEFAULT))] if rendering == "helm-default" else []
    rendered = _rendered(capsys, *policy)
    for reference in _references(rendering):
        assert reference in rendered, f"{reference} is not rendered by the {rendering}"
        for command in rendered[reference]:
            assert not command or command[0] in standins.COMMANDS, (reference, command)


def test_each_driver_stand_in_installs_the_version_of_its_tag() -> None:
    """NVIDIA's driver images set DRIVER_VERSION; the stand-ins too, so the node's simulated
    NVML reports the version the policy named."""
    drivers = [s for s in standins.standins() if s.component == "driver"]
    assert len(drivers) == 3
    for standin in drivers:
        version = standin.reference.rsplit(":", 1)[1].removesuffix(f"-{standins.node_os_tag()}")
        assert standin.env == (f"DRIVER_VERSION={version}",), standin


def test_the_upgrade_stand_in_is_the_driver_a_policy_with_that_version_renders(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The real-node driver upgrade bumps the example's version to UPGRADE_DRIVER_VERSION: the
    driver image rendered for it must be a stand-in's name."""
    policy = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    policy["spec"]["driver"]["version"] = standins.UPGRADE_DRIVER_VERSION
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    assert cli_main(["render", "-f", str(path), "--node-os", standins.node_os_tag()]) == 0
    drivers = {
        c["image"]
        for doc in yaml.safe_load_all(capsys.readouterr().out)
        if doc and doc["kind"] == "DaemonSet"
        for c in doc["spec"]["template"]["spec"]["containers"]
        if c["name"] == "nvidia-driver-ctr"
    }
    upgrade = _references("upgrade")
    assert drivers == upgrade and len(upgrade) == 1, (drivers, upgrade)


@pytest.mark.parametrize("policy", ["examples/clusterpolicy.yaml", HELM_DEFAULT])
def test_every_image_a_real_node_e2e_runs_is_the_projects_or_a_stand_in(
    capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    """The real-node e2e reconciles examples/clusterpolicy.yaml and NVIDIA's Helm-default
    policy unchanged: an image either renders that has no stand-in would sit in
    ImagePullBackOff there (no registry), init containers included. A new NVIDIA image in the
    Helm defaults fails here first."""
    path = nvidia(policy) if policy == HELM_DEFAULT else REPO / policy
    known = {s.reference for s in standins.standins()} | {DEFAULT_OPERATOR_IMAGE}
    assert set(_rendered(capsys, "-f", str(path))) - known == set()


def test_context_marks_every_command_simulated(tmp_path: Path) -> None:
    standins.write_context(tmp_path, "ghcr.io/gpu-operator/gpu-operator:v0.1.0")
    assert (
        (tmp_path / "Containerfile")
        .read_text()
        .startswith("FROM ghcr.io/gpu-operator/gpu-operator:v0.1.0\n")
    )
    for command in standins.COMMANDS:
        assert "SIMULATED" in (tmp_path / "bin" / command).read_text()


def _spec(*env: str) -> dict:  # type: ignore[type-arg]
    return {"process": {"env": ["PATH=/bin", *env]}, "mounts": [{"destination": "/proc"}]}


def test_nvidia_runtime_adds_the_descriptor_env_and_the_shared_state_dir() -> None:
    spec = _spec("GPU_OPERATOR_SIMULATE=stale")
    env = ["GPU_OPERATOR_SIMULATE=a100-40gb:8", "GPU_OPERATOR_SIMULATE_STATE=/run/x/s.json"]
    assert nvidia_runtime.patch_spec(spec, env, labels.SIMULATED_GPUS_DIR)
    assert spec["process"]["env"] == ["PATH=/bin", *env]
    assert spec["mounts"][-1]["destination"] == labels.SIMULATED_GPUS_DIR
    assert spec["mounts"][-1]["source"] == labels.SIMULATED_GPUS_DIR


def test_nvidia_runtime_leaves_containers_alone_without_a_driver_or_when_opted_out() -> None:
    env = ["GPU_OPERATOR_SIMULATE=a100-40gb:8"]
    assert not nvidia_runtime.patch_spec(_spec(), [], "/run/s")
    assert not nvidia_runtime.patch_spec(_spec("NVIDIA_VISIBLE_DEVICES=void"), env, "/run/s")


def test_nvidia_runtime_finds_the_bundle_of_create_only() -> None:
    argv = ["--root", "/r", "--log", "l.json", "create", "--bundle", "/b", "--pid-file", "p", "id"]
    assert nvidia_runtime.bundle_of(argv) == "/b"
    assert nvidia_runtime.bundle_of(["--root", "/r", "start", "id"]) is None
    assert nvidia_runtime.bundle_of(["create", "--bundle=/c", "id"]) == "/c"


def test_nvidia_runtime_wrapper_execs_the_script_with_runc(tmp_path: Path) -> None:
    text = nodeconfig.nvidia_runtime_wrapper(
        "/v/python", Path("/p/nvidia_runtime.py"), "/sbin/runc"
    )
    assert text.splitlines()[-1] == 'exec /v/python -I /p/nvidia_runtime.py /sbin/runc "$@"'
    descriptor = tmp_path / labels.SIMULATED_NVML_DESCRIPTOR
    descriptor.write_text("# c\nGPU_OPERATOR_SIMULATE=t4:1\n")
    assert nvidia_runtime.descriptor_env(tmp_path) == ["GPU_OPERATOR_SIMULATE=t4:1"]
    assert json.dumps(nvidia_runtime.descriptor_env(tmp_path / "none")) == "[]"
