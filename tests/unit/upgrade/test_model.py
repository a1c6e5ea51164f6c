"""Reading the fleet from Kubernetes objects, resolving the policy, label selectors."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.spec import UpgradePolicy
from gpu_operator.nodeops.pods import Pod
from gpu_operator.upgrade import Fleet, Node, Policy, Selector, scaled_max_unavailable

DRIVER_POD: dict[str, Any] = {
    "metadata": {
        "name": "nvidia-driver-daemonset-abcde",
        "namespace": "gpu-operator",
        "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": "7d9f"},
        "ownerReferences": [
            {"kind": "DaemonSet", "name": "nvidia-driver-daemonset", "controller": True}
        ],
        "creationTimestamp": "2024-05-01T10:00:00Z",
    },
    "spec": {"nodeName": "gpu-1", "containers": [{"name": "driver"}]},
    "status": {
        "phase": "Running",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2024-05-01T10:00:00Z",
            },
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-05-01T10:02:30Z"},
        ],
        "containerStatuses": [{"name": "driver", "restartCount": 3}],
        "initContainerStatuses": [{"name": "init", "restartCount": 12}],
    },
}


def test_driver_pod_from_k8s() -> None:
    pod = Pod.from_k8s(DRIVER_POD)
    assert pod == Pod(
        name="nvidia-driver-daemonset-abcde",
        namespace="gpu-operator",
        node="gpu-1",
        labels=DRIVER_POD["metadata"]["labels"],
        owner="nvidia-driver-daemonset",
        revision_hash="7d9f",
        ready=True,
        phase="Running",
        restart_count=12,  # a crash-looping init container counts too
        uses_gpu=False,
        is_daemonset_pod=True,
        deleting=False,
        created=1714557600.0,
        ready_since=1714557750.0,  # the Ready condition's lastTransitionTime
    )


def test_unscheduled_daemonset_pod_belongs_to_its_pinned_node() -> None:
    pod = Pod.from_k8s(
        {
            "metadata": {"name": "d", "deletionTimestamp": "2024-05-01T10:00:00Z"},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {
                                            "key": "metadata.name",
                                            "operator": "In",
                                            "values": ["gpu-7"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            "status": {"phase": "Pending"},
        }
    )
    assert pod.node == "gpu-7" and pod.deleting and not pod.ready and pod.phase == "Pending"


@pytest.mark.parametrize(
    ("resources", "uses_gpu"),
    [
        ({"limits": {"nvidia.com/gpu": 1}}, True),
        ({"requests": {"nvidia.com/gpu": "2"}}, True),
        ({"limits": {"nvidia.com/mig-1g.10gb": 1}}, True),
        ({"limits": {"nvidia.com/gpu": 0}}, False),
        ({"limits": {"cpu": "1", "memory": "1Gi"}}, False),
        ({}, False),
    ],
)
def test_workload_pod_gpu_use(resources: dict[str, Any], uses_gpu: bool) -> None:
    pod = Pod.from_k8s(
        {
            "metadata": {
                "name": "w",
                "ownerReferences": [{"kind": "Job", "name": "train", "controller": True}],
            },
            "spec": {
                "nodeName": "n",
                "containers": [{"name": "c", "resources": resources}],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        }
    )
    assert pod.uses_gpu is uses_gpu
    assert pod.owner == "Job/train" and not pod.is_daemonset_pod and pod.uses_empty_dir


def test_node_from_k8s() -> None:
    node = Node.from_k8s(
        {
            "metadata": {"name": "gpu-1", "labels": {"a": "b"}, "annotations": {"c": "d"}},
            "spec": {"unschedulable": True},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }
    )
    assert node == Node("gpu-1", {"a": "b"}, {"c": "d"}, unschedulable=True, ready=False)
    assert node.unavailable


def test_fleet_from_k8s() -> None:
    fleet = Fleet.from_k8s([{"metadata": {"name": "gpu-1"}}], [DRIVER_POD], newest_hash={"x": "1"})
    assert [n.name for n in fleet.nodes] == ["gpu-1"]
    assert fleet.driver_pods[0].revision_hash == "7d9f"
    assert fleet.newest_hash == {"x": "1"}


def test_policy_defaults() -> None:
    assert Policy.from_spec(None) == Policy.from_spec(UpgradePolicy()) == Policy()
    p = Policy()
    assert (p.auto_upgrade, p.max_parallel_upgrades, p.max_unavailable) == (False, 1, "25%")
    assert (p.pod_deletion_force, p.pod_deletion_timeout_s) == (False, 300)
    assert (p.wait_selector, p.wait_timeout_s) == (None, 0)
    assert (p.drain_enable, p.drain_timeout_s, p.drain_selector) == (False, 300, None)


def test_policy_from_spec_keeps_explicit_zeroes_and_falses() -> None:
    spec = UpgradePolicy.model_validate(
        {
            "autoUpgrade": True,
            "maxParallelUpgrades": 0,
            "maxUnavailable": "50%",
            "podDeletion": {"force": True, "timeoutSeconds": 0, "deleteEmptyDir": True},
            "waitForCompletion": {"podSelector": "app=train", "timeoutSeconds": 60},
            "drain": {"enable": True, "podSelector": "", "timeoutSeconds": 10},
        }
    )
    p = Policy.from_spec(spec)
    assert p.auto_upgrade and p.max_parallel_upgrades == 0 and p.max_unavailable == "50%"
    assert p.pod_deletion_force and p.pod_deletion_timeout_s == 0
    assert p.pod_deletion_delete_empty_dir
    assert p.wait_selector is not None and p.wait_selector.matches({"app": "train"})
    assert p.wait_timeout_s == 60
    assert p.drain_enable and p.drain_selector is None and p.drain_timeout_s == 10
    assert not p.drain_force and not p.drain_delete_empty_dir


def test_a_bad_selector_is_refused_when_the_policy_is_read() -> None:
    """Refused with the field named, before the planner could ever see it."""
    with pytest.raises(ValueError, match=r"drain.podSelector[\s\S]*app in prod"):
        UpgradePolicy.model_validate({"drain": {"podSelector": "app in prod"}})


@pytest.mark.parametrize(
    ("value", "managed", "expected"),
    [
        ("25%", 100, 25),
        ("25%", 1, 1),
        ("25%", 5, 2),
        ("25%", 0, 0),
        ("0%", 50, 0),
        ("100%", 7, 7),
        ("1%", 1000, 10),
        ("33%", 10, 4),
        (3, 100, 3),
        ("3", 100, 3),
        (0, 10, 0),
    ],
)
def test_scaled_max_unavailable(value: int | str, managed: int, expected: int) -> None:
    assert scaled_max_unavailable(value, managed) == expected


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=train", {"app": "train"}, True),
        ("app==train", {"app": "train"}, True),
        ("app=train", {"app": "serve"}, False),
        ("app!=train", {}, True),
        ("app!=train", {"app": "train"}, False),
        ("app=train,tier=gpu", {"app": "train"}, False),
        ("app=train, tier=gpu", {"app": "train", "tier": "gpu"}, True),
        ("env in (a, b)", {"env": "b"}, True),
        ("env in (a,b),x", {"env": "b"}, False),
        ("env notin (a,b)", {}, True),
        ("env notin (a,b)", {"env": "a"}, False),
        ("example.com/batch", {"example.com/batch": ""}, True),
        ("!legacy", {"legacy": "x"}, False),
        ("!legacy", {}, True),
        ("", {"anything": "x"}, True),
    ],
)
def test_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert Selector.parse(selector).matches(labels) is matches


@pytest.mark.parametrize("bad", ["app in prod", "=x", "a=b=c", "env in ()", "a,,b", "a b"])
def test_selector_errors(bad: str) -> None:
    with pytest.raises(ValueError):
        Selector.parse(bad)
