"""Performing stages against the API (a fake of the Kube wrapper) and reporting outcomes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpu_operator.controller.runtime.actions import (
    Action,
    Apply,
    Create,
    DeletePod,
    Evict,
    Outcome,
    Patch,
    Prune,
    Stage,
    describe,
)
from gpu_operator.controller.runtime.execute import Executor, _counted_as, api_reason
from gpu_operator.controller.runtime.metrics import PrometheusMetrics
from tests.fakes.kube import FakeKube
from tests.unit.controller.builders import NAMESPACE, gpu_node, node_object, pod

SA = {"apiVersion": "v1", "kind": "ServiceAccount",
      "metadata": {"name": "sa", "namespace": NAMESPACE}}  # fmt: skip
EVENT = {"apiVersion": "v1", "kind": "Event", "reason": "Started",
         "metadata": {"generateName": "gpu-1.", "namespace": "default"}}  # fmt: skip


def execute(
    kube: FakeKube, *stages: Stage, concurrency: int = 4
) -> tuple[list[Outcome], PrometheusMetrics]:
    metrics = PrometheusMetrics()

    async def main() -> list[Outcome]:
        return await Executor(kube, concurrency, metrics).run(stages)

    return asyncio.run(asyncio.wait_for(main(), timeout=60)), metrics


def world() -> FakeKube:
    return FakeKube().add(
        node_object(gpu_node("gpu-1")),
        node_object(gpu_node("gpu-2")),
        pod("job", namespace="team"),
        pod("stuck", namespace="team"),
        {"kind": "ConfigMap", "metadata": {"name": "old", "namespace": NAMESPACE}},
    )


def written(metrics: PrometheusMetrics, verb: str, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpu_operator_api_writes_total", {"verb": verb, "kind": kind}
    )
    return value or 0.0


def test_each_action_is_its_request() -> None:
    kube = world()
    label = Patch("Node", "gpu-1", {"metadata": {"labels": {"a": "b"}}}, "labels")
    actions: list[Action] = [
        Apply(SA),
        Prune(("ConfigMap", NAMESPACE, "old")),
        label,
        Create(EVENT),
        Evict("job", "team"),
        DeletePod("stuck", "team", force=True),
    ]
    outcomes, metrics = execute(kube, Stage(tuple(actions), concurrent=False))
    assert [o.ok for o in outcomes] == [True] * 6
    assert kube.writes == [
        ("apply", "ServiceAccount", "sa"),
        ("delete", "ConfigMap", "old"),
        ("patch", "Node", "gpu-1"),
        ("create", "Event", "gpu-1.1"),
        ("evict", "Pod", "job"),
        ("delete", "Pod", "stuck"),
    ]
    node = kube.obj("Node", "gpu-1")
    assert node is not None and node["metadata"]["labels"]["a"] == "b"
    applied = kube.obj("ServiceAccount", "sa", NAMESPACE)
    assert applied is not None and applied["metadata"]["generation"] >= 1
    assert outcomes[0].generation == applied["metadata"]["generation"]  # the server's answer
    assert outcomes[4].generation == 0  # eviction answers nothing to keep
    for verb, kind in [("apply", "ServiceAccount"), ("delete", "ConfigMap"), ("patch", "Node"),
                       ("create", "Event"), ("evict", "Pod"), ("delete", "Pod")]:  # fmt: skip
        assert written(metrics, verb, kind) == 1


def test_a_status_patch_goes_to_the_subresource() -> None:
    kube = FakeKube().add({"kind": "ClusterPolicy", "metadata": {"name": "p"}, "spec": {"x": 1}})
    action = Patch("ClusterPolicy", "p", {"status": {"state": "ready"}}, "status", "status")
    (outcome,), metrics = execute(kube, Stage((action,)))
    assert outcome.ok
    assert kube.obj("ClusterPolicy", "p") == {
        "kind": "ClusterPolicy", "metadata": {"name": "p", "resourceVersion": "2"},
        "spec": {"x": 1}, "status": {"state": "ready"},
    }  # fmt: skip
    assert written(metrics, "patch", "ClusterPolicy/status") == 1


def test_refusals_come_back_as_outcomes_and_are_not_counted_as_writes() -> None:
    kube = world().refuse("evict", "Pod", "job", status=429)
    stale = Patch("Node", "gpu-1", {"metadata": {"resourceVersion": "0"}}, "labels")
    outcomes, metrics = execute(kube, Stage((Evict("job", "team"), stale, Apply(SA))))
    assert [(o.status, o.ok) for o in outcomes] == [(429, False), (409, False), (None, True)]
    assert outcomes[0].reason == "evict Pod/job refused"  # the API's message
    assert written(metrics, "evict", "Pod") == 0


def test_a_stage_after_success_is_skipped_once_anything_failed() -> None:
    kube = world().refuse("patch", "Node", "gpu-2", status=500)
    cleanup = Stage((Patch("Node", "gpu-1", {}, "labels"), Patch("Node", "gpu-2", {}, "labels")))
    release = Stage((Patch("ClusterPolicy", "p", {}, "finalizer"),), after_success=True)
    outcomes, _ = execute(kube, cleanup, release)
    assert [(o.ok, o.skipped) for o in outcomes] == [(True, False), (False, False), (False, True)]
    assert ("patch", "ClusterPolicy", "p") not in kube.writes


def test_a_stage_after_success_runs_when_all_went_well() -> None:
    kube = world().add({"kind": "ClusterPolicy", "metadata": {"name": "p"}})
    release = Stage((Patch("ClusterPolicy", "p", {}, "finalizer"),), after_success=True)
    outcomes, _ = execute(kube, Stage((Patch("Node", "gpu-1", {}, "labels"),)), release)
    assert all(o.ok for o in outcomes)


def test_a_nodes_later_steps_are_skipped_after_its_patch_failed() -> None:
    kube = world().refuse("patch", "Node", "gpu-1", status=409)
    steps = Stage(
        (
            Patch("Node", "gpu-1", {}, "upgrade"),  # refused
            Create(EVENT),  # same node: skipped
            Patch("Node", "gpu-2", {}, "upgrade"),  # another node goes on
            Evict("missing", "team"),  # a refused eviction skips nothing
            Patch("Node", "gpu-2", {}, "upgrade"),
        ),
        concurrent=False,
        groups=("gpu-1", "gpu-1", "gpu-2", "gpu-2", "gpu-2"),
    )
    outcomes, _ = execute(kube, steps)
    assert [(o.ok, o.skipped) for o in outcomes] == [
        (False, False), (False, True), (True, False), (False, False), (True, False),
    ]  # fmt: skip


def test_concurrency_is_bounded() -> None:
    kube = world()
    running: list[int] = []
    peak: list[int] = [0]
    apply = kube.apply

    def counted_apply(obj: Any, **kw: Any) -> Any:
        running.append(1)
        peak[0] = max(peak[0], len(running))
        try:
            return apply(obj, **kw)
        finally:
            running.pop()

    kube.apply = counted_apply  # type: ignore[method-assign]
    many = tuple(
        Apply({**SA, "metadata": {**SA["metadata"], "name": f"sa-{i}"}}) for i in range(20)
    )
    outcomes, _ = execute(kube, Stage(many), concurrency=2)
    assert all(o.ok for o in outcomes)
    assert 1 <= peak[0] <= 2


# How kube-apiserver 1.34 refuses a JSON patch whose ``test`` fails (read from testenv's): a
# generic message, no cause; a validation error names its fields in ``details.causes``.
TEST_FAILED = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {},
        "code": 422,
    }
)
INVALID = json.dumps(
    {
        "kind": "Status",
        "message": 'Node "gpu-1" is invalid: metadata.labels: Invalid value: "a b"',
        "reason": "Invalid",
        "details": {
            "name": "gpu-1",
            "kind": "Node",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": 'Invalid value: "a b"',
                    "field": "metadata.labels",
                }
            ],
        },
        "code": 422,
    }
)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ApiException(status=409, reason="Conflict", body='{"message": "changed"}'), "changed"),
        (ApiException(status=409, reason="Conflict", body='{"kind": "Status"}'), "Conflict"),
        (ApiException(status=502, reason="Bad Gateway", body="<html>"), "502 Bad Gateway"),
        (ApiException(status=500, reason="Internal"), "500 Internal"),
        (ApiException(status=500, reason="Internal", body="[1]"), "500 Internal"),
    ],
)
def test_api_reason(exc: ApiException, reason: str) -> None:
    assert api_reason(exc) == reason


@pytest.mark.parametrize(
    ("status", "body", "patch_type", "level"),
    [
        (422, TEST_FAILED, "json", logging.DEBUG),  # changed since it was read: planned again
        (422, INVALID, "json", logging.WARNING),  # a value the API refuses: a bug to see
        (422, TEST_FAILED, "merge", logging.WARNING),  # no test in a merge patch
        (409, '{"message": "changed"}', "merge", logging.DEBUG),
        (500, '{"message": "etcd"}', "json", logging.WARNING),
    ],
)
def test_a_patch_refused_because_the_node_changed_is_not_a_warning(
    status: int, body: str, patch_type: str, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    kube = world()

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=status, reason="refused", body=body)

    kube.json_patch = refused  # type: ignore[method-assign]
    kube.merge_patch = refused  # type: ignore[method-assign]
    labels = Patch("Node", "gpu-1", [] if patch_type == "json" else {}, "labels")
    labels = dataclasses.replace(labels, patch_type=patch_type)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="gpu_operator.controller.runtime.execute"):
        (outcome,), _ = execute(kube, Stage((labels,)))
    assert outcome.status == status and not outcome.ok
    assert [r.levelno for r in caplog.records if "refused" in r.getMessage()] == [level]


def test_every_action_has_a_metric_name_and_a_description() -> None:
    with pytest.raises(TypeError):
        _counted_as("not an action")
    assert describe(DeletePod("p", "ns")) == "deleting pod ns/p"
    assert describe(Evict("p", "ns")) == "evicting ns/p"
    assert describe(Create(EVENT)) == "creating Event Started"
    assert Stage((Evict("p", "ns"),)).group_of(3) is None
