"""The objects that install the operator, from one source for deploy/ and the OLM bundle.

``deploy_objects`` is the whole ``kubectl apply -f deploy/`` install; the bundle takes its
Deployment spec, Service and RBAC rules from here too, so the two installs cannot disagree.
Everything is a pure function returning plain dicts; the CLI writes the files.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from gpu_operator.api.crd import all_crds
from gpu_operator.api.spec import GpuNodeTaint
from gpu_operator.install import rbac
from gpu_operator.labels import GPU_PRESENT
from gpu_operator.render.components import REGISTRY, default_image
from gpu_operator.render.driver import DEFAULT_MANAGER
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE

# The oldest Kubernetes release claimed (README, "Kubernetes releases"); testenv's OLDEST is
# the patch release of it that CI runs. The chart's kubeVersion and the bundle's minKubeVersion.
MIN_KUBE_VERSION = "1.33.0"
NAME = "gpu-operator"
NAMESPACE = "gpu-operator"
METRICS_SERVICE = "gpu-operator-metrics"
HEALTH_PORT = 8080
METRICS_PORT = 8081
PROJECT_URL = "https://github.com/gpu-operator/gpu-operator"

# NVIDIA's operator reads DRIVER_MANAGER_IMAGE; no component here runs it yet, but the env is
# kept so a Deployment copied between the two stacks behaves the same.
DRIVER_MANAGER_IMAGE = DEFAULT_MANAGER.reference  # the driver pods' init container

# Only the labels rbac.py already puts on its objects, plus the component: never
# app.kubernetes.io/managed-by=gpu-operator, which marks the operator's own operands.
LABELS = {"app.kubernetes.io/name": NAME}
SELECTOR = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "operator"}


def image_env(image: str = DEFAULT_OPERATOR_IMAGE) -> dict[str, str]:
    """Every ``*_IMAGE`` fallback the operator reads, in registry order, resolved to defaults.

    Components that run the project's own image (the agents) fall back to ``image`` itself, so
    the operator and its agents are always the same build. The sandbox operands' images have
    no fallback here: nothing pulls them unless a policy enables sandbox workloads.
    """
    env = {"OPERATOR_IMAGE": image}
    for comp in REGISTRY:
        if comp.sandbox:
            continue  # NVIDIA's images, named by the ClusterPolicy or the built-in defaults
        env[comp.image_env] = default_image(comp, image).reference
    env["DRIVER_MANAGER_IMAGE"] = DRIVER_MANAGER_IMAGE
    return env


def namespace_object(namespace: str = NAMESPACE) -> dict[str, Any]:
    """The operand DaemonSets are privileged with hostPath mounts; Pod Security must allow it.
    The DRA exporter and validator claim their node's GPUs with admin access, which the API
    server allows only in namespaces labelled for it."""
    security = {
        f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")
    }
    security["resource.kubernetes.io/admin-access"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {**LABELS, **security}},
    }


def service_account(namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(LABELS)},
    }


def binding(
    kind: str, namespace: str, name: str = NAME, labels: dict[str, str] = LABELS
) -> dict[str, Any]:
    """A (Cluster)RoleBinding of the ServiceAccount ``name`` to the (Cluster)Role ``name``."""
    role_kind = kind.removesuffix("Binding")
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if kind == "RoleBinding":
        metadata["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


def rbac_objects(namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """ServiceAccount plus rbac.py's ClusterRole and Role, each bound to it."""
    return [
        service_account(namespace),
        rbac.cluster_role(NAME),
        binding("ClusterRoleBinding", namespace),
        rbac.role(namespace, NAME),
        binding("RoleBinding", namespace),
    ]


# The operator's pod and container run like this; so do the Helm chart's hook pods.
POD_SECURITY: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# ...and may run on the GPU nodes the operator taints: where every schedulable node is a GPU
# node, a rolled or rescheduled replica, or the uninstall hook, would otherwise never start.
# The replicas still prefer nodes without GPUs, which is where they run when there are some.
TOLERATIONS: list[dict[str, Any]] = [{"key": GpuNodeTaint().key, "operator": "Exists"}]
OFF_GPU_NODES = {
    "weight": 50,
    "preference": {"matchExpressions": [{"key": GPU_PRESENT, "operator": "DoesNotExist"}]},
}


def _probe(failure_threshold: int, period: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failure_threshold,
    }


def deployment_spec(image: str = DEFAULT_OPERATOR_IMAGE) -> dict[str, Any]:
    """The operator's DeploymentSpec, shared verbatim by deploy/ and the CSV.

    Two replicas: one holds the Lease and acts, the other is a warm standby that takes over
    when the Lease is released (SIGTERM, at once) or expires (a lost node, --lease-duration).
    Both answer /healthz from the start, saying which role they have, so the standby is Ready
    and a rolling update can surge. The replicas prefer different nodes, so losing one node
    does not take both.
    """
    own_namespace = {"fieldRef": {"fieldPath": "metadata.namespace"}}
    env: list[dict[str, Any]] = [
        {"name": "OPERATOR_NAMESPACE", "valueFrom": own_namespace},
        *({"name": k, "value": v} for k, v in image_env(image).items()),
        {"name": "LOG_LEVEL", "value": "INFO"},
    ]
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["run"],  # the image entrypoint is gpu-operator; --lease-duration 30
        "env": env,
        "ports": [
            {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": _probe(failure_threshold=12, period=5),
        "livenessProbe": _probe(failure_threshold=3, period=20),
        "readinessProbe": _probe(failure_threshold=3, period=10),
        "resources": {
            "requests": {"cpu": "100m", "memory": "192Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "replicas": 2,
        "revisionHistoryLimit": 5,
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "selector": {"matchLabels": dict(SELECTOR)},
        "template": {
            "metadata": {"labels": dict(SELECTOR)},
            "spec": {
                "serviceAccountName": NAME,
                "terminationGracePeriodSeconds": 30,
                "enableServiceLinks": False,
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            copy.deepcopy(OFF_GPU_NODES)
                        ]
                    },
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "labelSelector": {"matchLabels": dict(SELECTOR)},
                                    "topologyKey": "kubernetes.io/hostname",
                                },
                            }
                        ]
                    },
                },
                "securityContext": copy.deepcopy(POD_SECURITY),
                "tolerations": copy.deepcopy(TOLERATIONS),
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            },
        },
    }


def deployment(namespace: str = NAMESPACE, image: str = DEFAULT_OPERATOR_IMAGE) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(SELECTOR)},
        "spec": deployment_spec(image),
    }


def _selector_metadata(name: str, namespace: str | None) -> dict[str, Any]:
    """Metadata of an object beside the Deployment; ``None`` leaves the namespace to OLM."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(SELECTOR)
    return metadata


def metrics_service(namespace: str | None = NAMESPACE) -> dict[str, Any]:
    """Prometheus scrapes the operator here."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _selector_metadata(METRICS_SERVICE, namespace),
        "spec": {
            "selector": dict(SELECTOR),
            "ports": [
                {
                    "name": "metrics",
                    "port": METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                }
            ],
        },
    }


def disruption_budget(namespace: str | None = NAMESPACE) -> dict[str, Any]:
    """A node drain may take one of the two replicas at a time, never both."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _selector_metadata(NAME, namespace),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(SELECTOR)}},
    }


def deploy_objects(
    namespace: str = NAMESPACE, image: str = DEFAULT_OPERATOR_IMAGE
) -> list[dict[str, Any]]:
    """Everything ``kubectl apply -f deploy/`` creates, in the order it must be created."""
    return [
        namespace_object(namespace),
        *all_crds(),
        *rbac_objects(namespace),
        deployment(namespace, image),
        disruption_budget(namespace),
        metrics_service(namespace),
    ]


# deploy/ file -> kinds it holds; kubectl applies a directory in file-name order.
DEPLOY_FILES: dict[str, tuple[str, ...]] = {
    "00-namespace.yaml": ("Namespace",),
    "01-crd.yaml": ("CustomResourceDefinition",),
    "02-rbac.yaml": ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    "03-operator.yaml": ("Deployment", "PodDisruptionBudget", "Service"),
}


def _literal_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (CSV description, alm-examples) as readable literal blocks."""


_Dumper.add_representer(str, _literal_str)


def to_yaml(docs: list[dict[str, Any]], header: str = "") -> str:
    """Multi-document YAML, keys in build order, like ``gpu-operator crd``; ``header`` on top."""
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return comment + body


def generated_header(command: str) -> str:
    return f"Generated by `{command}` from src/gpu_operator/install/.\nDo not edit: regenerate."


def deploy_files(namespace: str = NAMESPACE, image: str = DEFAULT_OPERATOR_IMAGE) -> dict[str, str]:
    """deploy/'s numbered files and their text, each object in exactly one file."""
    objects = deploy_objects(namespace, image)
    header = generated_header("gpu-operator deploy --output-dir deploy/")
    files = {}
    for filename, kinds in DEPLOY_FILES.items():
        docs = [obj for obj in objects if obj["kind"] in kinds]
        files[filename] = to_yaml(docs, header)
    placed = sum(len([o for o in objects if o["kind"] in k]) for k in DEPLOY_FILES.values())
    assert placed == len(objects), "an object kind has no deploy/ file"
    return files
