"""A pod on a kwok node that asks for the simulated fault (testenv.kwokconfig) starts but never
turns Ready, as a driver that fails validation; every other pod still turns Ready, and both go
away when deleted. Canary driver upgrades rely on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client, watch

from gpu_operator.testenv import nodes
from gpu_operator.testenv.kwokconfig import NOT_READY, SIMULATED_FAULT_ENV
from tests.e2e.support import NotYet, private_cluster, wait_for

NODE = "kwok-fault"
NS = "default"
IMAGE = "registry.k8s.io/pause:3.10"


def _pod(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": NODE, "containers": containers},
    }


def _conditions(pod: client.V1Pod) -> dict[str, client.V1PodCondition]:
    return {c.type: c for c in (pod.status.conditions if pod.status else None) or []}


def _ready(core: client.CoreV1Api, name: str) -> client.V1Pod | NotYet:
    pod = core.read_namespaced_pod(name, NS)
    ready = _conditions(pod).get("Ready")
    return pod if ready is not None and ready.status == "True" else NotYet(pod.status)


def _running(core: client.CoreV1Api, name: str) -> client.V1Pod | NotYet:
    pod = core.read_namespaced_pod(name, NS)
    return pod if pod.status and pod.status.phase == "Running" else NotYet(pod.status)


def _gone(core: client.CoreV1Api, name: str) -> bool | NotYet:
    try:
        pod = core.read_namespaced_pod(name, NS)
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return NotYet(pod.metadata.deletion_timestamp if pod.metadata else pod)


def test_a_faulted_pod_runs_but_never_turns_ready(testenv_bin_dir: Path) -> None:
    with private_cluster(testenv_bin_dir) as cluster, cluster.api_client() as api:
        cluster.create_nodes([nodes.node_manifest(NODE, gpu=True)])
        core = client.CoreV1Api(api)
        # The env var on the second container only: any container asks for the fault.
        faulted = _pod(
            "faulted",
            [
                {"name": "first", "image": IMAGE},
                {
                    "name": "driver",
                    "image": IMAGE,
                    "env": [
                        {"name": "OTHER", "value": "1"},
                        {"name": SIMULATED_FAULT_ENV, "value": NOT_READY},
                    ],
                },
            ],
        )
        plain = _pod(
            "plain",
            [{"name": "driver", "image": IMAGE, "env": [{"name": "OTHER", "value": NOT_READY}]}],
        )
        core.create_namespaced_pod(NS, faulted)
        wait_for("the faulted pod Running", lambda: _running(core, "faulted"))
        # Created after the faulted pod started, so its Ready below comes later still.
        core.create_namespaced_pod(NS, plain)
        ready = wait_for("the plain pod Ready", lambda: _ready(core, "plain"))
        assert all(s.ready for s in ready.status.container_statuses)

        pod = core.read_namespaced_pod("faulted", NS)
        assert pod.status.phase == "Running" and pod.status.pod_ip
        conditions = _conditions(pod)
        for kind in ("Ready", "ContainersReady"):
            assert (conditions[kind].status, conditions[kind].reason) == ("False", "SimulatedFault")
        assert conditions["Initialized"].status == "True"
        statuses = {s.name: s for s in pod.status.container_statuses}
        assert set(statuses) == {"first", "driver"}
        assert all(not s.ready and s.started and s.state.running for s in statuses.values())

        # Nothing turns it Ready later: watch it a while from where it was read.
        version = pod.metadata.resource_version
        events = watch.Watch().stream(
            core.list_namespaced_pod,
            NS,
            field_selector="metadata.name=faulted",
            resource_version=version,
            timeout_seconds=5,
        )
        for event in events:
            assert _conditions(event["object"])["Ready"].status == "False", event["type"]

        for name in ("faulted", "plain"):
            core.delete_namespaced_pod(name, NS)
        for name in ("faulted", "plain"):
            wait_for(f"pod {name} deleted", lambda name=name: _gone(core, name))
