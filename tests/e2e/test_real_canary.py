"""A driver version whose image cannot be pulled, on real kubelets: the canary alone tries it
and goes back. Its own cluster (two real nodes and the stack from examples/clusterpolicy.yaml):
the rollback takes minutes of real container restarts, which would otherwise queue behind the
other real-stack tests on the session's shared cluster (tests/conftest.py's worker groups)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpu_operator import testenv
from tests.e2e.stack_support import (
    POLICY,
    Stack,
    driver_pod,
    example_policy,
    on_version,
    real_stack,
    rollout_in,
    wait_all_operands_ready,
)
from tests.e2e.support import (
    OPERATOR_USER,
    audit_writes,
    events_with,
    object_events,
    policy_ready,
    policy_status,
    wait_for,
)

pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def stack(
    real_nodes_runtime: Path, testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    state = testenv.default_state_dir() / f"canary-{uuid.uuid4().hex[:8]}"
    cluster = testenv.start(state, real_nodes=2, bin_dir=testenv_bin_dir)
    try:
        with real_stack(cluster, example_policy(), tmp_path_factory) as running:
            yield running
    finally:
        cluster.stop(remove_state=True)


def test_a_driver_that_cannot_be_pulled_is_rolled_back_on_its_canary_alone(stack: Stack) -> None:
    """A version whose image does not exist: the canary's new driver pod sits in ImagePullBackOff,
    the gate fails at its timeout, the canary is rolled back to the old driver and is in service
    again, the status and an Event name the reason, nothing else is written to; then the spec
    going back to the running version ends the hold."""
    nodes = stack.cluster.real_nodes
    kube = stack.kube
    # A settled stack first: every operand Ready and the policy ready, so that what the
    # operator writes from here on is the upgrade's doing.
    wait_all_operands_ready(stack)
    wait_for("the policy ready", lambda: policy_ready(kube, POLICY), timeout=300)
    policy = kube.get("ClusterPolicy", POLICY) or {}
    current = policy["spec"]["driver"]["version"]
    before = {n: driver_pod(stack, n) for n in nodes}
    canary = {"nodeSelector": {"kubernetes.io/hostname": nodes[0]}, "soak": "5s", "timeout": "30s"}
    upgrade_policy = {"maxParallelUpgrades": 1, "maxUnavailable": "100%", "canary": canary}
    since = datetime.now(UTC)
    kube.merge_patch(
        "ClusterPolicy",
        POLICY,
        {"spec": {"driver": {"version": "999.0.1", "upgradePolicy": upgrade_policy}}},
    )
    try:
        held = wait_for(
            "the canary failed, rolled back, held", lambda: rollout_in(stack, "held"), timeout=360
        )
        failure = held["failure"]
        assert failure["node"] == nodes[0] and failure["gate"] == "driver", failure
        assert "ImagePullBackOff" in failure["reason"] or "ErrImagePull" in failure["reason"], (
            failure
        )
        conditions = {c["type"]: c for c in policy_status(kube, POLICY)["conditions"]}
        assert conditions["UpgradeFailed"]["status"] == "True"
        assert "ImagePull" in conditions["UpgradeFailed"]["message"]
        wait_for(
            f"{nodes[0]} back on {current}, in service",
            lambda: on_version(stack, nodes[0], current),
            timeout=240,
        )
        events_with(
            "the canary rolled back",
            lambda: object_events(kube, "ClusterPolicy"),
            "UpgradeFailed",
            "RolledBack",
        )
        # Nothing but the canary was written to: the other nodes, their driver pods.
        for name in stack.kube.list_objects("Node"):
            if name["metadata"]["name"] == nodes[0]:
                continue
            node_name = name["metadata"]["name"]
            written = audit_writes(
                stack.cluster, OPERATOR_USER, since, resource=("nodes", node_name)
            )
            assert not written, [(e["verb"], e["requestURI"], e["stageTimestamp"]) for e in written]
        for node_name, pod in before.items():
            if node_name != nodes[0] and pod is not None:
                pod_name = pod["metadata"]["name"]
                assert not audit_writes(
                    stack.cluster, OPERATOR_USER, since, resource=("pods", pod_name)
                ), pod_name
                assert (driver_pod(stack, node_name) or {}).get("metadata", {}).get("uid") == pod[
                    "metadata"
                ]["uid"]
    finally:
        kube.merge_patch("ClusterPolicy", POLICY, {"spec": {"driver": {"version": current}}})
    wait_for("the hold ended by the spec", lambda: rollout_in(stack, "done"), timeout=240)
