"""The GPUCluster's admission policies on a real API server: every bad claim config of the
shared table is refused at create, for ResourceClaims and ResourceClaimTemplates, with the
field named, and nothing is stored; the good ones are stored; a strategy is refused while its
gate is off and accepted once the policies are rendered with it on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_operator.api.dragates import Gates
from gpu_operator.api.gpucluster import DRIVER_NAME
from gpu_operator.kube import Kube
from gpu_operator.render.dra_admission import config_policies
from tests.dra_configs import ALL, BAD, GOOD, NONE, gpu

from .support import NotYet, private_cluster, wait_for

NS = "claims"


@pytest.fixture(scope="module")
def kube(testenv_bin_dir: Path) -> Iterator[Kube]:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        k = Kube(api)
        k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield k


def _claim(kind: str, parameters: dict[str, Any]) -> dict[str, Any]:
    devices = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": [
            {"requests": ["gpu"], "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
        ],
    }
    spec = {"devices": devices} if kind == "ResourceClaim" else {"spec": {"devices": devices}}
    name = f"c-{uuid.uuid4().hex[:8]}"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def _refusal(kube: Kube, obj: dict[str, Any]) -> str | None:
    """The API server's message when it refuses ``obj``; None when it stored it."""
    try:
        kube.create(obj)
    except ApiException as exc:
        assert exc.status == 422, (exc.status, exc.body)
        assert kube.get(obj["kind"], obj["metadata"]["name"], NS) is None
        return str(exc.body)
    return None


def _enforce(kube: Kube, gates: Gates) -> None:
    """Apply the policies for ``gates`` and wait until the API server enforces them: it loads
    them from its own watch a moment after they are stored, one policy at a time, and while it
    swaps one it may enforce none. One probe per kind, so one observation: a claim with a bad
    config and an MPS one is refused, naming the MPS gate (checked first) exactly when that
    gate is off."""
    for obj in config_policies(gates):
        kube.apply(obj)
    gate_named = not gates.on("MPSSupport")

    def enforced() -> bool | NotYet:
        seen = {}
        for kind in ("ResourceClaim", "ResourceClaimTemplate"):
            probe = _claim(kind, BAD[0][0])
            devices = probe["spec"].get("devices") or probe["spec"]["spec"]["devices"]
            mps = {
                **devices["config"][0],
                "opaque": {"driver": DRIVER_NAME, "parameters": gpu({"strategy": "MPS"})},
            }
            devices["config"].append(mps)
            body = _refusal(kube, probe)
            seen[kind] = body is not None and ("MPSSupport" in body) == gate_named
        return all(seen.values()) or NotYet(seen)

    wait_for("the admission policies enforced", enforced, timeout=60)


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_bad_configs_are_refused_naming_the_field_and_good_ones_stored(
    kube: Kube, kind: str
) -> None:
    _enforce(kube, ALL)
    wrong = {}
    for parameters, gates, _, says in BAD:
        if gates is not ALL:
            continue
        body = _refusal(kube, _claim(kind, parameters))
        if body is None or says not in body:
            wrong[str(parameters)] = body or "stored"
    assert not wrong, wrong
    stored = [p for p in GOOD if _refusal(kube, _claim(kind, p)) is not None]
    assert not stored, stored


def test_a_strategy_is_refused_while_its_gate_is_off(kube: Kube) -> None:
    _enforce(kube, NONE)
    for parameters, gates, _, says in BAD:
        if gates is NONE:
            body = _refusal(kube, _claim("ResourceClaim", parameters))
            assert body is not None and says in body, (parameters, body)
    assert _refusal(kube, _claim("ResourceClaim", gpu())) is None  # no sharing: no gate needed
    _enforce(kube, ALL)
    assert _refusal(kube, _claim("ResourceClaim", gpu({"strategy": "MPS"}))) is None
