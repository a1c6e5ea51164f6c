"""Canary driver rollouts per NVIDIADriver pool against the real control plane, on kwok nodes.

Two pools of three nodes, each with its own canary (one node). Pool ``a`` is bumped to a driver
whose pods never pass their readiness (the simulated fault ``GPU_OPERATOR_SIMULATE_FAULT=
not-ready``, what a driver that fails validation looks like to the operator): its canary fails
at the gate's timeout, is rolled back to the previous driver and is in service again, the pool
holds (status condition, Warning Event, metric), and no other node of either pool, nor any of
their pods, is written to (audit log). An operator killed while the canary soaks resumes. Then
a good version rolls pool ``b``'s canary first, soaks it, then the rest of ``b``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.labels import DRIVER_POOL, GPU_PRESENT, OWNED_ANNOTATION
from gpu_operator.testenv.processes import free_ports
from gpu_operator.views import pod_ready
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    OperatorProcess,
    audit_writes,
    events_with,
    object_events,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
POOL_LABEL = "nvidia.com/gpu.driver-pool"
STATE = "nvidia.com/gpu-driver-upgrade-state"
POOLS = {"a": [f"a-{i}" for i in range(3)], "b": [f"b-{i}" for i in range(3)]}
CANARY = {"a": "a-0", "b": "b-0"}  # the first by name
OLD, BAD, GOOD = "580.95.05", "580.105.08", "580.126.09"
UPGRADE = {
    "autoUpgrade": True,
    "maxParallelUpgrades": 1,
    "maxUnavailable": 1,
    "podDeletion": {"timeoutSeconds": 10},
    "canary": {"nodes": 1, "soak": "8s", "timeout": "25s"},
}

pytestmark = pytest.mark.timeout(900)


def nvidiadriver(
    name: str, version: str, env: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driverType": "gpu", "repository": "nvcr.io/nvidia", "image": "driver",
        "version": version, "nodeSelector": {"pool": name}, "upgradePolicy": UPGRADE,
    }  # fmt: skip
    if env:
        spec["env"] = env
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


CLUSTER_POLICY = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {"driver": {"useNvidiaDriverCRD": True}, "dcgmExporter": {"enabled": False}},
}


@pytest.fixture(scope="module")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    with private_cluster(testenv_bin_dir) as cluster:
        cluster.create_nodes(
            [
                testenv.node_manifest(name, gpu=True, extra_labels={"pool": pool})
                for pool, names in POOLS.items()
                for name in names
            ]
        )
        yield cluster


def driver_pods(kube: Kube, pool: str) -> dict[str, dict[str, Any]]:
    """The pool's own driver pods by node: the operator's ``default`` NVIDIADriver (made while
    the policy had none) ran on these nodes first, with the same driver version."""
    pods = kube.list_objects("Pod", NS, label_selector="app.kubernetes.io/component=nvidia-driver")
    return {
        p["spec"]["nodeName"]: p
        for p in pods
        if p["spec"].get("nodeName") in POOLS[pool]
        and not p["metadata"].get("deletionTimestamp")
        and (p["spec"].get("nodeSelector") or {}).get(DRIVER_POOL) == pool
    }


def on_version(kube: Kube, pool: str, nodes: list[str], version: str) -> bool | NotYet:
    """Each of ``nodes`` runs one Ready driver pod of ``version`` and is in service."""
    pods = driver_pods(kube, pool)
    seen = {}
    for name in nodes:
        pod = pods.get(name)
        image = pod["spec"]["containers"][0]["image"] if pod else None
        node = kube.get("Node", name) or {}
        labels = node["metadata"].get("labels") or {}
        state, member = labels.get(STATE), labels.get(DRIVER_POOL)
        ok = pod is not None and version in str(image) and pod_ready(pod) and member == pool
        ok = ok and not node["spec"].get("unschedulable") and state in (None, "upgrade-done")
        seen[name] = {
            "image": image, "ready": bool(pod and pod_ready(pod)), "state": state, "pool": member
        }  # fmt: skip
        if not ok:
            return NotYet(seen)
    return True


def labelled(kube: Kube) -> bool | NotYet:
    """Every node carries what the ClusterPolicy's node pass writes in one patch: the labels,
    the taint and the annotation naming what it owns."""
    missing = {}
    for name in (*POOLS["a"], *POOLS["b"]):
        meta = (kube.get("Node", name) or {}).get("metadata") or {}
        if (meta.get("labels") or {}).get(GPU_PRESENT) != "true" or OWNED_ANNOTATION not in (
            meta.get("annotations") or {}
        ):
            missing[name] = sorted(meta.get("labels") or {})
    return not missing or NotYet(missing)


def rollout(kube: Kube, pool: str) -> dict[str, Any]:
    return ((kube.get("NVIDIADriver", pool) or {}).get("status") or {}).get("rollout") or {}


def phase_is(kube: Kube, pool: str, *phases: str) -> dict[str, Any] | NotYet:
    got = rollout(kube, pool)
    return got if got.get("phase") in phases else NotYet(got)


def test_a_failing_driver_is_rolled_back_on_its_canary_and_a_good_one_goes_canary_first(
    cluster: testenv.Cluster, tmp_path: Path
) -> None:
    with cluster.api_client() as api:
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        (port,) = free_ports(1)
        kubeconfig = token_kubeconfig(cluster, identity, tmp_path / "kc")
        operator = OperatorProcess(kubeconfig, tmp_path / "op.log", NS, metrics_port=port)
        started = datetime.now().astimezone()
        operator.start()
        try:
            wait_for("NVIDIADriver API served", partial(_served, kube), timeout=90)
            kube.create(CLUSTER_POLICY)
            for pool in POOLS:
                kube.create(nvidiadriver(pool, OLD))
            for pool, nodes in POOLS.items():
                wait_for(
                    f"pool {pool} on {OLD}",
                    partial(on_version, kube, pool, nodes, OLD),
                    timeout=180,
                )
                wait_for(f"pool {pool} settled", partial(phase_is, kube, pool, "done"))
            # The ClusterPolicy's own node writes (labels, taint) are another loop's, which the
            # pools' state does not show: here the last of them lands ~1 s before ``since``
            # (b-2's, the last of six), and a CI run at 5 workers found a write to b-2 after it.
            wait_for("every node labelled by the ClusterPolicy", partial(labelled, kube))
            before = {pool: driver_pods(kube, pool) for pool in POOLS}
            since = datetime.now().astimezone()

            # Pool a: a driver whose pods never turn Ready.
            fault = [{"name": "GPU_OPERATOR_SIMULATE_FAULT", "value": "not-ready"}]
            kube.merge_patch("NVIDIADriver", "a", {"spec": {"version": BAD, "env": fault}})
            wait_for("a's canary upgrading", partial(phase_is, kube, "a", "canary"))
            assert rollout(kube, "a")["nodes"] == [CANARY["a"]]
            operator.kill()  # while the canary upgrades: its successor carries on from status
            operator.start()
            restarted = datetime.now().astimezone()
            held = wait_for(
                "a's canary failed, rolled back, held",
                partial(phase_is, kube, "a", "held"),
                timeout=180,
            )
            failure = held["failure"]
            assert failure["node"] == CANARY["a"] and failure["gate"] == "driver", failure
            wait_for(
                "a's canary back on the old driver, in service",
                partial(on_version, kube, "a", [CANARY["a"]], OLD),
                timeout=120,
            )
            conditions = {
                c["type"]: c for c in (kube.get("NVIDIADriver", "a") or {})["status"]["conditions"]
            }
            assert conditions["UpgradeFailed"]["status"] == "True", conditions
            assert f"node {CANARY['a']}, gate driver" in conditions["UpgradeFailed"]["message"]
            events_with(
                "a rolled back",
                partial(object_events, kube, "NVIDIADriver", "a"),
                "UpgradeFailed",
                "RolledBack",
            )
            failures = 'gpu_operator_driver_rollout_failures_total{gate="driver"}'
            wait_for(  # counted once the UpgradeFailed Event is created
                "the failure counted",
                lambda: (n := operator.metrics().get(failures)) == 1.0 or NotYet(n),
            )

            # Nothing outside a's canary was touched: its other nodes and their pods, pool b.
            untouched = [n for n in (*POOLS["a"], *POOLS["b"]) if n != CANARY["a"]]
            for name in untouched:
                writes = audit_writes(cluster, OPERATOR_USER, since, resource=("nodes", name))
                if writes:  # which operator wrote, and whether it repeats a write from before
                    every = audit_writes(cluster, OPERATOR_USER, started, resource=("nodes", name))
                    seen = {"since": since.isoformat(), "restarted": restarted.isoformat()}
                    # A string, not an object: pytest cuts an object's repr short, and the body.
                    raise AssertionError(
                        json.dumps([name, seen, *map(_what, every)], indent=1, default=str)
                    )
            others = [
                p["metadata"]["name"]
                for pool in POOLS
                for n, p in before[pool].items()
                if n != CANARY["a"]
            ]
            for pod in others:
                assert not audit_writes(cluster, OPERATOR_USER, since, resource=("pods", pod)), pod
            # Held: the spec still names the bad driver, and nothing moves, across a restart too.
            operator.kill()
            restarted = datetime.now().astimezone()
            operator.start()
            wait_for("the successor leads", partial(_leads, operator))
            assert rollout(kube, "a")["phase"] == "held"
            for name in POOLS["a"]:
                assert not audit_writes(
                    cluster, OPERATOR_USER, restarted, resource=("nodes", name)
                ), name

            # Pool b: a good version, canary first; the operator dies while the canary soaks.
            kube.merge_patch("NVIDIADriver", "b", {"spec": {"version": GOOD}})
            wait_for(
                "b's canary upgraded, soaking", partial(phase_is, kube, "b", "soaking"), timeout=120
            )
            assert driver_pods(kube, "b")[CANARY["b"]]["spec"]["containers"][0]["image"].endswith(
                f"{GOOD}-ubuntu22.04"
            )
            for name in POOLS["b"][1:]:  # the rest wait for the soak
                pod = driver_pods(kube, "b")[name]
                assert OLD in pod["spec"]["containers"][0]["image"], name
            operator.kill()
            operator.start()
            wait_for(
                "b's fleet followed", partial(on_version, kube, "b", POOLS["b"], GOOD), timeout=240
            )
            wait_for("b done", partial(phase_is, kube, "b", "done"), timeout=60)
            events_with(
                "b done",
                partial(object_events, kube, "NVIDIADriver", "b"),
                *("CanaryStarted", "CanaryUpgraded", "CanaryPassed", "UpgradeComplete"),
            )
            assert rollout(kube, "a")["phase"] == "held"  # b's rollout left a as it was
        finally:
            operator.kill()


def _what(write: dict[str, Any]) -> dict[str, Any]:
    """An audit event, as much as says which write it was."""
    ref = write.get("objectRef") or {}
    return {
        "verb": write.get("verb"),
        "subresource": ref.get("subresource"),
        "at": write.get("requestReceivedTimestamp"),
        "answered": write.get("stageTimestamp"),
        "code": (write.get("responseStatus") or {}).get("code"),
        "userAgent": write.get("userAgent"),
        "body": write.get("requestObject"),
    }


def _leads(operator: OperatorProcess) -> bool | NotYet:
    """The operator holds the Lease and has made a pass (its metrics say so)."""
    samples = operator.metrics()
    leading = samples.get("gpu_operator_leader") == 1.0
    passes = samples.get("gpu_operator_reconcile_total", 0.0)
    return (leading and passes > 0) or NotYet({"leader": leading, "passes": passes})


def _served(kube: Kube) -> bool | NotYet:
    try:
        kube.list_objects("NVIDIADriver")
    except Exception as exc:  # 404 until the operator has installed the CRD
        return NotYet(str(exc)[:200])
    return True
