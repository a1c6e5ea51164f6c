"""Merges of plain Kubernetes data, shared by the values builders and the templates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def merge_maps(*maps: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later maps win; a key keeps the position where it first appeared (``None`` is empty)."""
    merged: dict[str, Any] = {}
    for mapping in maps:
        merged.update(mapping or {})
    return merged


def merge_env(
    base: Sequence[Mapping[str, Any]] | None, overrides: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """``base`` in order, each var replaced by the override of the same name; new ones appended."""
    merged = list(base or [])
    index = {var["name"]: i for i, var in enumerate(merged)}
    for var in overrides:
        if var["name"] in index:
            merged[index[var["name"]]] = var
        else:
            index[var["name"]] = len(merged)
            merged.append(var)
    return merged
