"""The label and annotation keys the operator stamps on what it renders.

The controller finds its objects and pods by these labels, so templates cannot drop them: the
owned labels are merged last over anything a user or a template sets.
"""

from __future__ import annotations

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
STANDARD_LABELS = {MANAGED_BY_LABEL: "gpu-operator", "app.kubernetes.io/part-of": "gpu-operator"}
COMPONENT_LABEL = "app.kubernetes.io/component"
# On operand pods: a digest of the ConfigMaps they mount, so an edit rolls them.
CONFIG_HASH_ANNOTATION = "nvidia.com/config-hash"


def owned_labels(component: str) -> dict[str, str]:
    """The labels on every object of ``component``."""
    return {**STANDARD_LABELS, COMPONENT_LABEL: component}
