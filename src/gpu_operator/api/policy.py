"""Loading a ClusterPolicy document into the models, with errors a user can act on."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gpu_operator.api.base import drop_nulls
from gpu_operator.api.formats import dns_name
from gpu_operator.api.legacy import MIGRATE, hint
from gpu_operator.api.spec import ClusterPolicySpec

GROUP = "nvidia.com"
VERSION = "v1"
KIND = "ClusterPolicy"
PLURAL = "clusterpolicies"
API_VERSION = f"{GROUP}/{VERSION}"


class PolicyError(ValueError):
    """A ClusterPolicy that cannot be used; ``problems`` name each field and what is wrong."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in {"str", "int", "bool", "list", "dict"} or part.startswith(
            ("function-", "constrained-str", "literal[")
        ):
            continue  # pydantic names the union branch it tried; users think in fields
        elif part == "[key]":
            path += " (the key)"
        elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            path += f"[{part!r}]"  # a map key such as a label name
        else:
            path += f".{part}"
    return path


def describe_validation_error(exc: ValidationError, kind: str = KIND) -> list[str]:
    """One line per problem: the field path, what was wrong, and the input.

    A ClusterPolicy field NVIDIA moved or removed says where it lives now, and a last line
    names the command that rewrites the document.
    """
    seen: dict[str, list[str]] = {}
    moved = False
    for err in exc.errors(include_url=False):
        path = _field_path(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            legacy = hint(tuple(err["loc"])) if kind == KIND else None
            moved = moved or legacy is not None
            msg = legacy or f"unknown field (check its spelling against the {kind} schema)"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            if "input" in err and not isinstance(err["input"], (dict, list)):
                msg += f" (got {err['input']!r})"
        seen.setdefault(path, [])
        if msg not in seen[path]:
            seen[path].append(msg)
    lines = [f"{path}: {' or '.join(msgs)}" for path, msgs in seen.items()]
    return [*lines, MIGRATE] if moved else lines


def name_problems(name: Any, max_length: int | None = None, why: str = "") -> list[str]:
    """``metadata.name``'s problem, if it is no DNS-1123 subdomain (of ``max_length``): the
    API server refuses it, and the operator derives its objects' names from it."""
    try:
        dns_name(str(name), max_length=max_length)
    except ValueError as exc:
        return [f"metadata.name: {exc}{f' ({why})' if why else ''} (got {name!r})"]
    return []


def parse_spec(spec: Mapping[str, Any] | None) -> ClusterPolicySpec:
    """Validate a ClusterPolicy ``spec``; raise ``PolicyError`` naming every bad field."""
    try:
        return ClusterPolicySpec.model_validate(drop_nulls(dict(spec or {})))
    except ValidationError as exc:
        raise PolicyError(describe_validation_error(exc)) from None


def parse_document(doc: Mapping[str, Any]) -> ClusterPolicySpec:
    """Validate a whole ClusterPolicy object (apiVersion, kind, spec)."""
    problems = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: must be {API_VERSION} (got {doc.get('apiVersion')!r})")
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND} (got {doc.get('kind')!r})")
    meta = doc.get("metadata")
    if isinstance(meta, Mapping) and meta.get("name"):
        problems += name_problems(meta["name"])
    if problems:
        raise PolicyError(problems)
    spec = doc.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise PolicyError([f"spec: must be a mapping (got {type(spec).__name__})"])
    return parse_spec(spec)
