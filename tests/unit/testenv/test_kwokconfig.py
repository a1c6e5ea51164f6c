"""The configuration testenv hands kwok: it parses, keeps kwok's default pod lifecycle, and adds
the simulated never-Ready fault for pods that ask for it (real kwok runs it in the e2e tests)."""

from __future__ import annotations

from typing import Any

import yaml

from gpu_operator.testenv import cluster, kwokconfig
from gpu_operator.testenv.kwokconfig import NOT_READY, SIMULATED_FAULT_ENV


def _stages(kind: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all(kwokconfig.KWOK_CONFIG))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert all(d["kind"] == "Stage" for d in docs[1:])
    return {
        d["metadata"]["name"]: d["spec"]
        for d in docs[1:]
        if d["spec"]["resourceRef"]["kind"] == kind
    }


def _expressions(stage: dict[str, Any]) -> list[dict[str, Any]]:
    return list(stage["selector"]["matchExpressions"])


def test_the_config_and_audit_policy_parse() -> None:
    assert set(_stages("Node")) == {"testenv-node-ready", "testenv-node-status-report"}
    policy = yaml.safe_load(kwokconfig.AUDIT_POLICY)
    assert policy["kind"] == "Policy"
    assert cluster.KWOK_CONFIG is kwokconfig.KWOK_CONFIG  # still importable where it was


def test_pods_get_kwoks_default_stages_and_the_fault_stage() -> None:
    # A kind with any Stage configured gets only those: kwok's three defaults must all be here.
    pods = _stages("Pod")
    assert set(pods) == {"pod-ready", "pod-complete", "pod-delete", "testenv-pod-not-ready"}
    assert pods["pod-delete"]["next"] == {"finalizers": {"empty": True}, "delete": True}
    assert pods["pod-complete"]["next"]["statusTemplate"].rstrip().endswith("phase: Succeeded")


def test_the_fault_stage_and_pod_ready_split_the_starting_pods_on_the_env_var() -> None:
    pods = _stages("Pod")
    *ready_common, ready_env = _expressions(pods["pod-ready"])
    *fault_common, fault_env = _expressions(pods["testenv-pod-not-ready"])
    assert (
        ready_common
        == fault_common
        == [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.podIP", "operator": "DoesNotExist"},
        ]
    )
    # One query, In for the fault and NotIn for the rest: never both, so never picked at random.
    assert ready_env["key"] == fault_env["key"]
    assert f'select(.name == "{SIMULATED_FAULT_ENV}") | .value' in fault_env["key"]
    assert ".spec.containers" in fault_env["key"] and ".spec.initContainers" in fault_env["key"]
    assert (fault_env["operator"], fault_env["values"]) == ("In", [NOT_READY])
    assert (ready_env["operator"], ready_env["values"]) == ("NotIn", [NOT_READY])
    assert SIMULATED_FAULT_ENV == "GPU_OPERATOR_SIMULATE_FAULT" and NOT_READY == "not-ready"


def test_a_faulted_pod_runs_but_its_ready_conditions_stay_false() -> None:
    pods = _stages("Pod")
    ready = pods["pod-ready"]["next"]["statusTemplate"].splitlines()
    fault = pods["testenv-pod-not-ready"]["next"]["statusTemplate"].splitlines()
    message = f'  message: "{SIMULATED_FAULT_ENV}={NOT_READY}: containers never become ready"'
    # Only the Ready conditions and the containers' readiness differ from pod-ready's status.
    assert {line.strip() for line in set(fault) - set(ready)} == {
        'status: "False"',
        "reason: SimulatedFault",
        message.strip(),
        "ready: false",
    }
    text = "\n".join(fault)
    for condition in ("Ready", "ContainersReady"):
        assert f'status: "False"\n  type: {condition}\n  reason: SimulatedFault' in text
    assert 'status: "True"\n  type: Initialized' in text
    assert "  ready: false\n  started: true\n  restartCount: 0\n  state:\n    running:" in text
    assert "phase: Running" in text and "podIP:" in text
