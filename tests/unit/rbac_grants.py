"""RBAC rules flattened into single permissions, so that tests compare sets of them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Grant = tuple[str, str, str, str]  # api group, resource, verb, resource name ("" for any)


def grants(rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule.get("apiGroups") or [""]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def verbs(rules: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """(api group, resource, verb), whatever the resource names."""
    return {grant[:3] for grant in grants(rules)}


def role_rules(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rules of every Role and ClusterRole among ``objects``, together."""
    return [r for o in objects if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]
