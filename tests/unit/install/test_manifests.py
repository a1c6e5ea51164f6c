"""The kubectl install: what each object says, and that Kubernetes would accept it."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_operator.cli import build_parser
from gpu_operator.controller.runner import IMAGE_ENV_NAMES
from gpu_operator.install import helm, manifests, rbac
from gpu_operator.render.components import REGISTRY
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from tests.paths import CRD_FILE
from tests.schema import validate_kubernetes


def _key(obj: dict[str, Any]) -> str:
    """The kind; CRDs other than the ClusterPolicy's also carry their name."""
    if obj["kind"] == "CustomResourceDefinition" and not obj["metadata"]["name"].startswith(
        "clusterpolicies."
    ):
        return f"CustomResourceDefinition/{obj['metadata']['name']}"
    return str(obj["kind"])


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [_key(o) for o in objects]
    assert len(kinds) == len(set(kinds)), kinds
    return {_key(o): o for o in objects}


def container(spec: dict[str, Any]) -> dict[str, Any]:
    (only,) = spec["template"]["spec"]["containers"]
    return only


def env_values(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_every_object_validates_against_kubernetes_1_34() -> None:
    for obj in manifests.deploy_objects():
        assert validate_kubernetes(obj), f"no schema for {obj['kind']}"


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    deployment = manifests.deployment()
    container(deployment["spec"])["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes(deployment)


def test_objects_come_in_creation_order() -> None:
    kinds = [o["kind"] for o in manifests.deploy_objects()]
    assert kinds[:2] == ["Namespace", "CustomResourceDefinition"]
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")
    assert kinds.index("ClusterRoleBinding") < kinds.index("Deployment")


def test_crd_is_the_committed_one() -> None:
    crds = [o for o in manifests.deploy_objects() if o["kind"] == "CustomResourceDefinition"]
    committed = [
        CRD_FILE.with_name(f)
        for f in ("clusterpolicy.yaml", "gpucluster.yaml", "nvidiadriver.yaml")
    ]
    assert crds == [yaml.safe_load(path.read_text()) for path in committed]


def test_namespace_allows_privileged_operands() -> None:
    labels = manifests.namespace_object()["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_rbac_is_rbac_py_bound_to_the_service_account() -> None:
    objects = by_kind(manifests.deploy_objects("gpu-ops"))
    assert objects["ClusterRole"]["rules"] == [
        r.to_k8s() for r in (*rbac.CLUSTER_RULES, *rbac.DRA_CLUSTER_RULES)
    ]
    assert objects["Role"]["rules"] == [
        r.to_k8s() for r in (*rbac.NAMESPACE_RULES, *rbac.DRA_NAMESPACE_RULES)
    ]
    assert objects["Role"]["metadata"]["namespace"] == "gpu-ops"
    account = objects["ServiceAccount"]["metadata"]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = objects[kind]
        role = objects[kind.removesuffix("Binding")]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": "gpu-ops"}
        ]


def test_namespaced_objects_follow_the_namespace_argument() -> None:
    for obj in manifests.deploy_objects("gpu-ops"):
        if obj["kind"] in {"Namespace", "CustomResourceDefinition"} or obj["kind"].startswith(
            "Cluster"
        ):
            assert "namespace" not in obj["metadata"], obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == "gpu-ops", obj["kind"]
    assert manifests.namespace_object("gpu-ops")["metadata"]["name"] == "gpu-ops"


def test_no_install_object_is_marked_as_an_operand() -> None:
    """The operator prunes what it labels managed-by=gpu-operator: never its own install."""
    for obj in manifests.deploy_objects():
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") != "gpu-operator", obj["kind"]


def test_operator_env_has_namespace_image_and_every_operand_fallback() -> None:
    env = env_values(container(manifests.deployment_spec("reg.example/op:v9")))
    assert env["OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["OPERATOR_IMAGE"] == "reg.example/op:v9"
    assert set(IMAGE_ENV_NAMES) <= set(env), "an env var the operator reads is not set"
    # (the sandbox operands' images come from their sections or the built-in defaults)
    assert {c.image_env for c in REGISTRY if not c.sandbox} <= set(env)
    assert not {c.image_env for c in REGISTRY if c.sandbox} & set(env)
    assert env["DRIVER_IMAGE"] == "nvcr.io/nvidia/driver:580.95.05"
    assert env["DEVICE_PLUGIN_IMAGE"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
    assert env["DRIVER_MANAGER_IMAGE"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.8.1"
    for comp in REGISTRY:
        if comp.default_image is None:  # agents run the operator's own build
            assert env[comp.image_env] == "reg.example/op:v9", comp.name


def test_container_runs_the_operator_with_ports_the_cli_defaults_to() -> None:
    c = container(manifests.deployment_spec())
    assert c["image"] == DEFAULT_OPERATOR_IMAGE
    assert "command" not in c  # the image entrypoint is gpu-operator
    args = build_parser().parse_args(c["args"])
    assert args.command == "run"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": args.health_port, "metrics": args.metrics_port}
    assert ports == {"health": 8080, "metrics": 8081}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_two_replicas_one_standby_on_another_node() -> None:
    """A standby answers /healthz (it is Ready), so the rollout can surge without a gap."""
    spec = manifests.deployment_spec()
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"] == labels
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": labels},
        "topologyKey": "kubernetes.io/hostname",
    }


def test_locked_down_pod() -> None:
    spec = manifests.deployment_spec()
    c = container(spec)
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert {"mountPath": "/tmp", "name": "tmp"} in c["volumeMounts"]
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    assert set(c["resources"]) == {"requests", "limits"}


def test_replicas_prefer_cpu_nodes_and_may_run_on_tainted_gpu_nodes() -> None:
    """On a cluster of GPU nodes only, each tainted by the operator, a new replica must start."""
    pod = manifests.deployment_spec()["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    (prefer,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefer["preference"]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
    ]
    assert "podAntiAffinity" in pod["affinity"]
    (hook,) = [o for o in helm.uninstall_hook_objects(delete_crd=True) if o["kind"] == "Pod"]
    assert hook["spec"]["tolerations"] == pod["tolerations"]


def test_disruption_budget_keeps_one_replica_through_a_drain() -> None:
    objects = by_kind(manifests.deploy_objects())
    pdb, deployment = objects["PodDisruptionBudget"], objects["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]


def test_metrics_service_selects_the_operator_pod_on_the_metrics_port() -> None:
    objects = by_kind(manifests.deploy_objects())
    service = objects["Service"]
    assert service["metadata"]["name"] == "gpu-operator-metrics"
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8081
    assert port["targetPort"] in {
        p["name"] for p in container(objects["Deployment"]["spec"])["ports"]
    }


def test_deploy_files_hold_each_object_once_in_file_order() -> None:
    files = manifests.deploy_files()
    assert list(files) == sorted(files)
    docs = [d for text in files.values() for d in yaml.safe_load_all(text)]
    assert docs == manifests.deploy_objects()
    for text in files.values():
        assert text.startswith("# Generated by `gpu-operator deploy")
