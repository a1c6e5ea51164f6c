"""``gpu-operator render``: output on stdout, problems on stderr, exit codes a script can use."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api.crd import computedomain_crd
from gpu_operator.cli import main
from gpu_operator.render.components import REGISTRY
from gpu_operator.render.driver import POOL_LABEL
from tests import prerequisites
from tests.paths import REPO
from tests.schema import prune_nulls, strict, validate_kubernetes

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
        (
            "apiVersion: v1\nkind: ConfigMap\n",
            "metadata.name: required (kubectl apply names every object)",
        ),
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
    sandbox = [line.split() for line in lines[9:]]
    assert [row[0] for row in sandbox] == [c.name for c in REGISTRY if c.sandbox]
    assert {row[1] for row in sandbox} == {"no"}  # sandboxWorkloads is off in the sample


def test_summary_names_sections_not_implemented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, POLICY.format(strategy="single") + "  gds:\n    enabled: true\n")
    assert main(["render", "--summary", "-f", path]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "not implemented, ignored: gds"


# NVIDIADriver and GPUCluster, and streams of several documents.

DRIVER = """\
apiVersion: nvidia.com/v1alpha1
kind: NVIDIADriver
metadata:
  name: a100
spec:
  version: "570.172.08"
"""
CLUSTER = """\
apiVersion: nvidia.com/v1alpha1
kind: GPUCluster
metadata:
  name: gpu-cluster
spec:
  draDriver: {}
"""
DRA_PLUGIN = ("DaemonSet", "nvidia-dra-driver-kubelet-plugin")


def rendered(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The objects ``render`` prints, each checked against Kubernetes' own schema (stderr holds
    at most notes on what was left out)."""
    assert main(["render", *argv]) == 0
    out, err = capsys.readouterr()
    assert all(line.startswith("note: ") for line in err.splitlines()), err
    docs = list(yaml.safe_load_all(out))
    for doc in docs:
        if doc["kind"] == "ComputeDomain":  # NVIDIA's custom resource: its CRD's schema
            schema = computedomain_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate(prune_nulls(doc), strict(schema))
            continue
        assert validate_kubernetes(doc), f"no schema for {doc['kind']}"
    return docs


def kinds_names(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def daemonsets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}


def images(ds: dict[str, Any]) -> list[str]:
    return [c["image"] for c in ds["spec"]["template"]["spec"]["containers"]]


def test_nvidia_nvidiadriver_sample_one_daemonset_per_node_os(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(prerequisites.nvidia("nvidiadriver-sample.yaml"))
    docs = rendered(["-f", path, "--node-os", "ubuntu22.04", "--node-os", "rhel9.4"], capsys)
    drivers = daemonsets(docs)
    assert sorted(name.rsplit("-", 1)[0] for name in drivers) == [
        "nvidia-gpu-driver-rhel9.4",
        "nvidia-gpu-driver-ubuntu22.04",
    ]
    assert sorted(image for ds in drivers.values() for image in images(ds)) == [
        "nvcr.io/nvidia/driver:595.91.07-rhel9.4",
        "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04",
    ]
    for ds in drivers.values():  # the pool the controller labels the sample's nodes with
        selector = ds["spec"]["template"]["spec"]["nodeSelector"]
        assert selector[POOL_LABEL] == "nvidiadriver-sample"
    assert {"ServiceAccount", "ConfigMap", "Role", "ClusterRole"} <= {d["kind"] for d in docs}
    assert all(d["metadata"].get("namespace") in {None, "gpu-operator"} for d in docs)


def test_nvidia_gpucluster_sample(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(prerequisites.nvidia("gpucluster-sample.yaml"))
    docs = rendered(["-f", path, "-n", "gpus", "--operator-image", "example.com/op:v1"], capsys)
    assert {
        DRA_PLUGIN,
        ("DeviceClass", "gpu.nvidia.com"),
        ("DaemonSet", "nvidia-dra-validator"),
        ("DaemonSet", "nvidia-dcgm-exporter-dra"),
    } <= kinds_names(docs)
    # NVIDIA's sample enables computeDomains: the plugin's second container and the controller
    assert images(daemonsets(docs)[DRA_PLUGIN[1]]) == ["example.com/op:v1"] * 2
    assert ("Deployment", "nvidia-dra-driver-controller") in kinds_names(docs)
    assert all(d["metadata"].get("namespace") in {None, "gpus"} for d in docs)
    assert main(["render", "--summary", "-f", path]) == 0
    summary = capsys.readouterr().out.splitlines()
    assert summary[0].split() == ["KIND", "NAME", "IMAGE"]
    assert not [line for line in summary if "not implemented" in line]


def test_project_gpucluster_example(capsys: pytest.CaptureFixture[str]) -> None:
    docs = rendered(["-f", str(REPO / "examples" / "gpucluster.yaml")], capsys)
    assert {DRA_PLUGIN, ("DeviceClass", "gpu.nvidia.com")} <= kinds_names(docs)
    assert not any(d["kind"] == "DaemonSet" and "device-plugin" in d["metadata"]["name"]
                   for d in docs)  # fmt: skip


def test_project_nvidiadriver_pools_example(capsys: pytest.CaptureFixture[str]) -> None:
    """Two NVIDIADrivers (one precompiled) and the ClusterPolicy that hands the driver over."""
    path = str(REPO / "examples" / "nvidiadriver-pools.yaml")
    kernel = "5.14.0-427.13.1.el9_4.x86_64"
    docs = rendered(["-f", path, "--node-os", "rhel9.4", "--kernel", kernel], capsys)
    drivers = daemonsets(docs)
    pools = {
        ds["spec"]["template"]["spec"]["nodeSelector"].get(POOL_LABEL): ds
        for ds in drivers.values()
    }
    pools.pop(None)  # the ClusterPolicy's DaemonSets
    assert sorted(pools) == ["h100", "t4"]
    assert images(pools["h100"])[0] == f"nvcr.io/nvidia/driver:580-{kernel}-rhel9.4"
    assert images(pools["t4"]) == ["nvcr.io/nvidia/driver:535.261.03-rhel9.4"]
    # useNvidiaDriverCRD: the ClusterPolicy renders its stack but no driver of its own.
    assert "nvidia-device-plugin-daemonset" in drivers
    assert not any(name.startswith("nvidia-driver-daemonset") for name in drivers)

    assert main(["render", "--summary", "-f", path, "--kernel", kernel]) == 0
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if line.startswith("# ")]
    assert headers == ["# NVIDIADriver h100", "# NVIDIADriver t4", "# ClusterPolicy cluster-policy"]
    h100 = lines[lines.index("# NVIDIADriver h100") + 1 : lines.index("# NVIDIADriver t4")]
    assert h100[0].split() == ["KIND", "NAME", "IMAGE"]
    assert [row.split()[0] for row in h100[1:]].count("DaemonSet") == 1
    policy = lines[lines.index("# ClusterPolicy cluster-policy") + 1 :]
    assert policy[0].split() == ["COMPONENT", "ENABLED", "OBJECTS", "IMAGE"]
    assert policy[1].split()[:3] == ["driver", "no", "0"]


def test_precompiled_driver_without_a_kernel_renders_no_daemonset_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As for nodes without the kernel label: no pool, so no DaemonSet; --kernel makes one."""
    path = write(tmp_path, DRIVER + "  usePrecompiled: true\n")
    assert main(["render", "-f", path]) == 0
    out, err = capsys.readouterr()
    assert "DaemonSet" not in {d["kind"] for d in yaml.safe_load_all(out) if d}
    assert err.startswith("note: NVIDIADriver a100: spec.usePrecompiled") and "--kernel" in err


def test_nvidiadriver_summary_and_facts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, DRIVER)
    argv = ["-f", path, "-n", "gpu", "--node-os", "ubuntu24.04", "--node-os", "ubuntu22.04"]
    docs = rendered(argv, capsys)
    assert all(d["metadata"].get("namespace") in {None, "gpu"} for d in docs)
    assert main(["render", "--summary", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "IMAGE"]
    assert len(lines) == 1 + len(docs)
    rows = [line.split() for line in lines[1:] if line.startswith("DaemonSet")]
    assert [row[2].split(",")[-1] for row in rows] == [
        "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04",
        "nvcr.io/nvidia/driver:570.172.08-ubuntu24.04",
    ]


def test_json_output_of_a_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, DRIVER + "---\n" + CLUSTER)
    assert main(["render", "-o", "json", "-f", path]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    names = {d["metadata"]["name"] for d in items if d["kind"] == "DaemonSet"}
    assert DRA_PLUGIN[1] in names
    assert [n for n in names if n.startswith("nvidia-gpu-driver-ubuntu22.04-")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DRIVER + "  driverType: cuda\n", "spec.driverType: "),
        (DRIVER + "  kernelModuleTyp: open\n", "spec.kernelModuleTyp: unknown field"),
        (DRIVER + "  default: true\n  nodeSelector: {a: b}\n", "spec.nodeSelector: default"),
        (DRIVER.replace("name: a100", "labels: {}"), "metadata.name: required"),
        (DRIVER.replace("v1alpha1", "v1"), "apiVersion: must be nvidia.com/v1alpha1"),
        (CLUSTER.replace("{}", "{gpus: {kubeletPlugin: {env: 1}}}"), "spec.draDriver.gpus"),
        (CLUSTER.replace("draDriver: {}", "dcgm: {}"), "spec.draDriver: "),
        (CLUSTER.replace("name: gpu-cluster", "name: other"), "metadata.name: GPUCluster is"),
        (CLUSTER.replace("spec:\n  draDriver: {}\n", ""), "spec: must be a mapping"),
    ],
    ids=["driverType", "unknown", "default-selector", "no-name", "apiVersion",
         "draDriver-field", "no-draDriver", "not-singleton", "no-spec"],
)  # fmt: skip
def test_invalid_driver_and_cluster_documents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    assert main(["render", "-f", write(tmp_path, text)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and message in err


def test_every_bad_document_of_a_stream_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "---\n".join(
        [CLUSTER, DRIVER + "  driverType: cuda\n", POLICY.format(strategy="bogus"), "kind: Pod\n"]
    )
    path = write(tmp_path, text)
    assert main(["render", "-f", path]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith(f"error: {path} (document 2): spec.driverType")
    assert lines[1].startswith(f"error: {path} (document 3): spec.mig.strategy")
    assert lines[2:] == [
        f"error: {path} (document 4): apiVersion: required (every document must be a Kubernetes "
        "object)",
        f"error: {path} (document 4): metadata.name: required (kubectl apply names every object)",
    ]


def test_help_says_what_each_kind_renders(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["render", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for kind in ("ClusterPolicy (nvidia.com/v1)", "NVIDIADriver (nvidia.com/v1alpha1)",
                 "GPUCluster (nvidia.com/v1alpha1)"):  # fmt: skip
        assert kind in text
