"""`gpu-operator deploy`, `bundle` and `chart`: what they print and what they write."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import gpu_operator
from gpu_operator.cli import main
from gpu_operator.install import bundle, helm, manifests
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "clusterpolicy.yaml"


def test_deploy_prints_the_objects(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == manifests.deploy_objects()


def test_deploy_namespace_and_image(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "-n", "gpus", "--image", "mirror.example/op:v1"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == manifests.deploy_objects("gpus", "mirror.example/op:v1")
    assert docs[0] == manifests.namespace_object("gpus")


def test_deploy_writes_numbered_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deploy"
    assert main(["deploy", "--output-dir", str(out)]) == 0
    written = {p.name: p.read_text() for p in out.iterdir()}
    assert written == manifests.deploy_files()
    assert sorted(written) == [
        "00-namespace.yaml",
        "01-crd.yaml",
        "02-rbac.yaml",
        "03-operator.yaml",
    ]
    assert capsys.readouterr().out.count("wrote ") == 4


def test_bundle_writes_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # --example defaults to examples/clusterpolicy.yaml
    version = gpu_operator.__version__
    assert main(["bundle", "--version", version, "--output-dir", str(tmp_path)]) == 0
    written = {
        str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()
    }
    assert written == bundle.bundle_files(version, yaml.safe_load(EXAMPLE.read_text()))


def test_bundle_prints_its_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bundle", "--version", "2.0.0", "--example", str(EXAMPLE)]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == [
        "ClusterServiceVersion",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "Service",
        "PodDisruptionBudget",
    ]


def test_bundle_needs_a_version() -> None:
    with pytest.raises(SystemExit):
        main(["bundle"])


def test_bundle_refuses_a_version_olm_cannot_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert (
        main(
            ["bundle", "--version", "v1", "--example", str(EXAMPLE), "--output-dir", str(tmp_path)]
        )
        == 1
    )
    assert "error: bundle version must be semantic" in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing written on error"


def test_bundle_refuses_an_invalid_example(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nspec:\n  mig: {strategy: all}\n"
    )
    assert main(["bundle", "--version", "0.1.0", "--example", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: spec.mig.strategy")
    missing = tmp_path / "missing.yaml"
    assert main(["bundle", "--version", "0.1.0", "--example", str(missing)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_chart_writes_the_chart_and_the_readme_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n<!-- helm-values-table:start -->\nold\n<!-- helm-values-table:end -->\nz\n"
    )
    out = tmp_path / "chart"
    assert main(["chart", "--output-dir", str(out), "--readme", str(readme)]) == 0
    written = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert written == helm.chart_files()
    text = readme.read_text()
    assert text.startswith("# x\n<!-- helm-values-table:start -->\n| values key |")
    assert text.endswith("<!-- helm-values-table:end -->\nz\n") and "old" not in text


def test_chart_says_when_the_readme_has_no_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert main(["chart", "--output-dir", str(tmp_path / "c"), "--readme", str(readme)]) == 1
    assert "no <!-- helm-values-table:start -->" in capsys.readouterr().err
    assert readme.read_text() == "# no markers\n"
