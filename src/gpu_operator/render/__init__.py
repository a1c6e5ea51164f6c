"""Render a ClusterPolicy into the Kubernetes objects of the GPU stack.

``render(policy, facts)`` is pure and deterministic: the same inputs give the same objects in
the same order (registry order, then template file order). The templates hold every object
whole; what they read is typed values built here from (policy, facts, registry entry), see
``render.values`` and ``render.settings``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.render.components import REGISTRY, ComponentDef, is_enabled
from gpu_operator.render.engine import SHARED_FOLDER, render_template, templates
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE, Facts, NodeOS, mps_configured
from gpu_operator.render.values import component_images, template_context

__all__ = [
    "DEFAULT_OPERATOR_IMAGE",
    "Facts",
    "NodeOS",
    "RenderedComponent",
    "config_hash",
    "default_policy",
    "mps_configured",
    "render",
    "render_components",
]


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
    """``render``, grouped by component (for summaries and per-component status).

    ConfigMaps are hashed as they are rendered, so a pod that mounts one rendered before it
    (its component's 0400 before its 0500) carries the content's digest.
    """
    hashes = dict(facts.config_hashes)
    parts = []
    for comp in REGISTRY:
        if not is_rendered(policy, facts, comp):
            parts.append(RenderedComponent(comp, False, (), ()))
            continue
        context = template_context(policy, facts, comp)
        variables = context.variables(hashes)
        objects: list[dict[str, Any]] = []
        for name in component_templates(comp):
            rendered = render_template(name, variables)
            configmaps = [o for o in rendered if o["kind"] == "ConfigMap"]
            if configmaps:
                hashes.update({cm["metadata"]["name"]: config_hash(cm) for cm in configmaps})
                variables = context.variables(hashes)
            objects.extend(rendered)
        images = component_images(policy, facts, comp)
        parts.append(RenderedComponent(comp, True, images, tuple(objects)))
    return parts


def is_rendered(policy: ClusterPolicySpec, facts: Facts, comp: ComponentDef) -> bool:
    """Enabled, and for the driver not left to NVIDIADriver CRs (driver.useNvidiaDriverCRD),
    except on nodes that have not been handed over to one yet."""
    if comp.name == "driver" and policy.driver.use_nvidia_driver_crd:
        return policy.driver.enabled and facts.driver_handover
    return is_enabled(policy, comp)


def component_templates(comp: ComponentDef) -> list[str]:
    """The component's templates and the shared ones, interleaved by their number."""
    return sorted(
        templates(comp.name) + templates(SHARED_FOLDER), key=lambda n: n.rsplit("/", 1)[1]
    )


def config_hash(configmap: Mapping[str, Any]) -> str:
    """Content hash of a ConfigMap object; the controller fills ``Facts.config_hashes`` so."""
    content = {
        "data": configmap.get("data") or {},
        "binaryData": configmap.get("binaryData") or {},
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
