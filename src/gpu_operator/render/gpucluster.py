"""Render a GPUCluster into the objects of the DRA stack, as data (no YAML text).

Shaped after what NVIDIA's operator renders (``golden-gpucluster/``, compared field by field in
``tests/unit/render/test_gpucluster.py``): the DRA kubelet plugin DaemonSet with its identity
and least RBAC, the DeviceClasses, a validator and dcgm-exporter whose pods get every GPU of
their node through admin-access ResourceClaimTemplates instead of the device plugin. Never a
device plugin. Pods run this project's image (``gpu-operator agent dra-plugin``, ``exporter``,
``validate``), as the ClusterPolicy stack's agents do. Deliberate differences from NVIDIA are
listed in that test.
"""

from __future__ import annotations

from typing import Any

from gpu_operator.api import dragates
from gpu_operator.api.base import EnvVar, Resources
from gpu_operator.api.gpucluster import GPUClusterSpec
from gpu_operator.api.spec import DaemonsetsSpec
from gpu_operator.labels import DEPLOY_PREFIX, MANAGED_BY, OPERATOR_NAME
from gpu_operator.render.computedomain import DAEMON_ACCOUNT
from gpu_operator.render.dra import device_classes, domain_device_classes
from gpu_operator.render.dra_admission import config_policies
from gpu_operator.render.facts import Facts

PLUGIN = "nvidia-dra-driver-kubelet-plugin"
CONTROLLER = "nvidia-dra-driver-controller"  # the ComputeDomain controller's Deployment
DAEMON_ROLE = "compute-domain-daemon"
PLUGIN_ACCOUNT = "nvidia-dra-driver-kubeletplugin"
MPS_ROLE = f"{PLUGIN_ACCOUNT}-mps"  # NVIDIA's name
VALIDATOR = "nvidia-dra-validator"
EXPORTER = "nvidia-dcgm-exporter-dra"
EXPORTER_CLAIMS = "nvidia-dcgm-exporter-admin"
VALIDATOR_CLAIMS = "nvidia-dra-validator-gpu"
# Node labels that gate each DaemonSet (the operator's node labeller sets them on GPU nodes).
DEPLOY_LABELS = {
    PLUGIN: DEPLOY_PREFIX + "dra-driver",
    VALIDATOR: DEPLOY_PREFIX + "dra-validator",
    EXPORTER: DEPLOY_PREFIX + "dcgm-exporter-dra",
}
MANAGED = {MANAGED_BY: OPERATOR_NAME}
VALIDATIONS = "/run/nvidia/validations"
DRIVER_ROOT_ANNOTATION = "nvidia.com/gpu-operator.driver-root"
# The DRA init container's own results (its driver-ready file), apart from the ClusterPolicy
# validator's markers in the same directory.
DRIVER_VALIDATIONS = f"{VALIDATIONS}/dra-driver"
# The host's root and a driver container's install dir, as NVIDIA's DRA driver mounts them:
# the install dir writable, as NVIDIA's (the simulated GPUs keep what nvidia-smi sets on them,
# compute mode and time-slice, under the driver root's dev/).
DRIVER_MOUNTS = [
    {"name": "host-root", "mountPath": "/host", "readOnly": True,
     "mountPropagation": "HostToContainer"},
    {"name": "driver-install-dir", "mountPath": "/driver-root",
     "mountPropagation": "HostToContainer"},
]  # fmt: skip
# The kubelet plugin's permissions, each for one thing it does.
PLUGIN_RULES = [
    # read the claim NodePrepareResources names
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    # publish the node's pool (server-side apply is a patch)
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    # the Node's uid, so its slices are garbage-collected with it
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]
# With computeDomains, what the compute-domain plugin beside it does as well: find a claim's
# domain, and label its node for the domain's IMEX daemon (and with its NVLink clique).
DOMAIN_PLUGIN_RULES = [
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
]
DOMAIN_HEALTH_PORT = 51515  # NVIDIA's
# In its own namespace only: one MPS control daemon per claim that shares with MPS, and the
# state of the daemon's pod while Prepare waits for it.
PLUGIN_NAMESPACE_RULES = [
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]

_READ = ["get", "list", "watch"]
_MANAGE = ["get", "list", "watch", "create", "patch", "delete"]
# The ComputeDomain controller's permissions, each for one thing it does.
CONTROLLER_RULES = [
    # watch domains; its finalizer (a merge patch) and status
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"],
     "verbs": [*_READ, "patch"]},
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains/status"],
     "verbs": ["patch"]},
    # each domain's channel template in its namespace (and its daemons' in this one)
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"],
     "verbs": _MANAGE},
    # who holds a domain's channels, so a deleted domain waits for them
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods"], "verbs": _READ},
    # the domain label the kubelet plugin put on a node, taken off with the domain
    {"apiGroups": [""], "resources": ["nodes"], "verbs": [*_READ, "patch"]},
]  # fmt: skip
CONTROLLER_NAMESPACE_RULES = [
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": _MANAGE},  # the IMEX daemons
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "create", "patch"]},  # one acting replica
]  # fmt: skip
# What an IMEX daemon reads: its domain, and the daemon pods of its peers.
DAEMON_RULES = [
    {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
]  # fmt: skip


def _env(items: list[EnvVar] | None) -> list[dict[str, Any]]:
    return [e.to_wire() for e in items or []]


def _resources(res: Resources | None) -> dict[str, Any]:
    return res.to_wire() if res else {}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# With PassthroughSupport, as NVIDIA's kubelet plugin has them: name, host (= container) path,
# how it is mounted.
PASSTHROUGH_MOUNTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("lib-modules", "/lib/modules/", {"mountPropagation": "HostToContainer", "readOnly": True}),
    ("sysfs", "/sys/", {"mountPropagation": "Bidirectional"}),
    ("procfs", "/proc/", {"mountPropagation": "Bidirectional"}),
)


def _host_volume(name: str, path: str, kind: str | None = None) -> dict[str, Any]:
    host: dict[str, Any] = {"path": path}
    if kind:
        host["type"] = kind
    return {"name": name, "hostPath": host}


def _labels(app: str, component: str) -> dict[str, str]:
    return {
        "app": app,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/name": app,
        **MANAGED,
    }


def _daemonset(
    name: str,
    namespace: str,
    daemonsets: DaemonsetsSpec,
    pod_spec: dict[str, Any],
    *,
    max_surge_zero: bool,
) -> dict[str, Any]:
    labels = {**_labels(name, name), **(daemonsets.labels or {})}
    pod: dict[str, Any] = {
        "nodeSelector": {DEPLOY_LABELS[name]: "true"},
        "priorityClassName": daemonsets.priority_class_name or "system-node-critical",
        "tolerations": [t.to_wire() for t in daemonsets.tolerations or []],
        **pod_spec,
    }
    if daemonsets.pod_security_context:
        pod["securityContext"] = daemonsets.pod_security_context.to_wire()
    strategy: dict[str, Any] = {"type": daemonsets.update_strategy or "RollingUpdate"}
    if strategy["type"] == "RollingUpdate":
        rolling = daemonsets.rolling_update
        limit = (rolling.max_unavailable if rolling else None) or "100%"
        # "1" is a count: the API server takes a string only as a percent.
        strategy["rollingUpdate"] = {"maxUnavailable": int(limit) if limit.isdigit() else limit}
        if max_surge_zero:
            # Two plugin pods on one node would fight over the registration socket.
            strategy["rollingUpdate"]["maxSurge"] = 0
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    template_meta: dict[str, Any] = {"labels": labels}
    if daemonsets.annotations:
        template_meta["annotations"] = dict(daemonsets.annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template_meta, "spec": pod},
            "updateStrategy": strategy,
        },
    }


def _account(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED)},
    }


def _admin_claims(name: str, request: str, namespace: str, mode: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "adminAccess": True,
        "allocationMode": mode,
        "deviceClassName": "gpu.nvidia.com",
    }
    if mode == "ExactCount":
        exactly["count"] = 1
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED)},
        "spec": {"spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}}},
    }


def _driver_root(spec: GPUClusterSpec) -> str:
    return spec.host_paths.driver_install_dir or "/run/nvidia/driver"


def _prepared_for(spec: GPUClusterSpec, daemonset: dict[str, Any]) -> dict[str, Any]:
    """A claim holder's pods name the driver root their claims were prepared from: the CDI
    edits of a prepared claim are fixed for the pod's life, so a new root must mean new pods."""
    meta = daemonset["spec"]["template"]["metadata"]
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        DRIVER_ROOT_ANNOTATION: _driver_root(spec),
    }
    return daemonset


def _driver_validation(spec: GPUClusterSpec, facts: Facts, install_dir: str) -> dict[str, Any]:
    """NVIDIA's driver-validation init container: finds whether the node's driver is in the
    host's root or a driver container's install dir, waits for it, and writes the
    driver-ready file the plugin reads (:mod:`gpu_operator.agent.driverready`)."""
    return {
        "name": "driver-validation",
        "image": facts.operator_image,
        "imagePullPolicy": spec.dra_driver.image_pull_policy or "IfNotPresent",
        "args": [
            "agent",
            "validate",
            "--components",
            "driver",
            "--with-wait",
            "--output-dir",
            DRIVER_VALIDATIONS,
        ],
        "env": [
            _field_env("NODE_NAME", "spec.nodeName"),
            {"name": "HOST_ROOT_MOUNT", "value": "/host"},
            {"name": "DRIVER_INSTALL_DIR", "value": install_dir},
            {"name": "DRIVER_INSTALL_DIR_CTR_PATH", "value": "/driver-root"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ],
        "securityContext": {"privileged": True, "runAsUser": 0},
        "volumeMounts": [*DRIVER_MOUNTS, {"name": "validations", "mountPath": VALIDATIONS}],
    }


def _domains_container(
    spec: GPUClusterSpec, facts: Facts, gpus_env: list[dict[str, Any]], mounts: list[Any]
) -> dict[str, Any]:
    """NVIDIA's ``compute-domains`` container: the compute-domain.nvidia.com kubelet plugin
    (``gpu-operator agent compute-domain-plugin``), beside the GPUs' in the same pod as
    NVIDIA's, with the same directories, NVIDIA's gRPC health probes on its health port, and
    ``computeDomains.kubeletPlugin``'s env and resources."""
    domains = spec.dra_driver.compute_domains
    plugin = domains.kubelet_plugin if domains else None
    health = plugin.healthcheck if plugin else None
    port = (health.port if health else None) or DOMAIN_HEALTH_PORT
    shared = ("NODE_NAME", "NAMESPACE", "CDI_ROOT", "KUBELET_REGISTRAR_DIRECTORY_PATH",
              "KUBELET_PLUGINS_DIRECTORY_PATH", "HOST_ROOT", "DRIVER_READY_FILE",
              "NVIDIA_VISIBLE_DEVICES")  # fmt: skip
    env = [e for e in gpus_env if e["name"] in shared]
    env.append({"name": "HEALTHCHECK_PORT", "value": str(port)})
    env += _env(plugin.env if plugin else None)
    container: dict[str, Any] = {
        "name": "compute-domains",
        "image": facts.operator_image,
        "imagePullPolicy": spec.dra_driver.image_pull_policy or "IfNotPresent",
        "args": ["agent", "compute-domain-plugin"],
        "env": env,
        "securityContext": {"privileged": True, "runAsUser": 0},
        "volumeMounts": [dict(m) for m in mounts],
    }
    if health is None or health.enabled is not False:
        probe = {"grpc": {"port": port, "service": "liveness"}, "timeoutSeconds": 10}
        container["startupProbe"] = {**probe, "periodSeconds": 1, "failureThreshold": 600}
        container["livenessProbe"] = {**probe, "periodSeconds": 10, "failureThreshold": 3}
    resources = _resources(plugin.resources if plugin else None)
    if resources:
        container["resources"] = resources
    return container


def plugin_objects(spec: GPUClusterSpec, facts: Facts) -> list[dict[str, Any]]:
    ns = facts.namespace
    kubelet_dir = spec.host_paths.kubelet_root_dir or "/var/lib/kubelet"
    install_dir = _driver_root(spec)
    gpus = spec.dra_driver.gpus.kubelet_plugin if spec.dra_driver.gpus else None
    gates = spec.dra_driver.feature_gates or {}
    env = [
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("NAMESPACE", "metadata.namespace"),
        {"name": "CDI_ROOT", "value": "/var/run/cdi"},
        {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": f"{kubelet_dir}/plugins_registry"},
        {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": f"{kubelet_dir}/plugins"},
        {"name": "HOST_ROOT", "value": "/host"},
        # NVML by path from wherever the init container found the driver; no runtime hook
        {"name": "DRIVER_READY_FILE", "value": f"{DRIVER_VALIDATIONS}/driver-ready"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        # what claims' MPS control daemons run: this image
        {"name": "IMAGE_NAME", "value": facts.operator_image},
        {"name": "IMAGE_PULL_POLICY", "value": spec.dra_driver.image_pull_policy or "IfNotPresent"},
    ]
    if gates:
        text = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
        env.append({"name": "FEATURE_GATES", "value": text})
    env += _env(gpus.env if gpus else None)
    container: dict[str, Any] = {
        "name": "gpus",
        "image": facts.operator_image,
        "imagePullPolicy": spec.dra_driver.image_pull_policy or "IfNotPresent",
        "args": ["agent", "dra-plugin"],
        "env": env,
        # the kubelet's plugin directories are root's (the project's image runs as 65532)
        "securityContext": {"privileged": True, "runAsUser": 0},
        "volumeMounts": [
            {"name": "plugins-registry", "mountPath": f"{kubelet_dir}/plugins_registry"},
            # Bidirectional: the tmpfs a claim's MPS daemon shares with its clients, mounted
            # here under the plugin's directory, must be what the host (and their pods) see.
            {
                "name": "plugins",
                "mountPath": f"{kubelet_dir}/plugins",
                "mountPropagation": "Bidirectional",
            },
            {"name": "cdi", "mountPath": "/var/run/cdi"},
            {"name": "validations", "mountPath": VALIDATIONS, "readOnly": True},
            *DRIVER_MOUNTS,
        ],
    }
    resources = _resources(gpus.resources if gpus else None)
    if resources:
        container["resources"] = resources
    containers = [container]
    if spec.compute_domains_enabled:
        containers.append(_domains_container(spec, facts, env, container["volumeMounts"]))
    passthrough = bool(gates.get("PassthroughSupport"))
    if passthrough:  # NVIDIA's mounts: vfio-pci's module, the PCI bus in sysfs, host processes
        container["volumeMounts"] += [
            {"mountPath": path, "name": name, **extra} for name, path, extra in PASSTHROUGH_MOUNTS
        ]
    pod: dict[str, Any] = {
        "serviceAccountName": PLUGIN_ACCOUNT,
        "initContainers": [_driver_validation(spec, facts, install_dir)],
        "containers": containers,
        "volumes": [
            _host_volume("plugins-registry", f"{kubelet_dir}/plugins_registry"),
            _host_volume("plugins", f"{kubelet_dir}/plugins"),
            _host_volume("cdi", "/var/run/cdi", "DirectoryOrCreate"),
            _host_volume("validations", VALIDATIONS, "DirectoryOrCreate"),
            _host_volume("host-root", spec.host_paths.root_fs or "/"),
            _host_volume("driver-install-dir", install_dir, "DirectoryOrCreate"),
            *(
                _host_volume(name, path, "Directory")
                for name, path, _ in (PASSTHROUGH_MOUNTS if passthrough else ())
            ),
        ],
    }
    secrets = spec.dra_driver.image_pull_secrets
    if secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in secrets]
    rules = PLUGIN_RULES + (DOMAIN_PLUGIN_RULES if spec.compute_domains_enabled else [])
    daemonset = _daemonset(PLUGIN, ns, spec.daemonsets, pod, max_surge_zero=True)
    return [
        _account(PLUGIN_ACCOUNT, ns),
        *_rbac("ClusterRole", PLUGIN_ACCOUNT, None, rules, PLUGIN_ACCOUNT, ns),
        *_rbac("Role", MPS_ROLE, ns, PLUGIN_NAMESPACE_RULES, PLUGIN_ACCOUNT, ns),
        *device_classes(),
        daemonset,
    ]


def validator_objects(spec: GPUClusterSpec, facts: Facts) -> list[dict[str, Any]]:
    ns = facts.namespace
    pod = {
        "serviceAccountName": VALIDATOR,
        "resourceClaims": [
            {"name": "validation-gpu", "resourceClaimTemplateName": VALIDATOR_CLAIMS}
        ],
        "initContainers": [
            {
                "name": "gpu-validation",
                "image": facts.operator_image,
                # Exits 0 once the claim's GPUs answer (an init container must end); until
                # then it says why every few seconds instead of crash-looping. Its status
                # files are its own (nothing reads them): where the image's user may write.
                "args": [
                    "agent",
                    "validate",
                    "--components",
                    "cuda",
                    "--with-wait",
                    "--output-dir",
                    "/tmp/validations",
                ],
                "env": [_field_env("NODE_NAME", "spec.nodeName")],
                "resources": {"claims": [{"name": "validation-gpu"}]},
            }
        ],
        "containers": [
            {
                "name": VALIDATOR,
                "image": facts.operator_image,
                "command": ["sh", "-c", "echo all validations are successful; sleep infinity"],
            }
        ],
    }
    return [
        _account(VALIDATOR, ns),
        _admin_claims(VALIDATOR_CLAIMS, "validation-gpu", ns, "ExactCount"),
        _prepared_for(spec, _daemonset(VALIDATOR, ns, spec.daemonsets, pod, max_surge_zero=False)),
    ]


def exporter_objects(spec: GPUClusterSpec, facts: Facts) -> list[dict[str, Any]]:
    ns = facts.namespace
    exporter = spec.dcgm_exporter
    env = [
        {"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"},
        {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
        _field_env("NODE_NAME", "spec.nodeName"),
        {"name": "KUBERNETES_ENABLE_DRA", "value": "true"},
        *_env(exporter.env),
    ]
    container: dict[str, Any] = {
        "name": EXPORTER,
        "image": facts.operator_image,
        "args": ["agent", "exporter", *(exporter.args or [])],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": 9400}],
        "resources": {**_resources(exporter.resources), "claims": [{"name": "admin-gpus"}]},
        "volumeMounts": [
            {
                "name": "pod-gpu-resources",
                "mountPath": "/var/lib/kubelet/pod-resources",
                "readOnly": True,
            }
        ],
    }
    pod: dict[str, Any] = {
        "serviceAccountName": EXPORTER,
        "resourceClaims": [{"name": "admin-gpus", "resourceClaimTemplateName": EXPORTER_CLAIMS}],
        "containers": [container],
        "volumes": [_host_volume("pod-gpu-resources", "/var/lib/kubelet/pod-resources")],
    }
    if exporter.host_network:
        pod["hostNetwork"] = True
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": EXPORTER, "namespace": ns, "labels": _labels(EXPORTER, EXPORTER)},
        "spec": {
            "selector": {"app": EXPORTER},
            "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400}],
            "internalTrafficPolicy": (
                exporter.service.internal_traffic_policy if exporter.service else None
            )
            or "Cluster",
        },
    }
    return [
        _account(EXPORTER, ns),
        _admin_claims(EXPORTER_CLAIMS, "admin-gpus", ns, "All"),
        service,
        _prepared_for(spec, _daemonset(EXPORTER, ns, spec.daemonsets, pod, max_surge_zero=False)),
    ]


def _rbac(kind: str, name: str, namespace: str | None, rules: list[dict[str, Any]],
          account: str, account_namespace: str) -> list[dict[str, Any]]:  # fmt: skip
    """A (Cluster)Role of ``rules`` and its binding to ``account``."""
    meta: dict[str, Any] = {"name": name, "labels": dict(MANAGED)}
    if namespace:
        meta["namespace"] = namespace
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "rules": rules}  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": dict(meta),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}],
    }
    return [role, binding]


def compute_domain_objects(spec: GPUClusterSpec, facts: Facts) -> list[dict[str, Any]]:
    """With ``computeDomains`` enabled: the ComputeDomain controller (NVIDIA's Deployment
    name, this project's image and loop), its RBAC, the IMEX daemons' identity and the two
    DeviceClasses their claims and the workloads' channel claims ask for."""
    ns = facts.namespace
    domains = spec.dra_driver.compute_domains
    controller = domains.controller if domains else None
    pull = spec.dra_driver.image_pull_policy or "IfNotPresent"
    env = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("NAMESPACE", "metadata.namespace"),
        {"name": "IMAGE_NAME", "value": facts.operator_image},
        {"name": "IMAGE_PULL_POLICY", "value": pull},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]
    secrets = spec.dra_driver.image_pull_secrets or []
    if secrets:
        env.append({"name": "CD_DAEMON_IMAGE_PULL_SECRET_NAMES", "value": ",".join(secrets)})
    if spec.daemonsets.priority_class_name:
        value = spec.daemonsets.priority_class_name
        env.append({"name": "CD_DAEMON_PRIORITY_CLASS_NAME", "value": value})
    env += _env(controller.env if controller else None)
    container: dict[str, Any] = {
        "name": "compute-domain",
        "image": facts.operator_image,
        "imagePullPolicy": pull,
        "args": ["compute-domain-controller"],
        "env": env,
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
    }
    resources = _resources(controller.resources if controller else None)
    if resources:
        container["resources"] = resources
    labels = _labels(CONTROLLER, CONTROLLER)
    pod: dict[str, Any] = {
        "serviceAccountName": CONTROLLER,
        "priorityClassName": spec.daemonsets.priority_class_name or "system-node-critical",
        "containers": [container],
        # As NVIDIA's: on a control-plane node where there is one, never on a GPU taint's
        # account alone.
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}}]}},
        "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
             "effect": "NoSchedule"},
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            *(t.to_wire() for t in spec.daemonsets.tolerations or []),
        ],
    }  # fmt: skip
    if secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in secrets]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": CONTROLLER, "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": CONTROLLER}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    return [
        _account(CONTROLLER, ns),
        *_rbac("ClusterRole", CONTROLLER, None, CONTROLLER_RULES, CONTROLLER, ns),
        *_rbac("Role", CONTROLLER, ns, CONTROLLER_NAMESPACE_RULES, CONTROLLER, ns),
        _account(DAEMON_ACCOUNT, ns),
        *_rbac("ClusterRole", DAEMON_ROLE, None, DAEMON_RULES, DAEMON_ACCOUNT, ns),
        *domain_device_classes(),
        deployment,
    ]


def render_gpucluster(spec: GPUClusterSpec, facts: Facts) -> list[dict[str, Any]]:
    """Every object the GPUCluster asks for, in apply order, with the admission policies that
    check GPU claim configs, and with ``computeDomains`` enabled the ComputeDomain
    controller's. Not standalone DCGM (the exporter embeds it)."""
    objects = plugin_objects(spec, facts) + validator_objects(spec, facts)
    if spec.compute_domains_enabled:
        objects += compute_domain_objects(spec, facts)
    if spec.dcgm_exporter.enabled:
        objects += exporter_objects(spec, facts)
    # The gates were checked when the spec was parsed: resolving them again cannot fail.
    return objects + config_policies(dragates.resolve(spec.dra_driver.feature_gates or {}))
