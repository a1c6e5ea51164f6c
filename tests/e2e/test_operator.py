"""The operator against a real control plane: NVIDIA's Helm-default ClusterPolicy on 4 GPU and 2
CPU kwok nodes, then each change a platform team makes.

Every test gets a cluster of its own, converged on the Helm default (the ``env`` fixture), so
none depends on what another did or on the order they run in. Those whose outcome the API
server's release shapes (convergence by server-side apply, pruning, a restart, the watches'
quiet, deletion) run on the oldest release claimed too; the rest are marked ``one_release``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import testenv
from gpu_operator.controller.runner import OperatorThread
from gpu_operator.kube import Kube
from gpu_operator.labels import OWNED_ANNOTATION
from tests import prerequisites
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    audit_requests,
    audit_writes,
    now,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    start_operator,
    still_there,
    wait_for,
)

NS = "gpu-operator"
# A user's taint that operands do not tolerate would keep them off the node; PreferNoSchedule
# does not, so the GPU node can carry it and still run the stack.
USER_TAINT = {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}
GPU_NODES = ["gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3"]
CPU_NODES = ["cpu-node-0", "cpu-node-1"]
ENABLED_IN_HELM_DEFAULT = {
    "nvidia-driver-daemonset-ubuntu22.04",
    "nvidia-driver-daemonset-rhel9",
    "nvidia-container-toolkit-daemonset",
    "nvidia-operator-validator",
    "nvidia-device-plugin-daemonset",
    "nvidia-dcgm-exporter",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
}
# The steady-state test resyncs this often, so the passes it watches look at everything.
RESYNC_S = 2.0
QUIET_PASSES = 5


@dataclass
class Env:
    cluster: testenv.Cluster
    kube: Kube
    operator: OperatorThread
    settings: dict[str, Any]

    def start_operator(self) -> None:
        identity = service_account_config(self.cluster, NS, "gpu-operator")
        self.operator = start_operator(identity, NS, **self.settings)


@pytest.fixture
def env(request: pytest.FixtureRequest, testenv_bin_dir: Path) -> Iterator[Env]:
    """A cluster of this test's own, the operator (settings from an ``operator`` marker) and
    NVIDIA's Helm-default policy, ready."""
    policy = helm_default()  # before the cluster: a clone without the reference skips cheaply
    marker = request.node.get_closest_marker("operator")
    settings = dict(marker.kwargs) if marker else {}
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        manifests = [
            testenv.node_manifest(
                name,
                gpu=True,
                os_id="rhel" if name == "gpu-node-3" else "ubuntu",
                os_version="9.4" if name == "gpu-node-3" else "22.04",
                extra_labels={"team": "ml"} if name == "gpu-node-0" else None,
                taints=[USER_TAINT] if name == "gpu-node-0" else (),
            )
            for name in GPU_NODES
        ] + [
            testenv.node_manifest(
                name, gpu=False, extra_labels={"team": "web"}, taints=[USER_TAINT]
            )
            for name in CPU_NODES
        ]
        cluster.create_nodes(manifests)
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        env = Env(cluster, kube, start_operator(identity, NS, **settings), settings)
        try:
            env.kube.create(policy)
            wait_ready(env.kube)
            yield env
        finally:
            env.operator.stop()


def helm_default() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        prerequisites.nvidia("clusterpolicy-helm-default.yaml").read_text()
    )
    return doc


def daemonsets(kube: Kube) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in kube.list_objects("DaemonSet", NS)}


def image(kube: Kube, daemonset: str) -> str:
    ds = daemonsets(kube)[daemonset]
    found: str = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    return found


def wait_ready(kube: Kube, name: str = "cluster-policy", timeout: float = 90) -> dict[str, Any]:
    return wait_for(f"ClusterPolicy {name} ready", lambda: policy_ready(kube, name), timeout)


def node(kube: Kube, name: str) -> dict[str, Any]:
    got = kube.get("Node", name)
    assert got is not None
    return got


def operator_labels(n: dict[str, Any]) -> dict[str, str]:
    labels = n["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}


def test_helm_default_converges(env: Env) -> None:
    # `env` returns the moment the policy turned ready, and by then every DaemonSet has its
    # pods on all the nodes labelled for it: 0 of 0 before the DaemonSet controller has seen
    # the labels is not ready.
    ds = daemonsets(env.kube)
    status = policy_status(env.kube, "cluster-policy")
    assert status["state"] == "ready"
    # One write per GPU node (labels, ownership and taint together, never refused for a
    # conflict and asked again), none on CPU nodes: the cluster is this test's own, so since
    # its start.
    node_writes = [
        w["objectRef"]["name"]
        for w in audit_writes(env.cluster, OPERATOR_USER, datetime(2000, 1, 1, tzinfo=UTC))
        if w["objectRef"]["resource"] == "nodes"
    ]
    assert sorted(node_writes) == GPU_NODES
    assert status["namespace"] == NS
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Ready"] == "Reconciled"

    assert set(ds) == ENABLED_IN_HELM_DEFAULT
    assert ds["nvidia-driver-daemonset-ubuntu22.04"]["spec"]["updateStrategy"]["type"] == "OnDelete"
    # One driver DaemonSet per OS, each on its own nodes; mig-manager only on MIG-capable nodes.
    # The driver's are OnDelete: `ready` counted their Ready pods itself, and their
    # controller's numberReady is its own write, which may land after `ready`: waited for.
    per_os = {"nvidia-driver-daemonset-ubuntu22.04": 3, "nvidia-driver-daemonset-rhel9": 1}

    def drivers_counted() -> bool | NotYet:
        now = daemonsets(env.kube)
        got = {name: ((now.get(name) or {}).get("status") or {}).get("numberReady")
               for name in per_os}  # fmt: skip
        return got == per_os or NotYet({"numberReady": got})

    wait_for("the driver DaemonSets' numberReady", drivers_counted)
    assert ds["nvidia-mig-manager"]["status"]["desiredNumberScheduled"] == 0
    for name in ENABLED_IN_HELM_DEFAULT - {
        "nvidia-driver-daemonset-ubuntu22.04",
        "nvidia-driver-daemonset-rhel9",
        "nvidia-mig-manager",
    }:
        assert ds[name]["status"]["numberReady"] == 4, name

    pods = env.kube.list_objects("Pod", NS)
    assert pods and {p["spec"]["nodeName"] for p in pods} == set(GPU_NODES)
    for name in GPU_NODES:
        labels = operator_labels(node(env.kube, name))
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.deploy.driver"] == "true"
        assert "nvidia.com/gpu.deploy.mig-manager" not in labels  # not MIG-capable
        taints = node(env.kube, name)["spec"]["taints"]
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    for name in CPU_NODES:
        got = node(env.kube, name)
        assert operator_labels(got) == {}
        assert got["spec"]["taints"] == [USER_TAINT]
        assert OWNED_ANNOTATION not in (got["metadata"].get("annotations") or {})
    # The user's label and taint on a GPU node are still there.
    gpu0 = node(env.kube, "gpu-node-0")
    assert gpu0["metadata"]["labels"]["team"] == "ml"
    assert USER_TAINT in gpu0["spec"]["taints"]


@pytest.mark.one_release  # the operator's own logic: the same on every release
def test_every_child_is_owned_by_the_policy(env: Env) -> None:
    uid = env.kube.get("ClusterPolicy", "cluster-policy")["metadata"]["uid"]  # type: ignore[index]
    for kind in ("DaemonSet", "ServiceAccount", "ConfigMap", "Service", "Role", "RoleBinding"):
        for obj in env.kube.list_objects(kind, NS, label_selector="app.kubernetes.io/managed-by"):
            refs = obj["metadata"].get("ownerReferences") or []
            assert [r["uid"] for r in refs] == [uid], (kind, obj["metadata"]["name"])


@pytest.mark.one_release  # the operator's own logic: the same on every release
def test_image_version_change_updates_only_that_daemonset(env: Env) -> None:
    before = {n: d["metadata"]["generation"] for n, d in daemonsets(env.kube).items()}
    env.kube.merge_patch(
        "ClusterPolicy", "cluster-policy", {"spec": {"devicePlugin": {"version": "v0.99.0"}}}
    )
    wait_for(
        "device plugin image updated",
        lambda: (
            "v0.99.0" in (got := image(env.kube, "nvidia-device-plugin-daemonset")) or NotYet(got)
        ),
    )
    wait_ready(env.kube)
    after = {n: d["metadata"]["generation"] for n, d in daemonsets(env.kube).items()}
    changed = {n for n in before if after[n] != before[n]}
    assert changed == {"nvidia-device-plugin-daemonset"}


def test_disabling_a_component_prunes_it(env: Env) -> None:
    env.kube.merge_patch(
        "ClusterPolicy", "cluster-policy", {"spec": {"dcgmExporter": {"enabled": False}}}
    )

    def exporter_pruned() -> bool | NotYet:
        ds = daemonsets(env.kube).get("nvidia-dcgm-exporter")
        return ds is None or still_there(ds)

    def exporter_objects_pruned() -> bool | NotYet:
        for kind, name in (
            ("Service", "nvidia-dcgm-exporter"),
            ("ConfigMap", "nvidia-dcgm-exporter-metrics"),
            ("ServiceAccount", "nvidia-dcgm-exporter"),
        ):
            if (obj := env.kube.get(kind, name, NS)) is not None:
                return still_there(obj)
        return True

    def label_removed() -> bool | NotYet:
        for n in GPU_NODES:
            labels = operator_labels(node(env.kube, n))
            if "nvidia.com/gpu.deploy.dcgm-exporter" in labels:
                return NotYet({n: labels})
        return True

    wait_for("dcgm-exporter pruned", exporter_pruned)
    wait_for("exporter Service, ConfigMap, ServiceAccount pruned", exporter_objects_pruned)
    wait_for("deploy label removed", label_removed)

    def reported() -> bool | NotYet:
        # The status patch follows the prunes in the same pass: a moment after them.
        status = policy_ready(env.kube)
        if not status:
            return status
        names = {c["name"] for c in status["components"]}
        return "dcgm-exporter" not in names or NotYet({"components": sorted(names)})

    wait_for("ready without the exporter in the status", reported, timeout=90)


@pytest.mark.one_release  # the operator's own logic: the same on every release
def test_edited_device_plugin_config_rolls_its_pods(env: Env) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "time-slicing", "namespace": NS},
        "data": {
            "any": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - name: nvidia.com/gpu\n      replicas: 4\n"
        },
    }
    env.kube.create(config)
    env.kube.merge_patch(
        "ClusterPolicy",
        "cluster-policy",
        {"spec": {"devicePlugin": {"config": {"name": "time-slicing", "default": "any"}}}},
    )

    def template_hash() -> str | None:
        ds = daemonsets(env.kube)["nvidia-device-plugin-daemonset"]
        annotations = ds["spec"]["template"]["metadata"].get("annotations") or {}
        return annotations.get("nvidia.com/config-hash")

    first = wait_for("config hash on the pod template", template_hash)
    env.kube.merge_patch(
        "ConfigMap", "time-slicing", {"data": {"any": config["data"]["any"].replace("4", "8")}}, NS
    )
    wait_for(
        "pods rolled after the ConfigMap edit",
        lambda: (got := template_hash()) not in (None, first) or NotYet({"config-hash": got}),
    )
    wait_ready(env.kube)


@pytest.mark.one_release  # the operator's own logic: the same on every release
def test_second_policy_is_ignored(env: Env) -> None:
    second = helm_default()
    second["metadata"] = {"name": "zz-second"}
    env.kube.create(second)

    def ignored() -> dict[str, Any] | NotYet:
        status = policy_status(env.kube, "zz-second")
        return status if status.get("state") == "ignored" else NotYet(status)

    status = wait_for("second policy ignored", ignored)
    assert "cluster-policy" in status["message"]
    assert policy_status(env.kube, "cluster-policy")["state"] == "ready"
    env.kube.delete("ClusterPolicy", "zz-second")
    wait_for(
        "second policy gone",
        lambda: (got := env.kube.get("ClusterPolicy", "zz-second")) is None or still_there(got),
    )
    # Its deletion must not clean the nodes the active policy still manages.
    assert operator_labels(node(env.kube, "gpu-node-1"))["nvidia.com/gpu.present"] == "true"


def test_restart_converges_without_duplicates(env: Env) -> None:
    def inventory() -> list[tuple[str, str]]:
        out = []
        for kind in ("DaemonSet", "ServiceAccount", "ConfigMap", "Service", "Role", "RoleBinding"):
            out += [
                (kind, o["metadata"]["name"])
                for o in env.kube.list_objects(kind, NS)
                if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by")
            ]
        return sorted(out)

    before = inventory()
    # Stop mid-change: a new version is in flight when the operator dies.
    env.operator.stop()
    env.kube.merge_patch(
        "ClusterPolicy", "cluster-policy", {"spec": {"toolkit": {"version": "v1.99.0"}}}
    )
    env.start_operator()
    wait_for(
        "toolkit updated after the restart",
        lambda: (
            "v1.99.0" in (got := image(env.kube, "nvidia-container-toolkit-daemonset"))
            or NotYet(got)
        ),
    )
    wait_ready(env.kube)
    assert inventory() == before


@pytest.mark.operator(resync_seconds=RESYNC_S)
def test_steady_state_is_silent(env: Env) -> None:
    """Once ready, passes (resyncs every RESYNC_S, each looking at everything) write nothing
    but the leader Lease's renewals, and read nothing: what the operator knows comes from its
    watches (GPUClusters included), not from polling."""

    def completed() -> float:
        registry = env.operator.metrics.registry
        return registry.get_sample_value("gpu_operator_reconcile_duration_seconds_count") or 0.0

    # The pass that wrote `ready` may still be recording its Events: let one pass complete.
    at_ready = completed()
    wait_for(
        "a pass completed after ready",
        lambda: (n := completed()) > at_ready or NotYet({"passes": n, "at ready": at_ready}),
    )
    start, first = now(), completed()
    wait_for(
        f"{QUIET_PASSES} more passes (a resync every {RESYNC_S:.0f}s)",
        lambda: (n := completed()) >= first + QUIET_PASSES or NotYet({"passes": n, "first": first}),
        timeout=QUIET_PASSES * RESYNC_S * 10,
    )
    writes = audit_writes(env.cluster, OPERATOR_USER, start)
    others = [w for w in writes if w["objectRef"]["resource"] != "leases"]
    assert others == [], [(w["verb"], w["objectRef"]) for w in others]
    leases = {w["objectRef"].get("name") for w in writes} - {None}
    assert leases <= {"gpu-operator-leader"}  # leadership renewals only
    # Watches end and resume every 5 minutes (kopf's with a list of its CRD). This cluster has
    # no Prometheus operator: the ServiceMonitor kind's CRD is watched, not looked for. Nothing
    # else: a resync (here every RESYNC_S) reads nothing.
    reads = [
        r
        for r in audit_requests(env.cluster, OPERATOR_USER, start)
        if r["verb"] != "watch"
        and r["objectRef"]["resource"] != "leases"
        and not r.get("userAgent", "").startswith("kopf/")
    ]
    assert reads == [], [(r["verb"], r["objectRef"]) for r in reads]


@pytest.mark.one_release  # the operator's own logic: the same on every release
def test_node_joining_and_losing_its_gpu(env: Env) -> None:
    env.cluster.create_gpu_node("gpu-node-4")

    def labelled() -> bool | NotYet:
        labels = operator_labels(node(env.kube, "gpu-node-4"))
        return labels.get("nvidia.com/gpu.deploy.driver") == "true" or NotYet(labels)

    wait_for("new node labelled and running the stack", labelled)
    wait_ready(env.kube)
    env.kube.merge_patch(
        "Node",
        "gpu-node-4",
        {"metadata": {"labels": {"feature.node.kubernetes.io/pci-10de.present": None}}},
    )

    def cleaned() -> dict[str, Any] | NotYet:
        got = node(env.kube, "gpu-node-4")
        left = operator_labels(got)
        return got if not left else NotYet(left)

    gone = wait_for("labels and taint removed from the node that lost its GPU", cleaned)
    assert not [t for t in gone["spec"].get("taints") or [] if t["key"] == "nvidia.com/gpu"]


def test_deleting_the_policy_cleans_up_and_keeps_user_state(env: Env) -> None:
    env.kube.delete("ClusterPolicy", "cluster-policy")
    wait_for(
        "policy deleted",
        lambda: (
            (got := env.kube.get("ClusterPolicy", "cluster-policy")) is None or still_there(got)
        ),
    )
    wait_for(
        "children garbage-collected",
        lambda: not (left := daemonsets(env.kube)) or NotYet({"DaemonSets": sorted(left)}),
    )
    for name in GPU_NODES:
        got = node(env.kube, name)
        assert operator_labels(got) == {}, name
        assert not [t for t in got["spec"].get("taints") or [] if t["key"] == "nvidia.com/gpu"]
        assert OWNED_ANNOTATION not in (got["metadata"].get("annotations") or {})
    gpu0 = node(env.kube, "gpu-node-0")
    assert gpu0["metadata"]["labels"]["team"] == "ml"
    assert gpu0["spec"]["taints"] == [USER_TAINT]
    assert node(env.kube, "cpu-node-0")["spec"]["taints"] == [USER_TAINT]
