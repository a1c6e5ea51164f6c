"""The install and its least-privilege RBAC against the real apiserver.

`kubectl apply -f deploy/` works (server-side dry run, then for real); the operator running with
a token of deploy/'s ServiceAccount (not admin) installs its CRD, converges the example policy,
records Events, rolls a driver upgrade and cleans up on deletion, and the apiserver refuses it
nothing. Then every rule is removed in turn, and the apiserver's audit log must show a request
that rule would have allowed answered 403 Forbidden: the RBAC has nothing extra.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import testenv
from gpu_operator.controller.clusterpolicy.status import NOT_SERVED
from gpu_operator.controller.runner import OperatorThread, RunOptions
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.install.rbac import CLUSTER_RULES, NAMESPACE_RULES, Rule, cluster_role, role
from gpu_operator.kube import Kube
from tests import prerequisites
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    audit_refusals,
    policy_api_served,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    still_there,
    wait_for,
)
from tests.paths import REPO

NS = "gpu-operator"
STEP_TIMEOUT = 120.0  # generous: a step ends as soon as it is done (or refused)
GPU_NODE = "gpu-node-0"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SERVICEMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "ServiceMonitor",
            "plural": "servicemonitors",
            "listKind": "ServiceMonitorList",
            "singular": "servicemonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def example_policy(version: str = "580.95.05") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "clusterpolicy.yaml").read_text())
    doc["spec"]["driver"]["version"] = version
    doc["spec"]["driver"]["upgradePolicy"]["podDeletion"] = {"timeoutSeconds": 0}
    doc["spec"]["dcgmExporter"]["serviceMonitor"] = {"enabled": True}
    doc["spec"]["healthRemediation"] = {"enabled": True}  # its agent writes node conditions
    return doc


def kubectl(cluster: testenv.Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def grant(kube: Kube, cluster_rules: tuple[Rule, ...], namespace_rules: tuple[Rule, ...]) -> None:
    """deploy/'s identity and bindings, with the given rules."""
    if kube.get("Namespace", NS) is None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "gpu-operator", "namespace": NS}},
        cluster_role(rules=cluster_rules),
        role(NS, rules=namespace_rules),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "gpu-operator"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "gpu-operator"},
         "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NS}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "gpu-operator", "namespace": NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "gpu-operator"},
         "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NS}]},
    ]  # fmt: skip
    for obj in objects:
        kube.apply(obj)


def allows(rule: Rule, event: Mapping[str, Any]) -> bool:
    """Whether ``rule`` grants the request an audit event records (for a rule the operator
    holds to grant it to an operand: whether the request writes that operand's ClusterRole)."""
    ref = event.get("objectRef") or {}
    if rule.delegated_to and ref.get("resource") == "clusterroles":
        return ref.get("name") in rule.delegated_to and event.get("verb") in ("create", "patch")
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return (
        ref.get("apiGroup", "") == rule.api_group
        and resource in rule.resources
        and event.get("verb") in rule.verbs
        and (not rule.resource_names or ref.get("name") in rule.resource_names)
    )


def exercise(
    cluster: testenv.Cluster, kube: Kube, until: Callable[[], bool] = lambda: False
) -> str | None:
    """Run every step the operator takes, each until it is done or ``until()`` holds; the
    step ``until`` cut short, None when every step was done."""
    config = service_account_config(cluster, NS, "gpu-operator", cluster_role="")
    options = RunOptions(
        config=OperatorConfig(namespace=NS), metrics_port=None, health_endpoint=None,
        renew_seconds=1.0, lease_seconds=4,
    )  # fmt: skip
    operator = OperatorThread(options, config).start(wait=False)

    def step(name: str, done: Callable[[], Any], timeout: float = STEP_TIMEOUT) -> str | None:
        wait_for(f"{name} (or the awaited refusal)", lambda: until() or done(), timeout=timeout)
        if until():
            return name
        assert operator.error is None, f"the operator failed: {operator.error!r}"
        return None

    def crd_served() -> bool | NotYet:
        if not operator.started.is_set():
            return NotYet("the operator not started")
        return policy_api_served(kube)

    def converged() -> dict[str, Any] | NotYet:
        return policy_ready(kube)

    def monitor_note() -> list[dict[str, Any]]:
        status = policy_status(kube, "cluster-policy")
        return [c for c in status.get("conditions") or () if c["type"] == NOT_SERVED]

    def driver_reporting() -> str | NotYet:
        driver = kube.get("NVIDIADriver", "default")
        if driver is None:
            return NotYet("no NVIDIADriver default")
        status = driver.get("status") or {}
        return status.get("state") or NotYet({"status": status})

    def cleaned_up() -> bool | NotYet:
        policy = kube.get("ClusterPolicy", "cluster-policy")
        if policy is not None:
            return still_there(policy)
        labels = (kube.get("Node", GPU_NODE) or {})["metadata"]["labels"]
        present = labels.get("nvidia.com/gpu.present")
        return "nvidia.com/gpu.present" not in labels or NotYet({"nvidia.com/gpu.present": present})

    try:
        failed = step("operator starts and installs its CRD", crd_served)
        if failed:
            return failed
        kube.create(example_policy())
        failed = step("stack converges", converged) or step(
            "the missing ServiceMonitor kind reported", lambda: monitor_note() or NotYet("none")
        )
        if failed:
            return failed
        # The Prometheus operator installed later: the operator learns it from its CRD's watch.
        kube.apply(SERVICEMONITOR_CRD)
        failed = (
            step("ServiceMonitor applied", lambda: kube.get(
                "ServiceMonitor", "nvidia-dcgm-exporter", NS))
            or step("the report cleared", lambda: not monitor_note() or NotYet(monitor_note()))
            or step("Event recorded", lambda: kube.list_objects(
                "Event", "default", field_selector="involvedObject.name=cluster-policy"))
        )  # fmt: skip
        if failed:
            return failed
        kube.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"nodeName": GPU_NODE,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                     "containers": [{"name": "t", "image": "registry.example/t:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        })  # fmt: skip
        kube.merge_patch(
            "ClusterPolicy", "cluster-policy", {"spec": {"driver": {"version": "580.105.08"}}}
        )
        failed = step(
            "driver upgrade completes",
            lambda: (
                (state := (kube.get("Node", GPU_NODE) or {})["metadata"]["labels"].get(STATE))
                == "upgrade-done"
                or NotYet({STATE: state})
            ),
            timeout=STEP_TIMEOUT * 3,
        ) or step(
            "GPU pod evicted",
            lambda: (pod := kube.get("Pod", "train", "default")) is None or still_there(pod),
        )
        if failed:
            return failed
        # NVIDIADriver: the flag makes the operator create `default` and report its status.
        kube.merge_patch(
            "ClusterPolicy", "cluster-policy", {"spec": {"driver": {"useNvidiaDriverCRD": True}}}
        )
        failed = step("default NVIDIADriver created and reporting", driver_reporting)
        if failed:
            return failed
        kube.delete("ClusterPolicy", "cluster-policy")
        return step("deletion cleans nodes and lets go", cleaned_up)
    finally:
        operator.stop()


def test_kubectl_apply_deploy_and_least_privilege_operator(testenv_bin_dir: Path) -> None:
    prerequisites.kubectl()
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        # A server-side dry run needs the namespace to exist for the namespaced objects, so the
        # namespace is dry-run alone first, and the whole directory once it exists.
        deploy = str(REPO / "deploy")
        dry = kubectl(cluster, "apply", "--server-side", "--dry-run=server",
                      "-f", str(REPO / "deploy" / "00-namespace.yaml"))  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert kube.get("Namespace", NS) is None  # a dry run changes nothing
        real = kubectl(cluster, "apply", "--server-side", "-f", deploy)
        assert real.returncode == 0, real.stderr
        again = kubectl(cluster, "apply", "--server-side", "--force-conflicts",
                        "--dry-run=server", "-f", deploy)  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert kube.get("ClusterRole", "gpu-operator") is not None
        # deploy/ holds the CRD; start as if the operator installed it, to exercise that too.
        kube.delete("CustomResourceDefinition", "clusterpolicies.nvidia.com")
        wait_for(
            "CRD gone",
            lambda: (
                (crd := kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com")) is None
                or still_there(crd)
            ),
        )
        assert exercise(cluster, kube) is None
        refused = [(e["verb"], e["objectRef"]) for e in audit_refusals(cluster, OPERATOR_USER)]
        assert refused == []


RULES = [("cluster", i, r) for i, r in enumerate(CLUSTER_RULES)] + [
    ("namespace", i, r) for i, r in enumerate(NAMESPACE_RULES)
]


@pytest.mark.parametrize(
    ("scope", "index", "rule"), RULES,
    ids=[f"{s}-{r.api_group or 'core'}-{'+'.join(r.resources)}-{'+'.join(r.verbs)}"
         for s, _, r in RULES],
)  # fmt: skip
def test_every_rule_is_needed(testenv_bin_dir: Path, scope: str, index: int, rule: Rule) -> None:
    cluster_rules = tuple(
        r for i, r in enumerate(CLUSTER_RULES) if (scope, i) != ("cluster", index)
    )
    namespace_rules = tuple(
        r for i, r in enumerate(NAMESPACE_RULES) if (scope, i) != ("namespace", index)
    )
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        grant(kube, cluster_rules, namespace_rules)

        def refused() -> list[Mapping[str, Any]]:
            return [e for e in audit_refusals(cluster, OPERATOR_USER) if allows(rule, e)]

        # A step waits until it is done or the request the rule grants comes back 403.
        assert exercise(cluster, kube, until=lambda: bool(refused())) is not None, (
            f"nothing was refused without the rule for: {rule.why}"
        )
