"""The labels the operator stamps on what it renders.

The controller finds its objects and pods by these labels, so templates cannot drop them: the
owned labels are merged last over anything a user or a template sets.
"""

from __future__ import annotations

from gpu_operator.labels import COMPONENT, OPERATOR_LABELS


def owned_labels(component: str) -> dict[str, str]:
    """The labels on every object of ``component``."""
    return {**OPERATOR_LABELS, COMPONENT: component}
