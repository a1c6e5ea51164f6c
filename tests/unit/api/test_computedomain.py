"""NVIDIA's ComputeDomain: its own documents load unchanged, bad ones name the field in one
line, the CRD generated from the models is committed and keeps NVIDIA's schema, and a channel
claim joins a domain only from the domain's namespace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.api.computedomain import (
    ComputeDomain,
    ComputeDomainSpec,
    channel_config,
    claim_allowed,
    claim_domain_id,
    daemon_config,
    parse_computedomain,
    parse_computedomain_spec,
)
from gpu_operator.api.crd import computedomain_crd, printable_crds
from gpu_operator.api.policy import PolicyError
from gpu_operator.cli import dump_yaml
from tests.paths import REPO
from tests.schema import prune_nulls, strict

CRD_FILE = REPO / "crds" / "computedomain.yaml"

# NVIDIA's own ComputeDomain documents, unchanged.
NVIDIA_DOCUMENTS = {
    # NVIDIA GPU Operator documentation, "Run a Multi-node nvbandwidth Test Requiring IMEX
    # Channels with MPI" (the DRA driver's ComputeDomain page).
    "nvbandwidth": """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: nvbandwidth-test-compute-domain
spec:
  numNodes: 4
  channel:
    resourceClaimTemplate:
      name: nvbandwidth-test-compute-domain-channel
""",
    # kubernetes-sigs/dra-driver-nvidia-gpu,
    # demo/specs/imex/host-managed/smoke-channel-injection.yaml
    "smoke-channel-injection": """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: hostmanaged-smoke
spec:
  numNodes: 0
  channel:
    resourceClaimTemplate:
      name: hostmanaged-smoke-channel
    allocationMode: Single
""",
    # kubernetes-sigs/dra-driver-nvidia-gpu,
    # demo/specs/imex/host-managed/negative-allocationmode-all.yaml
    "allocationmode-all": """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: hostmanaged-all
spec:
  numNodes: 0
  channel:
    resourceClaimTemplate:
      name: hostmanaged-all-channel
    allocationMode: All
""",
}

# The schema of NVIDIA's published CRD (kubernetes-sigs/dra-driver-nvidia-gpu,
# deployments/helm/dra-driver-nvidia-gpu/crds/resource.nvidia.com_computedomains.yaml),
# transcribed without its descriptions.
NVIDIA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["channel"],
            "x-kubernetes-validations": [
                {"message": "A computeDomain.spec is immutable", "rule": "self == oldSelf"}
            ],
            "properties": {
                "channel": {
                    "type": "object",
                    "required": ["resourceClaimTemplate"],
                    "properties": {
                        "allocationMode": {
                            "type": "string",
                            "default": "Single",
                            "enum": ["All", "Single"],
                        },
                        "resourceClaimTemplate": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                },
                "numNodes": {"type": "integer", "default": 0, "minimum": 0},
            },
        },
        "status": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "nodes": {
                    "type": "array",
                    "x-kubernetes-list-map-keys": ["name"],
                    "x-kubernetes-list-type": "map",
                    "items": {
                        "type": "object",
                        "required": ["cliqueID", "ipAddress", "name"],
                        "properties": {
                            "cliqueID": {"type": "string"},
                            "index": {"type": "integer"},
                            "ipAddress": {"type": "string"},
                            "name": {"type": "string"},
                            "status": {
                                "type": "string",
                                "default": "NotReady",
                                "enum": ["Ready", "NotReady"],
                            },
                        },
                    },
                },
                "status": {"type": "string", "default": "NotReady", "enum": ["Ready", "NotReady"]},
            },
        },
    },
}


def ours() -> dict[str, Any]:
    schema: dict[str, Any] = computedomain_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def document(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "domain", "namespace": "team-a", "uid": "uid-1"},
        "spec": spec,
    }


def channel(name: str = "channel", **more: Any) -> dict[str, Any]:
    return {"resourceClaimTemplate": {"name": name}, **more}


@pytest.mark.parametrize("name", sorted(NVIDIA_DOCUMENTS))
def test_nvidias_documents_are_accepted_unchanged(name: str) -> None:
    doc = yaml.safe_load(NVIDIA_DOCUMENTS[name])
    jsonschema.validate(prune_nulls(doc), strict(ours()))
    jsonschema.validate(doc, NVIDIA_SCHEMA)
    domain = parse_computedomain(doc)
    assert domain.template_name == doc["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert domain.spec.num_nodes == doc["spec"]["numNodes"]
    assert domain.spec.channel.allocation_mode == doc["spec"]["channel"].get(
        "allocationMode", "Single"
    )
    assert domain.namespace == "default"  # none given: kubectl's


def test_the_defaults_are_nvidias() -> None:
    spec = parse_computedomain_spec({"channel": channel()})
    assert spec.num_nodes == 0
    assert spec.channel.allocation_mode == "Single"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.channel: Field required"),
        ({"channel": {}}, "spec.channel.resourceClaimTemplate: Field required"),
        ({"channel": {"resourceClaimTemplate": {}}}, "spec.channel.resourceClaimTemplate.name"),
        ({"channel": channel(allocationMode="Many")}, "spec.channel.allocationMode"),
        ({"channel": channel(), "numNodes": -1}, "spec.numNodes"),
        ({"channel": channel(), "numNodes": "4"}, "spec.numNodes"),
        ({"channel": channel(), "nodes": 4}, "spec.nodes: unknown field"),
        ({"channel": channel("Not_A_Name")}, "spec.channel.resourceClaimTemplate.name"),
    ],
)
def test_a_bad_document_is_refused_in_one_line_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_computedomain(document(**spec))
    (line,) = caught.value.problems
    assert line.startswith(field), line


def test_the_template_name_error_suggests_one() -> None:
    with pytest.raises(PolicyError, match="such as 'not-a-name'"):
        parse_computedomain_spec({"channel": channel("Not_A_Name")})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"apiVersion": "resource.nvidia.com/v1"}, "apiVersion: must be"),
        ({"kind": "ComputeDomains"}, "kind: must be ComputeDomain"),
        ({"metadata": {}}, "metadata.name"),
        ({"spec": None}, "spec: must be a mapping"),
    ],
)
def test_a_bad_object_is_refused_naming_what(change: dict[str, Any], problem: str) -> None:
    doc = {**document(channel=channel()), **change}
    with pytest.raises(PolicyError, match=problem):
        parse_computedomain(doc)


def test_a_deleted_domain_is_known_as_such() -> None:
    doc = document(channel=channel())
    doc["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert parse_computedomain(doc).deleting


# -- the CRD


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == dump_yaml([computedomain_crd()]), (
        "crds/computedomain.yaml is stale: run `make manifests`"
    )


def test_crd_shape_is_nvidias() -> None:
    crd = computedomain_crd()
    assert crd["metadata"]["name"] == "computedomains.resource.nvidia.com"
    assert crd["spec"]["names"] == {
        "kind": "ComputeDomain",
        "listKind": "ComputeDomainList",
        "plural": "computedomains",
        "singular": "computedomain",
    }
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta1", True, True)
    assert version["subresources"] == {"status": {}}
    spec = ours()["properties"]["spec"]
    assert (
        spec["x-kubernetes-validations"]
        == NVIDIA_SCHEMA["properties"]["spec"]["x-kubernetes-validations"]
    )


def test_every_nvidia_field_exists_in_ours_with_its_type_default_and_rules() -> None:
    theirs = dict(walk(NVIDIA_SCHEMA))
    mine = dict(walk(ours()))
    assert [p for p in theirs if p not in mine] == []
    for path, node in theirs.items():
        for key in ("type", "default", "enum", "minimum", "x-kubernetes-list-type"):
            if key in node:
                assert mine[path].get(key) == node[key], (path, key)
        for key in ("required", "x-kubernetes-list-map-keys"):
            if key in node:
                assert sorted(mine[path].get(key) or ()) == sorted(node[key]), (path, key)


def test_our_only_addition_is_the_status_conditions() -> None:
    theirs = set(dict(walk(NVIDIA_SCHEMA)))
    added = {p for p in dict(walk(ours())) if p not in theirs}
    assert {p for p in added if not p.startswith(".status.conditions")} == set()
    conditions = ours()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_a_status_as_the_operator_writes_it_fits_both_schemas() -> None:
    doc = yaml.safe_load(NVIDIA_DOCUMENTS["nvbandwidth"])
    doc["status"] = {
        "status": "NotReady",
        "nodes": [
            {"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "c.1", "index": 0,
             "status": "Ready"},
        ],
    }  # fmt: skip
    jsonschema.validate(doc, NVIDIA_SCHEMA)
    doc["status"]["conditions"] = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "DaemonNotReady",
            "message": "IMEX daemon not ready on n2: CrashLoopBackOff",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
        }
    ]
    jsonschema.validate(doc, strict(ours()))


def test_the_crd_is_printed_but_not_installed() -> None:
    kinds = [c["spec"]["names"]["kind"] for c in printable_crds()]
    assert kinds[-1] == "ComputeDomain" and kinds.count("ComputeDomain") == 1
    from gpu_operator.api.crd import all_crds

    assert "ComputeDomain" not in [c["spec"]["names"]["kind"] for c in all_crds()]


# -- the opaque configs and who may claim a channel


def test_the_opaque_configs_are_nvidias() -> None:
    assert channel_config("uid-1", "All") == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": "uid-1",
        "allocationMode": "All",
    }
    assert daemon_config("uid-1") == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainDaemonConfig",
        "domainID": "uid-1",
    }


def claim(parameters: dict[str, Any], driver: str = "compute-domain.nvidia.com") -> dict[str, Any]:
    config = [{"requests": ["channel"], "opaque": {"driver": driver, "parameters": parameters}}]
    return {
        "metadata": {"name": "c", "namespace": "team-a"},
        "spec": {"devices": {"config": config}},
    }


def test_a_claim_names_its_domain_through_its_channel_config() -> None:
    assert claim_domain_id(claim(channel_config("uid-1", "Single"))) == "uid-1"
    assert claim_domain_id(claim(daemon_config("uid-1"))) is None  # a daemon's, not a channel
    assert claim_domain_id(claim(daemon_config("uid-1")), "ComputeDomainDaemonConfig") == "uid-1"
    assert claim_domain_id(claim(channel_config("uid-1", "Single"), "gpu.nvidia.com")) is None
    assert claim_domain_id({"metadata": {"name": "c"}}) is None
    allocated = {
        "metadata": {"name": "c"},
        "status": {"allocation": {"devices": {"config": claim(channel_config("u2", "All"))[
            "spec"]["devices"]["config"]}}},
    }  # fmt: skip
    assert claim_domain_id(allocated) == "u2"


def domain(namespace: str = "team-a", deleting: bool = False) -> ComputeDomain:
    spec = ComputeDomainSpec.model_validate({"channel": channel()})
    return ComputeDomain("domain", namespace, "uid-1", spec, deleting)


def test_a_claim_from_the_domains_namespace_is_allowed() -> None:
    assert claim_allowed(domain(), "team-a") is None


def test_a_claim_from_another_namespace_is_refused_naming_both() -> None:
    reason = claim_allowed(domain(), "team-b")
    assert reason is not None
    assert "team-a/domain" in reason and "team-b" in reason


def test_a_claim_of_no_domain_or_a_deleted_one_is_refused() -> None:
    assert "no ComputeDomain" in (claim_allowed(None, "team-a") or "")
    assert "being deleted" in (claim_allowed(domain(deleting=True), "team-a") or "")
