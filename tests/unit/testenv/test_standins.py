"""The stand-ins carry exactly the names the rendered defaults give NVIDIA's images, and the
testenv's `nvidia` runtime hands the simulated driver's NVML to containers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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


def _node_spec(dev: Path) -> dict:  # type: ignore[type-arg]
    """A node's CDI spec as the toolkit stand-in writes it (one real device node: /dev/null's
    numbers stand in for a GPU's; the runtime copies type and numbers from the host's node)."""
    node = {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": str(dev)}]}
    mount = {
        "hostPath": "/drv/libcuda.so.1",
        "containerPath": "/usr/lib64/libcuda.so.1",
        "options": ["ro", "rbind"],
    }
    hook = {"hookName": "createContainer", "path": "/h", "args": ["h", "update-ldcache"]}
    return {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": node}, {"name": "all", "containerEdits": node}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [mount],
            "hooks": [hook],
        },
    }


def test_nvidia_runtime_gives_what_the_container_asks_for_from_the_node_spec() -> None:
    """CDI mode: NVIDIA_VISIBLE_DEVICES names devices of the node's spec; their edits and the
    spec-wide ones (the driver's files) go into the OCI spec."""
    spec = _spec("NVIDIA_VISIBLE_DEVICES=0")
    names = nvidia_runtime.requested(spec["process"]["env"])
    assert names == ["0"]
    nvidia_runtime.inject(spec, _node_spec(Path("/dev/null")), names)
    (device,) = spec["linux"]["devices"]
    assert device["path"] == "/dev/nvidia0" and device["type"] == "c"
    assert (device["major"], device["minor"]) == (1, 3)  # /dev/null's
    assert spec["linux"]["resources"]["devices"][0]["access"] == "rwm"
    assert spec["mounts"][-1] == {
        "destination": "/usr/lib64/libcuda.so.1",
        "type": "bind",
        "source": "/drv/libcuda.so.1",
        "options": ["ro", "rbind"],
    }
    assert spec["hooks"]["createContainer"][0]["args"] == ["h", "update-ldcache"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["process"]["env"]  # the hook: nothing again


def test_nvidia_runtime_gives_nothing_to_containers_that_do_not_ask() -> None:
    for env in ((), ("NVIDIA_VISIBLE_DEVICES=void",), ("NVIDIA_VISIBLE_DEVICES=none",)):
        assert nvidia_runtime.requested(["PATH=/bin", *env]) == []
    assert nvidia_runtime.requested(["NVIDIA_VISIBLE_DEVICES=0, GPU-1"]) == ["0", "GPU-1"]


def test_nvidia_runtime_refuses_devices_the_node_spec_lacks(tmp_path: Path) -> None:
    """As NVIDIA's runtime: an unresolvable device fails the container, naming what exists;
    a host path that is not a device node too."""
    with pytest.raises(nvidia_runtime.CdiError, match=r"nvidia\.com/gpu=7 .*has 0, all"):
        nvidia_runtime.inject(_spec(), _node_spec(Path("/dev/null")), ["7"])
    plain = tmp_path / "not-a-device"
    plain.write_text("")
    with pytest.raises(nvidia_runtime.CdiError, match="not a device"):
        nvidia_runtime.inject(_spec(), _node_spec(plain), ["all"])


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


def test_runc_wrapper_adds_the_kernel_view_at_create_only(tmp_path: Path) -> None:
    text = nodeconfig.runc_wrapper("/v/python", Path("/p/nvidia_runtime.py"), "/sbin/runc")
    body = text.splitlines()
    assert body[-2] == (
        'case " $* " in *" create "*) exec /v/python -I /p/nvidia_runtime.py --kernel-only '
        '/sbin/runc "$@" ;; esac'
    )
    assert body[-1] == 'exec /sbin/runc "$@"'


def _gpu_container(library_source: str) -> dict:  # type: ignore[type-arg]
    return {
        "linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia0"}]},
        "mounts": [
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {
                "destination": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "type": "bind",
                "source": library_source,
            },
        ],
    }


def test_a_container_given_a_stub_drivers_gpus_sees_their_state_read_only(
    tmp_path: Path,
) -> None:
    """As a kernel: a container holding the control device and the driver's NVML library
    sees that driver's simulated state (MIG devices made since) where the stub looks for it."""
    root = tmp_path / "driver"
    (root / "dev" / "gpu-operator-sim" / "mig").mkdir(parents=True)
    library = root / "usr" / "lib64" / "libnvidia-ml.so.570.86.15"
    spec = _gpu_container(str(library))
    nvidia_runtime.kernel_view(spec)
    assert spec["mounts"][-1] == {
        "destination": "/dev/gpu-operator-sim",
        "type": "bind",
        "source": str(root / "dev" / "gpu-operator-sim"),
        "options": ["rbind", "ro", "nosuid", "noexec"],
    }
    again = len(spec["mounts"])
    nvidia_runtime.kernel_view(spec)
    assert len(spec["mounts"]) == again, "one view, however often applied"


def test_containers_without_the_gpus_or_a_stub_driver_get_no_kernel_view(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    (root / "dev" / "gpu-operator-sim").mkdir(parents=True)
    library = str(root / "usr" / "lib" / "x86_64-linux-gnu" / "libnvidia-ml.so.1")
    no_device = _gpu_container(library)
    no_device["linux"]["devices"] = [{"path": "/dev/nvidia0"}]
    no_state = _gpu_container(str(tmp_path / "other" / "usr" / "lib64" / "libnvidia-ml.so.1"))
    for spec in (no_device, no_state, _spec()):
        before = [dict(m) for m in spec["mounts"]]
        nvidia_runtime.kernel_view(spec)
        assert spec["mounts"] == before
    assert nvidia_runtime.driver_root_of("/opt/x/libnvidia-ml.so.1") is None
    assert nvidia_runtime.driver_root_of("/usr/lib64/libnvidia-ml.so.1") == "/"


def test_a_container_given_the_hosts_vfio_devices_sees_the_simulated_pci_bus(
    tmp_path: Path,
) -> None:
    """As a kernel shows it: KubeVirt's device plugin, given the host's /dev/vfio, reads the
    GPUs' PCI functions in /sys; on a node with a simulated bus it sees that one there."""
    root = tmp_path / "node"
    (root / "sys/bus/pci").mkdir(parents=True)
    (root / "sys/bus/pci/SIMULATED").write_text("")
    host = tmp_path / "host"
    for rel in nvidia_runtime.PCI_SYSFS:
        (host / rel).mkdir(parents=True)
    vfio = {"destination": "/dev/vfio", "type": "bind", "source": "/dev/vfio",
            "options": ["rbind", "rprivate", "rw"]}  # fmt: skip
    spec = {"mounts": [{"destination": "/sys", "type": "sysfs"}, vfio]}
    nvidia_runtime.pci_view(spec, str(root), str(host))
    assert spec["mounts"][1]["source"] == str(root / "dev/vfio")
    assert spec["mounts"][2:] == [
        {"destination": f"/{rel}", "type": "bind", "source": str(root / rel),
         "options": ["rbind", "ro", "nosuid", "noexec"]}
        for rel in nvidia_runtime.PCI_SYSFS
    ]  # fmt: skip
    again = len(spec["mounts"])
    nvidia_runtime.pci_view(spec, str(root), str(host))
    assert len(spec["mounts"]) == again, "one view, however often applied"


def test_containers_without_the_vfio_devices_or_a_simulated_bus_see_the_hosts(
    tmp_path: Path,
) -> None:
    root = tmp_path / "node"
    (root / "sys/bus/pci").mkdir(parents=True)
    vfio = {"destination": "/dev/vfio", "type": "bind", "source": "/dev/vfio"}
    no_bus = {"mounts": [dict(vfio)]}
    nvidia_runtime.pci_view(no_bus, str(root), "/")
    assert no_bus == {"mounts": [vfio]}
    (root / "sys/bus/pci/SIMULATED").write_text("")
    others = {"mounts": [{"destination": "/sys", "type": "bind", "source": "/sys"}]}
    before = [dict(m) for m in others["mounts"]]
    nvidia_runtime.pci_view(others, str(root), "/")
    assert others["mounts"] == before


def test_the_runtime_finds_the_simulated_bus_where_the_harness_lays_it_out() -> None:
    """nvidia_runtime.py runs on the standard library only: its copies of the names agree."""
    from gpu_operator.agent.dra.vfio import SIMULATED_MARKER
    from gpu_operator.labels import SIMULATED_PCI_ROOT

    assert nvidia_runtime.PCI_ROOT == SIMULATED_PCI_ROOT
    assert nvidia_runtime.PCI_MARKER == SIMULATED_MARKER


def test_every_sandbox_operand_a_real_node_runs_is_a_stand_in(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The passthrough real-node e2e's policy: each sandbox operand's image is a stand-in, and
    every command its DaemonSet runs it with (or its entrypoint) is a stand-in's command or the
    shell's own."""
    from tests.e2e.stack_support import sandbox_policy

    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(sandbox_policy()))
    assert cli_main(["render", "-f", str(path), "-o", "yaml"]) == 0
    by_reference = {s.reference: s for s in standins.standins()}
    shell = {"until", "echo", "if", "while"}
    apps = {"nvidia-vfio-manager", "nvidia-sandbox-validator",
            "nvidia-sandbox-device-plugin-daemonset"}  # fmt: skip
    seen = set()
    for doc in yaml.safe_load_all(capsys.readouterr().out):
        if not doc or doc["kind"] != "DaemonSet" or doc["metadata"]["name"] not in apps:
            continue
        seen.add(doc["metadata"]["name"])
        pod = doc["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            standin = by_reference.get(c["image"])
            assert standin is not None, c["image"]
            command = c.get("command") or list(standin.entrypoint)
            if command[0] in ("sh", "/bin/sh"):
                command = c["args"][0].split()
            assert command[0] in standins.COMMANDS or command[0] in shell, (c["name"], command)
    assert seen == apps
