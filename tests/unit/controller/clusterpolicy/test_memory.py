"""What a pass's outcomes teach the next pass (remember), and the memory's own operations."""

from __future__ import annotations

import pytest

from gpu_operator.controller.clusterpolicy.memory import Memory, remember, summarize_errors
from gpu_operator.controller.runtime.actions import Apply, Create, Outcome, Patch, Prune
from gpu_operator.labels import APPLIED_HASH

DS = {"kind": "DaemonSet", "metadata": {"name": "ds", "namespace": "ns",
                                        "annotations": {APPLIED_HASH: "h1"}}}  # fmt: skip
DS_KEY = ("DaemonSet", "ns", "ds")
SM_KEY = ("ServiceMonitor", "ns", "sm")


def applied(obj: dict[str, object], generation: int = 1) -> Outcome:
    return Outcome(Apply(obj), generation=generation)


def test_an_apply_records_the_generation_it_produced() -> None:
    after = remember(Memory(), [applied(DS, 7)], reconciled=True)
    assert after.memory.applied_generations == {DS_KEY: 7}
    assert not after.look_again and after.retry_nodes == frozenset()


def test_a_pruned_object_is_forgotten_also_when_already_gone() -> None:
    memory = Memory(applied_generations={DS_KEY: 2, SM_KEY: 1})
    outcomes = [Outcome(Prune(DS_KEY)), Outcome(Prune(SM_KEY), status=404, reason="gone")]
    after = remember(memory, outcomes, reconciled=True)
    assert after.memory.applied_generations == {}
    assert after.memory.apply_error is None


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        (Outcome(Apply(DS), status=403, reason="forbidden"), "forbidden (DaemonSet/ds)"),
        (Outcome(Prune(DS_KEY), status=500, reason="boom"), "boom (deleting DaemonSet/ds)"),
        (Outcome(Apply(DS), skipped=True), None),  # not tried: no news
        (Outcome(Prune(DS_KEY), skipped=True), None),
    ],
)
def test_failures_become_the_status_error_and_wake_the_loop(
    outcome: Outcome, error: str | None
) -> None:
    after = remember(Memory(), [outcome], reconciled=True)
    assert after.memory.apply_error == error
    assert after.look_again is (error is not None)
    assert after.memory.applied_generations == {}


def test_a_clean_pass_clears_the_error_and_says_so() -> None:
    after = remember(Memory(apply_error="forbidden"), [applied(DS)], reconciled=True)
    assert after.memory.apply_error is None
    assert after.look_again


def test_a_pass_that_did_not_reconcile_keeps_the_error() -> None:
    failed = Outcome(Apply(DS), status=403, reason="forbidden")
    after = remember(Memory(apply_error="earlier"), [failed], reconciled=False)
    assert after.memory.apply_error == "earlier"
    assert not after.look_again


def test_refused_label_patches_are_retried_other_patches_are_not() -> None:
    outcomes = [
        Outcome(Patch("Node", "a", {}, "labels"), status=409),
        Outcome(Patch("Node", "b", {}, "labels")),
        Outcome(Patch("Node", "c", {}, "upgrade"), status=409),
        Outcome(Patch("ClusterPolicy", "p", {}, "status", "status"), status=409),
        Outcome(Create({"kind": "Event", "metadata": {}}), status=500),
    ]
    after = remember(Memory(), outcomes, reconciled=True)
    assert after.retry_nodes == frozenset({"a"})
    assert after.memory.apply_error is None


def test_errors_name_a_few_objects_per_reason() -> None:
    errors = [(f"SA/sa-{i}", "namespace missing") for i in range(4)] + [("DS/x", "forbidden")]
    assert summarize_errors(errors, shown=2) == (
        "namespace missing (SA/sa-0, SA/sa-1 and 2 more); forbidden (DS/x)"
    )
    assert summarize_errors([]) is None


def test_errors_are_grouped_by_reason() -> None:
    errors = [(f"ServiceAccount/sa-{i}", 'namespaces "gpu-operator" not found') for i in range(5)]
    errors.append(("DaemonSet/x", "forbidden"))
    assert summarize_errors(errors) == (
        'namespaces "gpu-operator" not found (ServiceAccount/sa-0, ServiceAccount/sa-1, '
        "ServiceAccount/sa-2 and 2 more); forbidden (DaemonSet/x)"
    )
    assert summarize_errors([]) is None
