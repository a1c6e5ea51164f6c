"""The GPUCluster loop's pure decision: what to apply, which nodes get DRA, what status says,
and how a node both stacks target is reported instead of advertised twice."""

from __future__ import annotations

from typing import Any

from gpu_operator.api.gpucluster import example_document
from gpu_operator.controller.clusterpolicy.status import Observation, compute_status
from gpu_operator.controller.gpucluster.decide import (
    CONFLICT,
    FINALIZER,
    TOO_OLD,
    GpuClusterSnapshot,
    decide_gpucluster,
)
from gpu_operator.render.gpucluster import DEPLOY_LABELS
from gpu_operator.views import NodeView

NS = "gpu-operator"
IMAGE = "example.com/gpu-operator:1"
STAMP = "2026-01-01T00:00:00Z"
DRA_LABEL = "nvidia.com/gpu.deploy.dra-driver"


def node(name: str, **labels: str) -> NodeView:
    return NodeView.from_k8s(
        {
            "metadata": {
                "name": name,
                "labels": {"feature.node.kubernetes.io/pci-10de.present": "true", **labels},
            }
        }
    )


def cluster(name: str = "gpu-cluster", compute_domains: bool = False) -> dict[str, Any]:
    doc = example_document()
    doc["metadata"].update(name=name, uid=f"uid-{name}", generation=3, resourceVersion="41")
    doc["spec"]["draDriver"]["computeDomains"] = {"enabled": compute_domains}
    return doc


def policy(device_plugin: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": "cluster-policy", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"devicePlugin": {"enabled": device_plugin}},
    }


def plugin_ds(desired: int, available: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "nvidia-dra-driver-kubelet-plugin", "namespace": NS},
        "status": {"desiredNumberScheduled": desired, "numberAvailable": available},
    }


def decide(**kwargs: Any) -> Any:
    snap = GpuClusterSnapshot(
        stamp=STAMP,
        clusters=tuple(kwargs.pop("clusters", (cluster(),))),
        policies=tuple(kwargs.pop("policies", ())),
        nodes=tuple(kwargs.pop("nodes", (node("gpu-a"), node("gpu-b")))),
        daemonsets=tuple(kwargs.pop("daemonsets", ())),
        domains=tuple(kwargs.pop("domains", ())),
        dra_served=kwargs.pop("dra_served", True),
        server_version=kwargs.pop("server_version", ""),
    )
    return decide_gpucluster(snap, NS, IMAGE, **kwargs)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_no_gpucluster_no_action() -> None:
    d = decide(clusters=())
    assert not d.applies and not d.labels and not d.statuses and not d.conflicts


def test_a_deleted_gpucluster_takes_its_deploy_labels_off_the_nodes() -> None:
    """Only the DRA stack's own labels go; the node's others (a user's, the device plugin's)
    stay."""
    dra = {label: "true" for label in DEPLOY_LABELS.values()}
    labelled = node("gpu-a", **dra, **{"nvidia.com/gpu.deploy.device-plugin": "false"})
    d = decide(clusters=(), nodes=(labelled, node("gpu-b")))
    assert d.labels == {"gpu-a": {label: None for label in DEPLOY_LABELS.values()}}
    assert not d.applies and not d.statuses


def deleting(finalizers: tuple[str, ...] = (FINALIZER,)) -> dict[str, Any]:
    doc = cluster()
    doc["metadata"].update(deletionTimestamp=STAMP, finalizers=list(finalizers))
    return doc


def ds(name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if deleting:
        meta["deletionTimestamp"] = STAMP
    return {"metadata": meta, "status": {}}


def test_a_gpucluster_gets_the_teardown_finalizer_once() -> None:
    first = decide()
    assert first.finalizers == {
        "gpu-cluster": {"metadata": {"finalizers": [FINALIZER], "resourceVersion": "41"}}
    }
    held = cluster()
    held["metadata"]["finalizers"] = ["someone.else/keep", FINALIZER]
    assert decide(clusters=(held,)).finalizers == {}


def test_a_deleted_gpucluster_removes_the_claim_holders_before_the_plugin() -> None:
    """The validator and exporter pods hold ResourceClaims the kubelet releases through the
    plugin: they go first (foreground), the plugin's deploy label and the finalizer stay."""
    dra = {label: "true" for label in DEPLOY_LABELS.values()}
    nodes = (node("gpu-a", **dra),)
    stack = (ds("nvidia-dra-driver-kubelet-plugin"), ds("nvidia-dra-validator"),
             ds("nvidia-dcgm-exporter-dra"))  # fmt: skip
    d = decide(clusters=(deleting(),), nodes=nodes, daemonsets=stack)
    assert d.deletes == ("nvidia-dcgm-exporter-dra", "nvidia-dra-validator")
    assert d.labels == {
        "gpu-a": {
            "nvidia.com/gpu.deploy.dra-validator": None,
            "nvidia.com/gpu.deploy.dcgm-exporter-dra": None,
        }
    }
    assert not d.applies and not d.finalizers
    ready = conditions(d.statuses["gpu-cluster"])["Ready"]
    assert ready["reason"] == "Deleting" and "nvidia-dra-validator" in ready["message"]
    # Already deleting (foreground: their pods still there): not deleted again, still waited on.
    stack = (ds("nvidia-dra-driver-kubelet-plugin"), ds("nvidia-dra-validator", deleting=True))
    d = decide(clusters=(deleting(),), nodes=nodes, daemonsets=stack)
    assert d.deletes == () and not d.finalizers


def test_a_deleted_gpucluster_waits_for_the_compute_domains_after_the_claim_holders() -> None:
    """A domain's finalizer is lifted by its controller, which goes with the GPUCluster: while
    one is left, the plugin and the controller stay and the status names the domains."""
    dra = {label: "true" for label in DEPLOY_LABELS.values()}
    nodes = (node("gpu-a", **dra),)
    plugin = (ds("nvidia-dra-driver-kubelet-plugin"),)
    d = decide(clusters=(deleting(),), nodes=nodes, daemonsets=plugin, domains=("team/job",))
    assert not d.finalizers and not d.deletes
    assert d.requeue_at is not None  # nothing watched says when they are gone
    assert DRA_LABEL not in d.labels.get("gpu-a", {})  # the plugin stays on the node
    ready = conditions(d.statuses["gpu-cluster"])["Ready"]
    assert ready["reason"] == "Deleting" and "ComputeDomains team/job" in ready["message"]
    # The claim holders still go first.
    holders = (*plugin, ds("nvidia-dra-validator"))
    d = decide(clusters=(deleting(),), nodes=nodes, daemonsets=holders, domains=("team/job",))
    assert d.deletes == ("nvidia-dra-validator",)
    gone = decide(clusters=(deleting(),), nodes=nodes, daemonsets=plugin)
    assert gone.finalizers and gone.requeue_at is None


def test_once_the_claim_holders_are_gone_the_plugin_label_and_the_finalizer_go() -> None:
    dra = {DRA_LABEL: "true"}
    d = decide(
        clusters=(deleting(("someone.else/keep", FINALIZER)),),
        nodes=(node("gpu-a", **dra),),
        daemonsets=(ds("nvidia-dra-driver-kubelet-plugin"),),
    )
    assert d.labels == {"gpu-a": {DRA_LABEL: None}}
    assert d.finalizers == {
        "gpu-cluster": {"metadata": {"finalizers": ["someone.else/keep"], "resourceVersion": "41"}}
    }
    assert d.deletes == () and not d.applies


def test_a_gpucluster_renders_the_dra_stack_owned_by_it() -> None:
    d = decide()
    kinds = {(o["kind"], o["metadata"]["name"]) for o in d.applies}
    assert ("DaemonSet", "nvidia-dra-driver-kubelet-plugin") in kinds
    assert ("DeviceClass", "gpu.nvidia.com") in kinds
    assert not [k for k in kinds if "device-plugin" in k[1]]
    for obj in d.applies:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["kind"] == "GPUCluster" and ref["uid"] == "uid-gpu-cluster"
    ds = next(o for o in d.applies if o["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
    assert d.labels == {
        n: {
            DRA_LABEL: "true",
            "nvidia.com/gpu.deploy.dra-validator": "true",
            "nvidia.com/gpu.deploy.dcgm-exporter-dra": "true",
        }
        for n in ("gpu-a", "gpu-b")
    }


def test_a_cpu_node_gets_nothing() -> None:
    cpu = NodeView.from_k8s({"metadata": {"name": "cpu", "labels": {}}})
    assert "cpu" not in decide(nodes=(cpu,)).labels


def test_a_cluster_without_dras_ga_api_gets_nothing_and_a_condition_saying_why() -> None:
    """Kubernetes 1.33 serves no ``resource.k8s.io/v1``: no object, label or finalizer is
    written (each apply would be refused), and the condition names the release and the way
    out."""
    d = decide(dra_served=False, server_version="v1.33.13")
    assert not d.applies and not d.labels and not d.finalizers and not d.conflicts
    status = d.statuses["gpu-cluster"]
    assert status["state"] == "notReady"
    ready = conditions(status)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", TOO_OLD)
    assert "Kubernetes v1.33.13 does not serve resource.k8s.io/v1" in ready["message"]
    assert "1.34 or newer" in ready["message"] and "device plugin" in ready["message"]
    assert decide(dra_served=True).applies  # the same GPUCluster, where the API is served


def test_status_follows_the_plugin_daemonset() -> None:
    pending = decide(daemonsets=(plugin_ds(2, 1),)).statuses["gpu-cluster"]
    assert pending["state"] == "notReady"
    assert "1 of 2" in conditions(pending)["Ready"]["message"]
    ready = decide(daemonsets=(plugin_ds(2, 2),)).statuses["gpu-cluster"]
    assert ready["state"] == "ready" and conditions(ready)["Ready"]["status"] == "True"
    assert conditions(ready)["Ready"]["observedGeneration"] == 3


def test_compute_domains_bring_the_controller_its_crd_and_classes_and_take_them_away() -> None:
    on = decide(clusters=(cluster(compute_domains=True),))
    kinds = {(o["kind"], o["metadata"]["name"]): o for o in on.applies}
    crd = kinds[("CustomResourceDefinition", "computedomains.resource.nvidia.com")]
    assert on.applies[0] is crd  # served before the controller starts
    # never owned by the GPUCluster: its deletion must not take the users' domains along
    assert "ownerReferences" not in crd["metadata"]
    controller = kinds[("Deployment", "nvidia-dra-driver-controller")]
    assert controller["metadata"]["ownerReferences"][0]["kind"] == "GPUCluster"
    (container,) = controller["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["compute-domain-controller"] and container["image"] == IMAGE
    assert ("DeviceClass", "compute-domain-default-channel.nvidia.com") in kinds
    assert not on.removes
    assert "NotImplemented" not in conditions(on.statuses["gpu-cluster"])

    off = decide()
    names = {o["metadata"]["name"] for o in off.applies}
    assert "nvidia-dra-driver-controller" not in names
    assert "computedomains.resource.nvidia.com" not in names
    assert ("Deployment", NS, "nvidia-dra-driver-controller") in off.removes
    assert ("DeviceClass", "", "compute-domain-daemon.nvidia.com") in off.removes
    assert off.applied_hash != on.applied_hash


def test_device_plugin_and_dra_on_one_node_is_reported_not_double_advertised() -> None:
    d = decide(policies=(policy(),), nodes=(node("gpu-a"), node("gpu-b", **{
        "nvidia.com/gpu.deploy.device-plugin": "false"})))  # fmt: skip
    assert d.conflicts == {"gpu-a"}
    assert d.labels["gpu-a"][DRA_LABEL] == "false"  # DRA stays off the device plugin's node
    assert d.labels["gpu-b"][DRA_LABEL] == "true"
    cond = conditions(d.statuses["gpu-cluster"])[CONFLICT]
    assert cond["status"] == "True" and "gpu-a" in cond["message"]
    (event,) = d.events
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["name"] == "gpu-a"
    assert event["type"] == "Warning"
    assert not decide(policies=(policy(),), reported=frozenset({"gpu-a", "gpu-b"})).events


def test_a_policy_without_the_device_plugin_is_no_conflict() -> None:
    d = decide(policies=(policy(device_plugin=False),))
    assert not d.conflicts and not d.events
    assert CONFLICT not in conditions(d.statuses["gpu-cluster"])


def test_another_gpucluster_is_ignored() -> None:
    d = decide(clusters=(cluster(), cluster("second")))
    assert d.statuses["second"]["state"] == "ignored"
    assert d.statuses["gpu-cluster"]["state"] == "notReady"


def test_an_unchanged_snapshot_decides_the_same_hash() -> None:
    assert decide().applied_hash == decide().applied_hash


def test_the_clusterpolicy_status_names_the_conflicting_nodes() -> None:
    obs = Observation(namespace=NS, generation=1, gpu_nodes=2, nfd_present=True,
                      dra_conflicts=("gpu-a",))  # fmt: skip
    status = compute_status(obs, {}, STAMP)
    cond = conditions(status)["DRAConflict"]
    assert cond["status"] == "True" and "gpu-a" in cond["message"]
    plain = Observation(namespace=NS, generation=1, gpu_nodes=2, nfd_present=True)
    assert "DRAConflict" not in conditions(compute_status(plain, {}, STAMP))
