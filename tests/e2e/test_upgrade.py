"""A driver version bump rolled across 8 GPU nodes on 2 OS releases, against the real control
plane: maxParallelUpgrades 2 and maxUnavailable 25% hold at every sample, GPU pods are evicted
before their node's driver is replaced, a PodDisruptionBudget fails one node while the others
finish, and an operator killed mid-rollout is replaced by one that finishes without repeating a
node."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.kube import Kube
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    OperatorProcess,
    audit_requests,
    events_with,
    node_events,
    policy_api_served,
    policy_status,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
NODES = [f"gpu-node-{i}" for i in range(8)]
PROTECTED = "gpu-node-7"  # its GPU pod is guarded by a PDB that allows no eviction
STATE = "nvidia.com/gpu-driver-upgrade-state"


def policy(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "driver": {
                "version": version,
                "upgradePolicy": {
                    "autoUpgrade": True,
                    "maxParallelUpgrades": 2,
                    "maxUnavailable": "25%",
                    "podDeletion": {"timeoutSeconds": 15, "force": False},
                },
            },
            "dcgmExporter": {"enabled": False},
        },
    }


def gpu_pod(node: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"train-{node}", "namespace": "default", "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


class CordonSampler:
    """Counts cordoned GPU nodes every 100 ms for the whole rollout."""

    def __init__(self, cluster: testenv.Cluster) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._cluster = cluster
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._cluster.api_client() as api:
            kube = Kube(api)
            while not self._stop.is_set():
                nodes = kube.list_objects("Node")
                self.samples.append(sum(1 for n in nodes if n["spec"].get("unschedulable")))
                time.sleep(0.1)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


@pytest.fixture(scope="module")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    with private_cluster(testenv_bin_dir) as cluster:
        cluster.create_nodes(
            [
                testenv.node_manifest(
                    name, gpu=True,
                    os_id="ubuntu" if i < 4 else "rhel",
                    os_version="22.04" if i < 4 else "9.4",
                )
                for i, name in enumerate(NODES)
            ]
        )  # fmt: skip
        yield cluster


def driver_pods(kube: Kube) -> dict[str, dict[str, Any]]:
    pods = kube.list_objects("Pod", NS, label_selector="app.kubernetes.io/component=driver")
    return {p["spec"]["nodeName"]: p for p in pods if p["spec"].get("nodeName")}


def test_driver_upgrade_rolls_safely(cluster: testenv.Cluster, tmp_path: Path) -> None:
    with cluster.api_client() as api:
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        operator = OperatorProcess(
            token_kubeconfig(cluster, identity, tmp_path / "kc"), tmp_path / "op.log", NS
        )
        operator.start()
        try:
            wait_for("ClusterPolicy API served", lambda: policy_api_served(kube))
            kube.create(policy("580.95.05"))
            wait_for(
                "stack ready",
                lambda: (
                    (s := policy_status(kube, "cluster-policy")).get("state") == "ready"
                    or NotYet(s)
                ),
                timeout=120,
            )
            for node in NODES:
                kube.create(gpu_pod(node, "protected" if node == PROTECTED else "train"))
            kube.create({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "protected", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}},
            })  # fmt: skip

            def pdb_computed() -> bool | NotYet:
                pdb = "/apis/policy/v1/namespaces/default/poddisruptionbudgets/protected"
                status = kube.request("GET", pdb).get("status", {})
                return status.get("currentHealthy") == 1 or NotYet(status)

            wait_for("PDB computed", pdb_computed)
            pods_before = driver_pods(kube)
            before = {n: p["metadata"]["uid"] for n, p in pods_before.items()}
            before_names = {p["metadata"]["name"]: n for n, p in pods_before.items()}
            assert set(before) == set(NODES)
            validators_before = {
                p["metadata"]["name"]: p["spec"]["nodeName"]
                for p in kube.list_objects(
                    "Pod", NS, label_selector="app=nvidia-operator-validator"
                )
            }
            assert sorted(validators_before.values()) == sorted(NODES)

            sampler = CordonSampler(cluster)
            kube.merge_patch("ClusterPolicy", "cluster-policy",
                             {"spec": {"driver": {"version": "580.105.08"}}})  # fmt: skip

            def done_count() -> int:
                return sum(
                    1 for n in NODES
                    if (kube.get("Node", n) or {})["metadata"]["labels"].get(STATE)
                    == "upgrade-done"
                )  # fmt: skip

            wait_for(
                "three nodes upgraded",
                lambda: (n := done_count()) >= 3 or NotYet({"upgrade-done": n}),
                timeout=180,
            )
            operator.kill()  # mid-rollout, no goodbye: the Lease must expire first, so the
            operator.start()  # new process is down for the Lease's duration without a sleep

            def finished() -> bool | NotYet:
                states = {
                    n: (kube.get("Node", n) or {})["metadata"]["labels"].get(STATE) for n in NODES
                }
                others = all(states[n] == "upgrade-done" for n in NODES if n != PROTECTED)
                return (others and states[PROTECTED] == "upgrade-failed") or NotYet(states)

            def summary_caught_up() -> bool | NotYet:
                upgrade = policy_status(kube, "cluster-policy").get("upgrade") or {}
                counts = {k: upgrade.get(k) for k in ("done", "failed", "inProgress")}
                return counts == {"done": 7, "failed": 1, "inProgress": 0} or NotYet(upgrade)

            wait_for("rollout finished", finished, timeout=300)
            samples = sampler.stop()
            wait_for("status summary caught up", summary_caught_up)
        finally:
            operator.kill()

        assert samples and max(samples) <= 2, f"more than 2 nodes cordoned: {max(samples)}"
        # Every upgraded node runs a new driver pod and is schedulable again.
        after = driver_pods(kube)
        for node in NODES:
            got = kube.get("Node", node) or {}
            if node == PROTECTED:
                assert got["spec"].get("unschedulable") is True  # failed nodes stay cordoned
                assert after[node]["metadata"]["uid"] == before[node]
                continue
            assert not got["spec"].get("unschedulable"), node
            assert after[node]["metadata"]["uid"] != before[node], node
            image = after[node]["spec"]["containers"][0]["image"]
            assert "580.105.08" in image, image
        report = subprocess.run(
            [sys.executable, "-m", "gpu_operator", "upgrade", "status",
             "--kubeconfig", str(cluster.kubeconfig)],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        assert f"{PROTECTED}  upgrade-failed" in report
        assert "7/8 done" in report
        events_with("the failure recorded", lambda: node_events(kube, PROTECTED), "UpgradeFailed")

    # From the audit log: on each node the GPU pod was evicted before the driver pod was
    # deleted, and no driver pod was deleted twice or after its node was done (the restarted
    # operator repeated nothing). kwok keeps validator pods Ready through the driver restart,
    # so each upgraded node's validator was stale and was restarted, once, after its driver.
    evicted: dict[str, datetime] = {}
    deleted: list[tuple[str, datetime]] = []
    for event in audit_requests(cluster, OPERATOR_USER, datetime(2000, 1, 1, tzinfo=UTC)):
        ref = event.get("objectRef") or {}
        stamp = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if ref.get("subresource") == "eviction" and ref.get("name", "").startswith("train-"):
            evicted.setdefault(ref["name"].removeprefix("train-"), stamp)
        elif (event["verb"] == "delete" and ref.get("resource") == "pods"
                and ref.get("namespace") == NS):  # fmt: skip
            deleted.append((ref["name"], stamp))
    assert set(evicted) >= set(NODES) - {PROTECTED}
    drivers_deleted = {name: stamp for name, stamp in deleted if name in before_names}
    validators_deleted = [(name, stamp) for name, stamp in deleted if name in validators_before]
    assert len(drivers_deleted) + len(validators_deleted) == len(deleted), deleted
    names = [name for name, _ in deleted if name in before_names]
    assert sorted(names) == sorted(n for n, node in before_names.items() if node != PROTECTED)
    for name, stamp in drivers_deleted.items():
        assert evicted[before_names[name]] < stamp, name
    driver_deleted_at = {before_names[name]: stamp for name, stamp in drivers_deleted.items()}
    validator_nodes = [validators_before[name] for name, _ in validators_deleted]
    assert sorted(validator_nodes) == sorted(set(NODES) - {PROTECTED}), validators_deleted
    for name, stamp in validators_deleted:
        assert driver_deleted_at[validators_before[name]] < stamp, name
