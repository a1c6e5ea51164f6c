"""Render test cases: a ClusterPolicy document and the cluster facts to render it with.

Shared by the golden, validation and benchmark-style tests; ``UPDATE_GOLDEN=1 pytest`` rewrites
``golden/<case>.yaml`` from the current renderer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpu_operator.api import ClusterPolicySpec, parse_document
from gpu_operator.render import Facts, NodeOS
from tests import prerequisites

HERE = Path(__file__).parent
CASES_DIR = HERE / "cases"
GOLDEN_DIR = HERE / "golden"

MIRROR_IMAGE = "registry.example.com:5000/gpu-operator/gpu-operator:v0.1.0"


@dataclass(frozen=True)
class Nvidia:
    """One of NVIDIA's reference documents: found when a test loads it (or the test skips)."""

    name: str


THREE_OSES = (NodeOS("ubuntu", "22.04"), NodeOS("ubuntu", "24.04"), NodeOS("rhel", "9.4"))

CASES: dict[str, tuple[Path | Nvidia, Facts]] = {
    "minimal": (CASES_DIR / "minimal.yaml", Facts()),
    "everything-on": (
        CASES_DIR / "everything-on.yaml",
        Facts(
            namespace="nvidia-gpu",
            node_oses=THREE_OSES,
            openshift=True,
            config_hashes={"device-plugin-configs": "0123abcd", "gpu-clients": "4567ef01"},
        ),
    ),
    "time-slicing": (
        CASES_DIR / "time-slicing.yaml",
        Facts(config_hashes={"time-slicing-config": "feedbeef"}),
    ),
    "mig-single": (CASES_DIR / "mig-single.yaml", Facts()),
    "mig-mixed": (CASES_DIR / "mig-mixed.yaml", Facts()),
    "private-registry": (
        CASES_DIR / "private-registry.yaml",
        Facts(
            operator_image=MIRROR_IMAGE,
            image_env={
                "DRIVER_IMAGE": "registry.example.com:5000/nvidia/driver:570.0",
                "MIG_MANAGER_IMAGE": MIRROR_IMAGE,
            },
        ),
    ),
    "multi-os": (
        CASES_DIR / "multi-os.yaml",
        Facts(
            runtime="crio",
            node_oses=(
                NodeOS("ubuntu", "22.04"),
                NodeOS("ubuntu", "24.04"),
                NodeOS("rhel", "9.4"),
                NodeOS("rhel", "9.2"),
            ),
        ),
    ),
    "disabled": (CASES_DIR / "disabled.yaml", Facts(runtime="docker")),
    "sandbox-workloads": (CASES_DIR / "sandbox-workloads.yaml", Facts()),
    "sandbox-kata": (CASES_DIR / "sandbox-kata.yaml", Facts()),
    "nvidia-helm-default": (Nvidia("clusterpolicy-helm-default.yaml"), Facts()),
    "nvidia-sample": (Nvidia("clusterpolicy-sample.yaml"), Facts(openshift=True)),
}


def load_policy(path: Path) -> ClusterPolicySpec:
    """The first document of a ClusterPolicy file, validated."""
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return parse_document(docs[0])


def case(name: str) -> tuple[ClusterPolicySpec, Facts]:
    source, facts = CASES[name]
    path = prerequisites.nvidia(source.name) if isinstance(source, Nvidia) else source
    return load_policy(path), facts
