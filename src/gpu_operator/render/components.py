"""The component registry: every operand the operator deploys, in deployment order.

Components are data, not code paths: an entry names the ClusterPolicy section, the template
folder (``templates/<name>/``), the DaemonSet/app name, the deploy-gate label and the default
image. Adding a component is a folder of templates, one entry here and the builder of what its
templates read (``render.values.VALUES``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_operator.api.base import Component
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.labels import DEPLOY_PREFIX
from gpu_operator.render.facts import Facts
from gpu_operator.render.images import ImageDefault, resolve_image, split_reference


@dataclass(frozen=True)
class ComponentDef:
    """One operand. ``name`` is the template folder and the deploy-label suffix."""

    name: str
    spec_field: str  # the ClusterPolicy section, as spelt on the wire (``devicePlugin``)
    app: str  # DaemonSet name and pod label ``app``
    service_account: str  # also the name of the component's RBAC objects
    image_env: str  # the operator Deployment's fallback env var for the image
    default_image: ImageDefault | None  # None: the project's own image (Facts.operator_image)
    agent: str | None = None  # ``gpu-operator agent <agent>`` when running the project image
    foreign_command: tuple[str, ...] = ()  # entrypoint for another image; () keeps the image's
    mig_capable_only: bool = False  # deploy label set only on MIG-capable nodes
    per_os: bool = False  # one DaemonSet per node OS (driver images are built per OS)
    on_delete: bool = False  # pods replaced only by the upgrade controller
    gpu_runtime: bool = True  # pods need the NVIDIA runtime to see GPUs and driver libs
    env_sections: tuple[str, ...] = ()  # sub-sections whose ``env`` joins the component's
    # NVIDIA images (repository/name) that cannot do this component's job in our pod layout;
    # a spec naming one gets the project's image instead of a pod that never works.
    replaced_images: tuple[str, ...] = ()
    sandbox: bool = False  # deployed only with sandboxWorkloads enabled (GPUs for VMs)
    # a sandbox operand of one sandboxWorkloads.mode only (kubevirt or kata); None: either
    sandbox_mode: str | None = None

    @property
    def deploy_label(self) -> str:
        return DEPLOY_PREFIX + self.name


REGISTRY: tuple[ComponentDef, ...] = (
    ComponentDef(
        name="driver",
        spec_field="driver",
        app="nvidia-driver-daemonset",
        service_account="nvidia-driver",
        image_env="DRIVER_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia", "driver", "580.95.05"),
        per_os=True,
        on_delete=True,
        gpu_runtime=False,
    ),
    ComponentDef(
        name="container-toolkit",
        spec_field="toolkit",
        app="nvidia-container-toolkit-daemonset",
        service_account="nvidia-container-toolkit",
        image_env="CONTAINER_TOOLKIT_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia/k8s", "container-toolkit", "v1.17.8"),
        gpu_runtime=False,
    ),
    ComponentDef(
        name="operator-validator",
        spec_field="validator",
        app="nvidia-operator-validator",
        service_account="nvidia-operator-validator",
        image_env="VALIDATOR_IMAGE",
        default_image=None,
        agent="validate",
        env_sections=("driver", "toolkit", "cuda", "plugin"),
        # NVIDIA's validator is its operator image (entrypoint: NVIDIA's operator), run as one
        # init container per check; NVIDIA's Helm values point validator.image at it.
        replaced_images=(
            "nvcr.io/nvidia/gpu-operator",
            "nvcr.io/nvidia/cloud-native/gpu-operator-validator",
        ),
    ),
    ComponentDef(
        name="device-plugin",
        spec_field="devicePlugin",
        app="nvidia-device-plugin-daemonset",
        service_account="nvidia-device-plugin",
        image_env="DEVICE_PLUGIN_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia", "k8s-device-plugin", "v0.17.4"),
        # NVIDIA's image stays the default (real GPUs); the project's image runs its own plugin
        agent="device-plugin",
    ),
    ComponentDef(
        name="dcgm",
        spec_field="dcgm",
        app="nvidia-dcgm",
        service_account="nvidia-dcgm",
        image_env="DCGM_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia/cloud-native", "dcgm", "4.2.3-1-ubuntu22.04"),
    ),
    ComponentDef(
        name="dcgm-exporter",
        spec_field="dcgmExporter",
        app="nvidia-dcgm-exporter",
        service_account="nvidia-dcgm-exporter",
        image_env="DCGM_EXPORTER_IMAGE",
        default_image=None,
        agent="exporter",
    ),
    ComponentDef(
        name="gpu-feature-discovery",
        spec_field="gfd",
        app="gpu-feature-discovery",
        service_account="nvidia-gpu-feature-discovery",
        image_env="GFD_IMAGE",
        default_image=None,
        agent="discover",
        foreign_command=("gpu-feature-discovery",),
    ),
    ComponentDef(
        name="mig-manager",
        spec_field="migManager",
        app="nvidia-mig-manager",
        service_account="nvidia-mig-manager",
        image_env="MIG_MANAGER_IMAGE",
        default_image=None,
        agent="mig-manager",
        mig_capable_only=True,
    ),
    # The sandbox-workload operands, NVIDIA's images: GPUs handed to virtual machines.
    ComponentDef(
        name="vfio-manager",
        spec_field="vfioManager",
        app="nvidia-vfio-manager",
        service_account="nvidia-vfio-manager",
        image_env="VFIO_MANAGER_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia/cloud-native", "k8s-driver-manager", "v0.12.0"),
        gpu_runtime=False,
        sandbox=True,
    ),
    ComponentDef(
        name="vgpu-manager",
        spec_field="vgpuManager",
        app="nvidia-vgpu-manager-daemonset",
        service_account="nvidia-vgpu-manager",
        image_env="VGPU_MANAGER_IMAGE",
        # NVIDIA publishes no vGPU manager image: users build theirs and name its repository
        default_image=ImageDefault("nvcr.io/nvidia", "vgpu-manager", "580.95.05"),
        gpu_runtime=False,
        sandbox=True,
    ),
    ComponentDef(
        name="vgpu-device-manager",
        spec_field="vgpuDeviceManager",
        app="nvidia-vgpu-device-manager",
        service_account="nvidia-vgpu-device-manager",
        image_env="VGPU_DEVICE_MANAGER_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia/cloud-native", "vgpu-device-manager", "v0.5.0"),
        gpu_runtime=False,
        sandbox=True,
    ),
    ComponentDef(
        name="sandbox-validator",
        spec_field="validator",
        app="nvidia-sandbox-validator",
        service_account="nvidia-sandbox-validator",
        # not VALIDATOR_IMAGE: the operator's Deployment points that at the project's image
        image_env="SANDBOX_VALIDATOR_IMAGE",
        # NVIDIA's validator (its operator image): the project's own has no sandbox checks
        default_image=ImageDefault("nvcr.io/nvidia", "gpu-operator", "v25.10.0"),
        gpu_runtime=False,
        sandbox=True,
    ),
    ComponentDef(
        name="sandbox-device-plugin",
        spec_field="sandboxDevicePlugin",
        app="nvidia-sandbox-device-plugin-daemonset",
        service_account="nvidia-sandbox-device-plugin",
        image_env="SANDBOX_DEVICE_PLUGIN_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia", "kubevirt-gpu-device-plugin", "v1.6.0"),
        gpu_runtime=False,
        sandbox=True,
        sandbox_mode="kubevirt",
    ),
    ComponentDef(
        name="kata-sandbox-device-plugin",
        spec_field="kataSandboxDevicePlugin",
        app="nvidia-kata-sandbox-device-plugin-daemonset",
        service_account="nvidia-kata-sandbox-device-plugin",
        image_env="KATA_SANDBOX_DEVICE_PLUGIN_IMAGE",
        default_image=ImageDefault(
            "nvcr.io/nvidia/cloud-native", "nvidia-sandbox-device-plugin", "v0.0.5"
        ),
        gpu_runtime=False,
        sandbox=True,
        sandbox_mode="kata",
    ),
    ComponentDef(
        name="kata-manager",
        spec_field="kataManager",
        app="nvidia-kata-manager",
        service_account="nvidia-kata-manager",
        image_env="KATA_MANAGER_IMAGE",
        # the last version NVIDIA's chart deployed, before its operator stopped honouring it
        default_image=ImageDefault("nvcr.io/nvidia/cloud-native", "k8s-kata-manager", "v0.2.3"),
        gpu_runtime=False,
        sandbox=True,
    ),
    ComponentDef(
        name="cc-manager",
        spec_field="ccManager",
        app="nvidia-cc-manager",
        service_account="nvidia-cc-manager",
        image_env="CC_MANAGER_IMAGE",
        default_image=ImageDefault("nvcr.io/nvidia/cloud-native", "k8s-cc-manager", "v0.4.3"),
        gpu_runtime=False,
        sandbox=True,
        # confidential containers run in Kata VMs: NVIDIA's operator deploys it in kata mode only
        sandbox_mode="kata",
    ),
)

_ATTRIBUTE_BY_WIRE = {
    (info.alias or name): name for name, info in ClusterPolicySpec.model_fields.items()
}


def component(name: str) -> ComponentDef:
    """The registry entry called ``name``; KeyError names the known ones."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise KeyError(f"unknown component {name!r}; known: {[c.name for c in REGISTRY]}")


def is_enabled(policy: ClusterPolicySpec, comp: ComponentDef) -> bool:
    """Whether the policy deploys ``comp`` at all: its section enabled, and for a sandbox
    operand sandboxWorkloads enabled too, in the operand's mode (as NVIDIA's operator decides:
    KubeVirt's device plugin in kubevirt mode, Kata's and the CC manager in kata mode)."""
    sandbox = policy.sandbox_workloads
    if comp.sandbox and not sandbox.enabled:
        return False
    if comp.sandbox_mode is not None and comp.sandbox_mode != sandbox_mode(policy):
        return False
    return section(policy, comp).enabled


def sandbox_mode(policy: ClusterPolicySpec) -> str:
    """``sandboxWorkloads.mode``, NVIDIA's default (kubevirt) where unset."""
    return policy.sandbox_workloads.mode or "kubevirt"


def section(policy: ClusterPolicySpec, comp: ComponentDef) -> Component:
    """The ClusterPolicy section that configures ``comp``."""
    value = getattr(policy, _ATTRIBUTE_BY_WIRE[comp.spec_field])
    assert isinstance(value, Component), comp.spec_field
    return value


def default_image(comp: ComponentDef, operator_image: str) -> ImageDefault:
    """The built-in default image; agent components run the operator's own image."""
    if comp.default_image is not None:
        return comp.default_image
    parts = split_reference(operator_image)
    return ImageDefault(parts.repository or "", parts.image or "", parts.version or "latest")


def component_image(comp: ComponentDef, spec: Component, facts: Facts) -> str:
    """The image ``comp`` runs: the spec's, completed from the env fallback and the default."""
    default = default_image(comp, facts.operator_image)
    fallback = facts.image_env.get(comp.image_env)
    image = resolve_image(spec, default, fallback)
    if _repository(image) in comp.replaced_images:
        return resolve_image(None, default, fallback)
    if comp.default_image is not None and runs_agent(comp, image, facts.operator_image):
        # pointed at the project's image: a missing version is the project's, not NVIDIA's
        own_version = split_reference(facts.operator_image).version or "latest"
        return resolve_image(spec, replace(default, version=own_version), fallback)
    return image


def _repository(image: str) -> str:
    parts = split_reference(image)
    return f"{parts.repository}/{parts.image}" if parts.repository else parts.image or ""


def runs_agent(comp: ComponentDef, image: str, operator_image: str) -> bool:
    """Whether ``image`` is the project's own, so the pod runs ``gpu-operator agent ...``."""
    return comp.agent is not None and _repository(image) == _repository(operator_image)


def command(comp: ComponentDef, image: str, operator_image: str) -> list[str] | None:
    """The container command: the project's agent only when ``image`` is the project's image.

    A user who points e.g. ``gfd`` back at NVIDIA's image gets NVIDIA's entrypoint
    (``foreign_command``, or the image's own when that is empty); env names are NVIDIA's either
    way, so both images read the same settings. ``None`` leaves the template's command alone.
    """
    if comp.agent is None:
        return None
    if runs_agent(comp, image, operator_image):
        return ["gpu-operator", "agent", comp.agent]
    return list(comp.foreign_command) or None
