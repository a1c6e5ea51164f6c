"""GPU health remediation against the real control plane, on five kwok GPU nodes whose
device-plugin agents (``--kwok-capacity``, the rendered ServiceAccount and RBAC) watch simulated
NVML: a GPU lost with XID 79 on one node gives GPUHealthy False, the quarantine taint, a cordon
and an Event; the GPU comes off the node's allocatable; its GPU pods are evicted, a
PodDisruptionBudget holding one back until it allows it; the driver pod is restarted once; an
operator killed mid-remediation is replaced by one that repeats nothing; the fault cleared, the
node is released after the quiet period and used again. Then a storm on 40 % of the nodes with a
limit of 20 % quarantines one node and reports the other."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.testenv import gpufaults
from gpu_operator.testenv.processes import free_ports
from tests.e2e.support import (
    OPERATOR_USER,
    NotYet,
    OperatorProcess,
    audit_writes,
    node_events,
    policy_ready,
    policy_status,
    private_cluster,
    service_account_config,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
NODES = [f"gpu-node-{i}" for i in range(5)]
SICK, STORM = NODES[0], NODES[1:3]
GPUS = "h100-80gb:2"
TAINT = "nvidia.com/gpu.unhealthy"
STATE = "nvidia.com/gpu-health.state"
QUIET, RECOVERY = "3s", "8s"

pytestmark = pytest.mark.timeout(900)


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "dcgmExporter": {"enabled": False},
            "healthRemediation": {
                "enabled": True,
                "maxUnavailable": "20%",
                "recoveryDelay": RECOVERY,
                "drain": {"timeoutSeconds": 300},
                "remediation": {"actions": ["restartDriver"], "timeout": "10s"},
                "signals": {"quietPeriod": QUIET},
            },
        },
    }


def gpu_pod(name: str, node: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
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


def node(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get("Node", name) or {}


def condition(kube: Kube, name: str) -> dict[str, Any]:
    for c in (node(kube, name).get("status") or {}).get("conditions") or []:
        if c.get("type") == "GPUHealthy":
            return dict(c)
    return {}


def quarantined(kube: Kube, name: str) -> bool:
    obj = node(kube, name)
    taints = {t.get("key") for t in obj["spec"].get("taints") or ()}
    return TAINT in taints and bool(obj["spec"].get("unschedulable"))


def released(kube: Kube, name: str) -> bool | NotYet:
    obj = node(kube, name)
    taints = [t for t in obj["spec"].get("taints") or () if t.get("key") == TAINT]
    state = (obj["metadata"].get("labels") or {}).get(STATE)
    if taints or obj["spec"].get("unschedulable") or state:
        return NotYet(
            {"taints": taints, "state": state, "cordoned": obj["spec"].get("unschedulable")}
        )
    return True


def serving(kube: Kube, name: str) -> bool | NotYet:
    """The node's agent says its GPUs are healthy and the scheduler may use both."""
    health, gpus = condition(kube, name), allocatable(kube, name)
    return (health.get("status") == "True" and gpus == "2") or NotYet(
        {"GPUHealthy": health, "gpu": gpus}
    )


def allocatable(kube: Kube, name: str) -> str | None:
    return ((node(kube, name).get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")


@pytest.fixture(scope="module")
def cluster(testenv_bin_dir: Path) -> Iterator[testenv.Cluster]:
    with private_cluster(testenv_bin_dir) as cluster:
        cluster.create_nodes([testenv.node_manifest(name, gpu=True) for name in NODES])
        yield cluster


class Agents:
    """One device-plugin agent per kwok node, as the rendered DaemonSet's ServiceAccount."""

    def __init__(self, cluster: testenv.Cluster, kubeconfig: Path, logs: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_OPERATOR_SIMULATE")}
        for name in NODES:
            env = {
                **base,
                "KUBECONFIG": str(kubeconfig),
                "NODE_NAME": name,
                "GPU_OPERATOR_SIMULATE": GPUS,
                "GPU_HEALTH_CONDITION": "true",
                "GPU_HEALTH_QUIET_PERIOD": QUIET,
            }
            state = gpufaults.kwok_state_file(cluster, name)
            with (logs / f"agent-{name}.log").open("w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "gpu_operator",
                            "agent",
                            "device-plugin",
                            "--kwok-capacity",
                            "--simulate-state",
                            str(state),
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            proc.wait(30)


def test_a_lost_gpu_is_quarantined_drained_remediated_and_released_within_the_limit(
    cluster: testenv.Cluster, tmp_path: Path
) -> None:
    with cluster.api_client() as api:
        kube = Kube(api)
        identity = service_account_config(cluster, NS, "gpu-operator")
        (port,) = free_ports(1)
        kubeconfig = token_kubeconfig(cluster, identity, tmp_path / "op.kc")
        operator = OperatorProcess(kubeconfig, tmp_path / "op.log", NS, metrics_port=port)
        started = datetime.now().astimezone()
        operator.start()
        agents = None
        try:
            wait_for(
                "ClusterPolicy CRD served",
                lambda: kube.get("CustomResourceDefinition", "clusterpolicies.nvidia.com"),
            )
            wait_for("ClusterPolicy API served", lambda: _create(kube, policy()))
            wait_for("stack ready", lambda: policy_ready(kube), timeout=180)
            # The agents run as the device plugin's own ServiceAccount: the rendered RBAC.
            plugin = service_account_config(cluster, NS, "nvidia-device-plugin", cluster_role="")
            agents = Agents(
                cluster, token_kubeconfig(cluster, plugin, tmp_path / "dp.kc"), tmp_path
            )
            for name in NODES:
                wait_for(
                    f"{name}: GPUHealthy True and 2 GPUs allocatable", partial(serving, kube, name)
                )
            kube.create(gpu_pod("train", SICK, "train"))
            kube.create(gpu_pod("protected", SICK, "protected"))
            kube.create({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "protected", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}},
            })  # fmt: skip
            wait_for("PDB computed", lambda: _pdb_healthy(kube))
            drivers = _driver_pods(kube, SICK)
            assert len(drivers) == 1, drivers

            # XID 79: the GPU fell off the bus, and NVML stops answering for it.
            injected = time.monotonic()
            gpufaults.inject(cluster, SICK, 0, "lost")
            gpufaults.inject(cluster, SICK, 0, "xid", 79)
            # The bound: condition, taint, cordon and Event within 10 s of the fault.
            wait_for("quarantined", lambda: _quarantine_seen(kube, SICK), timeout=10)
            latency = time.monotonic() - injected
            # The XID comes a moment after the loss (two injections): the message follows.
            wait_for("the condition names the GPU and XID 79", lambda: _names_xid_79(kube, SICK))
            print(f"fault to quarantine: {latency:.1f}s")
            wait_for(
                "the lost GPU off allocatable",
                lambda: allocatable(kube, SICK) == "1" or NotYet(allocatable(kube, SICK)),
            )
            wait_for("the unprotected GPU pod evicted", lambda: _gone(kube, "train"))
            assert kube.get("Pod", "protected", "default") is not None  # the PDB holds it

            # The operator dies mid-remediation; its successor takes over from the Node.
            operator.kill()
            killed = datetime.now().astimezone()
            operator.start()
            kube.delete("PodDisruptionBudget", "protected", "default")
            wait_for(
                "the protected pod evicted once the PDB allows it",
                lambda: _gone(kube, "protected"),
                timeout=90,
            )
            wait_for(
                "the driver pod restarted", lambda: _restarted(kube, SICK, drivers), timeout=60
            )
            wait_for(
                "remediation given up, the node held",
                lambda: (
                    (s := (node(kube, SICK)["metadata"].get("labels") or {}).get(STATE))
                    == "quarantined"
                    or NotYet(s)
                ),
                timeout=60,
            )
            assert quarantined(kube, SICK)

            # Storm: 2 of 5 nodes (40 %) lose a GPU while the limit (20 %: 1) is taken.
            for name in STORM:
                gpufaults.inject(cluster, name, 1, "lost")
            wait_for(
                "the storm reported",
                lambda: (
                    _held(kube) == set(STORM)
                    or NotYet(policy_status(kube, "cluster-policy").get("healthRemediation"))
                ),
            )
            for name in STORM:
                assert not quarantined(kube, name), name
            wait_for("the metrics say so", lambda: _metrics_say(operator, held=2, quarantined=1))

            # The first node's GPU is back: released after the quiet period and recovery delay,
            # then one storm node takes its place, never two.
            gpufaults.clear(cluster, SICK, 0)
            wait_for("the first node released", lambda: released(kube, SICK), timeout=60)
            wait_for(
                "one storm node quarantined",
                lambda: sum(quarantined(kube, n) for n in STORM) == 1 or NotYet(_held(kube)),
                timeout=30,
            )
            assert sum(quarantined(kube, n) for n in NODES) == 1
            kube.create(gpu_pod("again", SICK, "again"))
            wait_for("a new GPU pod runs on the released node", lambda: _running(kube, "again"))
            assert allocatable(kube, SICK) == "2"

            for name in STORM:
                gpufaults.clear(cluster, name, 1)
            for name in STORM:
                wait_for(f"{name} released", partial(released, kube, name), timeout=90)
            # The report's summary is the ClusterPolicy status, patched after the release.
            summary = "GPU health remediation on: 0 unhealthy, 0/1 quarantined"
            report = wait_for(
                "the health report's summary caught up",
                partial(_health_report, cluster, summary),
                every=1.0,  # a CLI run each time
            )
            assert summary in report, report
        finally:
            operator.kill()
            if agents is not None:
                agents.stop()

        # Though the operator was killed in the middle, the node was quarantined once, its
        # remediation started once and its driver pod deleted once (Events, the audit log).
        reasons = wait_for(  # the Event is its own write, after the release
            "the GPURecovered Event", lambda: _reasons_with(kube, SICK, "GPURecovered")
        )
        assert reasons.count("GPUQuarantined") == 1, reasons
        assert reasons.count("GPURemediationStarted") == 1, reasons
        assert reasons.count("GPURecovered") == 1, reasons
        deletions = [
            w["objectRef"]["name"]
            for w in audit_writes(cluster, OPERATOR_USER, started, resource=("pods", None))
            if w["verb"] == "delete" and w["objectRef"].get("name") in drivers
        ]
        assert deletions == drivers, deletions
        # the successor's
        assert audit_writes(cluster, OPERATOR_USER, killed, resource=("nodes", SICK))


def _metrics_say(operator: OperatorProcess, *, held: int, quarantined: int) -> bool | NotYet:
    """The successor's metrics: what it holds, what waits, and its own remediation steps."""
    samples = operator.metrics()
    want = {
        "gpu_operator_unhealthy_nodes": 3.0,
        "gpu_operator_quarantined_nodes": float(quarantined),
        "gpu_operator_health_held_nodes": float(held),
        'gpu_operator_remediations_total{action="restartDriver",outcome="failed"}': 1.0,
    }
    got = {k: samples.get(k) for k in want}
    return got == want or NotYet(got)


def _health_report(cluster: testenv.Cluster, line: str) -> str | NotYet:
    """`gpu-operator health status --all` once it says ``line``; else its last lines."""
    report = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "health", "status", "--all",
         "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return report if line in report else NotYet(report.splitlines()[-2:])


def _names_xid_79(kube: Kube, name: str) -> bool | NotYet:
    message = str(condition(kube, name).get("message") or "")
    return ("GPU 0 GPU-" in message and "XID 79" in message) or NotYet(message)


def _reasons_with(kube: Kube, name: str, reason: str) -> list[str] | NotYet:
    """The reasons of the node's Events once one is ``reason``."""
    reasons = [e["reason"] for e in node_events(kube, name)]
    return reasons if reason in reasons else NotYet(reasons)


def _quarantine_seen(kube: Kube, name: str) -> bool | NotYet:
    """GPUHealthy False, the taint, the cordon and the GPUQuarantined Event, all there."""
    health = condition(kube, name)
    reasons = [e["reason"] for e in node_events(kube, name)]
    if health.get("status") == "False" and quarantined(kube, name) and "GPUQuarantined" in reasons:
        return True
    return NotYet({"GPUHealthy": health, "spec": node(kube, name)["spec"], "events": reasons})


def _create(kube: Kube, obj: dict[str, Any]) -> bool | NotYet:
    try:
        kube.create(obj)
    except Exception as exc:  # 404 until the CRD is served
        return NotYet(str(exc)[:200])
    return True


def _pdb_healthy(kube: Kube) -> bool | NotYet:
    status = kube.request(
        "GET", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/protected"
    ).get("status", {})
    return status.get("currentHealthy") == 1 or NotYet(status)


def _driver_pods(kube: Kube, name: str) -> list[str]:
    pods = kube.list_objects("Pod", NS, label_selector="app.kubernetes.io/component=driver")
    return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == name]


def _restarted(kube: Kube, name: str, before: list[str]) -> bool | NotYet:
    now = _driver_pods(kube, name)
    return (bool(now) and not set(now) & set(before)) or NotYet(now)


def _gone(kube: Kube, pod: str) -> bool | NotYet:
    obj = kube.get("Pod", pod, "default")
    return obj is None or NotYet((obj.get("status") or {}).get("phase"))


def _running(kube: Kube, pod: str) -> bool | NotYet:
    obj = kube.get("Pod", pod, "default") or {}
    phase = (obj.get("status") or {}).get("phase")
    return phase == "Running" or NotYet(phase)


def _held(kube: Kube) -> set[str]:
    status = policy_status(kube, "cluster-policy").get("healthRemediation") or {}
    return set(status.get("held") or ())
