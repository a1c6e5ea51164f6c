"""Two replicas: only the Lease holder acts, the other takes over when it goes; health and
metrics endpoints answer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from gpu_operator.controller.runner import OperatorThread, RunOptions
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.kube import Kube
from gpu_operator.testenv.processes import free_ports
from tests import prerequisites
from tests.e2e.support import (
    NotYet,
    policy_status,
    private_cluster,
    service_account_config,
    still_there,
    token_kubeconfig,
    wait_for,
)

NS = "gpu-operator"


def free_port() -> int:
    return free_ports(1)[0]


def replica(config: object, identity: str, health: int, metrics: int) -> OperatorThread:
    options = RunOptions(
        config=OperatorConfig(namespace=NS),
        identity=identity,
        health_endpoint=f"http://127.0.0.1:{health}/healthz",
        metrics_port=metrics,
        renew_seconds=1.0,
        lease_seconds=4,
    )
    return OperatorThread(options, config)  # type: ignore[arg-type]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def test_one_leader_acts_and_the_other_takes_over(testenv_bin_dir: Path) -> None:
    policy = yaml.safe_load(prerequisites.nvidia("clusterpolicy-helm-default.yaml").read_text())
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        config = service_account_config(cluster, NS, "gpu-operator")
        ports = [free_port() for _ in range(4)]
        first = replica(config, "replica-a", ports[0], ports[1]).start()
        second = replica(config, "replica-b", ports[2], ports[3]).start(wait=False)
        try:
            kube.create(policy)
            wait_for(
                "ready",
                lambda: (
                    (s := policy_status(kube, "cluster-policy")).get("state") == "ready"
                    or NotYet(s)
                ),
            )
            lease = kube.get("Lease", "gpu-operator-leader", NS)
            assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
            assert not second.started.is_set()  # the standby does not act

            # Both answer /healthz, so a standby passes its probes; each says which role it has.
            assert json.loads(get(f"http://127.0.0.1:{ports[0]}/healthz"))["role"] == "leader"
            assert json.loads(get(f"http://127.0.0.1:{ports[2]}/healthz"))["role"] == "standby"
            assert "gpu_operator_leader 0.0" in get(f"http://127.0.0.1:{ports[3]}/metrics")

            def gauges_set() -> str | NotYet:
                """The leader's metrics once the pass that wrote `ready` has set its gauges
                (a pass sets them after its writes, the status among them)."""
                text = get(f"http://127.0.0.1:{ports[1]}/metrics")
                if 'gpu_operator_component_ready{component="device-plugin"} 1.0' in text:
                    return text
                return NotYet([line for line in text.splitlines() if "component_ready" in line])

            metrics = wait_for("the leader's gauges of the ready pass", gauges_set)
            assert "gpu_operator_leader 1.0" in metrics
            assert "gpu_operator_reconcile_total" in metrics
            assert "gpu_operator_gpu_nodes 1.0" in metrics
            assert 'gpu_operator_component_ready{component="device-plugin"} 1.0' in metrics

            first.stop()  # graceful: hands the Lease over at once
            wait_for("standby took over", second.started.is_set, timeout=30)
            kube.merge_patch(
                "ClusterPolicy", "cluster-policy", {"spec": {"gfd": {"enabled": False}}}
            )
            wait_for(
                "new leader acted",
                lambda: (
                    (ds := kube.get("DaemonSet", "gpu-feature-discovery", NS)) is None
                    or still_there(ds)
                ),
            )
            lease = kube.get("Lease", "gpu-operator-leader", NS)
            assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
            assert json.loads(get(f"http://127.0.0.1:{ports[2]}/healthz"))["role"] == "leader"
        finally:
            first.stop()
            second.stop()


def test_sigterm_hands_the_lease_over_and_exits_zero(testenv_bin_dir: Path, tmp_path: Path) -> None:
    """``gpu-operator run`` as a pod runs it: SIGTERM is a graceful stop (the Lease released at
    once, exit 0), not a deaf operator (kopf, in the main thread, used to take the signal and
    stop its watchers first: exit 1 and a Lease left to expire)."""
    with private_cluster(testenv_bin_dir, gpu_nodes=1) as cluster, cluster.api_client() as api:
        kube = Kube(api)
        kubeconfig = token_kubeconfig(
            cluster, service_account_config(cluster, NS, "gpu-operator"), tmp_path / "kubeconfig"
        )
        log = tmp_path / "operator.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "run", "--kubeconfig", str(kubeconfig),
                 "--namespace", NS, "--health-port", "0", "--metrics-port", "0",
                 "--lease-duration", "30"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            wait_for(
                "the operator leading",
                lambda: (
                    (kube.get("Lease", "gpu-operator-leader", NS) or {}).get("spec") or {}
                ).get("holderIdentity"),
                timeout=90,
            )
            kube.create(
                yaml.safe_load(prerequisites.nvidia("clusterpolicy-helm-default.yaml").read_text())
            )
            wait_for(
                "the policy ready",
                lambda: (
                    (s := policy_status(kube, "cluster-policy")).get("state") == "ready"
                    or NotYet(s)
                ),
                timeout=120,
            )
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        text = log.read_text()
        assert code == 0, text[-3000:]
        assert "deaf" not in text, text[-3000:]
        lease = kube.get("Lease", "gpu-operator-leader", NS) or {}
        assert not (lease.get("spec") or {}).get("holderIdentity"), lease  # handed over at once
