"""Starting and stopping the control plane leaves no processes and no bound ports behind,
however the starter ends: stopped cleanly, exited after a detached `up`, or killed (with real
nodes: test_real_nodes_lifecycle.py)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpu_operator import testenv
from gpu_operator.kube import Kube
from gpu_operator.testenv.cluster import https_ok
from gpu_operator.testenv.pki import CLIENTS
from gpu_operator.testenv.processes import (
    alive,
    listening_ports,
    port_bindable,
)
from tests.e2e.support import NotYet, audit_writes, hack_testenv, wait_for

CYCLES = 10
KWOK_USER = CLIENTS["kwok"][0]
REACTION_S = 10  # kwok answers a change to a node it plays within this on a busy machine


def _assert_nothing_left(state_dir: Path, cluster: testenv.Cluster) -> None:
    strays = testenv.find_strays(testenv.binaries.COMPONENTS, testenv.stray_markers(state_dir))
    assert strays == [], f"stray component processes: {strays}"
    assert not [p.name for p in cluster.processes if alive(p)]
    ports = set(cluster.ports.values())
    assert not ports & listening_ports(), "a component port is still listening"
    assert all(port_bindable(p) for p in ports), "a component port cannot be bound again"


def test_ten_start_stop_cycles_leave_no_processes_or_ports(
    tmp_path: Path, testenv_bin_dir: Path
) -> None:
    state_dir = tmp_path / "env"
    starts, stops = [], []
    for _ in range(CYCLES):
        t0 = time.monotonic()
        cluster = testenv.start(state_dir, gpu_nodes=1, bin_dir=testenv_bin_dir)
        starts.append(time.monotonic() - t0)
        assert cluster.healthy()
        assert len(cluster.processes) == len(testenv.binaries.COMPONENTS)
        t0 = time.monotonic()
        cluster.stop()
        stops.append(time.monotonic() - t0)
        _assert_nothing_left(state_dir, cluster)
    print(
        f"\n{CYCLES} cycles: start (to 1 Ready GPU node) mean {sum(starts) / CYCLES:.2f}s "
        f"max {max(starts):.2f}s; stop mean {sum(stops) / CYCLES:.2f}s max {max(stops):.2f}s; "
        f"total {sum(starts) + sum(stops):.1f}s"
    )


def test_detached_up_outlives_the_cli_and_down_removes_everything(
    tmp_path: Path, testenv_bin_dir: Path
) -> None:
    state_dir = tmp_path / "env"
    up = hack_testenv(state_dir, testenv_bin_dir, "up", "--gpu-nodes", "1", "--cpu-nodes", "1")
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = state_dir / "kubeconfig"
        assert up.stdout.splitlines() == [str(kubeconfig), f"export KUBECONFIG={kubeconfig}"]
        cluster = testenv.load(state_dir)
        assert cluster is not None and cluster.healthy(), "components outlive the CLI"
        status = hack_testenv(state_dir, testenv_bin_dir, "status")
        assert status.returncode == 0 and "2/2 Ready" in status.stdout, status.stdout
    finally:
        down = hack_testenv(state_dir, testenv_bin_dir, "down")
    assert down.returncode == 0, down.stderr
    assert cluster is not None
    _assert_nothing_left(state_dir, cluster)
    assert hack_testenv(state_dir, testenv_bin_dir, "status").returncode == 1


def test_an_exited_controller_manager_is_started_again_and_down_stops_its_loop(
    tmp_path: Path, testenv_bin_dir: Path
) -> None:
    """kcm and the scheduler are restarted when they exit, as a kubelet restarts a control
    plane's static pods (a leader-elected kcm exits during a long API server outage)."""
    state_dir = tmp_path / "env"
    cluster = testenv.start(state_dir, bin_dir=testenv_bin_dir)
    markers = testenv.stray_markers(state_dir)
    try:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs
        for name, port in (("kube-controller-manager", "kcm"), ("kube-scheduler", "scheduler")):
            (first,) = testenv.find_strays([name], markers)
            os.kill(first, signal.SIGKILL)
            wait_for(
                f"{name} started again (killed: pid {first})",
                lambda n=name, f=first: [p for p in testenv.find_strays([n], markers) if p != f],
                timeout=60,
            )
            url = f"https://127.0.0.1:{cluster.ports[port]}/healthz"
            wait_for(
                f"{name} healthy again at {url}", lambda u=url: https_ok(u, insecure), timeout=60
            )
    finally:
        cluster.stop()
    _assert_nothing_left(state_dir, cluster)
    assert testenv.find_strays(["sh"], markers) == [], "a restart loop outlived down"


def test_killed_starter_takes_its_components_with_it(tmp_path: Path, testenv_bin_dir: Path) -> None:
    """A test run killed with SIGKILL must not leave a control plane running (PDEATHSIG)."""
    state_dir = tmp_path / "env"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        from gpu_operator import testenv
        testenv.start(Path({str(state_dir)!r}), bin_dir=Path({str(testenv_bin_dir)!r}))
        print("up", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.stdout.strip() == "up", proc.stderr
    assert proc.returncode == -signal.SIGKILL
    cluster = testenv.load(state_dir)
    assert cluster is not None
    try:
        deadline = time.monotonic() + 15
        while any(alive(p) for p in cluster.processes) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p.name for p in cluster.processes if alive(p)]
    finally:
        testenv.stop(state_dir)
    _assert_nothing_left(state_dir, cluster)


def test_kwok_nodes_renew_leases_and_post_status_only_when_due(
    tmp_path: Path, testenv_bin_dir: Path
) -> None:
    """Like a kubelet with node Leases: a Lease renewed every 10 s, the Node's status posted
    only when it changes or every 5 minutes (kwok 0.7's own stages posted it every 20-45 s,
    which no real fleet does and which made an idle operator look busy).

    Judged from kwok's own writes in the audit log. kube-controller-manager writes nodes too
    (a not-ready taint it adds and removes, late on a busy machine), and kwok, like a kubelet,
    posts a node's status again when it sees the node change: a post within REACTION_S of
    another client's write to that node is such a reaction, not a heartbeat."""
    nodes, renewals = 8, 4  # 4 renewals, 40 s: the old stages posted most nodes' status by then
    cluster = testenv.start(tmp_path / "env", gpu_nodes=nodes, bin_dir=testenv_bin_dir)
    try:
        with cluster.api_client() as api:
            kube = Kube(api)
            since = datetime.now(UTC)
            before = _node_versions(kube)
            seen: dict[str, set[str]] = {}

            def renewed_enough() -> bool | NotYet:
                for name, renewed in _renew_times(kube).items():
                    seen.setdefault(name, set()).add(renewed)
                counts = {name: len(times) - 1 for name, times in seen.items()}
                done = len(seen) == nodes and min(counts.values()) >= renewals
                return done or NotYet({"renewals seen": counts})

            wait_for("every node Lease renewed 4 times", renewed_enough, timeout=120, every=1)
            after = _node_versions(kube)
        writes = audit_writes(
            cluster, None, since - timedelta(seconds=REACTION_S), resource=("nodes", None)
        )
    finally:
        cluster.stop(remove_state=True)
    assert len(before) == nodes
    heartbeats = _unprompted(writes, KWOK_USER, since)
    assert not heartbeats, "kwok posted node status between Lease renewals: " + "; ".join(
        _described(e) for e in heartbeats
    )
    moved = sorted(n for n in before if after.get(n) != before[n])
    assert {e["objectRef"]["name"] for e in writes} >= set(moved), (
        f"nodes {moved} changed with no write in the audit log"
    )


def _stamp(event: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def _unprompted(
    writes: list[Mapping[str, Any]], user: str, since: datetime
) -> list[Mapping[str, Any]]:
    """``user``'s writes since ``since`` that follow no other client's write to the same
    object within REACTION_S."""
    others: dict[str, list[datetime]] = {}
    for e in writes:
        if e["user"]["username"] != user:
            others.setdefault(e["objectRef"]["name"], []).append(_stamp(e))
    window = timedelta(seconds=REACTION_S)
    return [
        e
        for e in writes
        if e["user"]["username"] == user
        and _stamp(e) >= since
        and not any(
            timedelta(0) <= _stamp(e) - t <= window for t in others.get(e["objectRef"]["name"], [])
        )
    ]


def _described(event: Mapping[str, Any]) -> str:
    ref = event["objectRef"]
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return (
        f"{event['user']['username']} {event['verb']} {ref['name']}{sub} at "
        f"{event['requestReceivedTimestamp']} ({event.get('responseStatus', {}).get('code')})"
    )


def _node_versions(kube: Kube) -> dict[str, str]:
    return {
        n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in kube.list_objects("Node")
    }


def _renew_times(kube: Kube) -> dict[str, str]:
    return {
        lease["metadata"]["name"]: str(lease["spec"].get("renewTime"))
        for lease in kube.list_objects("Lease", "kube-node-lease")
    }
