"""The Kubernetes kinds the project reads or writes, in one table: where each lives in the REST
tree and whether it is namespaced. The API door, the renderer and the controller's watches all
select from it by kind name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def collection(self, namespace: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{base}/{self.plural}"

    def item(self, name: str, namespace: str | None = None) -> str:
        return f"{self.collection(namespace)}/{quote(name, safe='')}"


KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (
        Kind("v1", "Namespace", "namespaces", False),
        Kind("v1", "Node", "nodes", False),
        Kind("v1", "Pod", "pods", True),
        Kind("v1", "ConfigMap", "configmaps", True),
        Kind("v1", "Secret", "secrets", True),
        Kind("v1", "Service", "services", True),
        Kind("v1", "ServiceAccount", "serviceaccounts", True),
        Kind("v1", "Event", "events", True),
        Kind("apps/v1", "DaemonSet", "daemonsets", True),
        Kind("apps/v1", "Deployment", "deployments", True),
        Kind("apps/v1", "ControllerRevision", "controllerrevisions", True),
        Kind("rbac.authorization.k8s.io/v1", "Role", "roles", True),
        Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
        Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
        Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
        Kind("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False),
        Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
        Kind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", True),
        Kind("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False),
        Kind("nvidia.com/v1alpha1", "GPUCluster", "gpuclusters", False),
        Kind("resource.k8s.io/v1", "ResourceSlice", "resourceslices", False),
        Kind("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
        Kind("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", True),
        Kind("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
        Kind("nvidia.com/v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
        Kind("resource.nvidia.com/v1beta1", "ComputeDomain", "computedomains", True),
        Kind(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            False,
        ),
        Kind("coordination.k8s.io/v1", "Lease", "leases", True),
        Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
        Kind(
            "admissionregistration.k8s.io/v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            False,
        ),
        Kind(
            "admissionregistration.k8s.io/v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            False,
        ),
    )
}

CLUSTER_SCOPED = frozenset(k.kind for k in KINDS.values() if not k.namespaced)


def kind_of(obj: Mapping[str, Any]) -> Kind:
    return KINDS[obj["kind"]]
