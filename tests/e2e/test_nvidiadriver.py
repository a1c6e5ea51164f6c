"""NVIDIADriver against the real control plane: three pools on twelve simulated GPU nodes.

A100 ubuntu22.04, H100 rhel9.4 with precompiled drivers and T4 ubuntu24.04, four nodes each:
exactly one DaemonSet per pool and one driver pod per node; a node selected by two
NVIDIADrivers gets neither and both report it; a version bump in the A100 pool upgrades its
four nodes one at a time (its own upgradePolicy) while the other pools' driver pods and
DaemonSets are never written to (audit log), through an operator killed mid-upgrade. NVIDIA's
sample is accepted unchanged and an immutable field change is refused with NVIDIA's message.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpu_operator import testenv
from gpu_operator.controller.runtime.crd_install import ensure_crd
from gpu_operator.kube import Kube
from gpu_operator.views import pod_ready
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    OperatorProcess,
    audit_writes,
    events_with,
    now,
    object_events,
    private_cluster,
    service_account_config,
    start_operator,
    token_kubeconfig,
    wait_for,
)
from tests.e2e.test_upgrade import CordonSampler
from tests.prerequisites import nvidia

NS = "gpu-operator"
POOL = "nvidia.com/gpu.driver-pool"
STATE = "nvidia.com/gpu-driver-upgrade-state"
PRODUCT = "nvidia.com/gpu.product"
GROUPS = {  # pool -> (product, os, version)
    "a100": ("A100", "ubuntu", "22.04"),
    "h100": ("H100", "rhel", "9.4"),
    "t4": ("T4", "ubuntu", "24.04"),
}
NODES = {f"{pool}-{i}": pool for pool in GROUPS for i in range(4)}
ONE_AT_A_TIME = {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": 1,
                 "podDeletion": {"timeoutSeconds": 15}}  # fmt: skip


def nvidiadriver(name: str, version: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": {"driverType": "gpu", "repository": "nvcr.io/nvidia", "image": "driver",
                 "version": version, "nodeSelector": selector,
                 "upgradePolicy": ONE_AT_A_TIME, **spec},
    }  # fmt: skip


CLUSTER_POLICY = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "driver": {
            "useNvidiaDriverCRD": True,
            # The cluster-wide budget every pool's upgrades share.
            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 2,
                              "maxUnavailable": 2},
        },
        "dcgmExporter": {"enabled": False},
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    with private_cluster(testenv_bin_dir) as cluster:
        cluster.create_nodes(
            [
                testenv.node_manifest(
                    name, gpu=True, os_id=GROUPS[pool][1], os_version=GROUPS[pool][2],
                    extra_labels={PRODUCT: GROUPS[pool][0]},
                )
                for name, pool in NODES.items()
            ]
            + [
                testenv.node_manifest(
                    "l4-shared", gpu=True, extra_labels={PRODUCT: "L4", "canary": "true",
                                                         "team": "vision"},
                )
            ]
        )  # fmt: skip
        yield cluster


def driver_pods(kube: Kube) -> list[dict[str, Any]]:
    return kube.list_objects("Pod", NS, label_selector="app.kubernetes.io/component=nvidia-driver")


def driver_sets(kube: Kube) -> list[dict[str, Any]]:
    return kube.list_objects(
        "DaemonSet", NS, label_selector="app.kubernetes.io/component=nvidia-driver"
    )


def status(kube: Kube, name: str) -> dict[str, Any]:
    return (kube.get("NVIDIADriver", name) or {}).get("status") or {}


def pool_ready(kube: Kube, name: str) -> bool | NotYet:
    got = status(kube, name)
    return got.get("state") == "ready" or NotYet(got)


def condition(kube: Kube, name: str, ctype: str) -> dict[str, Any]:
    conditions = status(kube, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype), {})


def error_reported(kube: Kube, name: str) -> dict[str, Any] | NotYet:
    """``name``'s Error condition once True; else that condition as it is."""
    error = condition(kube, name, "Error")
    return error if error.get("status") == "True" else NotYet({"Error": error})


def one_running_pod_per_node(kube: Kube) -> dict[str, dict[str, Any]] | NotYet:
    """The one Running driver pod of each pooled node, by node; else the pods' phases on
    the nodes that are not so."""
    pods = [p for p in driver_pods(kube) if not p["metadata"].get("deletionTimestamp")]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"].get("nodeName") or "", []).append(pod)
    ready = {
        n: ps[0]
        for n, ps in by_node.items()
        if len(ps) == 1 and (ps[0].get("status") or {}).get("phase") == "Running"
    }
    if set(ready) == set(NODES) and set(by_node) == set(NODES):
        return ready
    phases = {
        n: [(p.get("status") or {}).get("phase") for p in by_node.get(n, [])]
        for n in sorted(set(NODES) | set(by_node))
        if n not in ready
    }
    return NotYet({"driver pods' phases": phases})


def served(kube: Kube) -> bool | NotYet:
    for kind in ("NVIDIADriver", "ClusterPolicy"):
        try:
            kube.list_objects(kind)
        except ApiException as exc:
            if exc.status == 404:
                return NotYet(f"listing {kind}: 404")
            raise
    return True


def test_pools_conflicts_and_a_pool_upgrade(cluster: testenv.Cluster, tmp_path: Path) -> None:
    with cluster.api_client() as api:
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        operator = OperatorProcess(
            token_kubeconfig(cluster, identity, tmp_path / "kc"), tmp_path / "op.log", NS
        )
        operator.start()
        try:
            wait_for("NVIDIADriver API served", lambda: served(kube), timeout=90)
            kube.create(nvidiadriver("a100", "570.172.08", {PRODUCT: "A100"}))
            kube.create(nvidiadriver("h100", "570", {PRODUCT: "H100"}, usePrecompiled=True))
            kube.create(nvidiadriver("t4", "535.261.03", {PRODUCT: "T4"}))
            # Two drivers that both select the L4 node: it gets neither.
            kube.create(nvidiadriver("canary", "580.95.05", {"canary": "true"}))
            kube.create(nvidiadriver("vision", "580.95.05", {"team": "vision"}))
            # After the operator has seen every NVIDIADriver (with none, it would create a
            # default one; with one of the two, the shared node would join it and stay).
            for name in ("a100", "h100", "t4", "canary", "vision"):
                wait_for(f"{name} seen", lambda n=name: status(kube, n).get("state") == "ignored")
            kube.create(CLUSTER_POLICY)

            pods = wait_for("one running driver pod on each pooled node",
                            lambda: one_running_pod_per_node(kube), timeout=180)  # fmt: skip
            sets = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in driver_sets(kube)}
            assert sorted(sets) == [
                "nvidia-gpu-driver-rhel9.4",
                "nvidia-gpu-driver-ubuntu22.04",
                "nvidia-gpu-driver-ubuntu24.04",
            ]
            images = {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"]
                      for p in pods.values()}  # fmt: skip
            assert images["a100-0"] == "nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"
            assert images["t4-3"] == "nvcr.io/nvidia/driver:535.261.03-ubuntu24.04"
            assert images["h100-1"].startswith("nvcr.io/nvidia/driver:570-")
            assert images["h100-1"].endswith("-rhel9.4")
            for pool in GROUPS:
                wait_for(f"{pool} ready", lambda p=pool: pool_ready(kube, p), timeout=120)

            # The overlapped node: reported by both, labelled for neither, no driver pod.
            for name in ("canary", "vision"):  # each Event its own write, after the status
                events_with(
                    f"{name}'s conflict",
                    partial(object_events, kube, "NVIDIADriver", name),
                    "NodeSelectorConflict",
                )

            # A version bump in the A100 pool; the others must stay untouched.
            others = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods.values()
                      if not p["spec"]["nodeName"].startswith("a100-")}  # fmt: skip
            other_sets = [d["metadata"]["name"] for d in driver_sets(kube)
                          if "ubuntu22.04" not in d["metadata"]["name"]]  # fmt: skip
            bumped_at = now()
            sampler = CordonSampler(cluster)
            kube.merge_patch("NVIDIADriver", "a100", {"spec": {"version": "580.95.05"}})

            def states(pool: str) -> list[str | None]:
                return [
                    (kube.get("Node", n) or {})["metadata"]["labels"].get(STATE)
                    for n, p in NODES.items() if p == pool
                ]  # fmt: skip

            def done(pool: str) -> int:
                return states(pool).count("upgrade-done")

            def upgraded(pool: str, count: int) -> bool | NotYet:
                """At least ``count`` of ``pool``'s nodes upgrade-done; else their states."""
                now = states(pool)
                return now.count("upgrade-done") >= count or NotYet({STATE: now})

            wait_for("first A100 node upgraded", lambda: upgraded("a100", 1), timeout=180)
            operator.kill()  # mid-upgrade, no goodbye: the Lease must expire first
            time.sleep(2)
            operator.start()
            wait_for("A100 pool upgraded", lambda: upgraded("a100", 4), timeout=300)
            samples = sampler.stop()
            after = wait_for("one running driver pod on each pooled node again",
                             lambda: one_running_pod_per_node(kube), timeout=120)  # fmt: skip
            report = subprocess.run(
                [sys.executable, "-m", "gpu_operator", "upgrade", "status",
                 "--kubeconfig", str(cluster.kubeconfig)],
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout  # fmt: skip
        finally:
            operator.kill()

        assert samples and max(samples) <= 1, f"more than 1 node cordoned: {max(samples)}"
        for node, pool in NODES.items():
            image = after[node]["spec"]["containers"][0]["image"]
            if pool == "a100":
                assert image == "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04", (node, image)
            assert not (kube.get("Node", node) or {})["spec"].get("unschedulable"), node
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after.values()
                if not p["spec"]["nodeName"].startswith("a100-")} == others  # fmt: skip
        assert done("h100") == 0 and done("t4") == 0
        pools_in_report = [
            line.split()[1] for line in report.splitlines() if line.startswith("POOL")
        ]
        assert pools_in_report == ["a100", "canary", "h100", "t4", "vision"], report
        assert "4/4 done" in report.split("POOL ")[1], report

    # From the audit log: since the bump the operator wrote nothing to the other pools' driver
    # pods, their DaemonSets or their nodes' upgrade state.
    touched = [
        e for e in audit_writes(cluster, OPERATOR_USER, bumped_at)
        if (e.get("objectRef") or {}).get("name") in {*others, *other_sets}
        or ((e.get("objectRef") or {}).get("resource") == "nodes"
            and not e["objectRef"]["name"].startswith(("a100-",)))
    ]  # fmt: skip
    assert not touched, [(e["verb"], e["objectRef"]) for e in touched]


def _sample() -> dict[str, Any]:
    path = nvidia("nvidiadriver-sample.yaml")
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def test_nvidia_sample_accepted_and_immutable_fields_refused(cluster: testenv.Cluster) -> None:
    sample = _sample()
    with cluster.api_client() as api:
        kube = Kube(api)
        ensure_crd(kube)
        wait_for("NVIDIADriver API served", lambda: served(kube))
        name = "sample-" + datetime.now().strftime("%H%M%S%f")
        created = kube.create({**sample, "metadata": {"name": name}})
        try:
            assert created["spec"]["upgradePolicy"]["maxUnavailable"] == "25%"
            assert created["spec"]["default"] is False  # NVIDIA's default filled in
            for field, value in (("driverType", "vgpu"), ("usePrecompiled", True)):
                with pytest.raises(ApiException) as refused:
                    kube.merge_patch("NVIDIADriver", name, {"spec": {field: value}})
                assert refused.value.status == 422
                assert (
                    f"{field} is an immutable field. Please create a new NvidiaDriver resource "
                    "instead when you want to change this setting."
                ) in (refused.value.body or "")
            with pytest.raises(ApiException) as refused:
                kube.merge_patch(
                    "NVIDIADriver", name, {"spec": {"default": True, "nodeSelector": {"a": "b"}}}
                )
            assert "default NVIDIADriver must not use nodeSelector" in (refused.value.body or "")
            # A name that cannot be the nodes' pool label value is refused at apply, not later.
            with pytest.raises(ApiException) as refused:
                kube.create({**sample, "metadata": {"name": name + "-" + "x" * (63 - len(name))}})
            assert refused.value.status == 422
            assert "metadata.name must be at most 63 characters" in (refused.value.body or "")
            assert kube.create({**sample, "metadata": {"name": name[:1] + "x" * 62}})
            kube.delete("NVIDIADriver", name[:1] + "x" * 62)
        finally:
            kube.delete("NVIDIADriver", name)


class DriverlessSampler:
    """Every 100 ms, how many of ``nodes`` have no Ready driver pod (either kind)."""

    def __init__(self, cluster: testenv.Cluster, nodes: list[str]) -> None:
        self.samples: list[int] = []
        self._nodes = nodes
        self._stop = threading.Event()
        self._cluster = cluster
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._cluster.api_client() as api:
            kube = Kube(api)
            while not self._stop.is_set():
                pods = kube.list_objects("Pod", NS)
                covered = {
                    p["spec"].get("nodeName")
                    for p in pods
                    if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
                    in ("driver", "nvidia-driver")
                    and pod_ready(p)
                    and not p["metadata"].get("deletionTimestamp")
                }
                self.samples.append(sum(1 for n in self._nodes if n not in covered))
                time.sleep(0.1)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(10)
        return self.samples


@contextlib.contextmanager
def four_gpu_nodes(testenv_bin_dir: Path) -> Iterator[tuple[testenv.Cluster, Kube, list[str]]]:
    """A private cluster of four GPU nodes with the operator on it (stopped on leaving)."""
    nodes = [f"gpu-{i}" for i in range(4)]
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        cluster.create_nodes([testenv.node_manifest(n, gpu=True) for n in nodes])
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
        try:
            yield cluster, Kube(api), nodes
        finally:
            operator.stop()


def driver_ready_on(kube: Kube, component: str, nodes: list[str]) -> Callable[[], bool | NotYet]:
    """Whether a driver pod of ``component`` (the ClusterPolicy's ``driver``, the pools'
    ``nvidia-driver``) is Ready on every one of ``nodes``."""

    def check() -> bool | NotYet:
        selector = f"app.kubernetes.io/component={component}"
        pods = kube.list_objects("Pod", NS, label_selector=selector)
        ready = {p["spec"].get("nodeName") for p in pods if pod_ready(p)}
        return ready == set(nodes) or NotYet({"Ready on": ready})

    return check


def default_pool_everywhere(kube: Kube, nodes: list[str]) -> None:
    """A ClusterPolicy with the flag set from the start: every node in ``default``, its
    driver Ready."""
    driver = {"version": "570.172.08", "useNvidiaDriverCRD": True}
    kube.create({**CLUSTER_POLICY, "spec": {"driver": driver, "dcgmExporter": {"enabled": False}}})
    wait_for("the default NVIDIADriver's driver on every node",
             driver_ready_on(kube, "nvidia-driver", nodes), timeout=120)  # fmt: skip


def test_switching_the_flag_hands_nodes_over_one_at_a_time(testenv_bin_dir: Path) -> None:
    with four_gpu_nodes(testenv_bin_dir) as (cluster, kube, nodes):
        spec = {"driver": {"version": "570.172.08"}, "dcgmExporter": {"enabled": False}}
        kube.create({**CLUSTER_POLICY, "spec": spec})
        wait_for("the ClusterPolicy's driver on every node",
                 driver_ready_on(kube, "driver", nodes), timeout=120)  # fmt: skip
        sampler = DriverlessSampler(cluster, nodes)
        kube.merge_patch("ClusterPolicy", "cluster-policy",
                         {"spec": {"driver": {"useNvidiaDriverCRD": True}}})  # fmt: skip
        default = wait_for("the default NVIDIADriver", lambda: kube.get("NVIDIADriver", "default"))
        assert default["spec"]["default"] is True
        assert default["spec"]["version"] == "570.172.08"

        def handed_over() -> bool | NotYet:
            labels = [(kube.get("Node", n) or {})["metadata"]["labels"] for n in nodes]
            legacy = kube.list_objects(
                "DaemonSet", NS, label_selector="app.kubernetes.io/component=driver"
            )
            if all(lab.get(POOL) == "default" for lab in labels) and not legacy:
                return True
            pools = {n: lab.get(POOL) for n, lab in zip(nodes, labels, strict=True)}
            return NotYet({POOL: pools, "legacy": [d["metadata"]["name"] for d in legacy]})

        wait_for("every node handed over, the old driver pruned", handed_over, timeout=180)
        wait_for("a new driver pod Ready on every node",
                 driver_ready_on(kube, "nvidia-driver", nodes))  # fmt: skip
        samples = sampler.stop()
        assert samples and max(samples) <= 1, f"{max(samples)} nodes without a driver at once"
        images = {p["spec"]["containers"][0]["image"] for p in driver_pods(kube)}
        assert images == {"nvcr.io/nvidia/driver:570.172.08-ubuntu22.04"}


def test_turning_the_flag_off_hands_nodes_back_one_at_a_time(testenv_bin_dir: Path) -> None:
    """The way back: the ClusterPolicy's driver takes the pools' nodes one at a time (never
    all of them at once, as deleting the pools' DaemonSets would), the pools' DaemonSets go
    last, and its own DaemonSet keeps the template it was created with (a changed one would
    mark every driver pod out of date: a fleet-wide upgrade for nothing)."""
    with four_gpu_nodes(testenv_bin_dir) as (cluster, kube, nodes):
        default_pool_everywhere(kube, nodes)
        sampler = DriverlessSampler(cluster, nodes)
        kube.merge_patch("ClusterPolicy", "cluster-policy",
                         {"spec": {"driver": {"useNvidiaDriverCRD": False}}})  # fmt: skip

        def handed_back() -> bool | NotYet:
            labels = [(kube.get("Node", n) or {})["metadata"]["labels"] for n in nodes]
            left = {n: lab[POOL] for n, lab in zip(nodes, labels, strict=True) if POOL in lab}
            pools = [d["metadata"]["name"] for d in driver_sets(kube)]
            return (not left and not pools) or NotYet({POOL: left, "pools' DaemonSets": pools})

        def policy_ready() -> bool | NotYet:
            state = (kube.get("ClusterPolicy", "cluster-policy") or {}).get("status") or {}
            return state.get("state") == "ready" or NotYet(state.get("state"))

        wait_for("every node handed back, the pools' drivers pruned", handed_back, timeout=180)
        wait_for("the ClusterPolicy's driver Ready on every node",
                 driver_ready_on(kube, "driver", nodes))  # fmt: skip
        wait_for("the policy ready", policy_ready)
        samples = sampler.stop()
        # A pass that starts after the pools' DaemonSets went (so one that sees every node
        # out of its pool): one for a later edit that leaves the driver as it is.
        edited = kube.merge_patch("ClusterPolicy", "cluster-policy",
                                  {"spec": {"dcgmExporter": {"enabled": True}}})  # fmt: skip
        generation = edited["metadata"]["generation"]

        def edit_seen() -> bool | NotYet:
            got = (kube.get("ClusterPolicy", "cluster-policy") or {}).get("status") or {}
            return got.get("observedGeneration") == generation or NotYet(got)

        wait_for("a pass for the later edit", edit_seen)
        (legacy,) = kube.list_objects(
            "DaemonSet", NS, label_selector="app.kubernetes.io/component=driver"
        )
        assert samples and max(samples) <= 1, f"{max(samples)} nodes without a driver at once"
        assert legacy["metadata"]["generation"] == 1, "its template changed after the handback"
        assert status(kube, "default")["state"] == "ignored"


def test_a_new_pool_takes_its_nodes_from_default_one_at_a_time(testenv_bin_dir: Path) -> None:
    """An NVIDIADriver created to split ``default``: each node runs default's driver until it
    moves, so the nodes move one at a time (the new pool's maxParallelUpgrades), never all
    their drivers restarting together."""
    with four_gpu_nodes(testenv_bin_dir) as (cluster, kube, nodes):
        default_pool_everywhere(kube, nodes)
        sampler = DriverlessSampler(cluster, nodes)
        kube.create(nvidiadriver("amd64", "580.95.05", {"kubernetes.io/arch": "amd64"}))

        def moved() -> bool | NotYet:
            labels = [(kube.get("Node", n) or {})["metadata"]["labels"] for n in nodes]
            pools = {n: lab.get(POOL) for n, lab in zip(nodes, labels, strict=True)}
            new = {
                p["spec"].get("nodeName")
                for p in driver_pods(kube)
                if pod_ready(p) and "580.95.05" in p["spec"]["containers"][0]["image"]
            }
            if set(pools.values()) == {"amd64"} and new == set(nodes):
                return True
            return NotYet({POOL: pools, "new driver Ready on": new})

        wait_for("every node in the new pool, its driver Ready", moved, timeout=180)
        samples = sampler.stop()
        assert samples and max(samples) <= 1, f"{max(samples)} nodes without a driver at once"
