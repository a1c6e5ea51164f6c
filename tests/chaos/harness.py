"""The chaos suite's harness: a converged 6-node cluster, operators as real processes reaching
the API server through Toxiproxy and the HTTP fault proxy, a workload (a policy change, a new
GPU node and a driver upgrade) and what a run is judged by (shared with benchmarks/bench_chaos.py).

Everything a verdict rests on comes from the API server itself or its audit log, read over a
direct admin connection that no fault touches.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.labels import MANAGED_SELECTOR
from gpu_operator.testenv.faults import Fault, FaultProxy, Toxiproxy
from gpu_operator.testenv.processes import alive
from tests.e2e.support import (
    NotYet,
    OperatorProcess,
    policy_api_served,
    service_account_config,
    wait_for,
)

NS = "gpu-operator"
POLICY = "cluster-policy"
VERSIONS = ("580.95.05", "580.105.08")
GPU_NODES = tuple(f"gpu-node-{i}" for i in range(6))
STATE = "nvidia.com/gpu-driver-upgrade-state"
IN_PROGRESS = (
    "upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
    "drain-required", "pod-restart-required", "validation-required", "uncordon-required",
)  # fmt: skip
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
# What a person set on the nodes; no fault may make the operator touch it (NVIDIA 2288 too).
USER_LABELS = {"team": "ml"}
USER_TAINT = {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}
USER_CHOICE = ("gpu-node-5", "nvidia.com/gpu.deploy.gpu-feature-discovery", "false")
# Shorter than the 30 s default so that hand-overs fit a test; long enough that 2 s of latency
# per request leaves a renewal (one round trip) inside half the renew deadline (two thirds of the
# Lease): a holder renewing back to back answers each renewal one round trip after its renew time.
LEASE_SECONDS = 9
# After the API server was away for minutes, kube-controller-manager's DaemonSet controller may
# hold off creating pods until its expectations expire (5 minutes): the driver pods an upgrade
# deletes then come back that late, whatever the operator does.
AFTER_OUTAGE_S = 600.0


def policy(version: str, marker: str) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "driver": {
                "version": version,
                "upgradePolicy": {
                    "autoUpgrade": True,
                    "maxParallelUpgrades": 3,
                    "maxUnavailable": "50%",
                    "podDeletion": {"timeoutSeconds": 15, "force": False},
                },
            },
            "devicePlugin": {"env": [{"name": "CHAOS_ROUND", "value": marker}]},
            "dcgmExporter": {"enabled": False},
        },
    }


def stamp(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


class DriverPods:
    """Every driver pod seen (name -> node), polled over the admin connection."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(Exception):  # the API server may be down on purpose
                for pod in self.kube.list_objects(
                    "Pod", NS, label_selector="app.kubernetes.io/component=driver"
                ):
                    node = pod["spec"].get("nodeName")
                    if node:
                        self.seen[pod["metadata"]["name"]] = node

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Outcome:
    """What one run under one fault came to."""

    fault: str
    converge_s: float  # from the end of the fault to convergence
    writes: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    upgraded_twice: list[str] = field(default_factory=list)
    user_changes: list[str] = field(default_factory=list)
    handover_s: float | None = None
    exits: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class ChaosEnv:
    """A private cluster with 6 converged GPU nodes and one or two supervised operators."""

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.workdir = workdir
        state = testenv.default_state_dir() / f"chaos-{workdir.name[-8:]}"
        self.cluster = testenv.start(state, bin_dir=bin_dir)
        self.api = self.cluster.api_client()
        self.kube = Kube(self.api)
        self.proxy = FaultProxy(self.cluster.api_url, self.cluster.ca_file).start()
        binary = bin_dir / "toxiproxy-server"
        self.toxiproxy = Toxiproxy(binary, workdir / "toxiproxy.log").start()
        self.operators: dict[str, OperatorProcess] = {}
        self.round = 0
        self.extra_nodes: list[str] = []
        self.drivers = DriverPods(self.kube)
        self._setup()

    # -- set-up -------------------------------------------------------------------------------
    def _setup(self) -> None:
        self.cluster.create_nodes(
            [
                testenv.node_manifest(
                    name,
                    gpu=True,
                    extra_labels={**USER_LABELS, **({USER_CHOICE[1]: USER_CHOICE[2]}
                                                    if name == USER_CHOICE[0] else {})},
                    taints=[USER_TAINT],
                )
                for name in GPU_NODES
            ]
        )  # fmt: skip
        from gpu_operator.controller.runtime.crd_install import ensure_crd

        ensure_crd(self.kube)
        wait_for("ClusterPolicy API served", lambda: policy_api_served(self.kube))
        self.kube.create(policy(VERSIONS[0], "r0"))

    def identity_kubeconfig(self, replica: str) -> Path:
        """A ServiceAccount of its own per replica (told apart in the audit log), reaching the
        API server through its own Toxiproxy proxy and the fault proxy."""
        sa = f"gpu-operator-{replica}"
        config = service_account_config(self.cluster, NS, sa)
        upstream = f"127.0.0.1:{self.proxy.port}"
        url = self.toxiproxy.proxy(f"op-{replica}", upstream)
        token = config.api_key["authorization"].split(" ", 1)[1]
        path = self.workdir / f"kubeconfig-{replica}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "chaos", "cluster": {"server": url}}],
                    "users": [{"name": sa, "user": {"token": token}}],
                    "contexts": [{"name": "chaos", "context": {"cluster": "chaos", "user": sa}}],
                    "current-context": "chaos",
                }
            )
        )
        return path

    def user(self, replica: str) -> str:
        return f"system:serviceaccount:{NS}:gpu-operator-{replica}"

    def start_operator(self, replica: str) -> OperatorProcess:
        from gpu_operator.testenv.processes import free_ports

        operator = OperatorProcess(
            self.identity_kubeconfig(replica),
            self.workdir / f"operator-{replica}.log",
            NS,
            health_port=free_ports(1)[0],
            lease_seconds=LEASE_SECONDS,
            install_crd=False,
        ).start()
        self.operators[replica] = operator
        return operator

    def close(self) -> None:
        for operator in self.operators.values():
            operator.stop()
        self.drivers.stop()
        self.proxy.stop()
        self.toxiproxy.stop()
        self.api.close()
        # The components' logs outlive the cluster, beside the operators' (for a failed run).
        with contextlib.suppress(OSError):
            shutil.copytree(self.cluster.state_dir / "logs", self.workdir / "cluster-logs")
            shutil.copy(self.cluster.audit_log, self.workdir / "cluster-logs" / "audit.log")
        self.cluster.stop(remove_state=True)

    # -- state --------------------------------------------------------------------------------
    def gpu_nodes(self) -> list[str]:
        return [*GPU_NODES, *self.extra_nodes]

    def pending(self, version: str, marker: str) -> str:
        """What keeps the cluster from the end state (version, marker); "" once it is there."""
        kube = self.kube
        obj = kube.get("ClusterPolicy", POLICY) or {}
        status = obj.get("status") or {}
        if status.get("state") != "ready":
            why = [
                f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
                for c in status.get("conditions") or []
            ]
            down = [p.name for p in self.cluster.processes if not alive(p)]
            return f"policy state {status.get('state')!r} {why} (processes down: {down})"
        nodes = {n["metadata"]["name"]: n for n in kube.list_objects("Node")}
        for name in self.gpu_nodes():
            node = nodes.get(name)
            if node is None:
                return f"{name} missing"
            state = node["metadata"].get("labels", {}).get(STATE, "")
            if state in IN_PROGRESS or state == "upgrade-failed":
                return f"{name} upgrade state {state}"
            if node["spec"].get("unschedulable"):
                return f"{name} cordoned"
        for ds in kube.list_objects("DaemonSet", NS, label_selector=MANAGED_SELECTOR):
            st = ds.get("status") or {}
            want = st.get("desiredNumberScheduled", 0)
            if st.get("observedGeneration") != ds["metadata"].get("generation"):
                return f"{ds['metadata']['name']} not observed"
            # The driver rolls node by node (OnDelete): its pods are checked below.
            settled = want == st.get("numberReady") == st.get("updatedNumberScheduled", want)
            if not settled and not ds["metadata"]["name"].startswith("nvidia-driver"):
                return f"{ds['metadata']['name']} {st}"
        drivers = kube.list_objects("Pod", NS, label_selector="app.kubernetes.io/component=driver")
        on = {p["spec"].get("nodeName"): p for p in drivers}
        for name in self.gpu_nodes():
            pod = on.get(name)
            if pod is None:
                return f"no driver pod on {name}"
            image = pod["spec"]["containers"][0]["image"]
            if version not in image:
                return f"{name} driver {image}"
        plugins = kube.list_objects("DaemonSet", NS, label_selector=MANAGED_SELECTOR)
        for ds in plugins:
            if "device-plugin" in ds["metadata"]["name"]:
                env = ds["spec"]["template"]["spec"]["containers"][0].get("env") or []
                if {"name": "CHAOS_ROUND", "value": marker} not in env:
                    return "device plugin not at this round's policy"
        return ""

    def fingerprint(self) -> dict[str, Any]:
        """The end state that must not depend on faults: managed objects by identity, pods per
        DaemonSet per node, and the operator's node labels."""
        objects = set()
        for kind in ("DaemonSet", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service"):
            for obj in self.kube.list_objects(kind, NS, label_selector=MANAGED_SELECTOR):
                objects.add(f"{kind}/{obj['metadata']['name']}")
        for kind in ("ClusterRole", "ClusterRoleBinding", "RuntimeClass"):
            for obj in self.kube.list_objects(kind, label_selector=MANAGED_SELECTOR):
                objects.add(f"{kind}/{obj['metadata']['name']}")
        pods: dict[str, int] = {}
        for pod in self.kube.list_objects("Pod", NS, label_selector=MANAGED_SELECTOR):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
            key = f"{owner}@{pod['spec'].get('nodeName')}"
            pods[key] = pods.get(key, 0) + 1
        labels = {}
        for node in self.kube.list_objects("Node"):
            name = node["metadata"]["name"]
            if name in self.gpu_nodes():
                labels[name] = {
                    k: v
                    for k, v in node["metadata"].get("labels", {}).items()
                    if k.startswith("nvidia.com/gpu.deploy.") or k == "nvidia.com/gpu.present"
                }
        return {"objects": sorted(objects), "pods": pods, "labels": labels}

    def user_changes(self) -> list[str]:
        changes = []
        for node in self.kube.list_objects("Node"):
            name = node["metadata"]["name"]
            if name not in GPU_NODES:
                continue
            labels = node["metadata"].get("labels", {})
            for key, value in USER_LABELS.items():
                if labels.get(key) != value:
                    changes.append(f"{name}: label {key}={labels.get(key)!r}")
            if name == USER_CHOICE[0] and labels.get(USER_CHOICE[1]) != USER_CHOICE[2]:
                changes.append(f"{name}: {USER_CHOICE[1]}={labels.get(USER_CHOICE[1])!r}")
            taints = node["spec"].get("taints") or []
            if USER_TAINT not in taints:
                changes.append(f"{name}: taint {USER_TAINT} gone: {taints}")
        return changes

    def writes(self, users: set[str], since: datetime, until: datetime) -> list[dict[str, Any]]:
        out = []
        with self.cluster.audit_log.open() as log:
            for line in log:
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                if event.get("verb") not in WRITE_VERBS:
                    continue
                if event.get("user", {}).get("username") not in users:
                    continue
                if since <= stamp(event) <= until:
                    out.append(event)
        return out

    # -- a run ----------------------------------------------------------------------------------
    def converge(self, what: str, timeout: float = 240.0) -> float:
        version, marker = self.target()
        started = time.monotonic()
        last = "not looked yet"
        while time.monotonic() - started < timeout:
            try:
                last = self.pending(version, marker)
            except Exception as exc:  # the API server may still be coming back
                last = f"cannot read: {exc!r}"[:300]
            if not last:
                return time.monotonic() - started
            time.sleep(0.5)
        raise AssertionError(
            f"timed out after {timeout:.0f}s waiting for {what}; last: {last} "
            f"(logs in {self.workdir})"
        )

    def target(self) -> tuple[str, str]:
        return VERSIONS[self.round % 2], f"r{self.round}"

    def workload(self) -> None:
        """A policy change, a driver upgrade and a new GPU node, all at once."""
        self.round += 1
        version, marker = self.target()
        self.kube.apply(policy(version, marker))
        name = f"gpu-extra-{self.round}"
        self.cluster.create_nodes(
            [testenv.node_manifest(name, gpu=True, extra_labels=USER_LABELS)], wait=False
        )
        self.extra_nodes.append(name)

    def retire_extra_node(self) -> None:
        """Delete the last run's new node and its pods and let the operator settle, so that
        every run starts from the same 6 nodes (and upgrades the same number).

        A deleted node's pods stay until kube-controller-manager's pod GC finds them orphaned
        (40 s of quarantine, checked every 20 s), and the DaemonSets count them until then:
        left to it, each run's convergence waited 40-60 s for the last run's node. They are
        removed here as the pod GC would remove them, at once."""
        if not self.extra_nodes:
            return
        name = self.extra_nodes.pop()
        self.kube.delete("Node", name)
        wait_for(
            f"{name} gone",
            lambda: (
                (node := self.kube.get("Node", name)) is None
                or NotYet({k: node["metadata"].get(k) for k in ("deletionTimestamp", "finalizers")})
            ),
        )
        on_node = f"spec.nodeName={name}"
        for pod in self.kube.list_objects("Pod", NS, field_selector=on_node):
            self.kube.delete("Pod", pod["metadata"]["name"], NS, grace_period_seconds=0)
        wait_for(
            f"{name}'s pods gone",
            lambda: (
                not (left := self.kube.list_objects("Pod", NS, field_selector=on_node))
                or NotYet([p["metadata"]["name"] for p in left])
            ),
        )
        self.converge(f"settling after {name} went")

    def run(
        self, name: str, fault: Callable[[], None] | None, converge_timeout: float = 240.0
    ) -> Outcome:
        """The workload, then ``fault`` (which returns when the fault is over), then
        convergence; judged by the end state and the API writes it took."""
        self.retire_extra_node()
        users = {self.user(r) for r in self.operators}
        exits_before = {r: len(op.exits) for r, op in self.operators.items()}
        since = datetime.now(UTC)
        self.workload()
        if fault is not None:
            fault()
        fault_end = time.monotonic()
        self.converge(f"convergence after {name}", converge_timeout)
        converge_s = time.monotonic() - fault_end
        until = datetime.now(UTC)
        writes = self.writes(users, since, until)
        deleted: dict[str, int] = {}
        for event in writes:
            ref = event.get("objectRef") or {}
            if event["verb"] == "delete" and ref.get("resource") == "pods":
                node = self.drivers.seen.get(ref.get("name", ""))
                if node is not None:
                    deleted[node] = deleted.get(node, 0) + 1
        return Outcome(
            fault=name,
            converge_s=round(converge_s, 1),
            writes=len(writes),
            upgraded_twice=[n for n, count in deleted.items() if count > 1],
            user_changes=self.user_changes(),
            exits=[c for r, op in self.operators.items() for c in op.exits[exits_before[r] :]],
        )


def compare(outcome: Outcome, baseline: dict[str, Any], now: dict[str, Any]) -> Outcome:
    """Objects lost or duplicated against the fault-free end state (same shape, new names for
    the new node aside)."""

    def shape(fp: dict[str, Any]) -> tuple[set[str], dict[str, int]]:
        pods = {}
        for key, count in fp["pods"].items():
            owner, node = key.rsplit("@", 1)
            pods[f"{owner}@{'extra' if node.startswith('gpu-extra') else node}"] = count
        return set(fp["objects"]), pods

    objects_before, _ = shape(baseline)
    objects_now, pods_now = shape(now)
    outcome.lost = sorted(objects_before - objects_now)
    outcome.duplicated = sorted(
        [f"{k} x{v}" for k, v in pods_now.items() if v > 1] + sorted(objects_now - objects_before)
    )
    return outcome


# -- the faults ------------------------------------------------------------------------------
FAULT_S = 10.0  # how long the HTTP-level faults and the latency last
SLOW_LINK = "2s latency on every request"


def sigkill_apiserver(env: ChaosEnv) -> None:
    env.cluster.restart_apiserver(down_s=3.0)


def sigstop_apiserver(env: ChaosEnv) -> None:
    env.cluster.signal_apiserver(signal.SIGSTOP)
    try:
        time.sleep(LEASE_SECONDS * 2)  # longer than the Lease
    finally:
        env.cluster.signal_apiserver(signal.SIGCONT)


def toxic(kind: str, seconds: float, **attributes: int) -> Callable[[ChaosEnv], None]:
    def fault(env: ChaosEnv) -> None:
        with env.toxiproxy.toxic("op-a", kind, **attributes):
            time.sleep(seconds)

    return fault


def http_fault(fault: Fault) -> Callable[[ChaosEnv], None]:
    def run(env: ChaosEnv) -> None:
        env.proxy.inject(fault)
        try:
            wait_for(
                "the fault to end",
                lambda: not env.proxy.active or NotYet({"injected": dict(env.proxy.injected)}),
                timeout=fault.duration_s + 30,
            )
        finally:
            env.proxy.clear()

    return run


FAULTS: dict[str, Callable[[ChaosEnv], None]] = {
    "apiserver SIGKILL + restart": sigkill_apiserver,
    f"apiserver SIGSTOP {LEASE_SECONDS * 2}s (Lease {LEASE_SECONDS}s)": sigstop_apiserver,
    "30s of connection resets": toxic("reset_peer", 30.0, timeout=0),
    SLOW_LINK: toxic("latency", FAULT_S, latency=2000),
    "20% of writes 409": http_fault(Fault(409, 0.2, writes_only=True, duration_s=FAULT_S)),
    "10% of requests 429 + Retry-After": http_fault(
        Fault(429, 0.1, retry_after_s=1, duration_s=FAULT_S)
    ),
    "every watch ended with 410 Gone": http_fault(
        Fault(410, 1.0, watches_only=True, duration_s=FAULT_S)
    ),
}


def kill_at_every_upgrade_state(env: ChaosEnv) -> tuple[Outcome, list[str]]:
    """The operator SIGKILLed the first time any node is seen in each upgrade state (its
    supervisor starts a new process, which waits for the Lease to expire)."""
    killed_at: list[str] = []
    stop = threading.Event()

    def killer() -> None:
        operator = env.operators["a"]
        while not stop.is_set():
            try:
                nodes = env.kube.list_objects("Node")
            except Exception:
                time.sleep(0.2)
                continue
            states = {n["metadata"].get("labels", {}).get(STATE) for n in nodes}
            for state in IN_PROGRESS:
                if state in states and state not in killed_at:
                    killed_at.append(state)
                    operator.kill(signal.SIGKILL, restart=True)
                    break
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    try:
        outcome = env.run("operator SIGKILL at every upgrade state", thread.start)
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)
    outcome.notes.append(f"killed at {killed_at}")
    return outcome, killed_at


@dataclass
class Handover:
    seconds: float  # from the cut to the new leader's first write
    old_leader_writes_after: int  # writes of the old leader after the new one's first (0)
    new_leader_writes: int


def leader_network_cut(env: ChaosEnv) -> tuple[Outcome, Handover]:
    """Replica b stands by; replica a (leading) loses its network (requests and answers black-
    holed) until b leads and a Lease period more. From the audit log: when b first wrote, and
    whether a wrote after that."""
    standby = env.start_operator("b")
    cut: dict[str, datetime] = {}

    def fault() -> None:
        cut["start"] = datetime.now(UTC)
        with env.toxiproxy.toxic("op-a", "timeout", both=True, timeout=0):
            wait_for(
                "the standby to lead",
                lambda: (got := standby.healthz())[1].get("role") == "leader" or NotYet(got),
                timeout=LEASE_SECONDS * 6,
            )
            time.sleep(LEASE_SECONDS)
        cut["end"] = datetime.now(UTC)

    try:
        # Inside the try: a standby that never comes up must not outlive this scenario (its
        # restarts would be counted as the next scenario's exits).
        wait_for(
            "the standby is up",
            lambda: (
                (got := standby.healthz())[1].get("role") == "standby"
                or NotYet((got, f"{len(standby.exits)} exits"))
            ),
        )
        outcome = env.run("leader network cut, standby healthy", fault)
        writes = env.writes({env.user("a"), env.user("b")}, cut["start"], datetime.now(UTC))
    finally:
        standby.stop()
        del env.operators["b"]
    a = [e for e in writes if e["user"]["username"] == env.user("a")]
    b = [e for e in writes if e["user"]["username"] == env.user("b")]
    first_b = min((stamp(e) for e in b), default=datetime.now(UTC))
    handover = Handover(
        seconds=round((first_b - cut["start"]).total_seconds(), 1),
        old_leader_writes_after=sum(1 for e in a if stamp(e) >= first_b),
        new_leader_writes=len(b),
    )
    outcome.handover_s = handover.seconds
    return outcome, handover
