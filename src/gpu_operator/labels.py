"""Label, annotation and resource names shared across the project, each defined once.

The ``nvidia.com/`` names are NVIDIA's (reference/gpu-facts.md): users swap images and copy
manifests between stacks, so their spelling is part of the interface. The operator's own
bookkeeping keys say ``gpu-operator`` in their name.
"""

from __future__ import annotations

# -- objects the operator owns
MANAGED_BY = "app.kubernetes.io/managed-by"
PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
OPERATOR_NAME = "gpu-operator"
MANAGED_SELECTOR = f"{MANAGED_BY}={OPERATOR_NAME}"
OPERATOR_LABELS = {MANAGED_BY: OPERATOR_NAME, PART_OF: OPERATOR_NAME}  # on all it renders
APPLIED_HASH = "nvidia.com/gpu-operator.applied-hash"  # what the operator last applied
CONFIG_HASH = "nvidia.com/config-hash"  # on pod templates: the ConfigMaps they mount
REVISION_HASH = "controller-revision-hash"  # set by the DaemonSet controller

# -- GPU nodes
GPU_PRESENT = "nvidia.com/gpu.present"
DRIVER_POOL = "nvidia.com/gpu.driver-pool"  # the NVIDIADriver whose driver the node runs
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DEPLOY_OPERANDS = DEPLOY_PREFIX + "operands"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_CONFIG = "nvidia.com/mig.config"
WORKLOAD_CONFIG = "nvidia.com/gpu.workload.config"  # container|vm-passthrough|vm-vgpu
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
DEVICE_PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
OWNED_ANNOTATION = "nvidia.com/gpu-operator.owned"  # what the operator added to the node
# A node moving between workload stacks: where the move is (JSON, see node_labels.Move).
WORKLOAD_MOVE = "nvidia.com/gpu-operator.workload-move"
# The operator's finalizers: on a ClusterPolicy until the nodes are clean, on the GPUCluster
# until its DRA stack is torn down in order.
NODE_CLEANUP_FINALIZER = "nvidia.com/gpu-operator-node-cleanup"
DRA_TEARDOWN_FINALIZER = "nvidia.com/gpu-operator-dra-teardown"
# -- ComputeDomains (NVIDIA's DRA driver names): on a domain's DaemonSet, its daemon pods, its
# claim templates and the nodes its workloads run on (value: the domain's uid), the clique a
# daemon pod joined, which of a domain's two templates a template is (Daemon or Workload), and the
# NVLink clique a node's GPUs belong to (GPU feature discovery's label)
COMPUTE_DOMAIN = "resource.nvidia.com/computeDomain"
COMPUTE_DOMAIN_CLIQUE = "resource.nvidia.com/computeDomain.cliqueID"
COMPUTE_DOMAIN_TARGET = "resource.nvidia.com/computeDomainTarget"
GPU_CLIQUE = "nvidia.com/gpu.clique"
NFD_PREFIX = "feature.node.kubernetes.io/"
NFD_GPU_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
OS_ID = "feature.node.kubernetes.io/system-os_release.ID"
OS_VERSION = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"

# -- extended resources
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

# -- simulated nodes: kwok plays the kubelet of the Nodes annotated so
KWOK_NODE = "kwok.x-k8s.io/node"
KWOK_NODE_FAKE = "fake"

# -- driver upgrades (NVIDIA's names, then ours for what must survive a restart)
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SKIP = "nvidia.com/gpu-driver-upgrade.skip"
UPGRADE_DRAIN_SKIP = "nvidia.com/gpu-driver-upgrade-drain.skip"
UPGRADE_REQUESTED = "nvidia.com/gpu-driver-upgrade-requested"
UPGRADE_SINCE = "nvidia.com/gpu-driver-upgrade-state.since"
UPGRADE_WAS_CORDONED = "nvidia.com/gpu-driver-upgrade.was-cordoned"
# On a ClusterPolicy or NVIDIADriver: try a rollout held after a failed canary again.
UPGRADE_RETRY = "nvidia.com/gpu-driver-upgrade.retry"
# On a failed node: the driver template it failed to reach (a newer one is a new try).
UPGRADE_FAILED_TEMPLATE = "nvidia.com/gpu-driver-upgrade.failed-template"
VALIDATOR_APP = "nvidia-operator-validator"

# -- GPU health (this project's): the node condition the device-plugin agent publishes (anyone
# may), the quarantine taint, and the remediation's bookkeeping on the node
GPU_HEALTHY_CONDITION = "GPUHealthy"
UNHEALTHY_TAINT = "nvidia.com/gpu.unhealthy"
HEALTH_STATE = "nvidia.com/gpu-health.state"  # label: where the node is in its remediation
HEALTH_SINCE = "nvidia.com/gpu-health.state.since"  # epoch seconds the state was entered
HEALTH_WAS_CORDONED = "nvidia.com/gpu-health.was-cordoned"  # before the quarantine
HEALTH_TAINTED = "nvidia.com/gpu-health.tainted"  # "true": the quarantine taint is ours
HEALTH_ACTION = "nvidia.com/gpu-health.action"  # index of the remediation action under way
HEALTH_REASON = "nvidia.com/gpu-health.reason"  # why the node was quarantined
# The operator asks the node's device-plugin agent to reset its unhealthy GPUs (value: the
# request's epoch seconds); the agent answers with "<that value>:<outcome>".
HEALTH_RESET_REQUESTED = "nvidia.com/gpu-health.reset-requested"
HEALTH_RESET_DONE = "nvidia.com/gpu-health.reset-done"
HEALTH_EXTERNAL_LABEL = "nvidia.com/gpu-health.remediation"  # default; value "requested"
# Device-plugin agent settings rendered from spec.healthRemediation
HEALTH_ENV_CONDITION = "GPU_HEALTH_CONDITION"  # "true": publish GPUHealthy
HEALTH_ENV_XIDS = "GPU_HEALTH_XIDS"  # comma-separated XIDs counted beyond NVIDIA's
HEALTH_ENV_IGNORED_XIDS = "GPU_HEALTH_IGNORED_XIDS"
HEALTH_ENV_THERMAL = "GPU_HEALTH_THERMAL"  # "true"/"false"
HEALTH_ENV_POWER = "GPU_HEALTH_POWER"
HEALTH_ENV_DEBOUNCE = "GPU_HEALTH_DEBOUNCE"  # a duration, "30s"
HEALTH_ENV_QUIET_PERIOD = "GPU_HEALTH_QUIET_PERIOD"  # a duration, "2m"

# -- the MIG manager's bookkeeping on the node
MIG_PAUSED_LABELS = "nvidia.com/mig-manager.paused-labels"
MIG_FAILED_CONFIG = "nvidia.com/mig-manager.failed-config"
MIG_STATE_REASON = "nvidia.com/mig.config.state.reason"

# Annotations other parts of the GPU stack write on nodes: meaningless once it is uninstalled.
STACK_ANNOTATIONS = frozenset(
    {
        UPGRADE_SINCE,
        UPGRADE_WAS_CORDONED,
        MIG_PAUSED_LABELS,
        MIG_FAILED_CONFIG,
        MIG_STATE_REASON,
        HEALTH_RESET_DONE,
        UPGRADE_FAILED_TEMPLATE,
        WORKLOAD_MOVE,
    }
)


def is_true(value: str | None) -> bool:
    """Label and annotation booleans, as people write them (``true``, ``True``, `` true``)."""
    return (value or "").strip().lower() == "true"


# -- simulated GPUs on the testenv's real nodes: where the harness, the SIMULATED driver stand-in
# and the node's `nvidia` runtime stand-in meet (paths on the node, never used on real clusters)
SIMULATED_GPUS_ANNOTATION = "gpu-operator.testenv/simulated-gpus"
SIMULATED_GPUS_DIR = "/run/gpu-operator-sim"  # the node's GPUs in <dir>/profile (`a100-40gb:8`)
SIMULATED_GPUS_PROFILE = "profile"
SIMULATED_NVML_STATE = "nvml-state.json"  # MIG state the node's agents share, in the same dir
# What the SIMULATED driver leaves in the driver root (as the real one leaves libnvidia-ml): the
# environment that gives a container the node's simulated NVML.
SIMULATED_DRIVER_ROOT = "/run/nvidia/driver"
SIMULATED_HOST_DRIVER_ROOT = "/var/lib/testenv-host-driver"  # a "preinstalled" one, GKE-like
# The node's simulated PCI bus (sys/bus/pci, sys/kernel/iommu_groups, dev/vfio), which the
# harness lays out with that driver: what the passthrough stand-ins and plugins act on.
SIMULATED_PCI_ROOT = SIMULATED_HOST_DRIVER_ROOT
SIMULATED_NVML_DESCRIPTOR = "gpu-operator-simulated-nvml.env"
