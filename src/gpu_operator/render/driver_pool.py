"""One NVIDIADriver's node pools: what a pool is, what its driver DaemonSet is named and which
image it runs (NVIDIA's names and tags), and the cluster facts a driver pod depends on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.base import ImageRef
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec
from gpu_operator.labels import (
    DRIVER_POOL,
    OS_ID,
    OS_VERSION,
)
from gpu_operator.render.images import ImageDefault, is_digest, resolve_image, split_reference

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


def driver_image(spec: NVIDIADriverSpec, pool: Pool, image_env: str | None = None) -> str:
    """The driver image for ``pool``: ``<version>-<os>``, or ``<branch>-<kernel>-<os>`` for a
    precompiled pool; a digest names one exact image and is used as it is."""
    default = DEFAULT_VGPU_MANAGER if spec.driver_type == "vgpu-host-manager" else DEFAULT_DRIVER
    image = resolve_image(image_ref(spec), default, image_env)
    version = split_reference(image).version
    if version is None or is_digest(version):
        return image
    suffix = f"-{pool.kernel}-{pool.os_tag}" if spec.use_precompiled and pool.kernel else ""
    suffix = suffix or f"-{pool.os_tag}"
    return image if version.endswith(suffix) else image + suffix


def image_ref(spec: NVIDIADriverSpec) -> ImageRef:
    return ImageRef(repository=spec.repository, image=spec.image, version=spec.version)


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
    quarantine_taint: bool = False  # GPU health remediation on: its taint is tolerated
