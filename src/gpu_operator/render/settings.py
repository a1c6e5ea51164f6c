"""The settings every operand DaemonSet shares: ``d`` in the templates.

``daemonsets.*`` applies to every operand; the component's own section supplies the image pull
policy and secrets, hostNetwork, and the command, args, env and resources of its main container.
``_shared/_daemonset.j2`` places them and every ``<component>/0500_daemonset.yaml.j2`` calls it,
so one type serves every component.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.api.base import Component
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.labels import CONFIG_HASH, UNHEALTHY_TAINT
from gpu_operator.render.components import (
    ComponentDef,
    command,
    component_image,
    runs_agent,
    section,
)
from gpu_operator.render.facts import Facts
from gpu_operator.render.wire import merge_env, merge_maps

DEFAULT_PRIORITY_CLASS = "system-node-critical"
DEFAULT_PULL_POLICY = "IfNotPresent"
# NVIDIA's requests and limits for operands whose section sets none
_SMALL = {"limits": {"memory": "200Mi"}, "requests": {"cpu": "100m", "memory": "200Mi"}}
DEFAULT_RESOURCES: Mapping[str, Mapping[str, Any]] = {"vfio-manager": _SMALL, "cc-manager": _SMALL}
# Node labels an operand needs beyond its deploy label (NFD's rule marks CC-capable GPUs)
EXTRA_NODE_SELECTOR: Mapping[str, Mapping[str, str]] = {
    "cc-manager": {"nvidia.com/cc.capable": "true"}
}


@dataclass(frozen=True)
class DaemonSetSettings:
    """One component's share of ``daemonsets.*`` and of its own section, defaults applied."""

    user_labels: Mapping[str, str]  # daemonsets.labels; the owned labels win over them
    user_annotations: Mapping[str, str]  # daemonsets.annotations, on the pods
    update_strategy: Mapping[str, Any]
    node_selector: Mapping[str, str]  # the component's deploy label
    tolerations: tuple[Mapping[str, Any], ...]  # the GPU taint's first, then the user's
    priority_class_name: str
    runtime_class_name: str | None  # set where containerd must select the NVIDIA runtime
    security_context: Mapping[str, Any] | None  # the pods'
    image_pull_secrets: tuple[Mapping[str, str], ...]
    host_network: bool | None  # None: the template's (Kubernetes') default
    image_pull_policy: str  # every container's
    command: tuple[str, ...] | None  # the main container's; None keeps the template's
    args: tuple[str, ...]  # the main container's; empty keeps the template's
    env: tuple[Mapping[str, Any], ...]  # merged by name over the main container's own
    resources: Mapping[str, Any] | None  # the main container's
    # The main container runs the project's image (``gpu-operator agent ...``): it loads NVML by
    # path from the driver root it mounts, never through a runtime hook (``_daemonset.j2``).
    project_image: bool = False
    # ConfigMap name -> content hash, for those known so far: the user's (from the facts) and
    # those rendered before this template.
    config_hashes: Mapping[str, str] = field(default_factory=dict)

    def pod_annotations(
        self, own: Mapping[str, str] | None, configmaps: Sequence[str | None]
    ) -> dict[str, str]:
        """``daemonsets.annotations``, the pod's own, and a digest of the ConfigMaps it mounts.

        The digest rolls the pods when a mounted ConfigMap changes; it covers only ConfigMaps
        whose content is known, and is absent when none is (rather than a wrong one).
        """
        known = [
            f"{name}={self.config_hashes[name]}"
            for name in sorted(name for name in configmaps if name is not None)
            if name in self.config_hashes
        ]
        if not known:
            return merge_maps(self.user_annotations, own)
        digest = hashlib.sha256("\n".join(known).encode()).hexdigest()[:16]
        return merge_maps(self.user_annotations, own, {CONFIG_HASH: digest})


def daemonset_settings(
    policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef
) -> DaemonSetSettings:
    """The shared settings of ``comp``'s DaemonSets under ``policy``."""
    common = policy.daemonsets
    spec = section(policy, comp)
    image = component_image(comp, spec, facts)
    entrypoint = command(comp, image, facts.operator_image)
    # The project's agents load the driver themselves: no NVIDIA runtime (nor its toolkit having
    # configured it) needed to start them.
    project_image = runs_agent(comp, image, facts.operator_image)
    resources = (
        spec.resources.to_wire()
        if spec.resources is not None
        else dict(DEFAULT_RESOURCES.get(comp.name, {}))
    )
    return DaemonSetSettings(
        user_labels=dict(common.labels or {}),
        user_annotations=dict(common.annotations or {}),
        update_strategy=_update_strategy(policy, comp),
        node_selector={comp.deploy_label: "true", **EXTRA_NODE_SELECTOR.get(comp.name, {})},
        tolerations=_tolerations(policy),
        priority_class_name=common.priority_class_name or DEFAULT_PRIORITY_CLASS,
        runtime_class_name=(None if project_image else _runtime_class_name(policy, facts, comp)),
        security_context=(
            common.pod_security_context.to_wire()
            if common.pod_security_context is not None
            else None
        ),
        image_pull_secrets=tuple({"name": name} for name in spec.image_pull_secrets or []),
        host_network=spec.host_network,
        image_pull_policy=spec.image_pull_policy or DEFAULT_PULL_POLICY,
        command=tuple(entrypoint) if entrypoint is not None else None,
        args=tuple(spec.args or ()),
        env=tuple(_user_env(comp, spec)),
        resources=resources or None,
        project_image=project_image,
        config_hashes=facts.config_hashes,
    )


def _update_strategy(policy: ClusterPolicySpec, comp: ComponentDef) -> dict[str, Any]:
    """OnDelete where the upgrade controller replaces the pods; else a rolling update."""
    common = policy.daemonsets
    if comp.on_delete or common.update_strategy == "OnDelete":
        return {"type": "OnDelete"}
    limit = common.rolling_update.max_unavailable if common.rolling_update else None
    if not limit:
        return {"type": "RollingUpdate"}
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": int(limit) if limit.isdigit() else limit},
    }


def _tolerations(policy: ClusterPolicySpec) -> tuple[dict[str, Any], ...]:
    """The operator's GPU taint (and, with health remediation on, its quarantine taint: a
    quarantined node's operands must stay and restart there), then the user's tolerations
    without duplicates."""
    tolerations: list[dict[str, Any]] = [{"key": policy.gpu_node_taint.key, "operator": "Exists"}]
    if policy.health_remediation.enabled:
        tolerations.append({"key": UNHEALTHY_TAINT, "operator": "Exists"})
    for toleration in policy.daemonsets.tolerations or []:
        wire = toleration.to_wire()
        if wire not in tolerations:
            tolerations.append(wire)
    return tuple(tolerations)


def _runtime_class_name(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> str | None:
    """containerd selects the NVIDIA runtime per pod; CRI-O (OCI hook) and Docker (default
    runtime) need no class. A preinstalled toolkit (toolkit disabled) is the host's default."""
    if comp.gpu_runtime and facts.runtime == "containerd" and policy.toolkit.enabled:
        return runtime_class(policy)
    return None


def runtime_class(policy: ClusterPolicySpec) -> str:
    """The RuntimeClass (and containerd runtime handler) of the NVIDIA runtime."""
    return policy.operator.runtime_class or "nvidia"


def _user_env(comp: ComponentDef, spec: Component) -> list[Mapping[str, Any]]:
    """The section's env over its sub-sections' (validator.driver.env, ...)."""
    env: list[Mapping[str, Any]] = []
    for name in comp.env_sections:
        sub = getattr(spec, name, None)
        env = merge_env(env, [e.to_wire() for e in (getattr(sub, "env", None) or [])])
    return merge_env(env, [e.to_wire() for e in spec.env or []])
