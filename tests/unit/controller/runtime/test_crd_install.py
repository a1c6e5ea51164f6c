"""Installing the ClusterPolicy and GPUCluster CRDs at start-up: when to apply each, and waiting
for it."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator import __version__
from gpu_operator.api.crd import all_crds
from gpu_operator.controller.runtime.crd_install import (
    SCHEMA_ANNOTATION,
    VERSION_ANNOTATION,
    desired_crd,
    ensure_crd,
    needs_update,
)
from tests.fakes.kube import FakeKube


def crd(version: str, schema: str = "same") -> dict[str, Any]:
    return {"metadata": {"annotations": {VERSION_ANNOTATION: version, SCHEMA_ANNOTATION: schema}}}


@pytest.mark.parametrize(
    ("installed", "ours", "schema", "apply"),
    [
        (None, "0.3.0", "same", True),  # missing
        ("0.2.9", "0.3.0", "same", True),  # older
        ("0.3.0", "0.2.9", "other", False),  # newer: a newer operator owns it
        ("0.3.0", "0.3.0", "same", False),
        ("0.3.0", "0.3.0", "other", True),  # same version, another schema (a dev build)
        ("v0.3.0", "0.3.0", "same", False),
        ("0.3", "0.3.0", "same", False),
        ("0.10.0", "0.9.0", "same", False),  # numbers, not text
        # pre-releases come before their release (bug: 0.3.0-rc1 read as 0.3.1)
        ("0.3.0-rc1", "0.3.0", "same", True),
        ("0.3.0", "0.3.0-rc1", "same", False),
        ("0.3.0rc1", "0.3.0", "same", True),
        ("0.3.0.dev4", "0.3.0", "same", True),
        ("0.3.0-rc2", "0.3.0-rc10", "same", True),
        ("0.2.9", "0.3.0-rc1", "same", True),
        ("0.3.0+build.7", "0.3.0", "same", False),  # build metadata does not order
        ("garbage", "0.1.0", "same", True),
    ],
)
def test_needs_update(installed: str | None, ours: str, schema: str, apply: bool) -> None:
    current = None if installed is None else crd(installed, schema)
    assert needs_update(current, crd(ours)) is apply


def test_an_unannotated_crd_is_replaced() -> None:
    assert needs_update({"metadata": {}}, crd("0.1.0"))


def test_desired_crd_carries_this_version_and_its_schema_hash() -> None:
    one, two = desired_crd(), desired_crd()
    annotations = one["metadata"]["annotations"]
    assert annotations[VERSION_ANNOTATION] == __version__
    assert annotations[SCHEMA_ANNOTATION] == two["metadata"]["annotations"][SCHEMA_ANNOTATION]
    assert one["kind"] == "CustomResourceDefinition"


def test_ensure_crd_applies_a_missing_crd_and_waits_until_established() -> None:
    kube = FakeKube()
    assert ensure_crd(kube) is True
    names = [crd["metadata"]["name"] for crd in all_crds()]
    assert names == [
        "clusterpolicies.nvidia.com",
        "gpuclusters.nvidia.com",
        "nvidiadrivers.nvidia.com",
    ]
    assert kube.writes == [("apply", "CustomResourceDefinition", name) for name in names]
    # already there and current: nothing written
    assert ensure_crd(kube) is False
    assert len(kube.writes) == 3


def test_ensure_crd_leaves_a_newer_crd_alone() -> None:
    kube = FakeKube()
    for crd in all_crds():
        newer = desired_crd(crd)
        newer["metadata"]["annotations"][VERSION_ANNOTATION] = "99.0.0"
        kube.add(newer)
    assert ensure_crd(kube) is False
    assert kube.writes == []


def test_ensure_crd_fails_when_the_crd_is_never_established() -> None:
    kube = FakeKube(establish_crds=False)
    with pytest.raises(TimeoutError, match="not Established"):
        ensure_crd(kube, timeout=0)


class SlowToEstablish(FakeKube):
    """A CRD that the API server reports Established only on the second look after it."""

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found = super().get(kind, name, namespace)
        if found is not None and kind == "CustomResourceDefinition":
            self.establish_crds = True
            stored = self.obj(kind, name)
            assert stored is not None
            stored["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
        return found


def test_ensure_crd_waits_for_the_crd_to_be_established() -> None:
    kube = SlowToEstablish(establish_crds=False)
    assert ensure_crd(kube) is True
    assert len(kube.writes) == 3  # each CRD once
