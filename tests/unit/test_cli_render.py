"""``gpu-operator render``: output on stdout, problems on stderr, exit codes a script can use."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from gpu_operator.cli import main
from tests import prerequisites

POLICY = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: p
spec:
  mig:
    strategy: {strategy}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_render_defaults_prints_multi_document_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render"]) == 0
    out, err = capsys.readouterr()
    docs = list(yaml.safe_load_all(out))
    assert err == ""
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ServiceAccount", "RuntimeClass"}
    assert all(d["metadata"].get("namespace") in {None, "gpu-operator"} for d in docs)


def test_render_file_with_facts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, POLICY.format(strategy="mixed"))
    argv = ["render", "-f", path, "-n", "gpu", "--node-os", "ubuntu24.04", "--node-os", "rhel9.4"]
    assert main([*argv, "--runtime", "crio"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"}
    assert {"nvidia-driver-daemonset-ubuntu24.04", "nvidia-driver-daemonset-rhel9"} <= names
    assert "nvidia-driver-daemonset-ubuntu22.04" not in names
    toolkit = next(d for d in docs if d["metadata"]["name"] == "nvidia-container-toolkit-daemonset")
    env = toolkit["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RUNTIME", "value": "crio"} in env
    assert all(d["metadata"].get("namespace") in {None, "gpu"} for d in docs)


def test_json_output_is_a_kubernetes_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-o", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["kind"] == "List" and listing["apiVersion"] == "v1"
    assert len(listing["items"]) > 20


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(POLICY.format(strategy="none")))
    assert main(["render", "-f", "-"]) == 0
    assert "MIG_STRATEGY" in capsys.readouterr().out


def test_nvidia_helm_default_renders(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(prerequisites.nvidia("clusterpolicy-helm-default.yaml"))
    assert main(["render", "-f", path]) == 0
    assert "nvidia-driver-daemonset-ubuntu22.04" in capsys.readouterr().out


def test_invalid_field_is_named_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, POLICY.format(strategy="bogus"))
    assert main(["render", "-f", path]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "spec.mig.strategy" in err
    assert err.startswith("error: ")


def test_unknown_key_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, POLICY.format(strategy="single") + "  devicePlugn:\n    enabled: true\n")
    assert main(["render", "-f", path]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "spec.devicePlugn" in err and "unknown field" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: ConfigMap\n", "kind: must be ClusterPolicy"),
        ("spec: [unclosed\n", "not valid YAML"),
        ("", "found no document"),
        ("- a list\n", "found a list"),
    ],
)
def test_bad_documents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    assert main(["render", "-f", write(tmp_path, text)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "-f", str(tmp_path / "nope.yaml")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "nope.yaml: cannot read" in err


@pytest.mark.parametrize("argv", [["render", "--node-os", "ubuntu"], ["render", "-o", "xml"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().out == ""


def test_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(prerequisites.nvidia("clusterpolicy-sample.yaml"))
    assert main(["render", "--summary", "-f", path, "--node-os", "rhel9.4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["COMPONENT", "ENABLED", "OBJECTS", "IMAGE"]
    rows = {line.split()[0]: line.split() for line in lines[1:9]}
    assert list(rows) == [
        "driver",
        "container-toolkit",
        "operator-validator",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "gpu-feature-discovery",
        "mig-manager",
    ]
    assert rows["dcgm"][1] == "yes"
    assert rows["driver"][3] == "nvcr.io/nvidia/driver:580.95.05-rhel9"
    assert int(rows["mig-manager"][2]) > 0
    assert len(lines) == 9


def test_summary_names_sections_not_implemented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, POLICY.format(strategy="single") + "  gds:\n    enabled: true\n")
    assert main(["render", "--summary", "-f", path]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "not implemented, ignored: gds"
