"""Render a ClusterPolicy into the Kubernetes objects of the GPU stack.

``render(policy, facts)`` is pure and deterministic: the same inputs give the same objects in
the same order (registry order, then template file order). Component-specific content lives in
the templates; the settings every operand DaemonSet shares (labels, tolerations, priority,
update strategy, pull secrets, env overrides, ...) are applied here, once, after parsing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.base import Component
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.render.components import (
    REGISTRY,
    ComponentDef,
    command,
    component_image,
    section,
)
from gpu_operator.render.engine import SHARED_FOLDER, render_template, templates
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts, NodeOS
from gpu_operator.render.images import with_os_tag

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "DEFAULT_OPERATOR_IMAGE",
    "STANDARD_LABELS",
    "Facts",
    "NodeOS",
    "RenderedComponent",
    "config_hash",
    "default_policy",
    "render",
    "render_components",
]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
STANDARD_LABELS = {MANAGED_BY_LABEL: "gpu-operator", "app.kubernetes.io/part-of": "gpu-operator"}
COMPONENT_LABEL = "app.kubernetes.io/component"
CONFIG_HASH_ANNOTATION = "nvidia.com/config-hash"
CLUSTER_SCOPED_KINDS = frozenset(
    {"ClusterRole", "ClusterRoleBinding", "RuntimeClass", "Namespace", "PriorityClass"}
)
DEFAULT_PRIORITY_CLASS = "system-node-critical"
DEFAULT_PULL_POLICY = "IfNotPresent"
# NVIDIA's driver startupProbe timings; a long first start compiles the kernel modules.
DRIVER_STARTUP_PROBE = {
    "initialDelaySeconds": 60,
    "periodSeconds": 10,
    "timeoutSeconds": 60,
    "successThreshold": 1,
    "failureThreshold": 120,
}


@dataclass(frozen=True)
class RenderedComponent:
    """One registry entry's share of the output (empty when the component is disabled)."""

    component: ComponentDef
    enabled: bool
    images: tuple[str, ...]
    objects: tuple[dict[str, Any], ...]


def default_policy() -> ClusterPolicySpec:
    """The policy used when none is given: every field at its default."""
    return ClusterPolicySpec()


def render(policy: ClusterPolicySpec, facts: Facts) -> list[dict[str, Any]]:
    """Every object the policy asks for, in apply order."""
    return [obj for part in render_components(policy, facts) for obj in part.objects]


def render_components(policy: ClusterPolicySpec, facts: Facts) -> list[RenderedComponent]:
    """``render``, grouped by component (for summaries and per-component status)."""
    values = _values(policy, facts)
    enabled: dict[str, tuple[Component, tuple[str, ...], list[dict[str, Any]]]] = {}
    for comp in REGISTRY:
        spec = section(policy, comp)
        if not spec.enabled:
            continue
        image = component_image(comp, spec, facts)
        comp_values = _component_values(comp, image, facts)
        context = {"ns": facts.namespace, "v": values, "c": comp_values}
        # The component's templates and the shared ones, interleaved by their number.
        names = sorted(
            templates(comp.name) + templates(SHARED_FOLDER), key=lambda n: n.rsplit("/", 1)[1]
        )
        objects = [obj for name in names for obj in render_template(name, context)]
        images = tuple(o["image"] for o in comp_values["oses"]) if comp.per_os else (image,)
        enabled[comp.name] = (spec, images, objects)

    # Pods that mount a ConfigMap carry its hash, so an edit rolls them. Hashes of ConfigMaps
    # rendered here are computed; those the user owns come from the facts.
    hashes = dict(facts.config_hashes)
    for _, _, objects in enabled.values():
        hashes.update(
            {o["metadata"]["name"]: config_hash(o) for o in objects if o["kind"] == "ConfigMap"}
        )

    parts = []
    for comp in REGISTRY:
        if comp.name not in enabled:
            parts.append(RenderedComponent(comp, False, (), ()))
            continue
        spec, images, objects = enabled[comp.name]
        for obj in objects:
            _label(obj, comp, facts)
            if obj["kind"] == "DaemonSet":
                _daemonset_settings(obj, comp, spec, policy, facts, hashes)
        parts.append(RenderedComponent(comp, True, images, tuple(objects)))
    return parts


def config_hash(configmap: Mapping[str, Any]) -> str:
    """Content hash of a ConfigMap object; the controller fills ``Facts.config_hashes`` so."""
    content = {
        "data": configmap.get("data") or {},
        "binaryData": configmap.get("binaryData") or {},
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def _values(policy: ClusterPolicySpec, facts: Facts) -> dict[str, Any]:
    """Every setting the templates read, with defaults applied, in one plain structure."""
    host = policy.host_paths
    root_fs = host.root_fs or "/"
    driver_install_dir = host.driver_install_dir or "/run/nvidia/driver"
    dp_config = policy.device_plugin.config
    exporter = policy.dcgm_exporter
    monitor = exporter.service_monitor
    mig_config = policy.mig_manager.config
    clients = policy.mig_manager.gpu_clients_config
    driver = policy.driver
    return {
        "host_root": root_fs,
        "driver_enabled": driver.enabled,
        "driver_install_dir": driver_install_dir,
        # Where operands find the driver: the driver container's tree when we install it.
        "driver_root": driver_install_dir if driver.enabled else root_fs,
        "kubelet_root": (host.kubelet_root_dir or "/var/lib/kubelet").rstrip("/"),
        "runtime": facts.runtime,
        "runtime_class": policy.operator.runtime_class or "nvidia",
        "openshift": facts.openshift,
        "toolkit_install_dir": policy.toolkit.install_dir or "/usr/local/nvidia",
        "cdi_enabled": policy.cdi.enabled is not False,
        # Checks the validator runs: the plugin check only where a device plugin is deployed.
        "validations": ",".join(
            ["driver", "toolkit", "cuda"] + (["plugin"] if policy.device_plugin.enabled else [])
        ),
        "cdi_default": bool(policy.cdi.default),
        "mig_strategy": policy.mig.strategy or "single",
        "device_plugin_config": (
            {"name": dp_config.name, "default": dp_config.default or ""}
            if dp_config is not None and dp_config.name
            else None
        ),
        "mps_root": (policy.device_plugin.mps.root if policy.device_plugin.mps else None)
        or "/run/nvidia/mps",
        "dcgm_enabled": policy.dcgm.enabled,
        "dcgm_port": policy.dcgm.host_port or 5555,
        "exporter": {
            "config_name": (exporter.config.name if exporter.config else None)
            or "nvidia-dcgm-exporter-metrics",
            "generate_config": not (exporter.config and exporter.config.name),
            "annotations": exporter.annotations or {},
            "enable_pod_labels": bool(exporter.enable_pod_labels),
            "enable_pod_uid": bool(exporter.enable_pod_uid),
            "host_pid": bool(exporter.host_pid),
            "pod_label_allowlist": ",".join(exporter.pod_label_allowlist_regex or []),
            "hpc_job_dir": (
                (exporter.hpc_job_mapping.directory or "/var/lib/dcgm-exporter/job-mapping")
                if exporter.hpc_job_mapping and exporter.hpc_job_mapping.enabled
                else None
            ),
            "service_type": (exporter.service.type if exporter.service else None) or "ClusterIP",
            "internal_traffic_policy": (
                exporter.service.internal_traffic_policy if exporter.service else None
            )
            or "Cluster",
            "service_monitor": monitor.to_wire() if monitor and monitor.enabled else None,
        },
        "mig_manager": {
            "config_name": (mig_config.name if mig_config else None) or "default-mig-parted-config",
            "generate_config": not (mig_config and mig_config.name),
            "default_config": (mig_config.default if mig_config else None) or "all-disabled",
            "gpu_clients_config": clients.name if clients and clients.name else None,
        },
        "driver": {
            "startup_probe": {
                **DRIVER_STARTUP_PROBE,
                **(driver.startup_probe.to_wire() if driver.startup_probe else {}),
            },
            "liveness_probe": driver.liveness_probe.to_wire() if driver.liveness_probe else None,
            "readiness_probe": (
                driver.readiness_probe.to_wire() if driver.readiness_probe else None
            ),
        },
    }


def _component_values(comp: ComponentDef, image: str, facts: Facts) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": comp.name,
        "app": comp.app,
        "service_account": comp.service_account,
        "image": image,
    }
    if comp.per_os:
        values["oses"] = [
            {**group, "image": with_os_tag(image, group["tag"])}
            for group in os_groups(facts.node_oses)
        ]
    return values


def os_groups(node_oses: Sequence[NodeOS]) -> list[dict[str, Any]]:
    """Node OSes grouped by driver image tag, sorted: rhel9.2 and rhel9.4 share ``rhel9``."""
    groups: dict[str, list[NodeOS]] = {}
    for os in node_oses:
        groups.setdefault(os.tag, []).append(os)
    return [
        {
            "tag": tag,
            "ids": sorted({os.id for os in members}),
            "version_ids": sorted({os.version_id for os in members}),
        }
        for tag, members in sorted(groups.items())
    ]


def _label(obj: dict[str, Any], comp: ComponentDef, facts: Facts) -> None:
    """Ownership labels on every object; the namespace on every namespaced one."""
    meta = obj.get("metadata") or {}
    placed: dict[str, Any] = {"name": meta.get("name")}
    if obj["kind"] not in CLUSTER_SCOPED_KINDS:
        placed["namespace"] = facts.namespace
    placed["labels"] = {**(meta.get("labels") or {}), **STANDARD_LABELS, COMPONENT_LABEL: comp.name}
    obj["metadata"] = {**placed, **{k: v for k, v in meta.items() if k not in placed}}


def _daemonset_settings(
    ds: dict[str, Any],
    comp: ComponentDef,
    spec: Component,
    policy: ClusterPolicySpec,
    facts: Facts,
    config_hashes: Mapping[str, str],
) -> None:
    """The settings every operand DaemonSet shares, applied in one place.

    ``daemonsets.*`` applies to all; the component's own section supplies the image pull
    policy and secrets, resources, env, args and hostNetwork of its first (operand) container.
    Our labels win over the user's: the operator finds its objects and pods by them.
    """
    common = policy.daemonsets
    user_labels = dict(common.labels or {})
    ours = {**STANDARD_LABELS, COMPONENT_LABEL: comp.name}
    ds["metadata"]["labels"] = {**user_labels, **ds["metadata"]["labels"]}

    ds_spec = ds["spec"]
    template = ds_spec["template"]
    pod_meta = template.setdefault("metadata", {})
    pod_meta["labels"] = {**user_labels, **(pod_meta.get("labels") or {}), **ours}
    annotations = {**(common.annotations or {}), **(pod_meta.get("annotations") or {})}

    pod = template["spec"]
    mounted = sorted(v["configMap"]["name"] for v in pod.get("volumes") or [] if "configMap" in v)
    known = [f"{name}={config_hashes[name]}" for name in mounted if name in config_hashes]
    if known:
        digest = hashlib.sha256("\n".join(known).encode()).hexdigest()[:16]
        annotations[CONFIG_HASH_ANNOTATION] = digest
    if annotations:
        pod_meta["annotations"] = annotations
    else:
        pod_meta.pop("annotations", None)

    if comp.on_delete or common.update_strategy == "OnDelete":
        ds_spec["updateStrategy"] = {"type": "OnDelete"}
    else:
        strategy: dict[str, Any] = {"type": "RollingUpdate"}
        if common.rolling_update and common.rolling_update.max_unavailable:
            limit = common.rolling_update.max_unavailable
            strategy["rollingUpdate"] = {"maxUnavailable": int(limit) if limit.isdigit() else limit}
        ds_spec["updateStrategy"] = strategy

    pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), comp.deploy_label: "true"}
    taint_key = policy.gpu_node_taint.key
    tolerations: list[dict[str, Any]] = [{"key": taint_key, "operator": "Exists"}]
    for toleration in common.tolerations or []:
        wire = toleration.to_wire()
        if wire not in tolerations:
            tolerations.append(wire)
    pod["tolerations"] = tolerations
    pod["priorityClassName"] = common.priority_class_name or DEFAULT_PRIORITY_CLASS
    # containerd selects the NVIDIA runtime per pod; CRI-O (OCI hook) and Docker (default
    # runtime) need no class. A preinstalled toolkit (toolkit disabled) is the host's default.
    if comp.gpu_runtime and facts.runtime == "containerd" and policy.toolkit.enabled:
        pod["runtimeClassName"] = policy.operator.runtime_class or "nvidia"
    if common.pod_security_context is not None:
        pod["securityContext"] = common.pod_security_context.to_wire()
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.host_network is not None:
        pod["hostNetwork"] = spec.host_network
        if spec.host_network:
            pod["dnsPolicy"] = "ClusterFirstWithHostNet"

    pull_policy = spec.image_pull_policy or DEFAULT_PULL_POLICY
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        container["imagePullPolicy"] = pull_policy

    main = pod["containers"][0]
    entrypoint = command(comp, main["image"], facts.operator_image)
    if entrypoint is not None:
        main["command"] = entrypoint
    if spec.args:
        main["args"] = list(spec.args)
    user_env = _user_env(comp, spec)
    if user_env:
        main["env"] = merge_env(main.get("env") or [], user_env)
    if spec.resources is not None and spec.resources.to_wire():
        main["resources"] = spec.resources.to_wire()


def _user_env(comp: ComponentDef, spec: Component) -> list[dict[str, Any]]:
    """The section's env over its sub-sections' (validator.driver.env, ...)."""
    env: list[dict[str, Any]] = []
    for name in comp.env_sections:
        sub = getattr(spec, name, None)
        env = merge_env(env, [e.to_wire() for e in (getattr(sub, "env", None) or [])])
    return merge_env(env, [e.to_wire() for e in spec.env or []])


def merge_env(
    base: Sequence[dict[str, Any]], overrides: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``base`` in order, each var replaced by the override of the same name; new ones appended."""
    merged = list(base)
    index = {var["name"]: i for i, var in enumerate(merged)}
    for var in overrides:
        if var["name"] in index:
            merged[index[var["name"]]] = var
        else:
            index[var["name"]] = len(merged)
            merged.append(var)
    return merged
