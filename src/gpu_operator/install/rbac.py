"""The operator's permissions, one rule per thing it does, each with the reason it exists.

The e2e suite removes each rule in turn and shows some step of the operator then fails, so a
rule here is never decoration. No wildcards; no cluster-wide Secrets; writes only where the
operator writes. Operand ClusterRoles and Roles grant subsets of these (Kubernetes refuses to
let the operator grant what it does not hold itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_operator.labels import OPERATOR_NAME

READ = ("get", "list", "watch")
MANAGE = ("get", "list", "watch", "create", "patch", "delete")


@dataclass(frozen=True)
class Rule:
    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    resource_names: tuple[str, ...] = ()
    # Operand ClusterRoles the operator writes that grant this rule (it holds the rule so that
    # Kubernetes lets it grant it): without it, writing those is what is refused.
    delegated_to: tuple[str, ...] = ()

    def to_k8s(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "apiGroups": [self.api_group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            rule["resourceNames"] = list(self.resource_names)
        return rule


CRD = "clusterpolicies.nvidia.com"
GPUCLUSTER_CRD = "gpuclusters.nvidia.com"
NVIDIADRIVER_CRD = "nvidiadrivers.nvidia.com"
COMPUTEDOMAIN_CRD = "computedomains.resource.nvidia.com"
SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"

# Shared by the operator (it installs its CRD at start-up) and the Helm chart's CRD hook.
CRD_RULES: tuple[Rule, ...] = (
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("get",),
        "see whether its CRDs are current",
    ),
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("create", "patch"),
        "install or upgrade its own CRDs at start-up, and NVIDIA's ComputeDomain CRD with a "
        "GPUCluster that enables computeDomains",
        (CRD, GPUCLUSTER_CRD, NVIDIADRIVER_CRD, COMPUTEDOMAIN_CRD),
    ),
)

CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(
        "nvidia.com",
        ("clusterpolicies",),
        ("get", "list", "watch", "patch"),
        "watch policies; add and remove the node-cleanup finalizer",
    ),
    Rule("nvidia.com", ("clusterpolicies/status",), ("patch",), "write status"),
    Rule(
        "nvidia.com",
        ("nvidiadrivers",),
        ("get", "list", "watch", "create"),
        "per-pool drivers; create the default NVIDIADriver when the ClusterPolicy asks for it",
    ),
    Rule("nvidia.com", ("nvidiadrivers/status",), ("patch",), "write NVIDIADriver status"),
    *CRD_RULES,
    Rule(
        "apiextensions.k8s.io",
        ("customresourcedefinitions",),
        ("list", "watch"),
        "learn at once when an optional kind's CRD is installed (the Prometheus operator's "
        "ServiceMonitor), by name, instead of looking for the kind now and then",
        (SERVICEMONITOR_CRD, GPUCLUSTER_CRD),
    ),
    Rule(
        "",
        ("nodes",),
        ("get", "list", "watch", "patch"),
        "find GPU nodes; labels, taint, cordon for upgrades and GPU health quarantines "
        "(operands get a subset)",
    ),
    Rule(
        "",
        ("nodes/status",),
        ("patch",),
        "granted to the device-plugin agent, which publishes the GPUHealthy condition "
        "(RBAC lets the operator grant only what it holds)",
        delegated_to=("nvidia-device-plugin",),
    ),
    Rule(
        "",
        ("pods",),
        READ,
        "operand readiness; GPU workload pods on a node being upgraded (watch: granted to the "
        "exporter, which copies pod labels onto metrics)",
    ),
    Rule(
        "",
        ("pods",),
        ("delete",),
        "replace the old driver pod; podDeletion/drain force after the timeout",
    ),
    Rule(
        "",
        ("pods/eviction",),
        ("create",),
        "evict GPU workloads through the Eviction API so PodDisruptionBudgets apply",
    ),
    Rule(
        "",
        ("events",),
        ("create",),
        "Events about ClusterPolicies and Nodes (cluster-scoped: they live in default)",
    ),
    Rule(
        "rbac.authorization.k8s.io",
        ("clusterroles", "clusterrolebindings"),
        MANAGE,
        "node access for the operands that label or read their Node",
    ),
    Rule(
        "node.k8s.io",
        ("runtimeclasses",),
        MANAGE,
        "the nvidia RuntimeClass, and the Kata manager's runtime classes",
    ),
)

NAMESPACE_RULES: tuple[Rule, ...] = (
    Rule("apps", ("daemonsets",), MANAGE, "the operand DaemonSets"),
    Rule("apps", ("controllerrevisions",), READ, "driver pod revisions for upgrades"),
    Rule("", ("configmaps",), MANAGE,
         "operand configs; user ConfigMaps are read to roll pods when they change"),
    Rule("", ("services", "serviceaccounts"), MANAGE, "operand Services and identities"),
    Rule("rbac.authorization.k8s.io", ("roles", "rolebindings"), MANAGE,
         "namespaced operand permissions"),
    Rule("coordination.k8s.io", ("leases",), ("get", "create", "patch"),
         "leader election, so two replicas never both act"),
    Rule("monitoring.coreos.com", ("servicemonitors",),
         ("list", "watch", "create", "patch", "delete"),
         "the exporter's ServiceMonitor when Prometheus operator is installed"),
)  # fmt: skip


# The GPUCluster (DRA) loop's rules. Kept apart so the ClusterPolicy-only least-privilege e2e
# (each rule of CLUSTER_RULES removed in turn) runs unchanged; the operator treats a refused
# GPUCluster list as "no GPUCluster".
DRA_CLUSTER_RULES: tuple[Rule, ...] = (
    Rule("nvidia.com", ("gpuclusters",), ("get", "list", "watch", "patch"),
         "watch the GPUCluster; its teardown finalizer"),
    Rule("nvidia.com", ("gpuclusters/status",), ("patch",), "write the GPUCluster status"),
    Rule("resource.k8s.io", ("deviceclasses",), MANAGE, "DeviceClasses gpu/mig.nvidia.com"),
    Rule("admissionregistration.k8s.io",
         ("validatingadmissionpolicies", "validatingadmissionpolicybindings"), MANAGE,
         "the policies that check GPU claim configs at admission"),
    Rule("resource.k8s.io", ("resourceclaims",), ("get", "list"),
         "granted to the DRA plugin (the claim it prepares) and the driver manager (claims on "
         "the node it empties)"),
    Rule("resource.k8s.io", ("resourceslices",),
         ("get", "list", "watch", "create", "patch", "delete"),
         "granted to the DRA plugin (publish its node's pool)"),
    Rule("resource.nvidia.com", ("computedomains",), ("get", "list", "watch", "patch"),
         "granted to the ComputeDomain controller (its finalizer), plugin and daemons (read)"),
    Rule("resource.nvidia.com", ("computedomains/status",), ("patch",),
         "granted to the ComputeDomain controller (a domain's status)"),
    Rule("resource.k8s.io", ("resourceclaimtemplates",), MANAGE,
         "granted to the ComputeDomain controller (each domain's channel template, in the "
         "domain's namespace)"),
    Rule("resource.k8s.io", ("resourceclaims",), ("watch",),
         "granted to the ComputeDomain controller (who holds a domain's channels)"),
)  # fmt: skip
DRA_NAMESPACE_RULES: tuple[Rule, ...] = (
    Rule("resource.k8s.io", ("resourceclaimtemplates",), MANAGE,
         "admin-access claims of the DRA validator and exporter"),
    Rule("apps", ("deployments",), ("get", "list", "create", "patch", "delete"),
         "the ComputeDomain controller's Deployment; granted to the DRA plugin: one MPS "
         "control daemon per claim that shares with MPS"),
)  # fmt: skip


def cluster_role(
    name: str = "gpu-operator", rules: tuple[Rule, ...] = CLUSTER_RULES + DRA_CLUSTER_RULES
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpu-operator"}},
        "rules": [r.to_k8s() for r in rules],
    }


def role(
    namespace: str,
    name: str = "gpu-operator",
    rules: tuple[Rule, ...] = NAMESPACE_RULES + DRA_NAMESPACE_RULES,
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpu-operator"},
        },
        "rules": [r.to_k8s() for r in rules],
    }


# The Helm chart's pre-delete hook (`gpu-operator uninstall --wait`): delete every resource of
# the operator's kinds while the operator still runs, so its finalizers clean the nodes, wait
# until they are gone (removing those finalizers itself once the operator is gone), and clean
# what is left on the nodes.
UNINSTALL_RULES: tuple[Rule, ...] = (
    Rule(
        "nvidia.com",
        ("clusterpolicies",),
        ("list", "delete", "patch"),
        "delete every ClusterPolicy and wait for the operator's finalizer (remove it when the "
        "operator is gone)",
    ),
    Rule(
        "nvidia.com",
        ("gpuclusters",),
        ("list", "delete", "patch"),
        "delete the GPUCluster and wait for its DRA stack's ordered teardown (remove the "
        "finalizer when the operator is gone)",
    ),
    Rule(
        "nvidia.com",
        ("nvidiadrivers",),
        ("list", "delete"),
        "delete every NVIDIADriver (garbage collection takes its driver DaemonSets)",
    ),
    Rule(
        "",
        ("nodes",),
        ("list", "patch"),
        "take the labels, annotations and taints the operator owns off the nodes it leaves",
    ),
)
UNINSTALL_NAMESPACE_RULES: tuple[Rule, ...] = (
    Rule(
        "apps",
        ("deployments",),
        ("get",),
        "see whether the operator still runs to handle its finalizers",
        (OPERATOR_NAME,),  # the name of its Deployment
    ),
)


def listing(rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """Read-only ``list`` of every resource the operator creates and deletes in ``rules``."""
    return tuple(
        Rule(r.api_group, r.resources, ("list",), f"wait until GC has removed: {r.why}")
        for r in rules
        if {"create", "delete"} <= set(r.verbs) and not r.resource_names
    )


# ... and, with operator.cleanupCRD, the CRD itself once no policy is left and garbage
# collection has removed what the policies owned (with the CRD gone it cannot resolve the owner
# references, and would leave those objects forever): it lists what the operator makes.
# What the operator creates, cluster-wide and in its namespace, read-only: with
# operator.cleanupCRD the uninstall waits until garbage collection has removed it.
CREATED_CLUSTER_RULES = listing(CLUSTER_RULES + DRA_CLUSTER_RULES)
CREATED_NAMESPACE_RULES = listing(NAMESPACE_RULES + DRA_NAMESPACE_RULES)
CRD_DELETE_RULE = Rule(
    "apiextensions.k8s.io",
    ("customresourcedefinitions",),
    ("get", "delete"),
    "remove the operator's CRDs on uninstall (operator.cleanupCRD)",
    (CRD, GPUCLUSTER_CRD, NVIDIADRIVER_CRD),
)
