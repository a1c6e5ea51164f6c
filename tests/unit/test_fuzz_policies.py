"""Fuzzed ClusterPolicies, NVIDIADrivers and GPUClusters from their CRDs' own schemas (issue
16): whatever the API server would accept is either refused by the operator with the field
named, or renders manifests that pass Kubernetes' own schemas, with no object and no field but
the expected ones; nothing crashes.

At least ``FUZZ_EXAMPLES`` (2,000) ClusterPolicies per run and a quarter as many of each of the
other two kinds, seeded: ``FUZZ_SEED`` picks the seed (a new one each run otherwise) and a
failure prints it, so ``FUZZ_SEED=<seed>`` replays the run.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, seed, settings

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import clusterpolicy_crd, gpucluster_crd, nvidiadriver_crd
from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.render import Facts, render
from gpu_operator.render.driver import POOL_LABEL, ExtraConfig, Pool, driver_names, render_driver
from gpu_operator.render.gpucluster import render_gpucluster
from tests.schema import validate_kubernetes
from tests.unit.fuzz_schema import from_schema

SEED = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 2000)
FACTS = Facts()
# What a refusal may start with: a field path, or the way out that names one.
FIELD_PREFIXES = ("spec", "Run ")
# Two pools a driver renders for: one that builds on the node, one precompiled for a kernel.
POOLS = (
    Pool("ubuntu", "22.04", node_selector={POOL_LABEL: "a100"}),
    Pool("rhel", "9.4", kernel="5.14.0-427.13.1.el9_4.x86_64"),
)
DRIVER_EXTRA = ExtraConfig(configmap_keys={"repo": ("custom.list",), "certs": ("ca.crt",)})


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def render_policy(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return render(parse_spec(spec), FACTS)


def render_nvidiadriver(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """As the controller does: every pool the driver's nodes fall in; a ValueError is what the
    controller reports in the NVIDIADriver's status."""
    parsed = parse_driver_spec(spec)
    objects = []
    for pool in POOLS:
        names = driver_names("fuzzed", "0f1e2d3c-uid", parsed, pool)
        try:
            objects += render_driver(parsed, pool, names, DRIVER_EXTRA)
        except ValueError as exc:
            raise PolicyError([f"spec.{exc}"]) from None
    return objects


def render_cluster(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return render_gpucluster(parse_gpucluster_spec(spec), FACTS)


@dataclass(frozen=True)
class Kind:
    name: str
    schema: dict[str, Any]
    render: Callable[[dict[str, Any]], list[dict[str, Any]]]
    kinds: frozenset[str]  # what its renderer makes; anything else was injected
    examples: int


RBAC = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
POLICY_KINDS = frozenset(
    RBAC | {"ConfigMap", "DaemonSet", "Service", "ServiceMonitor", "RuntimeClass", "PrometheusRule"}
)
DRIVER_KINDS = frozenset(RBAC | {"ConfigMap", "DaemonSet"})
GPUCLUSTER_KINDS = frozenset(
    RBAC | {"DaemonSet", "Deployment", "Service", "DeviceClass", "ResourceClaimTemplate",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)  # fmt: skip
KINDS = (
    Kind("ClusterPolicy", spec_schema(clusterpolicy_crd()), render_policy, POLICY_KINDS, EXAMPLES),
    Kind(
        "NVIDIADriver",
        spec_schema(nvidiadriver_crd()),
        render_nvidiadriver,
        DRIVER_KINDS,
        EXAMPLES // 4,
    ),
    Kind(
        "GPUCluster", spec_schema(gpucluster_crd()), render_cluster, GPUCLUSTER_KINDS, EXAMPLES // 4
    ),
)


def check(kind: Kind, spec: dict[str, Any], validated: set[str], outcome: dict[str, int]) -> None:
    """One generated spec: refused with a field named, or rendered into valid manifests."""
    note(f"FUZZ_SEED={SEED} (replay with this environment variable)")
    try:
        objects = kind.render(spec)
    except PolicyError as exc:
        assert exc.problems, "a refusal that names nothing"
        for problem in exc.problems:
            assert problem.startswith(FIELD_PREFIXES) or "gpu-operator migrate" in problem, (
                f"refusal without a field: {problem!r}"
            )
        outcome["refused"] += 1
        return
    found = {o["kind"] for o in objects}
    assert found <= kind.kinds, f"unexpected kinds {found - kind.kinds}"
    for obj in objects:
        key = json.dumps(obj, sort_keys=True)
        if key in validated:
            continue
        validate_kubernetes(obj)  # raises naming the manifest field
        validated.add(key)
    outcome["rendered"] += 1


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_accepted_spec_renders_valid_manifests_or_is_refused_by_field(kind: Kind) -> None:
    validated: set[str] = set()
    outcome = {"refused": 0, "rendered": 0}

    @seed(SEED)
    @settings(
        max_examples=kind.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(spec=from_schema(kind.schema))
    def run(spec: dict[str, Any]) -> None:
        check(kind, spec, validated, outcome)

    try:
        run()
    except BaseException as exc:
        exc.add_note(f"FUZZ_SEED={SEED}")
        raise
    print(f"{kind.name} FUZZ_SEED={SEED}: {outcome}")
    assert outcome["refused"] + outcome["rendered"] >= kind.examples
    assert outcome["rendered"] >= kind.examples // 10, "almost every spec refused: a useless fuzz"
