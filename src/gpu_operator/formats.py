"""``-o/--output``: a format, on every command that has it (``yaml``, ``json``; ``table`` and
``wide`` where a table fits). Where a command writes files or a directory, that is a separate
long option (``--output-file``, ``--output-dir``), so ``-o`` never means a path."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

__all__ = ["add_output_option", "object_list", "structured"]


def add_output_option(
    parser: argparse.ArgumentParser, formats: Sequence[str], default: str, note: str = ""
) -> None:
    """``-o/--output FORMAT``, one of ``formats``."""
    parser.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=default,
        help=f"output format: {', '.join(formats)} (default {default}){note}",
    )


def structured(value: Any, fmt: str) -> str:
    """``value`` as JSON (``fmt == "json"``) or block YAML, keys in the order they were built.
    Through JSON first: objects shared in memory would otherwise print as YAML anchors, which
    some readers do not follow."""
    plain = json.loads(json.dumps(value))
    if fmt == "json":
        return json.dumps(plain, indent=2) + "\n"
    text: str = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    return text


def object_list(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Kubernetes objects as one ``v1`` List, as ``kubectl get -o json`` prints several."""
    return {"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objects]}
