"""The values files tests use: NVIDIA's chart defaults (from our keys list) and a real-world one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
NVIDIA_KEYS = DATA / "nvidia-chart-v26.3.1.keys"
REAL_WORLD = DATA / "realworld-values.yaml"


def keys_file(path: Path = NVIDIA_KEYS) -> dict[str, Any]:
    """``dotted.key = JSON`` lines as a flat dict."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition(" = ")
            out[key] = json.loads(value)
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys as the nested values Helm reads."""
    values: dict[str, Any] = {}
    for key, value in flat.items():
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


def nvidia_values() -> dict[str, Any]:
    """NVIDIA's chart v26.3.1 default values."""
    return nest(keys_file(NVIDIA_KEYS))
