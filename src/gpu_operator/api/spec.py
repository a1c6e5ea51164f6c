"""ClusterPolicy ``spec``: every section of NVIDIA's nvidia.com/v1 schema.

Sections the operator acts on are typed strictly. Sections it does not implement yet (GDS,
GDRCopy, PSP) are ``OpenSection``s: accepted, preserved, and reported in status as not
implemented when enabled. The sandbox operands' sections (VFIO, vGPU, the KubeVirt and Kata
device plugins, Kata manager, confidential computing) are typed like the others, after NVIDIA's
schema.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from gpu_operator.api.base import (
    ApiModel,
    Component,
    ConfigRef,
    Duration,
    EnvOnly,
    EnvVar,
    ImageRef,
    IntOrPercent,
    NamedConfig,
    NonNegativeInt,
    OpenSection,
    PercentText,
    Probe,
    ServiceMonitor,
    Toleration,
    crd_default,
)
from gpu_operator.api.formats import dns_name
from gpu_operator.selector import Selector

MigStrategy = Literal["none", "single", "mixed"]


class OperatorMetrics(ApiModel):
    service_monitor: ServiceMonitor | None = None


class OperatorSpec(ApiModel):
    default_runtime: Literal["containerd", "crio", "docker"] | None = Field(
        default=None, description="Container runtime of GPU nodes when it cannot be detected."
    )
    runtime_class: str | None = Field(default=None, json_schema_extra=crd_default("nvidia"))
    init_container: ImageRef | None = None
    use_ocp_driver_toolkit: bool | None = Field(default=None, alias="use_ocp_driver_toolkit")
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    metrics: OperatorMetrics | None = None


class SeccompProfile(ApiModel):
    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    localhost_profile: str | None = None


class SELinuxOptions(ApiModel):
    level: str | None = None
    role: str | None = None
    type: str | None = None
    user: str | None = None


class Sysctl(ApiModel):
    name: str
    value: str


class WindowsOptions(ApiModel):
    gmsa_credential_spec: str | None = None
    gmsa_credential_spec_name: str | None = None
    host_process: bool | None = None
    run_as_user_name: str | None = None


class PodSecurityContext(ApiModel):
    app_armor_profile: SeccompProfile | None = None
    fs_group: int | None = None
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    run_as_user: int | None = None
    se_linux_change_policy: str | None = Field(default=None, alias="seLinuxChangePolicy")
    se_linux_options: SELinuxOptions | None = Field(default=None, alias="seLinuxOptions")
    seccomp_profile: SeccompProfile | None = None
    supplemental_groups: list[int] | None = None
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = None
    sysctls: list[Sysctl] | None = None
    windows_options: WindowsOptions | None = None


class RollingUpdate(ApiModel):
    max_unavailable: PercentText | None = Field(
        default=None, description='Pods of one DaemonSet down at once: "1" or "25%".'
    )


LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?)?$"


def _label_key(value: str) -> str:
    if not re.fullmatch(LABEL_KEY, value) or len(value) > 316:
        raise ValueError("must be a label key such as example.com/team or team")
    return value


def _label_value(value: str) -> str:
    if not re.fullmatch(LABEL_VALUE, value):
        raise ValueError(
            "must be a label value: at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return value


def _pod_selector(value: str) -> str:
    try:
        Selector.parse(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; write it as kubectl -l accepts, e.g. app=x,tier!=db") from None
    return value


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
PodSelectorText = Annotated[str, AfterValidator(_pod_selector)]


class DaemonsetsSpec(ApiModel):
    """Settings shared by every operand DaemonSet."""

    labels: dict[LabelKey, LabelValue] | None = None
    annotations: dict[str, str] | None = None
    tolerations: list[Toleration] | None = None
    priority_class_name: str | None = None
    update_strategy: Literal["RollingUpdate", "OnDelete"] | None = Field(
        default=None, json_schema_extra=crd_default("RollingUpdate")
    )
    rolling_update: RollingUpdate | None = None
    pod_security_context: PodSecurityContext | None = None


class DriverManager(ImageRef):
    env: list[EnvVar] | None = None


class DrainSpec(ApiModel):
    enable: bool | None = Field(default=None, json_schema_extra=crd_default(False))
    force: bool | None = Field(default=None, json_schema_extra=crd_default(False))
    pod_selector: PodSelectorText | None = None
    timeout_seconds: NonNegativeInt | None = Field(default=None, json_schema_extra=crd_default(300))
    delete_empty_dir: bool | None = Field(default=None, json_schema_extra=crd_default(False))


class PodDeletionSpec(ApiModel):
    force: bool | None = Field(default=None, json_schema_extra=crd_default(False))
    timeout_seconds: NonNegativeInt | None = Field(default=None, json_schema_extra=crd_default(300))
    delete_empty_dir: bool | None = Field(default=None, json_schema_extra=crd_default(False))


class WaitForCompletionSpec(ApiModel):
    pod_selector: PodSelectorText | None = None
    timeout_seconds: NonNegativeInt | None = Field(default=None, json_schema_extra=crd_default(0))


class CanarySpec(ApiModel):
    """This project's addition: the nodes that take a new driver first, and its gates."""

    nodes: IntOrPercent | None = Field(
        default=None,
        description='Canary nodes of each pool, a count or a percent such as "10%" (default 1).',
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Nodes with all these labels are the canary (instead of nodes)."
    )
    soak: Duration | None = Field(
        default=None,
        description="How long the upgraded canary must stay GPUHealthy before the fleet follows.",
        json_schema_extra=crd_default("10m"),
    )
    timeout: Duration | None = Field(
        default=None,
        description="How long a canary node may take to run and validate the new driver.",
        json_schema_extra=crd_default("30m"),
    )
    batch_soak: Duration | None = Field(
        default=None,
        description="A pause after each later batch before the next starts (0s: none).",
        json_schema_extra=crd_default("0s"),
    )


class UpgradePolicy(ApiModel):
    auto_upgrade: bool | None = Field(
        default=None,
        description="Roll new driver versions across nodes automatically.",
        json_schema_extra=crd_default(False),
    )
    max_parallel_upgrades: NonNegativeInt | None = Field(
        default=None,
        description="Nodes upgraded at once; 0 means no limit.",
        json_schema_extra=crd_default(1),
    )
    max_unavailable: IntOrPercent | None = Field(
        default=None,
        description='Nodes that may be unavailable at once, a count or a percent such as "25%".',
        json_schema_extra=crd_default("25%"),
    )
    pod_deletion: PodDeletionSpec | None = None
    wait_for_completion: WaitForCompletionSpec | None = None
    drain: DrainSpec | None = None
    canary: CanarySpec | None = Field(
        default=None,
        description="Upgrade a canary first, soak it, roll it back alone if it fails "
        "(gpu-operator addition; absent: NVIDIA's behaviour).",
    )


class RdmaSpec(ApiModel):
    enabled: bool | None = None
    use_host_mofed: bool | None = None


class LicensingConfig(ApiModel):
    config_map_name: str | None = None
    secret_name: str | None = None
    nls_enabled: bool | None = None


class RepoConfig(ApiModel):
    config_map_name: str | None = None


class VirtualTopology(ApiModel):
    config: str | None = None


class DriverSpec(Component):
    use_nvidia_driver_crd: bool | None = Field(default=None, alias="useNvidiaDriverCRD")
    use_open_kernel_modules: bool | None = None
    kernel_module_type: Literal["auto", "open", "proprietary"] | None = Field(
        default=None, json_schema_extra=crd_default("auto")
    )
    use_precompiled: bool | None = None
    startup_probe: Probe | None = None
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    manager: DriverManager | None = None
    rdma: RdmaSpec | None = None
    repo_config: RepoConfig | None = None
    cert_config: ConfigRef | None = None
    licensing_config: LicensingConfig | None = None
    virtual_topology: VirtualTopology | None = None
    kernel_module_config: ConfigRef | None = None
    secret_env: str | None = None
    upgrade_policy: UpgradePolicy | None = None


class ToolkitSpec(Component):
    install_dir: str | None = Field(
        default=None, json_schema_extra=crd_default("/usr/local/nvidia")
    )


class MpsSpec(ApiModel):
    root: str | None = Field(default=None, json_schema_extra=crd_default("/run/nvidia/mps"))


class DevicePluginSpec(Component):
    config: NamedConfig | None = Field(
        default=None,
        description="ConfigMap of named device-plugin configs; nodes pick one with label "
        "nvidia.com/device-plugin.config.",
    )
    mps: MpsSpec | None = None


class DcgmSpec(Component):
    enabled: bool = False
    host_port: int | None = Field(default=None, ge=1, le=65535)


class HpcJobMapping(ApiModel):
    enabled: bool | None = None
    directory: str | None = None


class ExporterService(ApiModel):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] | None = None
    internal_traffic_policy: Literal["Cluster", "Local"] | None = None


class DcgmExporterSpec(Component):
    config: ConfigRef | None = Field(
        default=None, description="ConfigMap holding the metrics CSV (dcgm-exporter format)."
    )
    annotations: dict[str, str] | None = None
    enable_pod_labels: bool | None = None
    enable_pod_uid: bool | None = Field(default=None, alias="enablePodUID")
    host_pid: bool | None = Field(default=None, alias="hostPID")
    hpc_job_mapping: HpcJobMapping | None = None
    pod_label_allowlist_regex: list[str] | None = None
    service: ExporterService | None = None
    service_monitor: ServiceMonitor | None = None


class NodeStatusExporterSpec(Component):
    enabled: bool = False


class GfdSpec(Component):
    pass


class MigSpec(ApiModel):
    strategy: MigStrategy | None = Field(
        default=None, description="How MIG devices are exposed: none, single or mixed."
    )


class MigManagerConfig(NamedConfig):
    default: Literal["all-disabled", ""] | None = Field(
        default=None, json_schema_extra=crd_default("all-disabled")
    )


class MigManagerSpec(Component):
    config: MigManagerConfig | None = None
    gpu_clients_config: ConfigRef | None = None


class ValidatorSpec(Component):
    plugin: EnvOnly | None = None
    driver: EnvOnly | None = None
    toolkit: EnvOnly | None = None
    cuda: EnvOnly | None = None
    vfio_pci: EnvOnly | None = Field(default=None, alias="vfioPCI")
    vgpu_manager: EnvOnly | None = None
    vgpu_devices: EnvOnly | None = None


class EnabledOnly(ApiModel):
    enabled: bool | None = None


class CdiSpec(ApiModel):
    enabled: bool | None = Field(default=None, json_schema_extra=crd_default(True))
    default: bool | None = Field(default=None, json_schema_extra=crd_default(False))
    nri_plugin_enabled: bool | None = Field(default=None, json_schema_extra=crd_default(False))


class HostPathsSpec(ApiModel):
    root_fs: str | None = Field(default=None, alias="rootFS")
    driver_install_dir: str | None = None
    kubelet_root_dir: str | None = Field(
        default=None, json_schema_extra=crd_default("/var/lib/kubelet")
    )


class SandboxOperandSpec(Component):
    """A sandbox-workload operand's section: off unless enabled (NVIDIA's operator's default
    too); deployed only with sandboxWorkloads enabled."""

    enabled: bool = False


class VfioManagerSpec(SandboxOperandSpec):
    driver_manager: DriverManager | None = Field(
        default=None,
        description="The k8s-driver-manager image whose init container unloads a host driver "
        "before the GPUs are bound to vfio-pci.",
    )


class VgpuManagerSpec(SandboxOperandSpec):
    driver_manager: DriverManager | None = None
    kernel_module_config: ConfigRef | None = None


class VgpuDevicesConfig(ApiModel):
    name: str | None = Field(
        default=None,
        description="ConfigMap of named vGPU device layouts (key config.yaml); empty: the "
        "vGPU device manager's own default-vgpu-devices-config.",
    )
    default: str | None = Field(
        default=None,
        description="The layout applied where a node has no nvidia.com/vgpu.config label.",
        json_schema_extra=crd_default("default"),
    )


class VgpuDeviceManagerSpec(SandboxOperandSpec):
    config: VgpuDevicesConfig | None = None


class CcManagerSpec(SandboxOperandSpec):
    default_mode: Literal["on", "off", "devtools"] | None = Field(
        default=None, description="Confidential-computing mode set on capable GPUs."
    )


KATA_ARTIFACTS_DIR = "/opt/nvidia-gpu-operator/artifacts/runtimeclasses"


class KataArtifacts(ApiModel):
    url: str = Field(
        description="OCI artifact with the runtime class's guest kernel, image and "
        "configuration, e.g. nvcr.io/nvidia/cloud-native/kata-gpu-artifacts:<tag>."
    )
    pull_secret: str | None = Field(
        default=None, description="Secret in the operator namespace that pulls the artifact."
    )


class KataRuntimeClass(ApiModel):
    name: Annotated[str, AfterValidator(dns_name)] = Field(
        description="The RuntimeClass, and the runtime handler the Kata manager adds to the "
        "node's container runtime."
    )
    node_selector: dict[str, str] | None = Field(
        default=None,
        description="Node labels a pod of this RuntimeClass also needs, beyond the Kata "
        "manager's deploy label.",
    )
    artifacts: KataArtifacts


class KataManagerConfig(ApiModel):
    artifacts_dir: str | None = Field(
        default=None,
        description="Host directory the runtime classes' artifacts are downloaded to.",
        json_schema_extra=crd_default(KATA_ARTIFACTS_DIR),
    )
    runtime_classes: list[KataRuntimeClass] | None = Field(
        default=None, description="The Kata runtime classes to set up on the nodes."
    )


class KataManagerSpec(SandboxOperandSpec):
    """NVIDIA's k8s-kata-manager: on vm-passthrough nodes it downloads each Kata runtime
    class's artifacts and adds its runtime to containerd; the operator creates the
    RuntimeClasses. (NVIDIA's operator has stopped honouring this section; this one deploys
    it as NVIDIA's did before.)"""

    config: KataManagerConfig | None = Field(
        default=None,
        description="The Kata manager's config; without runtimeClasses, NVIDIA's chart's "
        "kata-nvidia-gpu and kata-nvidia-gpu-snp.",
    )


class FabricManagerSpec(ApiModel):
    mode: Literal["full-passthrough", "shared-nvswitch"] | None = Field(
        default=None,
        description="shared-nvswitch: vm-passthrough nodes keep the driver (the fabric "
        "manager runs on the host and partitions NVSwitches for the VMs).",
    )


class SandboxWorkloadsSpec(ApiModel):
    enabled: bool | None = None
    default_workload: Literal["container", "vm-passthrough", "vm-vgpu"] | None = Field(
        default=None, json_schema_extra=crd_default("container")
    )
    mode: Literal["kubevirt", "kata"] | None = Field(
        default=None, json_schema_extra=crd_default("kubevirt")
    )


class GpuNodeTaint(ApiModel):
    """This project's addition: the taint that keeps non-GPU workloads off GPU nodes."""

    enabled: bool = True
    key: str = "nvidia.com/gpu"
    value: str = "present"
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


RemediationAction = Literal["restartDriver", "resetGPU", "external"]


class HealthSignals(ApiModel):
    """What the device-plugin agent counts against a GPU, beyond NVIDIA's fatal XIDs."""

    xids: list[NonNegativeInt] | None = Field(
        default=None, description="More XIDs that make a GPU unhealthy (e.g. application XIDs)."
    )
    ignored_xids: list[NonNegativeInt] | None = Field(
        default=None, description="XIDs never counted, even where NVIDIA's plugin counts them."
    )
    thermal: bool | None = Field(
        default=None,
        description="Count a thermal slowdown lasting the debounce as unhealthy.",
        json_schema_extra=crd_default(False),
    )
    power: bool | None = Field(
        default=None,
        description="Count a power-brake slowdown lasting the debounce as unhealthy.",
        json_schema_extra=crd_default(False),
    )
    debounce: Duration | None = Field(
        default=None,
        description="How long a thermal or power slowdown must last before it counts.",
        json_schema_extra=crd_default("30s"),
    )
    quiet_period: Duration | None = Field(
        default=None,
        description="GPUHealthy turns True again only after this long with no fault seen.",
        json_schema_extra=crd_default("2m"),
    )


class RemediationSpec(ApiModel):
    actions: list[RemediationAction] | None = Field(
        default=None,
        description="Tried in order on a drained node until GPUHealthy is True again: "
        "restartDriver, resetGPU (only GPUs no process holds), external (label the node for "
        "another controller). None: quarantine and drain only.",
    )
    timeout: Duration | None = Field(
        default=None,
        description="How long each action may take to bring GPUHealthy back.",
        json_schema_extra=crd_default("10m"),
    )
    external_label: str | None = Field(
        default=None,
        description='The label set to "requested" for the external action.',
        json_schema_extra=crd_default("nvidia.com/gpu-health.remediation"),
    )


class HealthRemediationSpec(ApiModel):
    """This project's addition: act on the GPUHealthy node condition, whoever writes it."""

    enabled: bool = Field(
        default=False,
        description="Quarantine, drain and remediate nodes whose GPUHealthy condition is False, "
        "and have the device-plugin agent publish that condition.",
    )
    max_unavailable: IntOrPercent | None = Field(
        default=None,
        description='GPU nodes quarantined at once at most, a count or a percent such as "10%".',
        json_schema_extra=crd_default("10%"),
    )
    recovery_delay: Duration | None = Field(
        default=None,
        description="How long GPUHealthy must be True before the quarantine is lifted.",
        json_schema_extra=crd_default("5m"),
    )
    taint_effect: Literal["NoSchedule", "NoExecute"] | None = Field(
        default=None,
        description="Effect of the nvidia.com/gpu.unhealthy taint.",
        json_schema_extra=crd_default("NoSchedule"),
    )
    drain: DrainSpec | None = Field(
        default=None,
        description="GPU pods are always evicted; enable drains the pods podSelector picks "
        "too. Timeouts, force and deleteEmptyDir work as in upgradePolicy.drain.",
    )
    remediation: RemediationSpec | None = None
    signals: HealthSignals | None = None


class ClusterPolicySpec(ApiModel):
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    daemonsets: DaemonsetsSpec = Field(default_factory=DaemonsetsSpec)
    driver: DriverSpec = Field(default_factory=DriverSpec)
    toolkit: ToolkitSpec = Field(default_factory=ToolkitSpec)
    device_plugin: DevicePluginSpec = Field(default_factory=DevicePluginSpec)
    dcgm: DcgmSpec = Field(default_factory=DcgmSpec)
    dcgm_exporter: DcgmExporterSpec = Field(default_factory=DcgmExporterSpec)
    node_status_exporter: NodeStatusExporterSpec = Field(default_factory=NodeStatusExporterSpec)
    gfd: GfdSpec = Field(default_factory=GfdSpec)
    mig: MigSpec = Field(default_factory=MigSpec)
    mig_manager: MigManagerSpec = Field(default_factory=MigManagerSpec)
    validator: ValidatorSpec = Field(default_factory=ValidatorSpec)
    cdi: CdiSpec = Field(default_factory=CdiSpec)
    host_paths: HostPathsSpec = Field(default_factory=HostPathsSpec)
    psa: EnabledOnly = Field(default_factory=EnabledOnly)
    sandbox_workloads: SandboxWorkloadsSpec = Field(default_factory=SandboxWorkloadsSpec)
    gpu_node_taint: GpuNodeTaint = Field(
        default_factory=GpuNodeTaint,
        description="Taint put on GPU nodes so only pods that tolerate it land there "
        "(gpu-operator addition; NVIDIA's operator sets none).",
    )
    health_remediation: HealthRemediationSpec = Field(
        default_factory=HealthRemediationSpec,
        description="Quarantine, drain and remediate GPU nodes whose GPUHealthy condition is "
        "False (gpu-operator addition; off by default).",
    )
    # Accepted and preserved, not acted on.
    psp: OpenSection = Field(default_factory=OpenSection)
    gds: OpenSection = Field(default_factory=OpenSection)
    gdrcopy: OpenSection = Field(default_factory=OpenSection)
    # The sandbox-workload operands (rendered only with sandboxWorkloads enabled).
    sandbox_device_plugin: SandboxOperandSpec = Field(
        default_factory=SandboxOperandSpec,
        description="KubeVirt's GPU device plugin (sandboxWorkloads.mode kubevirt).",
    )
    kata_sandbox_device_plugin: SandboxOperandSpec = Field(
        default_factory=SandboxOperandSpec,
        description="NVIDIA's device plugin for Kata containers (sandboxWorkloads.mode kata).",
    )
    kata_manager: KataManagerSpec = Field(default_factory=KataManagerSpec)
    vfio_manager: VfioManagerSpec = Field(default_factory=VfioManagerSpec)
    vgpu_manager: VgpuManagerSpec = Field(default_factory=VgpuManagerSpec)
    vgpu_device_manager: VgpuDeviceManagerSpec = Field(default_factory=VgpuDeviceManagerSpec)
    cc_manager: CcManagerSpec = Field(default_factory=CcManagerSpec)
    fabric_manager: FabricManagerSpec = Field(default_factory=FabricManagerSpec)

    @model_validator(mode="after")
    def _kata_runtime_classes_are_not_the_operators(self) -> ClusterPolicySpec:
        own = self.operator.runtime_class or "nvidia"
        config = self.kata_manager.config
        for i, runtime in enumerate((config.runtime_classes if config else None) or []):
            if runtime.name == own:
                raise ValueError(
                    f"kataManager.config.runtimeClasses[{i}].name {own!r} is the RuntimeClass "
                    "of the operator's own operands (operator.runtimeClass): name the Kata "
                    "runtime class otherwise"
                )
        return self

    def unimplemented_enabled(self) -> list[str]:
        """Enabled sections this operator accepts but does not act on, by wire name.

        The sandbox-family operands only run when sandboxWorkloads is enabled, as in NVIDIA's
        operator, so their default ``enabled: true`` in NVIDIA's Helm values is not reported.
        """
        names = []
        for field_name, info in type(self).model_fields.items():
            section = getattr(self, field_name)
            if not isinstance(section, OpenSection) or not section.enabled:
                continue
            names.append(info.alias or field_name)
        if self.node_status_exporter.enabled:
            names.insert(0, "nodeStatusExporter")
        return names
