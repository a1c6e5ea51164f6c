"""A ComputeDomain on two real nodes simulating GB200 compute trays of one NVLink clique, with
every part running as it would on a cluster: the GPUCluster's kubelet plugin pods (their
``compute-domains`` container serving ``compute-domain.nvidia.com`` to the real kubelet), the
ComputeDomain controller's Deployment, and the IMEX daemon pods it starts (the stand-in, which
reads the node's fabric through the stub driver's NVML).

A two-pod job claims the domain's channel: the daemons start on exactly those two nodes, each
pod runs with ``/dev/nvidia-caps-imex-channels/channel0`` (created by the runtime from the
plugin's CDI spec), and the domain is Ready listing both nodes in their clique. The fabric of
one node then fails: its daemon exits with the reason, and the domain turns NotReady naming that
node and reason. Deleted while the pods hold the channel, the domain waits for them; once they
are gone its daemons, templates and node labels go, and then the domain."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.labels import COMPUTE_DOMAIN, GPU_CLIQUE, SIMULATED_HOST_DRIVER_ROOT
from gpu_operator.render.computedomain import daemon_name
from gpu_operator.sim.nvml import SIM_STATE, set_fabric
from gpu_operator.sim.stubdriver import PROC_DEVICES
from tests.e2e.stack_support import project_images, ready
from tests.e2e.support import NotYet, service_account_config, start_operator, wait_for
from tests.paths import REPO

pytestmark = [pytest.mark.real_nodes, pytest.mark.timeout(1800)]

NS = "gpu-operator"
JOB_NS = "imex-job"
RACK = "8d1c5f3e-2b6a-4f0e-9c7d-1a2b3c4d5e6f"
CLIQUE = f"{RACK}.1"
GPUS = f"gb200:4,fabric={CLIQUE}"  # each node's simulation spec
PLUGIN = "nvidia-dra-driver-kubelet-plugin"
CONTROLLER = "nvidia-dra-driver-controller"
DOMAIN = "training"
CHANNEL_TEMPLATE = "training-channel"
SHELL = testenv.binaries.node_image_name("shell")
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def _gpucluster() -> dict[str, Any]:
    """The example with ComputeDomains on, the nodes' preinstalled (stub) driver, and the
    plugin told where the simulated driver's /proc/devices is, as NVIDIA's is on nodes whose
    driver is not the kernel's (ALT_PROC_DEVICES_PATH)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "gpucluster.yaml").read_text())
    spec = doc["spec"]
    spec["dcgmExporter"]["enabled"] = False
    spec["hostPaths"]["driverInstallDir"] = SIMULATED_HOST_DRIVER_ROOT
    spec["draDriver"]["computeDomains"] = {
        "enabled": True,
        "kubeletPlugin": {
            "env": [{"name": "ALT_PROC_DEVICES_PATH", "value": f"/driver-root/{PROC_DEVICES}"}]
        },
    }
    return doc


def _domain() -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": DOMAIN, "namespace": JOB_NS},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": CHANNEL_TEMPLATE}}},
    }


def _worker(index: int) -> dict[str, Any]:
    """One pod of the job: the domain's channel, one per node (anti-affinity), in the clique."""
    script = f'test -c {CHANNEL} && echo "channel0 is a char device"; sleep 3600'
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"worker-{index}", "namespace": JOB_NS, "labels": {"job": "imex"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {GPU_CLIQUE: CLIQUE},
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"job": "imex"}},
                 "topologyKey": "kubernetes.io/hostname"}]}},
            "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": CHANNEL_TEMPLATE}],
            "containers": [{
                "name": "main",
                "image": SHELL,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"claims": [{"name": "imex"}]},
            }],
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def domains_cluster(
    real_nodes_runtime: Path, testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[testenv.Cluster, Kube, k8s.CoreV1Api]]:
    state = testenv.default_state_dir() / f"imex-{uuid.uuid4().hex[:8]}"
    cluster = testenv.start(state, real_nodes=2, real_node_gpus=(GPUS,), bin_dir=testenv_bin_dir)
    try:
        for archive in project_images(tmp_path_factory):
            cluster.load_image(archive)
        with cluster.api_client() as api:
            kube = Kube(api)
            operator = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
            try:
                kube.create(_gpucluster())
                yield cluster, kube, k8s.CoreV1Api(api)
            finally:
                operator.stop()
    finally:
        cluster.stop(remove_state=True)


def _pods(kube: Kube, namespace: str, prefix: str) -> list[dict[str, Any]]:
    return [
        p for p in kube.list_objects("Pod", namespace) if p["metadata"]["name"].startswith(prefix)
    ]


def _states(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """What a wait on pods reports when it times out: each pod's node, phase, containers."""
    return {
        p["metadata"]["name"]: (
            p["spec"].get("nodeName"),
            (p.get("status") or {}).get("phase"),
            [c.get("state") for c in (p.get("status") or {}).get("containerStatuses") or []],
        )
        for p in pods
    }


def _stack_ready(kube: Kube, nodes: list[str]) -> bool | NotYet:
    plugins = _pods(kube, NS, PLUGIN)
    controller = _pods(kube, NS, CONTROLLER)
    cliques = {n: (kube.get("Node", n) or {})["metadata"]["labels"].get(GPU_CLIQUE) for n in nodes}
    slices = {
        s["spec"]["nodeName"]
        for s in kube.list_objects("ResourceSlice")
        if s["spec"]["driver"] == "compute-domain.nvidia.com"
    }
    done = (
        len([p for p in plugins if ready(p)]) == len(nodes)
        and any(ready(p) for p in controller)
        and set(cliques.values()) == {CLIQUE}
        and slices == set(nodes)
    )
    return done or NotYet(
        {"pods": _states(plugins + controller), "cliques": cliques, "slices": sorted(slices)}
    )


def _labels_of(kube: Kube, nodes: list[str]) -> list[str]:
    """The domain uids the nodes are labelled for."""
    return [
        (kube.get("Node", n) or {})["metadata"]["labels"].get(COMPUTE_DOMAIN, "") for n in nodes
    ]


def _conditions(doc: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((doc or {}).get("status") or {}).get("conditions") or []}


def test_a_two_node_job_gets_its_imex_channel_and_the_domain_goes_with_it(
    domains_cluster: tuple[testenv.Cluster, Kube, k8s.CoreV1Api],
) -> None:
    cluster, kube, core = domains_cluster
    nodes = sorted(cluster.real_nodes)
    wait_for("both plugins, the controller, the cliques and the pools", lambda: _stack_ready(
        kube, nodes), timeout=600)  # fmt: skip
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NS}})
    wait_for("the job namespace's account", lambda: kube.get("ServiceAccount", "default", JOB_NS))
    domain = kube.create(_domain())
    uid = domain["metadata"]["uid"]
    wait_for(
        "the channel template in the job's namespace",
        lambda: kube.get("ResourceClaimTemplate", CHANNEL_TEMPLATE, JOB_NS),
        timeout=120,
    )
    assert not _pods(kube, NS, daemon_name(uid))  # no workload yet, so no daemon anywhere

    for index in range(2):
        kube.create(_worker(index))

    def running() -> list[dict[str, Any]] | NotYet:
        workers = _pods(kube, JOB_NS, "worker-")
        phases = {(p.get("status") or {}).get("phase") for p in workers}
        daemons = _pods(kube, NS, daemon_name(uid))
        if len(workers) == 2 and phases == {"Running"}:
            return workers
        return NotYet({"workers": _states(workers), "daemons": _states(daemons)})

    workers = wait_for("both workers Running with their channel", running, timeout=420)
    assert sorted(p["spec"]["nodeName"] for p in workers) == nodes
    for pod in workers:
        log = str(core.read_namespaced_pod_log(pod["metadata"]["name"], JOB_NS))
        assert "channel0 is a char device" in log, log
    daemons = _pods(kube, NS, daemon_name(uid))
    assert sorted(p["spec"]["nodeName"] for p in daemons) == nodes  # only where the job runs

    def domain_ready() -> dict[str, Any] | NotYet:
        doc = kube.get("ComputeDomain", DOMAIN, JOB_NS)
        status = (doc or {}).get("status") or {}
        listed = sorted(n["name"] for n in status.get("nodes") or [])
        if status.get("status") == "Ready" and listed == nodes:
            return doc or {}
        return NotYet(status)

    doc = wait_for("the domain Ready with both nodes", domain_ready, timeout=180)
    entries = doc["status"]["nodes"]
    assert {n["cliqueID"] for n in entries} == {CLIQUE}
    assert sorted(n["index"] for n in entries) == [0, 1]
    assert all(n["ipAddress"] for n in entries)

    # One node's fabric fails: its daemon cannot serve, and the domain says where and why.
    broken = nodes[1]
    state_file = cluster.real_node_dir(broken) / "host-driver" / "dev" / SIM_STATE
    set_fabric(state_file, 0, state="not-started")
    try:

        def not_ready() -> dict[str, Any] | NotYet:
            found = kube.get("ComputeDomain", DOMAIN, JOB_NS)
            cond = _conditions(found).get("Ready") or {}
            message = cond.get("message") or ""
            if cond.get("status") == "False" and broken in message and "not-started" in message:
                return found or {}
            return NotYet((found or {}).get("status"))

        failed = wait_for("the domain NotReady naming the broken node", not_ready, timeout=240)
        assert failed["status"]["status"] == "NotReady"
        message = _conditions(failed)["Ready"]["message"]
        assert "GPU fabric state not-started on GPU 0" in message, message
        assert nodes[0] not in message  # the healthy node's daemon is not blamed
    finally:
        set_fabric(state_file, 0, state="completed")

    # Deleted while the job holds its channel: everything stays, and the status says who.
    kube.delete("ComputeDomain", DOMAIN, JOB_NS)

    def waiting() -> dict[str, Any] | NotYet:
        found = kube.get("ComputeDomain", DOMAIN, JOB_NS)
        cond = _conditions(found).get("Terminating") or {}
        return cond if cond.get("reason") == "WaitingForClaims" else NotYet(found)

    cond = wait_for("the domain waiting for its channel's holders", waiting, timeout=120)
    assert f"{JOB_NS}/worker-0" in cond["message"]
    assert kube.get("DaemonSet", daemon_name(uid), NS) is not None

    for index in range(2):
        kube.delete("Pod", f"worker-{index}", JOB_NS, grace_period_seconds=0)

    def all_gone() -> bool | NotYet:
        left = {
            "domain": kube.get("ComputeDomain", DOMAIN, JOB_NS) is not None,
            "daemonset": kube.get("DaemonSet", daemon_name(uid), NS) is not None,
            "daemon template": kube.get("ResourceClaimTemplate", daemon_name(uid), NS)
            is not None,
            "channel template": kube.get("ResourceClaimTemplate", CHANNEL_TEMPLATE, JOB_NS)
            is not None,
            "labels": [
                n for n in nodes if COMPUTE_DOMAIN in (kube.get("Node", n) or {})["metadata"][
                    "labels"]
            ],
        }  # fmt: skip
        return not any(left.values()) or NotYet(left)

    wait_for("the domain, its daemons, templates and node labels gone", all_gone, timeout=240)


def test_a_claim_from_another_namespace_is_refused_with_the_reason(
    domains_cluster: tuple[testenv.Cluster, Kube, k8s.CoreV1Api],
) -> None:
    """A channel config copied into another namespace names the domain's uid but is not its
    template's: Prepare refuses it, and the pod's Events say why."""
    cluster, kube, _ = domains_cluster
    nodes = sorted(cluster.real_nodes)
    wait_for("the stack", lambda: _stack_ready(kube, nodes), timeout=600)
    for ns in (JOB_NS + "-a", JOB_NS + "-b"):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        wait_for(f"{ns}'s account", lambda n=ns: kube.get("ServiceAccount", "default", n))
    owner = copy.deepcopy(_domain())
    owner["metadata"]["namespace"] = JOB_NS + "-a"
    uid = kube.create(owner)["metadata"]["uid"]
    template = wait_for(
        "the domain's channel template",
        lambda: kube.get("ResourceClaimTemplate", CHANNEL_TEMPLATE, JOB_NS + "-a"),
        timeout=120,
    )
    copied = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "stolen-channel", "namespace": JOB_NS + "-b"},
        "spec": template["spec"],
    }
    kube.create(copied)
    thief = _worker(9)
    thief["metadata"]["namespace"] = JOB_NS + "-b"
    thief["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "stolen-channel"
    del thief["spec"]["affinity"]
    kube.create(thief)

    def refused() -> str | NotYet:
        events = kube.list_objects("Event", JOB_NS + "-b")
        for event in events:
            text = event.get("message") or ""
            if event.get("involvedObject", {}).get("name") == "worker-9" and "serves" in text:
                return str(text)
        return NotYet([e.get("message") for e in events])

    message = wait_for("the refusal in the pod's Events", refused, timeout=180)
    assert f"serves claims in namespace {JOB_NS}-a only" in message, message
    assert uid not in _labels_of(kube, nodes)  # refused before any node joined for it
    pod = kube.get("Pod", "worker-9", JOB_NS + "-b") or {}
    assert (pod.get("status") or {}).get("phase") != "Running"
    kube.delete("Pod", "worker-9", JOB_NS + "-b", grace_period_seconds=0)
    kube.delete("ComputeDomain", DOMAIN, JOB_NS + "-a")
    wait_for(
        "the domain gone",
        lambda: kube.get("ComputeDomain", DOMAIN, JOB_NS + "-a") is None or NotYet("there"),
        timeout=180,
    )
