"""Node agents against the real control plane, with the operator running: discovery labels two
simulated GPU nodes, and a MIG change walks pending -> paused operands -> success -> resumed.

The module shares one cluster with NVIDIA's Helm-default policy ready; each test works on GPU
nodes of its own, so none depends on another having run first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch

from gpu_operator import testenv
from gpu_operator.controller.runner import OperatorThread
from gpu_operator.kube import Kube
from tests import prerequisites
from tests.e2e.support import (
    NotYet,
    audit_writes,
    events_with,
    node_events,
    policy_ready,
    private_cluster,
    service_account_config,
    start_operator,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"
A100 = "gpu-node-0"  # discovery
T4 = "gpu-node-1"  # discovery
MIG_A100 = "gpu-node-2"  # a MIG layout change
MIG_T4 = "gpu-node-3"  # a MIG layout refused
PAUSABLE = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")


@dataclass
class Env:
    cluster: testenv.Cluster
    kube: Kube
    operator: OperatorThread
    tmp: Path
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def kubeconfig_for(self, service_account: str) -> Path:
        """The agent's own rendered ServiceAccount and RBAC, not admin: as in its pod."""
        path = self.tmp / f"{service_account}.kubeconfig"
        if not path.exists():
            wait_for(
                f"ServiceAccount {service_account} applied by the operator",
                lambda: self.kube.get("ServiceAccount", service_account, NS),
            )
            identity = service_account_config(self.cluster, NS, service_account, cluster_role="")
            token_kubeconfig(self.cluster, identity, path)
        return path

    def agent_env(self, node: str, profile: str, service_account: str) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig_for(service_account)),
            "NODE_NAME": node,
            "GPU_OPERATOR_SIMULATE": profile,
            "GPU_OPERATOR_SIMULATE_STATE": str(self.tmp / f"{node}.nvml.json"),
            "MIG_STRATEGY": "single",
        }

    def discover(self, node: str, profile: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "gpu_operator", "agent", "discover", "--oneshot"],
            env=self.agent_env(node, profile, "nvidia-gpu-feature-discovery"),
            check=True,
            timeout=60,
        )

    def node_writes_since(self, node: str, since: datetime, history: LabelHistory) -> str:
        """Why a node's labels are not what a test expects: every label set it went through,
        who wrote it (audit log) and the MIG manager's log."""
        deploy = [f"nvidia.com/gpu.deploy.{c}" for c in PAUSABLE]
        keys = ("nvidia.com/mig.config", "nvidia.com/mig.config.state", *deploy)
        sets = [" ".join(f"{k.split('/')[-1]}={h.get(k)}" for k in keys) for h in history.seen]
        writes = [
            f"{e['requestReceivedTimestamp']} -> {e.get('stageTimestamp')} {e['verb']} by "
            f"{e['user']['username']} ({(e.get('responseStatus') or {}).get('code')})"
            for e in audit_writes(self.cluster, None, since, resource=("nodes", node))
        ]
        log = self.tmp / f"{node}.mig-manager.log"
        tail = log.read_text()[-3000:] if log.exists() else "(no MIG manager log)"
        return "\n".join(["label sets:", *sets, "node writes:", *writes, "MIG manager:", tail])

    def start_mig_manager(self, node: str, profile: str, config: Path) -> None:
        log = (self.tmp / f"{node}.mig-manager.log").open("w")
        self.agents.append(
            subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "agent", "mig-manager"],
                env={
                    **self.agent_env(node, profile, "nvidia-mig-manager"),
                    "CONFIG_FILE": str(config),
                    "DEFAULT_GPU_CLIENTS_NAMESPACE": NS,
                },
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )


@pytest.fixture(scope="module")
def env(testenv_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    policy = yaml.safe_load(prerequisites.nvidia("clusterpolicy-helm-default.yaml").read_text())
    with private_cluster(testenv_bin_dir, gpu_nodes=4) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        operator = start_operator(service_account_config(cluster, NS, "gpu-operator"), NS)
        env = Env(cluster, kube, operator, tmp_path_factory.mktemp("agents"))
        try:
            kube.create(policy)
            wait_for("policy ready", lambda: policy_ready(kube))
            yield env
        finally:
            for proc in env.agents:
                proc.terminate()
                proc.wait(10)
            operator.stop()


def labels(kube: Kube, node: str) -> dict[str, str]:
    got = kube.get("Node", node) or {}
    return dict((got.get("metadata") or {}).get("labels") or {})


def labels_are(kube: Kube, node: str, want: dict[str, str]) -> bool | NotYet:
    """True once ``node`` has the labels ``want``; else what those labels are."""
    now = labels(kube, node)
    got = {k: now.get(k) for k in want}
    return got == want or NotYet(got)


class LabelHistory:
    """Every label set a node passes through, from a real watch (polling could miss some)."""

    def __init__(self, cluster: testenv.Cluster, node: str) -> None:
        self.seen: list[dict[str, str]] = []
        self._stopped = False
        self._watch = watch.Watch()
        self._api = cluster.api_client()
        self._thread = threading.Thread(target=self._run, args=(node,), daemon=True)
        self._thread.start()

    def _run(self, node: str) -> None:
        core = k8s.CoreV1Api(self._api)
        try:
            for event in self._watch.stream(
                core.list_node, field_selector=f"metadata.name={node}", timeout_seconds=300
            ):
                self.seen.append(dict(event["object"].metadata.labels or {}))
        except Exception:
            if not self._stopped:
                raise  # only the connection we closed ourselves may end the watch

    def outcome(self, config: str) -> tuple[list[dict[str, str]], dict[str, str]] | None:
        """The label sets ``config`` went through while pending, and the first that says
        ``success`` after them; None until both are seen."""
        state = "nvidia.com/mig.config.state"
        seen = [h for h in list(self.seen) if h.get("nvidia.com/mig.config") == config]
        pending = [i for i, h in enumerate(seen) if h.get(state) == "pending"]
        if not pending:
            return None
        done = next((h for h in seen[pending[0] :] if h.get(state) == "success"), None)
        return (seen[pending[0] : pending[-1] + 1], done) if done else None

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()
        self._api.close()


def test_discovery_labels_both_nodes(env: Env) -> None:
    env.discover(A100, "a100-40gb:8")
    env.discover(T4, "t4:1")

    a100 = labels(env.kube, A100)
    assert a100["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert a100["nvidia.com/gpu.count"] == "8"
    assert a100["nvidia.com/gpu.memory"] == "40960"
    assert a100["nvidia.com/gpu.family"] == "ampere"
    assert a100["nvidia.com/mig.capable"] == "true"
    assert a100["nvidia.com/cuda.driver-version.full"] == "580.95.05"
    t4 = labels(env.kube, T4)
    assert t4["nvidia.com/gpu.product"] == "Tesla-T4"
    assert t4["nvidia.com/gpu.family"] == "turing"
    assert t4["nvidia.com/mig.capable"] == "false"
    # The operator reacts to the discovered MIG capability: manager and default layout.
    want = {"nvidia.com/gpu.deploy.mig-manager": "true", "nvidia.com/mig.config": "all-disabled"}
    wait_for(
        "mig-manager scheduled on the MIG-capable node only",
        lambda: labels_are(env.kube, A100, want),
    )
    assert "nvidia.com/gpu.deploy.mig-manager" not in labels(env.kube, T4)


def mig_config_file(env: Env) -> Path:
    configmap = yaml.safe_load(
        prerequisites.nvidia("mig-parted-default-configmap.yaml").read_text()
    )
    path = env.tmp / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    return path


def test_mig_change_pauses_operands_and_relabels(env: Env) -> None:
    config = mig_config_file(env)
    env.discover(MIG_A100, "a100-40gb:8")
    wait_for(
        "the default MIG layout asked of the MIG-capable node",
        lambda: labels_are(env.kube, MIG_A100, {"nvidia.com/mig.config": "all-disabled"}),
    )
    env.start_mig_manager(MIG_A100, "a100-40gb:8", config)
    wait_for(
        "initial layout applied",
        lambda: labels_are(env.kube, MIG_A100, {"nvidia.com/mig.config.state": "success"}),
    )
    plugin_pods_before = device_plugin_pods(env, MIG_A100)
    assert plugin_pods_before == 1

    history = LabelHistory(env.cluster, MIG_A100)
    since = datetime.now(UTC)

    def applied() -> bool | NotYet:
        if history.outcome("all-1g.5gb") is not None:
            return True
        keys = ("nvidia.com/mig.config", "nvidia.com/mig.config.state")
        return NotYet({"label sets": [tuple(h.get(k) for k in keys) for h in list(history.seen)]})

    try:
        env.kube.merge_patch(
            "Node", MIG_A100, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb"}}}
        )
        wait_for("new layout applied", applied, timeout=120)
    finally:
        history.stop()
    paused, done = history.outcome("all-1g.5gb") or ([], {})
    for component in PAUSABLE:
        key = f"nvidia.com/gpu.deploy.{component}"
        assert any(h.get(key) == "paused-for-mig-change" for h in paused), component
        assert done[key] == "true", component  # restored by the write that says success
    now = labels(env.kube, MIG_A100)
    restored = all(now[f"nvidia.com/gpu.deploy.{c}"] == "true" for c in PAUSABLE)
    assert restored, env.node_writes_since(MIG_A100, since, history)
    # While paused, the operand pods really left the node; now they are back.
    wait_for(
        "device plugin back on the node",
        lambda: (n := device_plugin_pods(env, MIG_A100)) == 1 or NotYet(n),
    )

    events = events_with(
        "the layout applied", lambda: node_events(env.kube, MIG_A100), "MIGConfigApplied"
    )
    reasons = [e["reason"] for e in events]
    assert reasons.count("MIGConfigPending") == 1, reasons

    env.discover(MIG_A100, "a100-40gb:8")
    after = labels(env.kube, MIG_A100)
    assert after["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert after["nvidia.com/gpu.count"] == "56"
    assert after["nvidia.com/gpu.memory"] == "4864"
    wait_for("policy ready again", lambda: policy_ready(env.kube))


def device_plugin_pods(env: Env, node: str) -> int:
    pods = env.kube.list_objects(
        "Pod",
        NS,
        label_selector="app=nvidia-device-plugin-daemonset",
        field_selector=f"spec.nodeName={node}",
    )
    return len([p for p in pods if not p["metadata"].get("deletionTimestamp")])


def test_non_mig_gpu_fails_with_a_reason(env: Env) -> None:
    config = mig_config_file(env)
    env.start_mig_manager(MIG_T4, "t4:1", config)
    env.kube.merge_patch(
        "Node", MIG_T4, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb"}}}
    )

    def failed() -> dict[str, Any] | NotYet:
        node = env.kube.get("Node", MIG_T4)
        state = node["metadata"]["labels"].get("nvidia.com/mig.config.state") if node else None
        if node and state == "failed":
            return node
        return NotYet({"nvidia.com/mig.config.state": state})

    node = wait_for("T4 node failed", failed)
    reason = node["metadata"]["annotations"]["nvidia.com/mig.config.state.reason"]
    assert "not MIG capable" in reason

    # The same reason is on the Node's Events, found the way `kubectl describe node` finds them;
    # the Event is written after the label, so it is waited for.
    def reported() -> bool | NotYet:
        events = node_events(env.kube, MIG_T4)
        if any(e["reason"] == "MIGConfigFailed" and reason in e["message"] for e in events):
            return True
        return NotYet([(e["reason"], e["message"]) for e in events])

    wait_for("a MIGConfigFailed Event naming the reason", reported)
    assert labels(env.kube, MIG_T4)["nvidia.com/gpu.deploy.device-plugin"] == "true"
