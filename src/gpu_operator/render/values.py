"""What each component's templates read, as typed values built by pure functions.

A template sees ``ns`` (the namespace), ``openshift``, ``host`` (``HostPaths``), ``c`` (the
``Operand``: names, image, owned labels), ``d`` (its ``DaemonSetSettings``) and ``v``, the
component's own values from ``VALUES[component]``. Every builder takes the same inputs
(policy, facts, registry entry) and applies the policy's defaults, so templates read settled
values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, spec_from_clusterpolicy
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.labels import (
    HEALTH_ENV_CONDITION,
    HEALTH_ENV_DEBOUNCE,
    HEALTH_ENV_IGNORED_XIDS,
    HEALTH_ENV_POWER,
    HEALTH_ENV_QUIET_PERIOD,
    HEALTH_ENV_THERMAL,
    HEALTH_ENV_XIDS,
)
from gpu_operator.render import driver as nvd
from gpu_operator.render.components import ComponentDef, component_image, runs_agent, section
from gpu_operator.render.facts import Facts, NodeOS, Runtime
from gpu_operator.render.images import with_os_tag
from gpu_operator.render.metadata import owned_labels
from gpu_operator.render.sandbox import kata_manager_values, sandbox_values
from gpu_operator.render.settings import DaemonSetSettings, daemonset_settings, runtime_class

DEFAULT_DRIVER_INSTALL_DIR = "/run/nvidia/driver"
# NVIDIA's driver startupProbe timings; a long first start compiles the kernel modules.
DRIVER_STARTUP_PROBE = {
    "initialDelaySeconds": 60,
    "periodSeconds": 10,
    "timeoutSeconds": 60,
    "successThreshold": 1,
    "failureThreshold": 120,
}


@dataclass(frozen=True)
class Operand:
    """Who the component is: the names its objects carry and the image it runs."""

    name: str
    app: str  # DaemonSet name and pod label ``app``
    service_account: str  # also the name of its RBAC objects
    image: str
    labels: Mapping[str, str]  # the owned labels every object of the component carries


@dataclass(frozen=True)
class HostPaths:
    """Directories on the node, with defaults applied."""

    root: str
    driver_install_dir: str  # where the driver container installs the driver
    driver_root: str  # where operands find the driver: the install dir when we install it
    kubelet_root: str
    toolkit_install_dir: str


@dataclass(frozen=True)
class OsImage:
    """Node OSes that share one driver image tag (rhel9.2 and rhel9.4 share ``rhel9``)."""

    tag: str
    ids: tuple[str, ...]
    version_ids: tuple[str, ...]
    image: str


@dataclass(frozen=True)
class DriverPod:
    """One OS group's driver pod: containers, init containers and volumes as the NVIDIADriver
    rendering (``render.driver``) builds them, so both paths render every driver setting."""

    os: OsImage
    containers: tuple[Mapping[str, Any], ...]
    init_containers: tuple[Mapping[str, Any], ...]
    volumes: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class DriverValues:
    oses: tuple[OsImage, ...]  # one DaemonSet each
    pods: tuple[DriverPod, ...]  # the same, with their pods
    probe_configmap: str  # the startup probe script's ConfigMap
    probe_script: str
    startup_probe: Mapping[str, Any]  # the spec's timings over NVIDIA's
    liveness_probe: Mapping[str, Any] | None
    readiness_probe: Mapping[str, Any] | None
    handover: bool  # NVIDIADriver pools hold some nodes: only nodes without a pool label


@dataclass(frozen=True)
class ToolkitValues:
    runtime: Runtime
    runtime_class: str
    cdi_enabled: bool
    cdi_default: bool  # CDI as the runtime's default mode


@dataclass(frozen=True)
class ValidatorValues:
    checks: str  # comma-separated; the plugin check only where a device plugin is deployed


@dataclass(frozen=True)
class DevicePluginValues:
    mig_strategy: str
    config_name: str | None  # the user's ConfigMap of plugin configs; None: no config manager
    default_config: str
    mps_root: str
    # The project's image runs ``gpu-operator agent device-plugin``: it follows the config
    # label itself (no config-manager sidecar) and needs the API only for that.
    agent: bool
    # The agent's DEVICE_LIST_STRATEGY; None with a config, whose flags then decide.
    list_strategy: str | None
    cdi: bool  # mount the CDI spec directory (CDI on in the policy)
    simulate: str | None  # GPU_OPERATOR_SIMULATE for the agents, only when explicitly set
    mps: bool  # the config shares GPUs with MPS: render the MPS control daemon
    mps_command: tuple[str, ...]  # the MPS control daemon's command in this image
    # healthRemediation on: the plugin publishes GPUHealthy (the env below; the project's agent
    # reads it) and may patch its Node (the condition, the reset answer). Off: nothing rendered.
    health: bool = False
    health_env: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class DcgmValues:
    host_port: int


@dataclass(frozen=True)
class ExporterValues:
    config_name: str  # the metrics ConfigMap: the user's, or the one generated
    generate_config: bool
    annotations: Mapping[str, str]  # on the pods
    enable_pod_labels: bool
    enable_pod_uid: bool
    host_pid: bool
    pod_label_allowlist: str  # comma-separated regexes
    hpc_job_dir: str | None
    service_type: str
    internal_traffic_policy: str
    service_monitor: Mapping[str, Any] | None  # wire form; None: no ServiceMonitor
    dcgm_port: int | None  # the standalone host engine's, when deployed


@dataclass(frozen=True)
class GfdValues:
    mig_strategy: str
    # The project's agent reads the device-plugin configs and follows the node's config label,
    # so its sharing labels (mps.capable, replicas) match what the plugin advertises. None for
    # NVIDIA's image, or without devicePlugin.config.
    config_name: str | None = None
    default_config: str = ""


@dataclass(frozen=True)
class MigManagerValues:
    config_name: str  # the mig-parted ConfigMap: the user's, or the one generated
    generate_config: bool
    default_config: str
    gpu_clients_config: str | None
    shutdown_host_gpu_clients: bool  # only when the host, not our container, has the driver
    cdi_enabled: bool


@dataclass(frozen=True)
class TemplateContext:
    """Everything one component's templates read, under the names they use."""

    ns: str
    openshift: bool
    host: HostPaths
    c: Operand
    d: DaemonSetSettings
    v: object  # the component's own values, from VALUES

    def variables(self, config_hashes: Mapping[str, str]) -> dict[str, object]:
        """The template variables, with the ConfigMap hashes known at this point of the pass."""
        return {
            "ns": self.ns,
            "openshift": self.openshift,
            "host": self.host,
            "c": self.c,
            "d": replace(self.d, config_hashes=dict(config_hashes)),
            "v": self.v,
        }


def template_context(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> TemplateContext:
    return TemplateContext(
        ns=facts.namespace,
        openshift=facts.openshift,
        host=host_paths(policy),
        c=operand(policy, facts, comp),
        d=daemonset_settings(policy, facts, comp),
        v=VALUES[comp.name](policy, facts, comp),
    )


def operand(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> Operand:
    return Operand(
        name=comp.name,
        app=comp.app,
        service_account=comp.service_account,
        image=component_image(comp, section(policy, comp), facts),
        labels=owned_labels(comp.name),
    )


def host_paths(policy: ClusterPolicySpec) -> HostPaths:
    host = policy.host_paths
    root = host.root_fs or "/"
    driver_install_dir = host.driver_install_dir or DEFAULT_DRIVER_INSTALL_DIR
    if policy.driver.enabled:
        driver_root = driver_install_dir
    elif driver_install_dir != DEFAULT_DRIVER_INSTALL_DIR:
        # A preinstalled driver with a root of its own: GKE's /home/kubernetes/bin/nvidia,
        # Talos's; the install dir says where (as NVIDIA's users set it there).
        driver_root = driver_install_dir
    else:
        driver_root = root
    return HostPaths(
        root=root,
        driver_install_dir=driver_install_dir,
        driver_root=driver_root,
        kubelet_root=(host.kubelet_root_dir or "/var/lib/kubelet").rstrip("/"),
        toolkit_install_dir=policy.toolkit.install_dir or "/usr/local/nvidia",
    )


def component_images(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> tuple[str, ...]:
    """The images ``comp`` runs: one per node OS group for per-OS components."""
    image = component_image(comp, section(policy, comp), facts)
    if not comp.per_os:
        return (image,)
    return tuple(group.image for group in os_images(facts.node_oses, image))


def os_images(node_oses: Sequence[NodeOS], image: str) -> tuple[OsImage, ...]:
    """Node OSes grouped by driver image tag, sorted by tag, each with its tagged ``image``."""
    groups: dict[str, list[NodeOS]] = {}
    for os in node_oses:
        groups.setdefault(os.tag, []).append(os)
    return tuple(
        OsImage(
            tag=tag,
            ids=tuple(sorted({os.id for os in members})),
            version_ids=tuple(sorted({os.version_id for os in members})),
            image=with_os_tag(image, tag),
        )
        for tag, members in sorted(groups.items())
    )


def driver_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> DriverValues:
    driver = policy.driver
    oses = os_images(facts.node_oses, component_image(comp, section(policy, comp), facts))
    spec = NVIDIADriverSpec.model_validate(spec_from_clusterpolicy(driver))
    extra = nvd.ExtraConfig(
        namespace=facts.namespace,
        openshift=facts.openshift,
        configmap_keys=dict(facts.configmap_keys),
        image_env=facts.image_env,
        gpu_taint_key=policy.gpu_node_taint.key,
        quarantine_taint=policy.health_remediation.enabled,
    )
    root = host_paths(policy).root
    pods = []
    probe = ""
    for os in oses:
        names = nvd.DriverNames(comp.service_account, f"{comp.app}-{os.tag}")
        pool = nvd.Pool(os.ids[0], os.version_ids[0])
        built = nvd.driver_values(spec, pool, names, extra, image=os.image)
        probe = built.probe_configmap
        main, *sides = built.containers
        # The ClusterPolicy's driver also sees the host root (hostPaths.rootFS) at /host.
        host = {"name": "host-root", "mountPath": "/host", "readOnly": True,
                "mountPropagation": "HostToContainer"}  # fmt: skip
        main = {**main, "volumeMounts": [*main["volumeMounts"], host]}
        if driver.liveness_probe is not None:  # the ClusterPolicy's own, beyond NVIDIA's
            main["livenessProbe"] = {"exec": {"command": ["nvidia-smi"]},
                                     **driver.liveness_probe.to_wire()}  # fmt: skip
        if driver.readiness_probe is not None:
            ready = ["sh", "-c", "test -f /run/nvidia/validations/.driver-ctr-ready"]
            main["readinessProbe"] = {"exec": {"command": ready},
                                      **driver.readiness_probe.to_wire()}  # fmt: skip
        volumes = tuple(
            {"name": "host-root", "hostPath": {"path": root}} if v["name"] == "host-root" else v
            for v in built.volumes
        )
        pods.append(DriverPod(os, (main, *sides), built.init_containers, volumes))
    return DriverValues(
        oses=oses,
        pods=tuple(pods),
        probe_configmap=probe or f"{comp.service_account}-startup-probe",
        probe_script=nvd.PROBE_SCRIPT,
        startup_probe={
            **DRIVER_STARTUP_PROBE,
            **(driver.startup_probe.to_wire() if driver.startup_probe else {}),
        },
        liveness_probe=driver.liveness_probe.to_wire() if driver.liveness_probe else None,
        readiness_probe=driver.readiness_probe.to_wire() if driver.readiness_probe else None,
        handover=facts.driver_handover,
    )


def toolkit_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> ToolkitValues:
    return ToolkitValues(
        runtime=facts.runtime,
        runtime_class=runtime_class(policy),
        cdi_enabled=cdi_enabled(policy),
        cdi_default=bool(policy.cdi.default),
    )


def validator_values(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> ValidatorValues:
    plugin = ["plugin"] if policy.device_plugin.enabled else []
    return ValidatorValues(checks=",".join(["driver", "toolkit", "cuda", *plugin]))


def device_plugin_values(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> DevicePluginValues:
    plugin = policy.device_plugin
    config = plugin.config if plugin.config is not None and plugin.config.name else None
    agent = runs_agent(comp, component_image(comp, plugin, facts), facts.operator_image)
    simulate = facts.simulate_gpus if agent else None
    if agent:
        mps_command: tuple[str, ...] = ("gpu-operator", "agent", "mps-control-daemon")
        mps_command += ("--simulated",) if simulate else ()
    else:
        mps_command = ("mps-control-daemon",)
    return DevicePluginValues(
        mig_strategy=mig_strategy(policy),
        config_name=config.name if config else None,
        default_config=(config.default if config else None) or "",
        mps_root=(plugin.mps.root if plugin.mps else None) or "/run/nvidia/mps",
        agent=agent,
        list_strategy=None if config else ("cdi-cri" if policy.cdi.default else "envvar"),
        cdi=cdi_enabled(policy),
        simulate=simulate,
        mps=config is not None and config.name in facts.mps_configs,
        mps_command=mps_command,
        health=policy.health_remediation.enabled,
        health_env=health_env(policy),
    )


def health_env(policy: ClusterPolicySpec) -> tuple[dict[str, str], ...]:
    """The device-plugin agent's GPU_HEALTH_* env from ``spec.healthRemediation``: only the
    signals set, as strings, durations as written; empty when remediation is off."""
    remediation = policy.health_remediation
    if not remediation.enabled:
        return ()
    signals = remediation.signals
    values: list[tuple[str, object]] = [(HEALTH_ENV_CONDITION, True)]
    if signals is not None:
        values += [
            (HEALTH_ENV_XIDS, signals.xids),
            (HEALTH_ENV_IGNORED_XIDS, signals.ignored_xids),
            (HEALTH_ENV_THERMAL, signals.thermal),
            (HEALTH_ENV_POWER, signals.power),
            (HEALTH_ENV_DEBOUNCE, signals.debounce),
            (HEALTH_ENV_QUIET_PERIOD, signals.quiet_period),
        ]
    return tuple({"name": name, "value": _env_text(v)} for name, v in values if v is not None)


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def dcgm_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> DcgmValues:
    return DcgmValues(host_port=dcgm_port(policy))


def exporter_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> ExporterValues:
    exporter = policy.dcgm_exporter
    config_name = exporter.config.name if exporter.config else None
    monitor = exporter.service_monitor
    hpc = exporter.hpc_job_mapping
    service = exporter.service
    return ExporterValues(
        config_name=config_name or "nvidia-dcgm-exporter-metrics",
        generate_config=not config_name,
        annotations=dict(exporter.annotations or {}),
        enable_pod_labels=bool(exporter.enable_pod_labels),
        enable_pod_uid=bool(exporter.enable_pod_uid),
        host_pid=bool(exporter.host_pid),
        pod_label_allowlist=",".join(exporter.pod_label_allowlist_regex or []),
        hpc_job_dir=(
            (hpc.directory or "/var/lib/dcgm-exporter/job-mapping") if hpc and hpc.enabled else None
        ),
        service_type=(service.type if service else None) or "ClusterIP",
        internal_traffic_policy=(service.internal_traffic_policy if service else None) or "Cluster",
        service_monitor=monitor.to_wire() if monitor and monitor.enabled else None,
        dcgm_port=dcgm_port(policy) if policy.dcgm.enabled else None,
    )


def gfd_values(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> GfdValues:
    config = policy.device_plugin.config
    agent = runs_agent(
        comp, component_image(comp, section(policy, comp), facts), facts.operator_image
    )
    if not (agent and config is not None and config.name):
        return GfdValues(mig_strategy=mig_strategy(policy))
    return GfdValues(
        mig_strategy=mig_strategy(policy),
        config_name=config.name,
        default_config=config.default or "",
    )


def mig_manager_values(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> MigManagerValues:
    config = policy.mig_manager.config
    clients = policy.mig_manager.gpu_clients_config
    return MigManagerValues(
        config_name=(config.name if config else None) or "default-mig-parted-config",
        generate_config=not (config and config.name),
        default_config=(config.default if config else None) or "all-disabled",
        gpu_clients_config=clients.name if clients and clients.name else None,
        shutdown_host_gpu_clients=not policy.driver.enabled,
        cdi_enabled=cdi_enabled(policy),
    )


def mig_strategy(policy: ClusterPolicySpec) -> str:
    return policy.mig.strategy or "single"


def dcgm_port(policy: ClusterPolicySpec) -> int:
    return policy.dcgm.host_port or 5555


def cdi_enabled(policy: ClusterPolicySpec) -> bool:
    """CDI is on unless the policy turns it off."""
    return policy.cdi.enabled is not False


ValuesBuilder = Callable[[ClusterPolicySpec, Facts, ComponentDef], object]

# Registry name -> the builder of that component's ``v``; a test keeps it complete.
VALUES: Mapping[str, ValuesBuilder] = {
    "driver": driver_values,
    "container-toolkit": toolkit_values,
    "operator-validator": validator_values,
    "device-plugin": device_plugin_values,
    "dcgm": dcgm_values,
    "dcgm-exporter": exporter_values,
    "gpu-feature-discovery": gfd_values,
    "mig-manager": mig_manager_values,
    "vfio-manager": sandbox_values,
    "vgpu-manager": sandbox_values,
    "vgpu-device-manager": sandbox_values,
    "sandbox-validator": sandbox_values,
    "sandbox-device-plugin": sandbox_values,
    "kata-sandbox-device-plugin": sandbox_values,
    "kata-manager": kata_manager_values,
    "cc-manager": sandbox_values,
}
