"""The ClusterPolicy models: NVIDIA's documents load unchanged, bad input names its field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_operator.api import API_VERSION, KIND, PolicyError, parse_document, parse_spec
from tests import prerequisites

NVIDIA_DOCS = ["clusterpolicy-helm-default.yaml", "clusterpolicy-sample.yaml"]


def nvidia_doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(prerequisites.nvidia(name).read_text())
    return doc


@pytest.mark.parametrize("name", NVIDIA_DOCS)
def test_nvidia_documents_load_unchanged(name: str) -> None:
    doc = nvidia_doc(name)
    spec = parse_document(doc)
    # Round trip: everything NVIDIA wrote is preserved (nulls are absent, as in the apiserver).
    assert _without_nulls(spec.to_wire()) == _without_nulls(doc["spec"])


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def test_helm_default_values_are_read() -> None:
    spec = parse_document(nvidia_doc("clusterpolicy-helm-default.yaml"))
    policy = spec.driver.upgrade_policy
    assert policy is not None
    assert policy.max_unavailable == "25%"  # written `maxUnavailable : 25%` in the file
    assert policy.max_parallel_upgrades == 1
    assert spec.mig.strategy == "single"
    assert spec.daemonsets.tolerations and spec.daemonsets.tolerations[0].key == "nvidia.com/gpu"
    assert spec.vgpu_device_manager.enabled is True
    assert spec.vgpu_device_manager.to_wire() == {
        "enabled": True,
        "repository": "nvcr.io/nvidia/cloud-native",
        "image": "vgpu-device-manager",
        "version": "v0.5.0",
        "imagePullPolicy": "IfNotPresent",
        "config": {"default": "default", "name": ""},
    }
    assert spec.kata_manager.to_wire() == {"enabled": False, "imagePullPolicy": "IfNotPresent"}
    assert spec.kata_sandbox_device_plugin.to_wire() == {
        "enabled": True,
        "repository": "nvcr.io/nvidia/cloud-native",
        "image": "nvidia-sandbox-device-plugin",
        "version": "v0.0.5",
        "imagePullPolicy": "IfNotPresent",
    }


def test_null_section_means_absent() -> None:
    spec = parse_document(nvidia_doc("clusterpolicy-sample.yaml"))
    assert spec.validator.plugin is None  # `plugin:` with no value in NVIDIA's sample


def test_empty_spec_uses_defaults() -> None:
    spec = parse_spec({})
    assert spec.driver.enabled and spec.toolkit.enabled and spec.device_plugin.enabled
    assert spec.gfd.enabled and spec.dcgm_exporter.enabled and spec.mig_manager.enabled
    assert not spec.dcgm.enabled and not spec.node_status_exporter.enabled
    assert not spec.gds.enabled and not spec.gdrcopy.enabled
    assert spec.gpu_node_taint.key == "nvidia.com/gpu"
    assert spec.gpu_node_taint.effect == "NoSchedule"
    assert spec.unimplemented_enabled() == []


def test_unimplemented_sections_are_reported_when_enabled() -> None:
    spec = parse_spec(
        {
            "gds": {"enabled": True},
            "sandboxWorkloads": {"enabled": True, "mode": "kata"},
            "kataManager": {"enabled": True},
            "vfioManager": {"enabled": True},
            "nodeStatusExporter": {"enabled": True},
        }
    )
    assert spec.unimplemented_enabled() == ["nodeStatusExporter", "gds"]
    # both sandbox modes and the sandbox operands are implemented
    for mode in ("kubevirt", "kata"):
        sandbox = {"enabled": True, "mode": mode}
        both = parse_spec(
            {"sandboxWorkloads": sandbox, "kataSandboxDevicePlugin": {"enabled": True}}
        )
        assert both.unimplemented_enabled() == []
    # NVIDIA's Helm default enables sandbox operands, which only act with sandboxWorkloads on.
    helm = parse_document(nvidia_doc("clusterpolicy-helm-default.yaml"))
    assert helm.unimplemented_enabled() == []


@pytest.mark.parametrize(
    ("spec", "field", "hint"),
    [
        ({"mig": {"strategy": "bogus"}}, "spec.mig.strategy", "'none', 'single' or 'mixed'"),
        ({"toolkit": {"enabled": "maybe"}}, "spec.toolkit.enabled", "boolean"),
        ({"devicePlugin": {"args": "--foo"}}, "spec.devicePlugin.args", "list"),
        (
            {"driver": {"upgradePolicy": {"maxParallelUpgrades": -1}}},
            "spec.driver.upgradePolicy.maxParallelUpgrades",
            "greater than or equal to 0",
        ),
        (
            {"driver": {"upgradePolicy": {"maxUnavailable": "25 percent"}}},
            "spec.driver.upgradePolicy.maxUnavailable",
            '"25%"',
        ),
        (
            {"driver": {"upgradePolicy": {"maxUnavailable": "150%"}}},
            "spec.driver.upgradePolicy.maxUnavailable",
            "0% to 100%",
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "one"}}},
            "spec.daemonsets.rollingUpdate.maxUnavailable",
            "0% to 100%",
        ),
        ({"devicePlugn": {}}, "spec.devicePlugn", "unknown field"),
        ({"driver": {"verison": "1"}}, "spec.driver.verison", "unknown field"),
        ({"driver": {"imagePullPolicy": "always"}}, "spec.driver.imagePullPolicy", "'Always'"),
        ({"driver": {"env": [{"value": "x"}]}}, "spec.driver.env[0].name", "required"),
        (
            {"daemonsets": {"updateStrategy": "Recreate"}},
            "spec.daemonsets.updateStrategy",
            "OnDelete",
        ),
    ],
)
def test_bad_input_names_the_field(spec: dict[str, Any], field: str, hint: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_spec(spec)
    problems = info.value.problems
    assert any(p.startswith(field + ":") and hint in p for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PolicyError) as info:
        parse_spec({"mig": {"strategy": "x"}, "toolkit": {"enabled": "x"}, "bogus": 1})
    fields = sorted(p.split(":")[0] for p in info.value.problems)
    assert fields == ["spec.bogus", "spec.mig.strategy", "spec.toolkit.enabled"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"apiVersion": "nvidia.com/v2", "kind": KIND}, "apiVersion: must be nvidia.com/v1"),
        ({"apiVersion": API_VERSION, "kind": "NVIDIADriver"}, "kind: must be ClusterPolicy"),
        ({"apiVersion": API_VERSION, "kind": KIND, "spec": []}, "spec: must be a mapping"),
    ],
)
def test_document_envelope_is_checked(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_document(doc)


@pytest.mark.parametrize("value", [0, 3, "3", "0%", "25%", "100%"])
def test_max_unavailable_accepts_counts_and_percents(value: int | str) -> None:
    spec = parse_spec({"driver": {"upgradePolicy": {"maxUnavailable": value}}})
    assert spec.driver.upgrade_policy is not None
    assert spec.driver.upgrade_policy.max_unavailable == value
