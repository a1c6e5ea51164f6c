"""With real nodes, `down` leaves no process, mount, network device, network namespace,
iptables rule or cgroup behind, however the starter ends: stopped by `down`, or killed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import client

from gpu_operator import testenv
from gpu_operator.testenv.processes import cmdline, start_time
from tests.e2e.support import NotYet, hack_testenv, wait_for

pytestmark = pytest.mark.real_nodes


def _cgroup_paths(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return ""


def _pids_of(state_dir: Path, cluster_id: str) -> list[int]:
    """Live processes that belong to the cluster: arguments naming its state dir (or only its
    nodes' dir), or a cgroup inside its nodes' (containers: the pause and the pod's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        args = " ".join(cmdline(pid))
        if start_time(pid) is not None and (
            str(state_dir) in args or cluster_id in _cgroup_paths(pid)
        ):
            found.append(pid)
    return found


def _ticks_now() -> int:
    """Now, in the units of a process's start time (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _netns_inodes(started_before: int) -> set[str]:
    """The network namespaces of live processes started before ``started_before``.

    Only those: the kernel reuses a freed namespace's inode number, and the real-node tests
    beside this one create and free pods' namespaces all the time, so a namespace made later
    may carry the number of one that was gone; one held by a process that was already running
    cannot have been freed and reused."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            started = start_time(int(entry.name))
            with contextlib.suppress(OSError):
                if started is not None and started < started_before:
                    found.add(os.readlink(entry / "ns" / "net"))
    return found


def test_up_with_real_nodes_and_a_pod_then_down_leaves_nothing_behind(
    tmp_path: Path, testenv_bin_dir: Path, real_nodes_runtime: Path
) -> None:
    """`down` removes every process (kubelets, containerds, shims, containers), mount, network
    device, network namespace and cgroup that `up --real-nodes 2` made, and `up` added no
    iptables rule to the root namespace."""
    state_dir = tmp_path / "env"
    iptables_before = subprocess.run(
        ["iptables-save"], capture_output=True, text=True, check=True
    ).stdout
    before_up = _ticks_now()
    t0 = time.monotonic()
    up = hack_testenv(state_dir, testenv_bin_dir, "up", "--real-nodes", "2", "--gpu-nodes", "0",
              "--cpu-nodes", "0")  # fmt: skip
    up_seconds = time.monotonic() - t0
    cluster = testenv.load(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        assert cluster is not None and cluster.real is not None
        real = cluster.real
        links = [real.network.bridge, *(n.host_veth for n in real.nodes)]
        assert set(links) <= set(os.listdir("/sys/class/net"))
        node_netns = {os.readlink(f"/proc/{p.pid}/ns/net") for p in cluster.processes
                      if p.name.startswith(testenv.realnodes.PROCESS_PREFIX)}  # fmt: skip
        assert len(node_netns) == 2 and not node_netns & _netns_inodes(started_before=before_up)
        with cluster.api_client() as api:
            core = client.CoreV1Api(api)
            shell = testenv.binaries.node_image_name("shell")
            core.create_namespaced_pod("default", {
                "metadata": {"name": "sleeper"},
                "spec": {"nodeName": "real-node-1", "containers": [
                    {"name": "c", "image": shell, "imagePullPolicy": "Never",
                     "command": ["sleep", "3600"]}]},
            })  # fmt: skip

            def running() -> bool | NotYet:
                pod = core.read_namespaced_pod("sleeper", "default")
                phase = pod.status.phase if pod.status else None
                return phase == "Running" or NotYet({"phase": phase, "status": pod.status})

            wait_for("the pod on real-node-1 to run", running, timeout=60)
        archive = real_nodes_runtime / "images" / "shell.oci.tar"
        loaded = hack_testenv(state_dir, testenv_bin_dir, "load-image", str(archive))
        assert loaded.returncode == 0, loaded.stderr
        assert "imported into real-node-0, real-node-1" in loaded.stderr
        cluster_id = testenv.nodeconfig.cluster_id(state_dir)
        pids = _pids_of(state_dir, cluster_id)
        names = {os.path.basename(cmdline(p)[0]) for p in pids if cmdline(p)}
        assert {"kubelet", "containerd", "kube-proxy", "pause", "sleep"} <= names, names
        assert testenv.realnodes.leftover_cgroups(state_dir, real)
    finally:
        before_down = _ticks_now()
        t0 = time.monotonic()
        down = hack_testenv(state_dir, testenv_bin_dir, "down")
        down_seconds = time.monotonic() - t0
    assert down.returncode == 0, down.stderr
    assert _pids_of(state_dir, cluster_id) == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state_dir) not in mounts
    assert not [line for line in mounts.splitlines() if "/var/lib/kubelet" in line]
    assert not set(links) & set(os.listdir("/sys/class/net"))
    assert not node_netns & _netns_inodes(started_before=before_down)
    assert testenv.realnodes.leftover_cgroups(state_dir, real) == []
    iptables_after = subprocess.run(
        ["iptables-save"], capture_output=True, text=True, check=True
    ).stdout
    assert real.network.bridge not in iptables_after
    assert real.network.subnet.rsplit(".", 1)[0] not in iptables_after

    def rules(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("#")]

    assert rules(iptables_after) == rules(iptables_before)
    print(f"\nup --real-nodes 2 (warm): {up_seconds:.1f}s; down: {down_seconds:.1f}s")


def test_killed_starter_takes_its_real_nodes_with_it(
    tmp_path: Path, testenv_bin_dir: Path, real_nodes_runtime: Path
) -> None:
    """SIGKILL of the test process kills each node's `unshare` (PDEATHSIG SIGKILL, as it ignores
    SIGTERM), hence the node's init and every process in its PID namespace; the next `stop()`
    removes the cgroups and the bridge that nothing holds any more."""
    state_dir = tmp_path / "env"
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from gpu_operator import testenv
        testenv.start(Path({str(state_dir)!r}), real_nodes=1,
                      bin_dir=Path({str(testenv_bin_dir)!r}))
        print("up", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.stdout.strip() == "up", proc.stderr
    cluster = testenv.load(state_dir)
    assert cluster is not None and cluster.real is not None
    cluster_id = testenv.nodeconfig.cluster_id(state_dir)
    try:
        deadline = time.monotonic() + 15
        while _pids_of(state_dir / "nodes", cluster_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pids_of(state_dir / "nodes", cluster_id) == []
    finally:
        testenv.stop(state_dir)
    assert testenv.realnodes.leftover_cgroups(state_dir, cluster.real) == []
    assert cluster.real.network.bridge not in os.listdir("/sys/class/net")
