"""What the sandbox-workload operands' templates read (``v``): GPUs handed to virtual machines.

These operands run NVIDIA's images (the VFIO manager, the vGPU manager and device manager, the
KubeVirt and Kata device plugins, the sandbox validator, the confidential-computing manager).
Their init containers that wait for a validation file run the validator's image, as NVIDIA's
do; those that unload a host driver run the section's ``driverManager`` image. The vGPU device
manager gets NVIDIA's vGPU layouts (``render.vgpu_layouts``) unless the policy names its own.
The Kata manager (``kata_manager_values``) reads its config from a ConfigMap the operator
writes, and the operator creates the RuntimeClasses that config declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_operator.api.base import EnvVar
from gpu_operator.api.spec import (
    KATA_ARTIFACTS_DIR,
    ClusterPolicySpec,
    DriverManager,
    KataArtifacts,
    KataRuntimeClass,
)
from gpu_operator.render.components import ComponentDef, component, component_image, section
from gpu_operator.render.facts import Facts, Runtime
from gpu_operator.render.images import ImageDefault, resolve_image
from gpu_operator.render.settings import DEFAULT_PULL_POLICY, runtime_class
from gpu_operator.render.vgpu_layouts import default_layouts

# NVIDIA's Helm default for vfioManager.driverManager and vgpuManager.driverManager
SANDBOX_DRIVER_MANAGER = ImageDefault(
    "nvcr.io/nvidia/cloud-native", "k8s-driver-manager", "v0.12.0"
)
DEFAULT_VGPU_DEVICES_CONFIG = "default-vgpu-devices-config"
# NVIDIA's chart's runtime classes for the Kata manager (the last it shipped): Kata with the
# GPU, and on CC-capable GPUs confidential containers (AMD SEV-SNP)
KATA_ARTIFACTS = "nvcr.io/nvidia/cloud-native/kata-gpu-artifacts"
DEFAULT_KATA_RUNTIME_CLASSES = (
    KataRuntimeClass(
        name="kata-nvidia-gpu",
        node_selector={},
        artifacts=KataArtifacts(url=f"{KATA_ARTIFACTS}:ubuntu22.04-535.54.03", pull_secret=""),
    ),
    KataRuntimeClass(
        name="kata-nvidia-gpu-snp",
        node_selector={"nvidia.com/cc.capable": "true"},
        artifacts=KataArtifacts(url=f"{KATA_ARTIFACTS}:ubuntu22.04-535.86.10-snp", pull_secret=""),
    ),
)


@dataclass(frozen=True)
class DriverManagerValues:
    """The init container that unloads a host NVIDIA driver before the GPUs change hands."""

    image: str
    pull_policy: str
    env: tuple[Mapping[str, Any], ...]  # the section's, over the container's own


@dataclass(frozen=True)
class SandboxValues:
    validator_image: str  # the wait-for-validation init containers'
    validator_pull_policy: str
    driver_manager: DriverManagerValues | None  # vfio-manager and vgpu-manager only
    vgpu_devices_config: str  # the ConfigMap of vGPU layouts the device manager mounts
    vgpu_default_config: str
    # NVIDIA's layouts (its config file), rendered as vgpu_devices_config where the policy
    # names no ConfigMap of its own; None where it does
    vgpu_layouts: str | None
    cc_default_mode: str
    # validator.vfioPCI/vgpuManager/vgpuDevices env, for the sandbox validator's checks
    vfio_pci_env: tuple[Mapping[str, Any], ...] = ()
    vgpu_manager_env: tuple[Mapping[str, Any], ...] = ()
    vgpu_devices_env: tuple[Mapping[str, Any], ...] = ()


def _env(items: list[EnvVar] | None) -> tuple[Mapping[str, Any], ...]:
    return tuple(e.to_wire() for e in items or [])


def _driver_manager(manager: DriverManager | None, facts: Facts) -> DriverManagerValues:
    fallback = facts.image_env.get("DRIVER_MANAGER_IMAGE")
    return DriverManagerValues(
        image=resolve_image(manager, SANDBOX_DRIVER_MANAGER, fallback),
        pull_policy=(manager.image_pull_policy if manager else None) or DEFAULT_PULL_POLICY,
        env=_env(manager.env if manager else None),
    )


def sandbox_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> SandboxValues:
    validator = component("sandbox-validator")
    manager: DriverManager | None = None
    if comp.name == "vfio-manager":
        manager = policy.vfio_manager.driver_manager
    elif comp.name == "vgpu-manager":
        manager = policy.vgpu_manager.driver_manager
    config = policy.vgpu_device_manager.config
    checks = policy.validator
    return SandboxValues(
        validator_image=component_image(validator, section(policy, validator), facts),
        validator_pull_policy=policy.validator.image_pull_policy or DEFAULT_PULL_POLICY,
        driver_manager=(
            _driver_manager(manager, facts)
            if comp.name in ("vfio-manager", "vgpu-manager")
            else None
        ),
        vgpu_devices_config=(config.name if config else None) or DEFAULT_VGPU_DEVICES_CONFIG,
        vgpu_default_config=(config.default if config else None) or "default",
        vgpu_layouts=(
            default_layouts()
            if comp.name == "vgpu-device-manager" and not (config and config.name)
            else None
        ),
        cc_default_mode=policy.cc_manager.default_mode or "on",
        vfio_pci_env=_env(checks.vfio_pci.env if checks.vfio_pci else None),
        vgpu_manager_env=_env(checks.vgpu_manager.env if checks.vgpu_manager else None),
        vgpu_devices_env=_env(checks.vgpu_devices.env if checks.vgpu_devices else None),
    )


@dataclass(frozen=True)
class KataRuntimeClassValues:
    name: str  # the RuntimeClass and its runtime handler
    node_selector: Mapping[str, str]  # the runtime class's own, beyond the deploy label


@dataclass(frozen=True)
class KataManagerValues:
    config: str  # the Kata manager's config file (its ConfigMap's config.yaml)
    artifacts_dir: str  # where it downloads the artifacts on the host
    runtime_classes: tuple[KataRuntimeClassValues, ...]
    runtime: Runtime  # the container runtime it configures
    runtime_class: str  # the NVIDIA runtime's handler in containerd (CONTAINERD_RUNTIME_CLASS)


def kata_manager_values(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> KataManagerValues:
    config = policy.kata_manager.config
    given = config.runtime_classes if config else None
    classes = DEFAULT_KATA_RUNTIME_CLASSES if given is None else tuple(given)
    artifacts_dir = (config.artifacts_dir if config else None) or KATA_ARTIFACTS_DIR
    wire = {"artifactsDir": artifacts_dir, "runtimeClasses": [c.to_wire() for c in classes]}
    return KataManagerValues(
        config=yaml.safe_dump(wire, sort_keys=False),
        artifacts_dir=artifacts_dir,
        runtime_classes=tuple(
            KataRuntimeClassValues(c.name, dict(c.node_selector or {})) for c in classes
        ),
        runtime=facts.runtime,
        runtime_class=runtime_class(policy),
    )
