"""The sandbox-workload operands against NVIDIA's DaemonSets (gpu-operator ``assets/state-*``),
field by field for what decides whether the pod works: names, images, commands and args, env
names, volume mounts, node selectors and security contexts.

The tables below are read off NVIDIA's assets (state-vfio-manager, state-vgpu-manager,
state-vgpu-device-manager, state-sandbox-validation, state-sandbox-device-plugin,
state-kata-device-plugin, state-cc-manager) and its state manager, which deploys KubeVirt's
device plugin in sandboxWorkloads.mode kubevirt only, and Kata's and the CC manager in kata
mode only. Deliberate differences:

- Every DaemonSet selects its pods by ``app`` (NVIDIA's vfio-manager, kata-manager and
  cc-manager select by ``name``); the pods carry the operator's owned labels too, as every
  operand here does.
- The tolerations are this operator's (its GPU taint with ``operator: Exists``, and the
  user's ``daemonsets.tolerations``), not NVIDIA's fixed ``nvidia.com/gpu:NoSchedule``.
- The vGPU manager has no OpenShift driver-toolkit sidecar (NVIDIA keeps it only on OpenShift
  with the driver toolkit on); its ``/etc/os-release`` mount is read-only.
- The vGPU device manager gets ``DEFAULT_VGPU_CONFIG`` from ``vgpuDeviceManager.config.default``
  and the cc manager ``DEFAULT_CC_MODE`` from ``ccManager.defaultMode`` in the template (NVIDIA
  sets both in code). Without ``vgpuDeviceManager.config.name`` the operator renders NVIDIA's
  ``default-vgpu-devices-config`` (state-vgpu-device-manager's ConfigMap, checked below), as
  NVIDIA's does; with one, it renders none and the pod mounts the user's.
- The wait-for-validation init containers carry the validator's pull policy.
- No OpenShift SCC annotation on the DaemonSets (this operator binds the privileged SCC to
  each ServiceAccount instead, as for its other operands).
- The Kata device plugin gets NVIDIA's ClusterRole (its Node and pods, read) but not NVIDIA's
  Role, which lets it create and delete pods and write NFD NodeFeatures: the operator holds
  neither, so it could not grant them, and KubeVirt's plugin runs without them too.
- The Kata manager (state-kata-manager, as NVIDIA's operator deployed it until it stopped
  honouring kataManager) gets no Role reading the namespace's Secrets: the operator does not
  hold that, so a runtime class whose artifacts need a ``pullSecret`` needs one granted beside
  it. Its pods roll on the operator's digest of its ConfigMaps, not NVIDIA's
  ``nvidia.com/kata-manager.last-applied-hash``, and its RuntimeClasses carry the operator's
  owned labels (``app.kubernetes.io/component: kata-manager``, where NVIDIA writes
  ``gpu-operator``) with NVIDIA's ``nvidia.com/kata-runtime-class: "true"``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import PolicyError, parse_document, parse_spec
from gpu_operator.api.legacy import migrate
from gpu_operator.labels import COMPONENT, CONFIG_HASH
from gpu_operator.render import Facts, render
from gpu_operator.render.components import REGISTRY
from tests import prerequisites

SANDBOX = {
    "sandboxWorkloads": {"enabled": True},
    "sandboxDevicePlugin": {"enabled": True},
    "vfioManager": {"enabled": True},
    "vgpuManager": {"enabled": True},
    "vgpuDeviceManager": {"enabled": True},
    "ccManager": {"enabled": True},
    "kataManager": {"enabled": True},
}
# The same sections in kata mode, Kata's device plugin too
KATA = {
    **SANDBOX,
    "sandboxWorkloads": {"enabled": True, "mode": "kata"},
    "kataSandboxDevicePlugin": {"enabled": True},
}
# NVIDIA's operator deploys these in kata mode only, KubeVirt's device plugin in kubevirt mode
KATA_ONLY = {"nvidia-kata-sandbox-device-plugin-daemonset", "nvidia-cc-manager"}
PRIVILEGED = {"privileged": True}
PRIVILEGED_S0 = {"privileged": True, "seLinuxOptions": {"level": "s0"}}
VALIDATOR_IMAGE = "nvcr.io/nvidia/gpu-operator:v25.10.0"
DRIVER_MANAGER_IMAGE = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
DRIVER_MANAGER = {
    "name": "k8s-driver-manager",
    "image": DRIVER_MANAGER_IMAGE,
    "command": ["driver-manager"],
    "args": ["uninstall_driver"],
    "env": [
        "NODE_NAME",
        "NVIDIA_VISIBLE_DEVICES",
        "ENABLE_GPU_POD_EVICTION",
        "ENABLE_AUTO_DRAIN",
        "OPERATOR_NAMESPACE",
    ],
    "mounts": {"run-nvidia": "/run/nvidia", "host-root": "/host", "host-sys": "/sys"},
    "securityContext": PRIVILEGED,
}


def waiter(name: str, mounts: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "image": VALIDATOR_IMAGE,
        "command": ["sh", "-c"],
        "env": ["NVIDIA_VISIBLE_DEVICES"],
        "mounts": mounts or {"run-nvidia-validations": "/run/nvidia/validations"},
        "securityContext": PRIVILEGED,
    }


def check(name: str, component: str, mounts: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": VALIDATOR_IMAGE,
        "command": ["sh", "-c"],
        "args": ["nvidia-validator"],
        "env": ["WITH_WAIT", "COMPONENT", "NODE_NAME"],
        "env_values": {"COMPONENT": component, "WITH_WAIT": "true"},
        "mounts": mounts,
        "securityContext": PRIVILEGED_S0,
    }


VALIDATIONS = {"run-nvidia-validations": "/run/nvidia/validations"}
# NVIDIA's DaemonSets, by name: the deploy label they select, then each container.
NVIDIA: dict[str, dict[str, Any]] = {
    "nvidia-vfio-manager": {
        "selector": {"nvidia.com/gpu.deploy.vfio-manager": "true"},
        "serviceAccount": "nvidia-vfio-manager",
        "init": [DRIVER_MANAGER],
        "containers": [
            {
                "name": "nvidia-vfio-manager",
                "image": DRIVER_MANAGER_IMAGE,
                "command": ["/bin/sh", "-c"],
                "args": ["vfio-manage bind --all && while true; do sleep 86400; done"],
                "env": ["HOST_ROOT"],
                "mounts": {
                    "host-sys": "/sys",
                    "host-lib-modules": "/lib/modules",
                    "host-root": "/host",
                },
                "securityContext": PRIVILEGED_S0,
                "preStop": ["/bin/sh", "-c", "vfio-manage unbind --all"],
            }
        ],
        "volumes": {
            "host-sys": "/sys",
            "host-lib-modules": "/lib/modules",
            "run-nvidia": "/run/nvidia",
            "host-root": "/",
        },
    },
    "nvidia-vgpu-manager-daemonset": {
        "selector": {"nvidia.com/gpu.deploy.vgpu-manager": "true"},
        "serviceAccount": "nvidia-vgpu-manager",
        "hostPID": True,
        "init": [DRIVER_MANAGER],
        "containers": [
            {
                "name": "nvidia-vgpu-manager-ctr",
                "image": "nvcr.io/nvidia/vgpu-manager:580.95.05",
                "command": ["nvidia-driver"],
                "args": ["init"],
                "env": [],
                "mounts": {
                    "run-nvidia": "/run/nvidia",
                    "host-os-release": "/host-etc/os-release",
                    "vfio": "/dev/vfio",
                    "cgroup": "/sys/fs/cgroup",
                    "var-log": "/var/log",
                    "dev-log": "/dev/log",
                },
                "securityContext": PRIVILEGED_S0,
            }
        ],
        "volumes": {
            "run-nvidia": "/run/nvidia",
            "host-os-release": "/etc/os-release",
            "cgroup": "/sys/fs/cgroup",
            "vfio": "/dev/vfio",
            "host-root": "/",
            "host-sys": "/sys",
            "var-log": "/var/log",
            "dev-log": "/dev/log",
        },
    },
    "nvidia-vgpu-device-manager": {
        "selector": {"nvidia.com/gpu.deploy.vgpu-device-manager": "true"},
        "serviceAccount": "nvidia-vgpu-device-manager",
        "init": [waiter("vgpu-manager-validation")],
        "containers": [
            {
                "name": "nvidia-vgpu-device-manager",
                "image": "nvcr.io/nvidia/cloud-native/vgpu-device-manager:v0.5.0",
                "env": ["NAMESPACE", "NODE_NAME", "CONFIG_FILE", "DEFAULT_VGPU_CONFIG"],
                "env_values": {"CONFIG_FILE": "/vgpu-config/config.yaml"},
                "mounts": {
                    "vgpu-config": "/vgpu-config",
                    "host-sys": "/sys",
                    "host-root": "/host",
                    "driver-install-dir": "/driver-root",
                },
                "securityContext": PRIVILEGED,
            }
        ],
        "volumes": {
            "host-sys": "/sys",
            "host-root": "/",
            "driver-install-dir": "/run/nvidia/driver",
            "run-nvidia-validations": "/run/nvidia/validations",
        },
    },
    "nvidia-sandbox-validator": {
        "selector": {"nvidia.com/gpu.deploy.sandbox-validator": "true"},
        "serviceAccount": "nvidia-sandbox-validator",
        "init": [
            check("vfio-pci-validation", "vfio-pci", {"host-root": "/host", **VALIDATIONS}),
            check(
                "vgpu-manager-validation",
                "vgpu-manager",
                {"host-root": "/host", "driver-install-path": "/run/nvidia/driver", **VALIDATIONS},
            ),
            {**check("vgpu-devices-validation", "vgpu-devices", VALIDATIONS)},
        ],
        "containers": [
            {
                "name": "nvidia-sandbox-validator",
                "image": VALIDATOR_IMAGE,
                "command": ["sh", "-c"],
                "args": ["echo all validations are successful; sleep infinity"],
                "env": [],
                "mounts": VALIDATIONS,
                "securityContext": PRIVILEGED,
                "preStop": ["/bin/sh", "-c", "rm -f /run/nvidia/validations/*"],
            }
        ],
        "volumes": {
            **VALIDATIONS,
            "driver-install-path": "/run/nvidia/driver",
            "host-root": "/",
        },
    },
    "nvidia-sandbox-device-plugin-daemonset": {
        "selector": {"nvidia.com/gpu.deploy.sandbox-device-plugin": "true"},
        "serviceAccount": "nvidia-sandbox-device-plugin",
        "init": [waiter("vfio-pci-validation"), waiter("vgpu-devices-validation")],
        "containers": [
            {
                "name": "nvidia-sandbox-device-plugin-ctr",
                "image": "nvcr.io/nvidia/kubevirt-gpu-device-plugin:v1.6.0",
                "env": [],
                "mounts": {
                    "device-plugin": "/var/lib/kubelet/device-plugins",
                    "vfio": "/dev/vfio",
                    "cdi-root": "/var/run/cdi",
                },
                "securityContext": PRIVILEGED,
            }
        ],
        "volumes": {
            "device-plugin": "/var/lib/kubelet/device-plugins",
            **VALIDATIONS,
            "vfio": "/dev/vfio",
            "cdi-root": "/var/run/cdi",
        },
    },
    "nvidia-kata-sandbox-device-plugin-daemonset": {
        "selector": {"nvidia.com/gpu.deploy.kata-sandbox-device-plugin": "true"},
        "serviceAccount": "nvidia-kata-sandbox-device-plugin",
        "init": [waiter("vfio-pci-validation")],
        "containers": [
            {
                "name": "nvidia-kata-sandbox-device-plugin-ctr",
                "image": "nvcr.io/nvidia/cloud-native/nvidia-sandbox-device-plugin:v0.0.5",
                "env": ["NODE_NAME", "POD_NAMESPACE", "POD_SERVICE_ACCOUNT"],
                "mounts": {
                    "device-plugin": "/var/lib/kubelet/device-plugins",
                    "cdi-root": "/var/run/cdi",
                },
                "securityContext": PRIVILEGED,
            }
        ],
        "volumes": {
            "device-plugin": "/var/lib/kubelet/device-plugins",
            **VALIDATIONS,
            "cdi-root": "/var/run/cdi",
        },
    },
    "nvidia-kata-manager": {
        "selector": {"nvidia.com/gpu.deploy.kata-manager": "true"},
        "serviceAccount": "nvidia-kata-manager",
        "hostPID": True,
        "init": [],
        "containers": [
            {
                "name": "nvidia-kata-manager",
                "image": "nvcr.io/nvidia/cloud-native/k8s-kata-manager:v0.2.3",
                "command": ["/bin/sh", "-c"],
                "args": ["/bin/entrypoint.sh"],
                # the DaemonSet's own, then the artifacts directory and containerd's (as
                # NVIDIA's operator sets them for the kata manager, containerd nodes)
                "env": [
                    "NODE_NAME",
                    "CONFIG_FILE",
                    "LOAD_KERNEL_MODULES",
                    "CDI_ENABLED",
                    "KATA_ARTIFACTS_DIR",
                    "RUNTIME",
                    "CONTAINERD_RUNTIME_CLASS",
                    "RUNTIME_CONFIG",
                    "CONTAINERD_CONFIG",
                    "RUNTIME_SOCKET",
                    "CONTAINERD_SOCKET",
                ],
                "env_values": {
                    "CONFIG_FILE": "/etc/kata-manager/config.yaml",
                    "LOAD_KERNEL_MODULES": "true",
                    "CDI_ENABLED": "true",
                    "KATA_ARTIFACTS_DIR": "/opt/nvidia-gpu-operator/artifacts/runtimeclasses",
                    "RUNTIME": "containerd",
                    "CONTAINERD_RUNTIME_CLASS": "nvidia",
                    "CONTAINERD_CONFIG": "/runtime/config-dir/config.toml",
                    "CONTAINERD_SOCKET": "/runtime/sock-dir/containerd.sock",
                },
                "mounts": {
                    "nvidia-kata-manager-entrypoint": "/bin/entrypoint.sh",
                    "nvidia-kata-manager-config": "/etc/kata-manager/config.yaml",
                    "host-root": "/host",
                    "cdi-root": "/var/run/cdi",
                    "run-nvidia-validations": "/run/nvidia/validations",
                    "kata-artifacts": "/opt/nvidia-gpu-operator/artifacts/runtimeclasses",
                    "containerd-config": "/runtime/config-dir/",
                    "containerd-socket": "/runtime/sock-dir/",
                },
                "securityContext": PRIVILEGED_S0,
            }
        ],
        "volumes": {
            "host-root": "/",
            "cdi-root": "/var/run/cdi",
            **VALIDATIONS,
            "kata-artifacts": "/opt/nvidia-gpu-operator/artifacts/runtimeclasses",
            "containerd-config": "/etc/containerd",
            "containerd-socket": "/run/containerd",
        },
    },
    "nvidia-cc-manager": {
        "selector": {"nvidia.com/gpu.deploy.cc-manager": "true", "nvidia.com/cc.capable": "true"},
        "serviceAccount": "nvidia-cc-manager",
        "init": [],
        "containers": [
            {
                "name": "nvidia-cc-manager",
                "image": "nvcr.io/nvidia/cloud-native/k8s-cc-manager:v0.4.3",
                "env": ["NODE_NAME", "NVIDIA_VISIBLE_DEVICES", "DEFAULT_CC_MODE"],
                "mounts": {"host-sys": "/sys", "run-nvidia": "/run/nvidia"},
                "securityContext": PRIVILEGED_S0,
                "preStop": ["/bin/rm", "-f", "/run/nvidia/validations/.cc-manager-ctr-ready"],
            }
        ],
        "volumes": {"host-sys": "/sys", "run-nvidia": "/run/nvidia"},
    },
}


def daemonsets(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for o in render(parse_spec(spec), Facts())
        if o["kind"] == "DaemonSet"
    }


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours["name"] == theirs["name"]
    where = theirs["name"]
    assert ours["image"] == theirs["image"], where
    for key in ("command", "args"):
        if key in theirs:
            assert ours.get(key) == theirs[key], (where, key)
    env = ours.get("env") or []
    assert [e["name"] for e in env] == theirs["env"], where
    values = {e["name"]: e.get("value") for e in env}
    for name, value in theirs.get("env_values", {}).items():
        assert values[name] == value, (where, name)
    mounts = {m["name"]: m["mountPath"] for m in ours.get("volumeMounts") or []}
    assert mounts == theirs["mounts"], where
    assert ours["securityContext"] == theirs["securityContext"], where
    if "preStop" in theirs:
        assert ours["lifecycle"]["preStop"]["exec"]["command"] == theirs["preStop"], where


@pytest.mark.parametrize("name", sorted(NVIDIA))
def test_each_sandbox_daemonset_matches_nvidias(name: str) -> None:
    ds = daemonsets(KATA if name in KATA_ONLY else SANDBOX)[name]
    theirs = NVIDIA[name]
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    assert ds["metadata"]["labels"]["app"] == name
    assert ds["spec"]["selector"]["matchLabels"] == {"app": name}
    assert pod["metadata"]["labels"]["app"] == name
    assert spec["nodeSelector"] == theirs["selector"]
    assert spec["serviceAccountName"] == theirs["serviceAccount"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert "runtimeClassName" not in spec  # NVIDIA's runtime plays no part in VMs' GPUs
    assert spec.get("hostPID", False) == theirs.get("hostPID", False)
    init = spec.get("initContainers") or []
    assert [c["name"] for c in init] == [c["name"] for c in theirs["init"]]
    for ours, nvidia in zip(init, theirs["init"], strict=True):
        compare(ours, nvidia)
    assert [c["name"] for c in spec["containers"]] == [c["name"] for c in theirs["containers"]]
    for ours, nvidia in zip(spec["containers"], theirs["containers"], strict=True):
        compare(ours, nvidia)
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert volumes == theirs["volumes"]


def test_sandbox_operands_need_sandbox_workloads_and_their_own_section() -> None:
    off = {k: v for k, v in SANDBOX.items() if k != "sandboxWorkloads"}
    assert not set(daemonsets(off)) & set(NVIDIA)
    # NVIDIA's default for each section is off, the validator's on (it is the validator's)
    assert set(daemonsets({"sandboxWorkloads": {"enabled": True}})) & set(NVIDIA) == {
        "nvidia-sandbox-validator"
    }
    without_vfio = daemonsets({**SANDBOX, "vfioManager": {"enabled": False}})
    assert set(without_vfio) & set(NVIDIA) == set(NVIDIA) - {"nvidia-vfio-manager"} - KATA_ONLY
    # the container stack stays: nodes labelled container still run it
    assert "nvidia-device-plugin-daemonset" in without_vfio


def test_each_sandbox_mode_deploys_its_own_device_plugin() -> None:
    both = {**SANDBOX, "kataSandboxDevicePlugin": {"enabled": True}}
    kubevirt = set(daemonsets(both)) & set(NVIDIA)
    kata = set(daemonsets({**both, "sandboxWorkloads": {"enabled": True, "mode": "kata"}}))
    assert "nvidia-sandbox-device-plugin-daemonset" in kubevirt - kata
    assert kata - kubevirt >= KATA_ONLY
    # the mode changes nothing else
    assert kubevirt - {"nvidia-sandbox-device-plugin-daemonset"} == (kata & set(NVIDIA)) - KATA_ONLY
    # Kata's plugin is still a section of its own
    assert "nvidia-kata-sandbox-device-plugin-daemonset" not in daemonsets(
        {**KATA, "kataSandboxDevicePlugin": {"enabled": False}}
    )


def test_the_kata_device_plugin_takes_its_sections_settings() -> None:
    spec = {
        **KATA,
        "kataSandboxDevicePlugin": {
            "enabled": True,
            "repository": "mirror.example.com/nvidia",
            "version": "v0.0.6",
            "imagePullPolicy": "Always",
            "imagePullSecrets": ["mirror"],
            "env": [{"name": "P_GPU_ALIAS", "value": "pgpu"}],
            "args": ["--verbose"],
        },
    }
    pod = daemonsets(spec)["nvidia-kata-sandbox-device-plugin-daemonset"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == "mirror.example.com/nvidia/nvidia-sandbox-device-plugin:v0.0.6"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == ["--verbose"]
    assert {"name": "P_GPU_ALIAS", "value": "pgpu"} in container["env"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "mirror"}]


def test_images_come_from_their_sections_as_elsewhere() -> None:
    spec = {
        **SANDBOX,
        "vgpuManager": {
            "enabled": True,
            "repository": "registry.example.com/nvidia",
            "image": "vgpu-manager",
            "version": "580.95.05-ubuntu24.04",
            "driverManager": {"version": "v0.13.0", "env": [{"name": "X", "value": "1"}]},
        },
        "sandboxDevicePlugin": {"enabled": True, "version": "v1.7.0"},
        "validator": {"repository": "mirror.example.com/nvidia", "version": "v25.10.1"},
        "vgpuDeviceManager": {"enabled": True, "config": {"name": "layouts", "default": "A"}},
        "ccManager": {"enabled": True, "defaultMode": "devtools"},
    }
    ds = daemonsets(spec)
    vgpu = ds["nvidia-vgpu-manager-daemonset"]["spec"]["template"]["spec"]
    assert (
        vgpu["containers"][0]["image"]
        == "registry.example.com/nvidia/vgpu-manager:580.95.05-ubuntu24.04"
    )
    manager = vgpu["initContainers"][0]
    assert manager["image"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.13.0"
    assert manager["env"][-1] == {"name": "X", "value": "1"}
    plugin = ds["nvidia-sandbox-device-plugin-daemonset"]["spec"]["template"]["spec"]
    assert plugin["containers"][0]["image"] == "nvcr.io/nvidia/kubevirt-gpu-device-plugin:v1.7.0"
    assert {c["image"] for c in plugin["initContainers"]} == {
        "mirror.example.com/nvidia/gpu-operator:v25.10.1"
    }
    devices = ds["nvidia-vgpu-device-manager"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in devices["containers"][0]["env"]}
    assert env["DEFAULT_VGPU_CONFIG"] == "A"
    assert devices["volumes"][0] == {"name": "vgpu-config", "configMap": {"name": "layouts"}}
    kata = daemonsets({**spec, "sandboxWorkloads": {"enabled": True, "mode": "kata"}})
    cc = kata["nvidia-cc-manager"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in cc["env"]}["DEFAULT_CC_MODE"] == "devtools"


def test_the_project_validator_image_is_not_used_for_sandbox_checks() -> None:
    """The operator's Deployment points VALIDATOR_IMAGE at the project's image, which has no
    sandbox checks: the sandbox validator falls back to NVIDIA's."""
    facts = Facts(image_env={"VALIDATOR_IMAGE": "ghcr.io/example/gpu-operator:v1"})
    objects = render(parse_spec(SANDBOX), facts)
    ds = next(
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "nvidia-sandbox-validator"
    )
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == VALIDATOR_IMAGE


def test_the_registry_names_nvidias_daemonsets() -> None:
    assert {c.app for c in REGISTRY if c.sandbox} == set(NVIDIA)


SECTIONS = {
    "kataManager": "nvidia-kata-manager",
    "sandboxDevicePlugin": "nvidia-sandbox-device-plugin-daemonset",
    "kataSandboxDevicePlugin": "nvidia-kata-sandbox-device-plugin-daemonset",
    "vfioManager": "nvidia-vfio-manager",
    "vgpuManager": "nvidia-vgpu-manager-daemonset",
    "vgpuDeviceManager": "nvidia-vgpu-device-manager",
    "ccManager": "nvidia-cc-manager",
}
# The sandbox mode a section's operand needs (NVIDIA's default mode is kubevirt)
MODES = {"sandboxDevicePlugin": "kubevirt", "kataSandboxDevicePlugin": "kata", "ccManager": "kata"}


def wild_with_sandbox_sections() -> list[Path]:
    paths = sorted(prerequisites.reference("wild-clusterpolicies").glob("[0-9][0-9]-*.yaml"))
    return [
        p
        for p in paths
        if set(yaml.safe_load(p.read_text()).get("spec") or {}) & {*SECTIONS, "sandboxWorkloads"}
    ]


def test_wild_documents_with_sandbox_sections_exist() -> None:
    assert len(wild_with_sandbox_sections()) >= 10


@pytest.mark.parametrize("path", wild_with_sandbox_sections(), ids=lambda p: p.name[:2])
def test_wild_documents_with_sandbox_sections_are_accepted_and_render(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    try:
        spec = parse_document(doc)
    except PolicyError:  # fields NVIDIA moved: `migrate` carries them (tests/unit/api)
        spec = parse_document(migrate(doc).document)
    names = {o["metadata"]["name"] for o in render(spec, Facts()) if o["kind"] == "DaemonSet"}
    raw = doc.get("spec") or {}
    sandbox = raw.get("sandboxWorkloads") or {}
    sandbox_on = sandbox.get("enabled") is True
    mode = sandbox.get("mode") or "kubevirt"
    for section_name, daemonset in SECTIONS.items():
        wanted = sandbox_on and (raw.get(section_name) or {}).get("enabled") is True
        wanted = wanted and MODES.get(section_name, mode) == mode
        assert (daemonset in names) == wanted, (section_name, names)
    assert ("nvidia-sandbox-validator" in names) == sandbox_on


# Read off NVIDIA's default-vgpu-devices-config: some layouts (devices of one type per GPU) and
# some GPU models' default type, with the counts NVIDIA gives them.
NVIDIA_LAYOUTS = {
    "6000D-1-42Q": 2,
    "A2-1Q": 16,
    "A10-24Q": 1,
    "A30-1-6C": 4,
    "A30-2-12CME": 1,
    "A40-1Q": 32,
    "A100-1-5C": 7,
    "A100D-4C": 20,
    "A800DX-7-80C": 1,
    "B200X-1-23CME": 1,
    "DC-1-2Q": 48,
    "GB200-1-47C": 4,
    "GH200L-144C": 1,
    "H20X-8C": 16,
    "H100L-4C": 23,
    "H100XM-5C": 16,
    "H100XS-4C": 16,
    "H200-7C": 20,
    "L4-3Q": 8,
    "L40S-48Q": 1,
    "RTX5000-Ada-2Q": 16,
    "RTX8000P-4C": 8,
    "RTX8000P-4Q": 12,
    "T4-16C": 1,
    "V100S-1Q": 32,
}
NVIDIA_DEFAULTS = {
    "0x1EB810DE": {"T4-8Q": 2},
    "0x20B010DE": {"A100X-20C": 2},
    "0x20B710DE": {"A30-12C": 2},
    "0x233110DE": {"H100-40C": 2},
    "0x234210DE": {"GH200-96C": 1},
    "0x26B910DE": {"L40S-24Q": 2},
    "0x27B810DE": {"L4-12Q": 2},
    "0x2BB910DE": {"6000D-84Q": 1},
}


def vgpu_configmaps(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for o in render(parse_spec(spec), Facts())
        if o["kind"] == "ConfigMap"
        and o["metadata"]["labels"].get(COMPONENT) == "vgpu-device-manager"
    }


def test_without_a_configmap_of_its_own_the_vgpu_device_manager_gets_nvidias_layouts() -> None:
    (configmap,) = vgpu_configmaps(SANDBOX).values()
    assert configmap["metadata"]["name"] == "default-vgpu-devices-config"
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert config["version"] == "v1"
    layouts = config["vgpu-configs"]
    for name, count in NVIDIA_LAYOUTS.items():
        assert layouts[name] == [{"devices": "all", "vgpu-devices": {name: count}}], name
    # every layout but the default fills all GPUs with devices of the type it is named after
    for name, layout in layouts.items():
        if name != "default":
            (entry,) = layout
            assert entry["devices"] == "all" and list(entry["vgpu-devices"]) == [name], name
    # the default layout: one type per GPU model, as many as that type's own layout makes
    default = layouts["default"]
    for entry in default:
        assert re.fullmatch(r"0x[0-9A-F]{4}10DE", entry["device-filter"]), entry
        (name,) = entry["vgpu-devices"]
        assert layouts[name][0]["vgpu-devices"] == entry["vgpu-devices"], entry
    chosen = {e["device-filter"]: e["vgpu-devices"] for e in default}
    assert {k: chosen[k] for k in NVIDIA_DEFAULTS} == NVIDIA_DEFAULTS
    # the device manager mounts it, and its pods carry its digest (they roll when it changes)
    pod = daemonsets(SANDBOX)["nvidia-vgpu-device-manager"]["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "vgpu-config")
    assert volume["configMap"]["name"] == "default-vgpu-devices-config"
    assert CONFIG_HASH in pod["metadata"]["annotations"]


def test_a_policy_naming_its_own_vgpu_layouts_gets_no_default_configmap() -> None:
    spec = {**SANDBOX, "vgpuDeviceManager": {"enabled": True, "config": {"name": "layouts"}}}
    assert vgpu_configmaps(spec) == {}
    # nor without the device manager
    assert vgpu_configmaps({**SANDBOX, "vgpuDeviceManager": {"enabled": False}}) == {}


def objects(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return render(parse_spec(spec), Facts())


def kata_config(spec: dict[str, Any]) -> dict[str, Any]:
    (configmap,) = (
        o for o in objects(spec) if o["kind"] == "ConfigMap"
        and o["metadata"]["name"] == "nvidia-kata-manager-config"
    )  # fmt: skip
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return config


def runtime_classes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for o in objects(spec)
        if o["kind"] == "RuntimeClass" and o["metadata"]["name"] != "nvidia"
    }


# NVIDIA's chart's kataManager.config (the last it shipped with the kata manager honoured)
NVIDIA_KATA_CONFIG = {
    "artifactsDir": "/opt/nvidia-gpu-operator/artifacts/runtimeclasses",
    "runtimeClasses": [
        {
            "name": "kata-nvidia-gpu",
            "nodeSelector": {},
            "artifacts": {
                "url": "nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.54.03",
                "pullSecret": "",
            },
        },
        {
            "name": "kata-nvidia-gpu-snp",
            "nodeSelector": {"nvidia.com/cc.capable": "true"},
            "artifacts": {
                "url": "nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:ubuntu22.04-535.86.10-snp",
                "pullSecret": "",
            },
        },
    ],
}


def test_the_kata_manager_reads_its_section_config_and_gets_its_runtime_classes() -> None:
    config = {
        "artifactsDir": "/var/lib/kata-artifacts",
        "runtimeClasses": [
            {
                "name": "kata-qemu-nvidia-gpu",
                "nodeSelector": {"example.com/pool": "vm"},
                "artifacts": {"url": "registry.example.com/kata:1", "pullSecret": "kata-pull"},
            }
        ],
    }
    spec = {**SANDBOX, "kataManager": {"enabled": True, "config": config}}
    assert kata_config(spec) == config
    # NVIDIA's operator makes each RuntimeClass: handler of the same name, on the nodes the
    # kata manager serves, and the runtime class's own node selector
    (rc,) = runtime_classes(spec).values()
    assert rc["metadata"]["name"] == rc["handler"] == "kata-qemu-nvidia-gpu"
    assert rc["metadata"]["labels"]["nvidia.com/kata-runtime-class"] == "true"
    assert rc["scheduling"]["nodeSelector"] == {
        "nvidia.com/gpu.deploy.kata-manager": "true",
        "example.com/pool": "vm",
    }
    pod = daemonsets(spec)["nvidia-kata-manager"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["KATA_ARTIFACTS_DIR"] == "/var/lib/kata-artifacts"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["kata-artifacts"]["hostPath"]["path"] == "/var/lib/kata-artifacts"
    # editing the config rolls the pods (their digest covers the config's ConfigMap)
    other = {**config, "artifactsDir": "/srv/kata"}
    moved = daemonsets({**SANDBOX, "kataManager": {"enabled": True, "config": other}})
    assert (
        moved["nvidia-kata-manager"]["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
        != pod["metadata"]["annotations"][CONFIG_HASH]
    )


def test_without_runtime_classes_the_kata_manager_gets_nvidias_charts() -> None:
    assert kata_config(SANDBOX) == NVIDIA_KATA_CONFIG
    assert set(runtime_classes(SANDBOX)) == {"kata-nvidia-gpu", "kata-nvidia-gpu-snp"}
    # an empty list is a choice: none
    none = {**SANDBOX, "kataManager": {"enabled": True, "config": {"runtimeClasses": []}}}
    assert runtime_classes(none) == {}
    assert kata_config(none)["runtimeClasses"] == []


def test_the_kata_manager_is_deployed_in_either_mode_and_only_with_its_section() -> None:
    assert "nvidia-kata-manager" in daemonsets(KATA)
    off = {**SANDBOX, "kataManager": {"enabled": False}}
    assert "nvidia-kata-manager" not in daemonsets(off)
    assert runtime_classes(off) == {}  # so the operator prunes the ones it made
    no_sandbox = {k: v for k, v in SANDBOX.items() if k != "sandboxWorkloads"}
    assert runtime_classes(no_sandbox) == {}


def test_a_kata_runtime_class_named_as_the_operators_own_is_refused() -> None:
    for name, operator in (("nvidia", {}), ("nvidia-gpu", {"runtimeClass": "nvidia-gpu"})):
        config = {"runtimeClasses": [{"name": name, "artifacts": {"url": "r.example.com/k:1"}}]}
        with pytest.raises(PolicyError, match=r"kataManager\.config\.runtimeClasses\[0\]\.name"):
            parse_spec({"operator": operator, "kataManager": {"enabled": True, "config": config}})
