"""The driver DaemonSet of one NVIDIADriver on one node pool, named and shaped as NVIDIA's.

``render_driver(spec, pool, names, facts)`` is pure. A *pool* is the nodes of one NVIDIADriver
that share an OS (and, for precompiled drivers, a kernel): each gets one DaemonSet
``nvidia-<type>-driver-<os>-<hash>`` whose hash is NVIDIA's input (the CR's uid, plus the
kernel for precompiled pools), so names survive operator restarts and match NVIDIA's.

Every setting of the spec reaches the pod: the k8s-driver-manager init container (its env over
NVIDIA's defaults), the precompiled image tag ``<branch>-<kernel>-<os>``, the nvidia-peermem
(RDMA), nvidia-fs (GDS) and gdrcopy side containers, and the ConfigMap/Secret volumes of
repoConfig, certConfig, licensingConfig, virtualTopologyConfig, kernelModuleConfig and
secretEnv. The objects are in ``templates/nvidia-driver/``; this module computes what they read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.base import ImageRef
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, SideContainer
from gpu_operator.labels import (
    DEPLOY_PREFIX,
    DRIVER_POOL,
    GPU_PRESENT,
    OS_ID,
    OS_VERSION,
)
from gpu_operator.render.engine import render_template, templates
from gpu_operator.render.images import ImageDefault, is_digest, resolve_image, split_reference
from gpu_operator.render.metadata import owned_labels
from gpu_operator.render.wire import merge_env, merge_maps

TEMPLATE_FOLDER = "nvidia-driver"
KERNEL_LABEL = "feature.node.kubernetes.io/kernel-version.full"
OSTREE_LABEL = "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION"
PRECOMPILED_LABEL = "nvidia.com/precompiled"
PRECOMPILED_KERNEL_LABEL = "nvidia.com/precompiled.kernel-version"
OS_VERSION_LABEL = "nvidia.com/node.os-version"
NVIDIA_COMPONENT = "app.kubernetes.io/component"  # NVIDIA's value: nvidia-driver
POOL_LABEL = DRIVER_POOL  # gpu-operator: which NVIDIADriver drives the node
COMPONENT_NAME = "driver"  # our owned component label, as the ClusterPolicy's driver
DEFAULT_DRIVER = ImageDefault("nvcr.io/nvidia", "driver", "580.95.05")
DEFAULT_VGPU_MANAGER = ImageDefault("nvcr.io/nvidia", "vgpu-manager", "580.95.05")
DEFAULT_MANAGER = ImageDefault("nvcr.io/nvidia/cloud-native", "k8s-driver-manager", "v0.8.1")
DEFAULT_GDS = ImageDefault("nvcr.io/nvidia/cloud-native", "nvidia-fs", "2.26.6")
DEFAULT_GDRCOPY = ImageDefault("nvcr.io/nvidia/cloud-native", "gdrdrv", "v2.5.1")
STARTUP_PROBE = {
    "initialDelaySeconds": 60,
    "timeoutSeconds": 60,
    "periodSeconds": 10,
    "successThreshold": 1,
    "failureThreshold": 120,
}
# k8s-driver-manager's settings when the spec's manager.env says nothing (NVIDIA's).
MANAGER_ENV_DEFAULTS = (
    ("ENABLE_GPU_POD_EVICTION", "true"),
    ("ENABLE_AUTO_DRAIN", "false"),
    ("DRAIN_USE_FORCE", "false"),
    ("DRAIN_POD_SELECTOR_LABEL", ""),
    ("DRAIN_TIMEOUT_SECONDS", "0s"),
    ("DRAIN_DELETE_EMPTYDIR_DATA", "false"),
)
# Where a distribution keeps package repositories and CA certificates (NVIDIA's table).
REPO_DIRS = {
    "centos": "/etc/yum.repos.d",
    "debian": "/etc/apt/sources.list.d",
    "ubuntu": "/etc/apt/sources.list.d",
    "rhcos": "/etc/yum.repos.d",
    "rhel": "/etc/yum.repos.d",
    "rocky": "/etc/yum.repos.d",
    "sles": "/etc/zypp/repos.d",
    "sl-micro": "/etc/zypp/repos.d",
}
CERT_DIRS = {
    "centos": "/etc/pki/ca-trust/extracted/pem",
    "debian": "/usr/local/share/ca-certificates",
    "ubuntu": "/usr/local/share/ca-certificates",
    "rhcos": "/etc/pki/ca-trust/extracted/pem",
    "rhel": "/etc/pki/ca-trust/extracted/pem",
    "rocky": "/etc/pki/ca-trust/extracted/pem",
    "sles": "/etc/pki/trust/anchors",
    "sl-micro": "/etc/pki/trust/anchors",
}
GRIDD_CONF = "gridd.conf"
NLS_TOKEN = "client_configuration_token.tok"
TOPOLOGY_CONF = "nvidia-topologyd.conf"


@dataclass(frozen=True)
class Pool:
    """Nodes of one NVIDIADriver that get the same DaemonSet."""

    os_id: str  # ubuntu
    os_version: str  # 22.04
    kernel: str | None = None  # precompiled pools only
    rhcos_version: str | None = None  # OpenShift pools that build on the node
    # The nodeSelector of the DaemonSet beyond the deploy label: the pool label and OS labels
    # in the operator; what NVIDIA's test used in the golden comparison.
    node_selector: Mapping[str, str] = field(default_factory=dict)

    @property
    def os_tag(self) -> str:
        """NVIDIA's image suffix: ``ubuntu22.04``; rocky and RHEL 10+ by major version only."""
        major = self.os_version.split(".")[0]
        if self.os_id == "rocky" or (self.os_id == "rhel" and major.isdigit() and int(major) >= 10):
            return f"{self.os_id}{major}"
        return f"{self.os_id}{self.os_version}"

    @classmethod
    def of_node(
        cls, labels: Mapping[str, str], precompiled: bool, pool_label: str | None
    ) -> Pool | None:
        """The pool a node with ``labels`` belongs to; None without the NFD labels it needs."""
        os_id, version = labels.get(OS_ID), labels.get(OS_VERSION)
        kernel = labels.get(KERNEL_LABEL) if precompiled else None
        if not os_id or not version or (precompiled and not kernel):
            return None
        selector = {OS_ID: os_id, OS_VERSION: version}
        if kernel:
            selector[KERNEL_LABEL] = kernel
        if pool_label is not None:
            selector[POOL_LABEL] = pool_label
        return cls(os_id.lower(), version, kernel, None, selector)


@dataclass(frozen=True)
class DriverNames:
    name: str  # ServiceAccount and RBAC objects
    app: str  # DaemonSet and pod label ``app``


def string_hash(text: str) -> str:
    """NVIDIA's short hash: FNV-1a (32 bit) of ``text``, written in Kubernetes' safe alphabet
    (no vowels, no look-alike digits), as in ``-7c6d7bd86b`` suffixes."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return "".join(alphabet[ord(ch) % len(alphabet)] for ch in str(value))


def driver_names(cr_name: str, cr_uid: str, spec: NVIDIADriverSpec, pool: Pool) -> DriverNames:
    """NVIDIA's names: ``nvidia-<type>-driver-<cr>-<os>`` and ``nvidia-<type>-driver-<os>-<hash>``
    (``nvidia-vgpu-manager-...`` for the vGPU host manager), the app name at most 63 chars."""
    prefix = (
        "nvidia-vgpu-manager"
        if spec.driver_type == "vgpu-host-manager"
        else f"nvidia-{spec.driver_type}-driver"
    )
    name = f"{prefix}-{cr_name}-{pool.os_tag}"[:253]
    extra = pool.kernel or pool.rhcos_version
    digest = string_hash(cr_uid + (f"-{extra}" if extra else ""))
    head = f"{prefix}-{pool.os_tag}"
    head = head[: 63 - len(digest) - 1]
    return DriverNames(name=name, app=f"{head}-{digest}")


@dataclass(frozen=True)
class DriverValues:
    """What ``templates/nvidia-driver/`` reads (``v``)."""

    ns: str
    name: str
    app: str
    owned: Mapping[str, str]  # our labels on every object
    ds_labels: Mapping[str, str]
    pod_labels: Mapping[str, str]
    ds_annotations: Mapping[str, str]
    pod_annotations: Mapping[str, str]
    probe_configmap: str
    probe_script: str
    containers: tuple[Mapping[str, Any], ...]
    init_containers: tuple[Mapping[str, Any], ...]
    volumes: tuple[Mapping[str, Any], ...]
    pod_spec: Mapping[str, Any]  # scheduling and security fields of the pod
    openshift: bool = False  # the SCC and ClusterVersion rules exist only there


# The driver container's readiness contract: the validators wait for this file. Our own script.
PROBE_SCRIPT = """#!/bin/sh
# Ready when nvidia-smi answers (it cannot without the kernel module); the validators and
# the side containers wait for the ready file, which lists what this driver enabled.
set -eu
dir=/run/nvidia/validations
mkdir -p "$dir"
status_file="$dir/.driver-daemons-status"
if [ -f "$status_file" ] && [ "$(cat "$status_file")" != Ready ]; then
  echo "driver daemons not ready: $(cat "$status_file")"; exit 1
fi
nvidia-smi >/dev/null || { echo "nvidia-smi failed: driver not loaded yet"; exit 1; }
printf 'GDRCOPY_ENABLED: %s\\nGDS_ENABLED: %s\\nGPU_DIRECT_RDMA_ENABLED: %s\\n' \\
  "${GDRCOPY_ENABLED:-false}" "${GDS_ENABLED:-false}" "${GPU_DIRECT_RDMA_ENABLED:-false}" \\
  > "$dir/.driver-ctr-ready.tmp"
mv "$dir/.driver-ctr-ready.tmp" "$dir/.driver-ctr-ready"
"""


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _host(name: str, path: str, type_: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": path}
    if type_:
        source["type"] = type_
    return {"name": name, "hostPath": source}


def _mount(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "mountPath": path, **extra}


def driver_image(spec: NVIDIADriverSpec, pool: Pool, image_env: str | None = None) -> str:
    """The driver image for ``pool``: ``<version>-<os>``, or ``<branch>-<kernel>-<os>`` for a
    precompiled pool; a digest names one exact image and is used as it is."""
    default = DEFAULT_VGPU_MANAGER if spec.driver_type == "vgpu-host-manager" else DEFAULT_DRIVER
    image = resolve_image(_image_ref(spec), default, image_env)
    version = split_reference(image).version
    if version is None or is_digest(version):
        return image
    suffix = f"-{pool.kernel}-{pool.os_tag}" if spec.use_precompiled and pool.kernel else ""
    suffix = suffix or f"-{pool.os_tag}"
    return image if version.endswith(suffix) else image + suffix


def _image_ref(spec: NVIDIADriverSpec) -> ImageRef:
    return ImageRef(repository=spec.repository, image=spec.image, version=spec.version)


def _side_image(side: SideContainer, default: ImageDefault) -> str:
    return resolve_image(side, default, None)


def config_digest(value: object) -> str:
    """A short decimal digest (as NVIDIA's DRIVER_CONFIG_DIGEST) of what makes a driver pod."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    digest = 0x811C9DC5
    for byte in text.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return str(digest)


@dataclass(frozen=True)
class ExtraConfig:
    """Cluster facts a driver pod depends on beyond its spec (from the controller)."""

    namespace: str = "gpu-operator"
    openshift: bool = False
    runtime: str = "containerd"
    # ConfigMap name -> its keys, for repoConfig/certConfig/kernelModuleConfig mounts (one
    # file each, so the directory's other files stay); unknown: the ConfigMap as a directory.
    configmap_keys: Mapping[str, Sequence[str]] = field(default_factory=dict)
    image_env: Mapping[str, str] = field(default_factory=dict)  # DRIVER_IMAGE, ...
    # Extra volumes and mounts (NVIDIA's "additional configs"), added to every container.
    volumes: tuple[Mapping[str, Any], ...] = ()
    mounts: tuple[Mapping[str, Any], ...] = ()
    gpu_taint_key: str = "nvidia.com/gpu"


def _configmap_files(
    volume: str, configmap: str, directory: str, keys: Sequence[str] | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Mounts of each key of ``configmap`` into ``directory`` and the volume they read."""
    if not keys:
        return [_mount(volume, directory, readOnly=True)], {
            "name": volume,
            "configMap": {"name": configmap},
        }
    mounts = [
        _mount(volume, f"{directory}/{key}", readOnly=True, subPath=key) for key in sorted(keys)
    ]
    items = [{"key": key, "path": key} for key in sorted(keys)]
    return mounts, {"name": volume, "configMap": {"name": configmap, "items": items}}


def _additional(
    spec: NVIDIADriverSpec, pool: Pool, extra: ExtraConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The config volumes of the driver container: repoConfig, certConfig (not for precompiled
    drivers, which install no packages), kernelModuleConfig, licensing and topology."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []

    def add_configmap(volume: str, name: str, directory: str, usual: Sequence[str] = ()) -> None:
        keys = extra.configmap_keys.get(name) or usual
        more, vol = _configmap_files(volume, name, directory, keys)
        mounts.extend(more)
        volumes.append(vol)

    if not spec.use_precompiled:
        if spec.repo_config and spec.repo_config.name:
            add_configmap("repo-config", spec.repo_config.name, _dir(REPO_DIRS, pool, "repo"))
        if spec.cert_config and spec.cert_config.name:
            add_configmap("cert-config", spec.cert_config.name, _dir(CERT_DIRS, pool, "cert"))
    if spec.kernel_module_config and spec.kernel_module_config.name:
        # Not seen yet: its usual file, never the whole of /drivers (the driver lives there).
        add_configmap(
            "kernel-module-config", spec.kernel_module_config.name, "/drivers", ("nvidia.conf",)
        )
    licensing = spec.licensing_config
    if licensing and (licensing.secret_name or licensing.name):
        items = [{"key": GRIDD_CONF, "path": GRIDD_CONF}]
        mounts.append(
            _mount("licensing-config", f"/drivers/{GRIDD_CONF}", readOnly=True, subPath=GRIDD_CONF)
        )
        if licensing.nls_enabled is not False:
            items.append({"key": NLS_TOKEN, "path": NLS_TOKEN})
            mounts.append(
                _mount(
                    "licensing-config",
                    f"/drivers/ClientConfigToken/{NLS_TOKEN}",
                    readOnly=True,
                    subPath=NLS_TOKEN,
                )
            )
        source: dict[str, Any] = (
            {"secret": {"secretName": licensing.secret_name, "items": items}}
            if licensing.secret_name
            else {"configMap": {"name": licensing.name, "items": items}}
        )
        volumes.append({"name": "licensing-config", **source})
    topology = spec.virtual_topology_config
    if topology and topology.name:
        mounts.append(
            _mount(
                "topology-config",
                f"/etc/nvidia/{TOPOLOGY_CONF}",
                readOnly=True,
                subPath=TOPOLOGY_CONF,
            )
        )
        volumes.append(
            {
                "name": "topology-config",
                "configMap": {
                    "name": topology.name,
                    "items": [{"key": TOPOLOGY_CONF, "path": TOPOLOGY_CONF}],
                },
            }
        )
    return mounts, volumes


def _dir(table: Mapping[str, str], pool: Pool, what: str) -> str:
    try:
        return table[pool.os_id]
    except KeyError:
        raise ValueError(
            f"{what}Config: no known {what} directory for {pool.os_id} nodes; "
            f"supported: {', '.join(sorted(table))}"
        ) from None


def _probe(spec_probe: Any, defaults: Mapping[str, int]) -> dict[str, Any]:
    return {**defaults, **(spec_probe.to_wire() if spec_probe is not None else {})}


def _driver_container(
    spec: NVIDIADriverSpec,
    pool: Pool,
    image: str,
    extra: ExtraConfig,
    config_mounts: list[dict[str, Any]],
    digest: str,
) -> dict[str, Any]:
    host_manager = spec.driver_type == "vgpu-host-manager"
    rdma = bool(spec.rdma and spec.rdma.enabled)
    env = [
        _env("NVIDIA_VISIBLE_DEVICES", "void"),
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("NODE_IP", "status.hostIP"),
        _env("DRIVER_CONFIG_DIGEST", digest),
    ]
    if spec.gds and spec.gds.enabled:
        env.append(_env("GDS_ENABLED", "true"))
    if spec.gdrcopy and spec.gdrcopy.enabled:
        env.append(_env("GDRCOPY_ENABLED", "true"))
    if rdma:
        env.append(_env("GPU_DIRECT_RDMA_ENABLED", "true"))
        if spec.rdma and spec.rdma.use_host_mofed:
            env.append(_env("USE_HOST_MOFED", "true"))
    if spec.kernel_module_type and spec.kernel_module_type != "auto":
        env.append(_env("KERNEL_MODULE_TYPE", spec.kernel_module_type))
    if spec.licensing_config and spec.licensing_config.nls_enabled is not None:
        env.append(_env("NLS_ENABLED", str(spec.licensing_config.nls_enabled).lower()))
    user_env = [e.to_wire() for e in spec.env or []]
    container: dict[str, Any] = {
        "name": "nvidia-driver-ctr",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy or "IfNotPresent",
        "command": ["nvidia-driver"],
        "args": ["init", *(spec.args or [])],
        "env": merge_env(env, user_env),
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
    }
    if spec.secret_env:
        container["envFrom"] = [{"secretRef": {"name": spec.secret_env}}]
    if spec.resources is not None and spec.resources.to_wire():
        container["resources"] = spec.resources.to_wire()
    if not host_manager:
        container["lifecycle"] = {
            "preStop": {
                "exec": {
                    "command": [
                        "/bin/sh",
                        "-c",
                        "rm -f /run/nvidia/validations/.driver-ctr-ready "
                        "/run/nvidia/validations/.driver-daemons-status",
                    ]
                }
            }
        }
        container["startupProbe"] = {
            "exec": {"command": ["sh", "/usr/local/bin/startup-probe.sh"]},
            **_probe(spec.startup_probe, STARTUP_PROBE),
        }
    mounts = [
        _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
        _mount("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager"),
        _mount("run-nvidia-topologyd", "/run/nvidia-topologyd"),
        _mount("var-log", "/var/log"),
        _mount("dev-log", "/dev/log"),
        _mount("host-os-release", "/host-etc/os-release", readOnly=True),
        _mount(
            "mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", mountPropagation="HostToContainer"
        ),
        _mount("run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"),
        _mount("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        _mount("host-sys-devices-system", "/sys/devices/system"),
        _mount("nv-firmware", "/lib/firmware"),
    ]
    if host_manager:
        mounts += [_mount("cgroup", "/sys/fs/cgroup"), _mount("vfio", "/dev/vfio")]
    mounts.append(
        _mount(
            "driver-startup-probe-script",
            "/usr/local/bin/startup-probe.sh",
            subPath="startup-probe.sh",
        )
    )
    container["volumeMounts"] = [*mounts, *config_mounts, *extra.mounts]
    return container


def _peermem_container(spec: NVIDIADriverSpec, image: str) -> dict[str, Any]:
    """nvidia-peermem, the GPUDirect RDMA module, loaded once the driver is."""
    host_mofed = bool(spec.rdma and spec.rdma.use_host_mofed)
    return {
        "name": "nvidia-peermem-ctr",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy or "IfNotPresent",
        "command": ["nvidia-driver"],
        "args": ["reload_nvidia_peermem"],
        "env": [_env("USE_HOST_MOFED", str(host_mofed).lower())],
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
        "startupProbe": {
            "exec": {"command": ["sh", "-c", "lsmod | grep nvidia_peermem"]},
            "initialDelaySeconds": 10,
            "failureThreshold": 120,
            "successThreshold": 1,
            "periodSeconds": 10,
            "timeoutSeconds": 10,
        },
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
            _mount("var-log", "/var/log"),
            _mount("dev-log", "/dev/log", readOnly=True),
            _mount(
                "run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"
            ),
        ],
    }


def _side_container(
    name: str,
    side: SideContainer,
    image: str,
    program: str,
    module: str,
    extra: ExtraConfig,
    resources: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """GDS (nvidia-fs) and GDRCopy (gdrdrv): wait for the driver, then install the module."""
    wait = (
        "until [ -d /run/nvidia/driver/usr/src ] && lsmod | grep nvidia; do echo  Waiting "
        f"for nvidia-driver to be installed...; sleep 10; done; exec {program} install"
    )
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": side.image_pull_policy or "IfNotPresent",
        "command": ["bash", "-xc"],
        "args": [wait, *(side.args or [])],
        "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
        "startupProbe": {
            "exec": {"command": ["sh", "-c", f"lsmod | grep {module}"]},
            "initialDelaySeconds": 10,
            "failureThreshold": 120,
            "successThreshold": 1,
            "periodSeconds": 10,
            "timeoutSeconds": 10,
        },
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="HostToContainer"),
            _mount("var-log", "/var/log"),
            _mount("dev-log", "/dev/log", readOnly=True),
            *extra.mounts,
        ],
    }
    if side.env:
        container["env"] = [e.to_wire() for e in side.env]
    if resources:
        container["resources"] = dict(resources)
    return container


def _manager_container(spec: NVIDIADriverSpec, extra: ExtraConfig, digest: str) -> dict[str, Any]:
    manager = spec.manager
    image = resolve_image(manager, DEFAULT_MANAGER, extra.image_env.get("DRIVER_MANAGER_IMAGE"))
    env = [
        _field_env("NODE_NAME", "spec.nodeName"),
        _env("NVIDIA_VISIBLE_DEVICES", "void"),
        *(_env(k, v) for k, v in MANAGER_ENV_DEFAULTS),
        _field_env("OPERATOR_NAMESPACE", "metadata.namespace"),
        _env("DRIVER_CONFIG_DIGEST", digest),
    ]
    container: dict[str, Any] = {
        "name": "k8s-driver-manager",
        "image": image,
        "imagePullPolicy": (manager.image_pull_policy if manager else None) or "IfNotPresent",
        "command": ["driver-manager"],
        "args": ["uninstall_driver"],
        "env": merge_env(env, [e.to_wire() for e in (manager.env if manager else None) or []]),
        "securityContext": {"privileged": True},
        "volumeMounts": [
            _mount("run-nvidia", "/run/nvidia", mountPropagation="Bidirectional"),
            _mount("host-root", "/host", mountPropagation="HostToContainer", readOnly=True),
            _mount("host-sys", "/sys"),
            _mount(
                "run-mellanox-drivers", "/run/mellanox/drivers", mountPropagation="HostToContainer"
            ),
        ],
    }
    if spec.resources is not None and spec.resources.to_wire():
        container["resources"] = spec.resources.to_wire()
    return container


def _volumes(spec: NVIDIADriverSpec, host_manager: bool, probe_cm: str) -> list[dict[str, Any]]:
    volumes = [
        _host("run-nvidia", "/run/nvidia", "DirectoryOrCreate"),
        _host("var-log", "/var/log"),
        _host("dev-log", "/dev/log"),
        _host("host-os-release", "/etc/os-release"),
        _host("run-nvidia-fabricmanager", "/run/nvidia-fabricmanager", "DirectoryOrCreate"),
        _host("run-nvidia-topologyd", "/run/nvidia-topologyd", "DirectoryOrCreate"),
        _host("mlnx-ofed-usr-src", "/run/mellanox/drivers/usr/src", "DirectoryOrCreate"),
        _host("run-mellanox-drivers", "/run/mellanox/drivers", "DirectoryOrCreate"),
        _host("run-nvidia-validations", "/run/nvidia/validations", "DirectoryOrCreate"),
        _host("host-root", "/"),
        _host("host-sys", "/sys", "Directory"),
        _host("firmware-search-path", "/sys/module/firmware_class/parameters/path"),
        _host("host-sys-devices-system", "/sys/devices/system", "Directory"),
        _host("nv-firmware", "/run/nvidia/driver/lib/firmware", "DirectoryOrCreate"),
    ]
    if host_manager:
        volumes += [_host("cgroup", "/sys/fs/cgroup"), _host("vfio", "/dev/vfio")]
    volumes.append(
        {
            "name": "driver-startup-probe-script",
            "configMap": {"name": probe_cm, "defaultMode": 0o755},
        }
    )
    return volumes


def driver_values(
    spec: NVIDIADriverSpec,
    pool: Pool,
    names: DriverNames,
    extra: ExtraConfig,
    image: str | None = None,
) -> DriverValues:
    """What the templates read; ``image`` overrides the pool's (the ClusterPolicy's own
    driver keeps its image tags)."""
    host_manager = spec.driver_type == "vgpu-host-manager"
    image = image or driver_image(spec, pool, extra.image_env.get("DRIVER_IMAGE"))
    config_mounts, config_volumes = _additional(spec, pool, extra)
    digest = config_digest(
        {"spec": spec.to_wire(), "image": image, "mounts": config_mounts, "pool": pool.os_tag}
    )
    resources = spec.resources.to_wire() if spec.resources is not None else None
    containers = [_driver_container(spec, pool, image, extra, config_mounts, digest)]
    if spec.rdma and spec.rdma.enabled and not host_manager:
        containers.append(_peermem_container(spec, image))
    if spec.gds and spec.gds.enabled:
        containers.append(
            _side_container(
                "nvidia-fs-ctr",
                spec.gds,
                _side_image(spec.gds, DEFAULT_GDS),
                "nvidia-gds-driver",
                "nvidia_fs",
                extra,
                resources,
            )
        )
    if spec.gdrcopy and spec.gdrcopy.enabled:
        containers.append(
            _side_container(
                "nvidia-gdrcopy-ctr",
                spec.gdrcopy,
                _side_image(spec.gdrcopy, DEFAULT_GDRCOPY),
                "nvidia-gdrcopy-driver",
                "gdrdrv",
                extra,
                resources,
            )
        )
    component = "nvidia-vgpu-host-manager" if host_manager else "nvidia-driver"
    precompiled = {PRECOMPILED_LABEL: "true" if spec.use_precompiled else "false"}
    if spec.use_precompiled and pool.kernel:
        precompiled[PRECOMPILED_KERNEL_LABEL] = pool.kernel
    owned = owned_labels(COMPONENT_NAME)
    nvidia_labels = {
        "app": names.app,
        NVIDIA_COMPONENT: component,
        OS_VERSION_LABEL: pool.os_tag,
        **precompiled,
    }
    # The spec's labels first; NVIDIA's and ours win (the controller finds pods by them).
    ds_labels = merge_maps(spec.labels, nvidia_labels, owned, {NVIDIA_COMPONENT: component})
    deploy = DEPLOY_PREFIX + ("vgpu-manager" if host_manager else "driver")
    node_selector = {deploy: "true", **pool.node_selector}
    if spec.use_precompiled and pool.kernel:
        node_selector[KERNEL_LABEL] = pool.kernel
    elif pool.rhcos_version:
        node_selector[OSTREE_LABEL] = pool.rhcos_version
    tolerations = [{"key": extra.gpu_taint_key, "operator": "Exists", "effect": "NoSchedule"}]
    for toleration in spec.tolerations or []:
        wire = toleration.to_wire()
        if wire not in tolerations:
            tolerations.append(wire)
    affinity: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {
                                "key": NVIDIA_COMPONENT,
                                "operator": "In",
                                "values": ["nvidia-driver", "nvidia-vgpu-manager"],
                            }
                        ]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    if spec.node_affinity is not None:
        affinity["nodeAffinity"] = spec.node_affinity.to_wire()
    pod_spec: dict[str, Any] = {
        "affinity": affinity,
        "hostPID": True,
        "nodeSelector": node_selector,
        "priorityClassName": spec.priority_class_name or "system-node-critical",
        "serviceAccountName": names.name,
        "tolerations": tolerations,
    }
    if host_manager:
        pod_spec["terminationGracePeriodSeconds"] = 120
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    side_secrets = [
        s
        for side in (spec.gds, spec.gdrcopy)
        if side is not None and side.enabled
        for s in side.image_pull_secrets or []
    ]
    for secret in side_secrets:
        pod_spec.setdefault("imagePullSecrets", [])
        if {"name": secret} not in pod_spec["imagePullSecrets"]:
            pod_spec["imagePullSecrets"].append({"name": secret})
    if spec.host_network is not None:
        pod_spec["hostNetwork"] = spec.host_network
        if spec.host_network:
            pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.pod_security_context is not None:
        pod_spec["securityContext"] = spec.pod_security_context.to_wire()
    return DriverValues(
        ns=extra.namespace,
        name=names.name,
        app=names.app,
        owned=owned,
        ds_labels=ds_labels,
        pod_labels=ds_labels,
        ds_annotations={"openshift.io/scc": names.name},
        pod_annotations=merge_maps(
            spec.annotations, {"kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"}
        ),
        probe_configmap=f"{names.name}-startup-probe",
        probe_script=PROBE_SCRIPT,
        containers=tuple(containers),
        init_containers=(_manager_container(spec, extra, digest),),
        volumes=tuple(
            [
                *_volumes(spec, host_manager, f"{names.name}-startup-probe"),
                *config_volumes,
                *extra.volumes,
            ]
        ),
        pod_spec=pod_spec,
        openshift=extra.openshift,
    )


def render_driver(
    spec: NVIDIADriverSpec, pool: Pool, names: DriverNames, extra: ExtraConfig
) -> list[dict[str, Any]]:
    """The objects of one pool's driver: ServiceAccount, RBAC, probe ConfigMap, DaemonSet."""
    values = driver_values(spec, pool, names, extra)
    objects: list[dict[str, Any]] = []
    for name in templates(TEMPLATE_FOLDER):
        objects.extend(render_template(name, {"v": values}))
    return objects


__all__ = [
    "GPU_PRESENT",
    "POOL_LABEL",
    "DriverNames",
    "DriverValues",
    "ExtraConfig",
    "Pool",
    "driver_image",
    "driver_names",
    "render_driver",
    "string_hash",
]
