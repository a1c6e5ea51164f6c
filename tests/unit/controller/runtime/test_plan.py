"""What to write: stamping rendered objects and diffing them against the server's."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.controller.runtime.plan import (
    ObjectChanges,
    Observed,
    Owner,
    content_hash,
    key_of,
    plan_changes,
    stamp,
)
from gpu_operator.labels import APPLIED_HASH, MANAGED_BY, OPERATOR_NAME

OWNER = Owner("nvidia.com/v1", "ClusterPolicy", "cluster-policy", "uid-1")


def rendered(name: str = "sa", kind: str = "ServiceAccount", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "ns",
            "labels": {"app": name}}, **extra}  # fmt: skip


def stamped(*objs: dict[str, Any]) -> list[dict[str, Any]]:
    return stamp(objs, OWNER)


def seen(obj: dict[str, Any], generation: int = 1, hash_: str | None = "as desired") -> Observed:
    applied = obj["metadata"]["annotations"][APPLIED_HASH] if hash_ == "as desired" else hash_
    return Observed(key_of(obj), applied, generation)


def test_stamp_adds_owner_label_and_hash_without_touching_the_input() -> None:
    obj = rendered()
    (out,) = stamped(obj)
    meta = out["metadata"]
    assert meta["ownerReferences"] == [
        {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
         "uid": "uid-1", "controller": True}
    ]  # fmt: skip
    assert meta["labels"] == {"app": "sa", MANAGED_BY: OPERATOR_NAME}
    assert len(meta["annotations"][APPLIED_HASH]) == 16
    assert "ownerReferences" not in obj["metadata"]  # the rendering is not mutated


def test_the_hash_follows_content_only() -> None:
    a, b = stamped(rendered(data={"x": "1"}), rendered(data={"x": "1"}))
    (c,) = stamped(rendered(data={"x": "2"}))
    assert a["metadata"]["annotations"] == b["metadata"]["annotations"]
    assert a["metadata"]["annotations"] != c["metadata"]["annotations"]
    assert content_hash({"a": 1, "b": 2}) == content_hash({"b": 2, "a": 1})


def test_observed_from_a_server_object() -> None:
    obj = {"metadata": {"name": "r", "generation": 4, "annotations": {APPLIED_HASH: "h"}}}
    assert Observed.from_k8s(obj, "ClusterRole") == Observed(("ClusterRole", "", "r"), "h", 4)
    bare = {"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}
    assert Observed.from_k8s(bare) == Observed(("ConfigMap", "ns", "c"), None, 0)


SA, CM = stamped(rendered(), rendered("cm", "ConfigMap", data={"k": "v"}))


@pytest.mark.parametrize(
    ("observed", "generations", "apply", "prune"),
    [
        ([], {}, ["sa", "cm"], []),  # nothing there yet
        ([seen(SA), seen(CM)], {}, [], []),  # as desired: no write
        ([seen(SA, hash_="old"), seen(CM)], {}, ["sa"], []),  # content changed
        ([seen(SA, hash_=None), seen(CM)], {}, ["sa"], []),  # unannotated: not ours yet
        # someone edited it after our apply (generation moved past what we saw)
        ([seen(SA, 3), seen(CM)], {key_of(SA): 2}, ["sa"], []),
        ([seen(SA, 2), seen(CM)], {key_of(SA): 2}, [], []),
        ([seen(SA, 5), seen(CM)], {}, [], []),  # generation unknown (restart): trust the hash
        ([seen(SA), seen(CM), Observed(("Role", "ns", "gone"), "h", 1),
          Observed(("DaemonSet", "ns", "gone"), "h", 1)], {}, [],
         [("DaemonSet", "ns", "gone"), ("Role", "ns", "gone")]),
    ],
)  # fmt: skip
def test_plan_changes(
    observed: list[Observed], generations: dict[Any, int], apply: list[str], prune: list[Any]
) -> None:
    changes = plan_changes([SA, CM], observed, generations)
    assert [o["metadata"]["name"] for o in changes.apply] == apply
    assert changes.prune == prune
    assert changes.empty is (not apply and not prune)


def test_kinds_the_api_lacks_are_skipped_not_applied() -> None:
    changes = plan_changes([SA, CM], [], available_kinds=frozenset({"ConfigMap"}))
    assert [o["kind"] for o in changes.apply] == ["ConfigMap"]
    assert changes.skipped == [key_of(SA)]
    assert not ObjectChanges(skipped=[key_of(SA)]).apply
    assert ObjectChanges().empty
