"""The NVIDIADriver API: NVIDIA's sample and golden inputs accepted, NVIDIA's rules kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api import PolicyError
from gpu_operator.api.crd import nvidiadriver_crd
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.cli import dump_yaml
from tests.paths import REPO
from tests.prerequisites import REFERENCE, reference
from tests.schema import prune_nulls, strict

GOLDEN = REFERENCE / "wild-clusterpolicies" / "golden"
NVIDIA_REFERENCE = REFERENCE / "nvidia"
COMMITTED = REPO / "crds" / "nvidiadriver.yaml"


def need(path: Path) -> Path:
    """``path`` under the reference documents, through the one prerequisite check."""
    return reference(*path.relative_to(REFERENCE).parts)


def ours() -> dict[str, Any]:
    schema: dict[str, Any] = nvidiadriver_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def as_applied() -> dict[str, Any]:
    """Our schema as ``kubectl apply`` meets it: the required fields all have defaults, which
    the API server fills in before it checks them."""
    schema = strict(ours())
    schema["properties"]["spec"].pop("required")
    return schema


def nvidia() -> dict[str, Any]:
    crd = yaml.safe_load(need(NVIDIA_REFERENCE / "nvidiadrivers-crd.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.read_text() == dump_yaml([nvidiadriver_crd()]), "run `make manifests`"


def test_nvidia_sample_is_accepted_unchanged() -> None:
    sample = yaml.safe_load(need(NVIDIA_REFERENCE / "nvidiadriver-sample.yaml").read_text())
    jsonschema.validate(prune_nulls(sample), as_applied())
    spec = parse_driver_spec(sample["spec"])
    assert spec.upgrade_policy is not None and spec.upgrade_policy.max_parallel_upgrades == 1
    assert spec.licensing_config is not None and spec.licensing_config.nls_enabled is True


@pytest.mark.parametrize(
    "name",
    [
        "01-driver-minimal",
        "02-driver-precompiled",
        "03-driver-openshift-drivertoolkit",
        "04-driver-vgpu-host-manager",
        "05-driver-gds",
    ],
)
def test_golden_inputs_are_accepted(name: str) -> None:
    doc = yaml.safe_load(need(GOLDEN / f"{name}.input.yaml").read_text())
    base = yaml.safe_load((GOLDEN / "01-driver-minimal.input.yaml").read_text())
    spec = {**base["renderData"]["Driver"]["Spec"]}
    spec.update(((doc.get("overrides") or {}).get("Driver") or {}).get("Spec") or {})
    gds = ((doc.get("overrides") or {}).get("GDS") or {}).get("Spec")
    if gds:
        spec["gds"] = gds
    jsonschema.validate(prune_nulls({"spec": spec}), as_applied())
    parse_driver_spec(spec)


def test_every_nvidia_spec_field_is_declared() -> None:
    def fields(node: dict[str, Any], path: str = "") -> set[str]:
        out = set()
        for name, child in (node.get("properties") or {}).items():
            out.add(f"{path}.{name}")
            if name not in ("podSecurityContext", "nodeAffinity"):
                out |= fields(child, f"{path}.{name}")
        return out

    theirs = fields(nvidia()["properties"]["spec"])
    assert theirs - fields(ours()["properties"]["spec"]) == set()


def test_cel_rules_and_messages_are_nvidias() -> None:
    def rules(schema: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
        spec = schema["properties"]["spec"]
        found = {"spec": spec.get("x-kubernetes-validations", [])}
        for name, child in spec["properties"].items():
            if "x-kubernetes-validations" in child:
                found[name] = child["x-kubernetes-validations"]
        return found

    assert rules(ours()) == rules(nvidia())
    assert set(rules(ours())) == {"spec", "driverType", "usePrecompiled"}


def test_the_one_rule_added_to_nvidias_keeps_the_name_a_label_value() -> None:
    """NVIDIA's CRD has no rule at the root; ours refuses names the pool label cannot hold, so
    `kubectl apply` refuses what the operator could not label nodes with."""
    assert "x-kubernetes-validations" not in nvidia()
    (rule,) = ours()["x-kubernetes-validations"]
    assert rule["rule"] == "size(self.metadata.name) <= 63"
    assert "nvidia.com/gpu.driver-pool" in rule["message"]


def test_defaults_are_nvidias() -> None:
    spec = ours()["properties"]["spec"]
    theirs = nvidia()["properties"]["spec"]
    for name in ("default", "driverType", "image", "kernelModuleType"):
        assert spec["properties"][name]["default"] == theirs["properties"][name]["default"], name
    assert spec["required"] == theirs["required"]
    policy = spec["properties"]["upgradePolicy"]["properties"]
    assert policy["autoUpgrade"]["default"] is True


def test_bad_field_is_named() -> None:
    with pytest.raises(PolicyError, match=r"spec\.driverType"):
        parse_driver_spec({"driverType": "cpu"})
