"""deploy/ (with the Helm chart) and bundle/ are generated: a test fails as soon as they drift
from the generator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import gpu_operator
from gpu_operator.api import gpucluster
from gpu_operator.install import bundle, helm, manifests
from tests.paths import REPO

DEPLOY = REPO / "deploy"
CHART = REPO / helm.CHART_DIR
BUNDLE = REPO / "bundle"
EXAMPLE = REPO / "examples" / "clusterpolicy.yaml"
REGENERATE = "run `make manifests`"


def committed(root: Path) -> dict[str, str]:
    """The files under ``root``; deploy/'s own, without the chart below it."""
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file() and (root != DEPLOY or CHART not in p.parents)
    }


def expected_bundle() -> dict[str, str]:
    example = yaml.safe_load(EXAMPLE.read_text())
    return bundle.bundle_files(gpu_operator.__version__, example)


@pytest.mark.parametrize(
    ("root", "generate"),
    [(DEPLOY, manifests.deploy_files), (BUNDLE, expected_bundle), (CHART, helm.chart_files)],
    ids=["deploy", "bundle", "chart"],
)
def test_committed_files_match_the_generator(
    root: Path, generate: Callable[[], dict[str, str]]
) -> None:
    want = generate()
    have = committed(root)
    assert sorted(have) == sorted(want), (
        f"{root.name}/ has other files than generated: {REGENERATE}"
    )
    stale = [name for name in want if have[name] != want[name]]
    assert not stale, f"stale in {root.name}/: {stale}; {REGENERATE}"


def test_committed_bundle_is_the_package_version() -> None:
    csv = yaml.safe_load((BUNDLE / bundle.CSV_FILE).read_text())
    assert csv["spec"]["version"] == gpu_operator.__version__ == "0.1.0"
    assert csv["metadata"]["name"] == "gpu-operator.v0.1.0"


def test_deploy_and_bundle_run_the_same_operator() -> None:
    """The one-source promise, checked on the committed files themselves."""
    deploy_docs = [
        d for p in sorted(DEPLOY.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
    ]
    deploy = {
        d["kind"]: d for d in deploy_docs if d["metadata"]["name"] != "gpuclusters.nvidia.com"
    }
    csv = yaml.safe_load((BUNDLE / bundle.CSV_FILE).read_text())
    install = csv["spec"]["install"]["spec"]
    assert install["deployments"][0]["spec"] == deploy["Deployment"]["spec"]
    assert install["clusterPermissions"][0]["rules"] == deploy["ClusterRole"]["rules"]
    assert install["permissions"][0]["rules"] == deploy["Role"]["rules"]
    crd = yaml.safe_load((BUNDLE / bundle.CRD_FILE).read_text())
    assert crd == deploy["CustomResourceDefinition"]
    service = yaml.safe_load((BUNDLE / bundle.SERVICE_FILE).read_text())
    deploy["Service"]["metadata"].pop("namespace")
    assert service == deploy["Service"]
    pdb = yaml.safe_load((BUNDLE / bundle.PDB_FILE).read_text())
    deploy["PodDisruptionBudget"]["metadata"].pop("namespace")
    assert pdb == deploy["PodDisruptionBudget"]


def test_committed_alm_example_is_examples_clusterpolicy() -> None:
    csv = yaml.safe_load((BUNDLE / bundle.CSV_FILE).read_text())
    examples = json.loads(csv["metadata"]["annotations"]["alm-examples"])
    assert examples == [yaml.safe_load(EXAMPLE.read_text()), gpucluster.example_document()]
