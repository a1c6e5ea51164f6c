"""The ComputeDomain controller at rack scale against the real control plane: an NVL72 rack's
18 compute trays in one clique, a second rack's trays in another, and two GPU nodes without the
compute-domain plugin; the controller runs as its own ServiceAccount with the RBAC the
GPUCluster renders for it.

kwok plays the kubelets and runs no plugin: every plugin node's pool is published by the
plugin's own publisher, and what the plugin's Prepare does to a node (label it for the domain)
is done here for each node a worker pod was placed on. The scheduler places a domain's workers
only where a channel can be allocated (one per node: a node's ``channel-0``), the DaemonSet puts
an IMEX daemon on each node the workers joined, and the domain lists all 18 in their clique."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpu_operator.agent.dra.agent import node_owner
from gpu_operator.agent.dra.computedomain import agent as domain_agent
from gpu_operator.agent.dra.computedomain.decide import domain_label
from gpu_operator.api.crd import computedomain_crd
from gpu_operator.api.gpucluster import example_document, parse_gpucluster
from gpu_operator.controller.computedomain.process import ControllerOptions, run_controller
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.kube import Kube
from gpu_operator.labels import COMPUTE_DOMAIN, GPU_CLIQUE
from gpu_operator.render.computedomain import DaemonSettings, daemon_name
from gpu_operator.render.facts import Facts
from gpu_operator.render.gpucluster import CONTROLLER, compute_domain_objects
from gpu_operator.testenv import nodes as testenv_nodes
from tests.e2e.support import (
    NotYet,
    api_served,
    private_cluster,
    service_account_config,
    wait_for,
)

NS = "gpu-operator"
RACK_A, RACK_B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
CLIQUE_A, CLIQUE_B = f"{RACK_A}.7", f"{RACK_B}.2"
TRAYS_A = [f"nvl72-a-{i:02d}" for i in range(18)]
TRAYS_B = [f"nvl72-b-{i}" for i in range(4)]
NO_PLUGIN = ["plain-gpu-0", "plain-gpu-1"]


class ControllerThread:
    """The controller's process in a thread of its own, as its Deployment runs it."""

    def __init__(self, api_config: k8s.Configuration) -> None:
        self.options = ControllerOptions(
            config=OperatorConfig(namespace=NS, debounce_seconds=0.2),
            settings=DaemonSettings(namespace=NS),
            lease_seconds=6,
        )
        self.api_config = api_config
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._main, name="cd-controller", daemon=True)

    def _main(self) -> None:
        try:
            self._loop.run_until_complete(run_controller(self.options, self.api_config, self._stop))
        except BaseException as exc:  # the test reads it
            self.error = exc
        finally:
            self._loop.close()

    def start(self) -> ControllerThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def _rack_node(name: str, clique: str | None) -> dict[str, Any]:
    labels = {GPU_CLIQUE: clique} if clique else {}
    return testenv_nodes.node_manifest(name, gpu=True, extra_labels=labels)


@pytest.fixture(scope="module")
def racks(testenv_bin_dir: Path) -> Iterator[Kube]:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        cluster.create_nodes(
            [_rack_node(n, CLIQUE_A) for n in TRAYS_A]
            + [_rack_node(n, CLIQUE_B) for n in TRAYS_B]
            + [_rack_node(n, None) for n in NO_PLUGIN]
        )
        kube.apply(computedomain_crd())
        wait_for(
            "the ComputeDomain API served", lambda: api_served(kube, "ComputeDomain"), timeout=60
        )
        doc = example_document()
        doc["spec"]["draDriver"]["computeDomains"] = {"enabled": True}
        objects = compute_domain_objects(parse_gpucluster(doc), Facts(namespace=NS))
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for obj in objects:
            if obj["kind"] != "Deployment":  # its process runs here instead
                kube.apply(obj)
        for node in TRAYS_A + TRAYS_B:  # as each node's compute-domain plugin publishes
            domain_agent.publish(kube, node, node_owner(kube, node), [])
        config = service_account_config(cluster, NS, CONTROLLER, cluster_role="")
        controller = ControllerThread(config).start()
        try:
            yield kube
        finally:
            controller.stop()
        assert controller.error is None, controller.error


def _worker(namespace: str, index: int, clique: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"worker-{index}", "namespace": namespace},
        "spec": {
            "nodeSelector": {GPU_CLIQUE: clique},
            "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": "channel"}],
            "containers": [{"name": "main", "image": "trainer",
                            "resources": {"claims": [{"name": "imex"}]}}],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


def _domain(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "job", "namespace": namespace},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "channel"}}},
    }


def _placed(kube: Kube, namespace: str, count: int) -> dict[str, str] | NotYet:
    pods = kube.list_objects("Pod", namespace)
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") or "" for p in pods}
    return nodes if len([n for n in nodes.values() if n]) == count else NotYet(nodes)


def _ready_with(kube: Kube, namespace: str, count: int) -> dict[str, Any] | NotYet:
    doc = kube.get("ComputeDomain", "job", namespace) or {}
    status = doc.get("status") or {}
    if status.get("status") == "Ready" and len(status.get("nodes") or []) == count:
        return doc
    return NotYet(status)


def _start_domain(kube: Kube, namespace: str, workers: int, clique: str) -> tuple[str, set[str]]:
    """A domain in ``namespace`` and its workers, placed, their nodes labelled as the plugin's
    Prepare labels them: the domain's uid, and the nodes the workers run on."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    wait_for(f"{namespace}'s account", lambda: kube.get("ServiceAccount", "default", namespace))
    uid = kube.create(_domain(namespace))["metadata"]["uid"]
    wait_for("the domain's channel template", lambda: kube.get(
        "ResourceClaimTemplate", "channel", namespace), timeout=60)  # fmt: skip
    for index in range(workers):
        kube.create(_worker(namespace, index, clique))
    placed = wait_for(f"{workers} workers placed", lambda: _placed(kube, namespace, workers),
                      timeout=180)  # fmt: skip
    used = set(placed.values())
    for node in used:
        kube.merge_patch("Node", node, domain_label(uid))
    return uid, used


def test_an_nvl72_domain_spans_its_rack_one_channel_a_node_and_leaves_nothing_behind(
    racks: Kube,
) -> None:
    kube = racks
    uid, used = _start_domain(kube, "train", 18, CLIQUE_A)
    assert used == set(TRAYS_A)  # one worker a tray: each tray has one channel-0

    # A 19th worker of the rack finds no channel left in it, and waits with the reason.
    kube.create(_worker("train", 18, CLIQUE_A))

    def unschedulable() -> str | NotYet:
        pod = kube.get("Pod", "worker-18", "train") or {}
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("message") or "")
        return NotYet(pod.get("status"))

    assert "cannot allocate all claims" in wait_for("the 19th waiting", unschedulable, timeout=60)

    doc = wait_for("the domain Ready over the rack", lambda: _ready_with(kube, "train", 18),
                   timeout=240)  # fmt: skip
    entries = doc["status"]["nodes"]
    assert {e["name"] for e in entries} == set(TRAYS_A)
    assert {e["cliqueID"] for e in entries} == {CLIQUE_A}
    assert sorted(e["index"] for e in entries) == list(range(18))
    daemons = [
        p["spec"].get("nodeName")
        for p in kube.list_objects("Pod", NS)
        if p["metadata"]["name"].startswith(daemon_name(uid))
    ]
    assert sorted(daemons) == sorted(TRAYS_A)  # a daemon where the job runs, nowhere else

    # A second domain, on the other rack, in its own namespace: kept apart from the first.
    other, used_b = _start_domain(kube, "infer", 4, CLIQUE_B)
    assert used_b == set(TRAYS_B)
    doc_b = wait_for("the second domain Ready", lambda: _ready_with(kube, "infer", 4),
                     timeout=180)  # fmt: skip
    assert {e["cliqueID"] for e in doc_b["status"]["nodes"]} == {CLIQUE_B}
    assert all(not n.startswith("plain-gpu") for n in (*used, *used_b))

    for namespace in ("train", "infer"):
        for pod in kube.list_objects("Pod", namespace):
            kube.delete("Pod", pod["metadata"]["name"], namespace, grace_period_seconds=0)
        kube.delete("ComputeDomain", "job", namespace)

    def nothing_left() -> bool | NotYet:
        left = {
            "domains": [d["metadata"]["name"] for d in kube.list_objects("ComputeDomain")],
            "daemonsets": [
                d["metadata"]["name"]
                for d in kube.list_objects("DaemonSet", NS)
                if COMPUTE_DOMAIN in (d["metadata"].get("labels") or {})
            ],
            "templates": [
                t["metadata"]["name"]
                for t in kube.list_objects("ResourceClaimTemplate")
                if t["metadata"]["name"] in ("channel", daemon_name(uid), daemon_name(other))
            ],
            "labelled": [
                n["metadata"]["name"]
                for n in kube.list_objects("Node")
                if COMPUTE_DOMAIN in (n["metadata"].get("labels") or {})
            ],
        }
        return not any(left.values()) or NotYet(left)

    wait_for("both domains and everything they had gone", nothing_left, timeout=240)
