"""Real nodes: a kubelet, its own containerd with runc, and kube-proxy per node, each node in
private PID, mount and network namespaces on this machine.

The harness owns a bridge in the root network namespace (the API server listens on its address)
and one veth per node; `node-init.sh` runs as the init of each node's PID namespace, so killing
the node's `unshare` process takes every process of the node with it (containers included), and
the namespaces, mounts and the node's veth vanish with the last of them. `cleanup()` then removes
the cgroups and the bridge: nothing is left in the root namespace. What the files contain is
decided in `nodeconfig` (pure); this module only does the I/O.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes import client

from . import binaries, nodeconfig, nodes, pki
from .nodeconfig import Network, RealNode
from .processes import ProcessRecord, start_time

PROCESS_PREFIX = "node/"
# Debian packages the real nodes use (installed by `make packages` when root).
DEBIAN_PACKAGES = (
    "runc", "containernetworking-plugins", "iptables", "buildah", "busybox-static", "mmdebstrap",
)  # fmt: skip
CNI_BIN_DIR = "/usr/lib/cni"
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
TOOLS = ("unshare", "nsenter", "ip", "mount", "iptables", "iptables-restore", "runc")
# The node gets its own tmpfs on these, so state and cache dirs must live elsewhere.
NODE_PRIVATE = (Path("/run"), Path("/var/lib"), Path("/var/log"))
HOST_LOCK = Path("/tmp/gpu-operator-testenv-net.lock")


class RealNodesError(RuntimeError):
    """Real nodes cannot run here or did not come up; the message says why."""


@dataclass(frozen=True)
class RealNodes:
    """What `start_nodes` set up, as recorded in state.json for `cleanup()` and `load_image()`."""

    network: Network
    nodes: tuple[RealNode, ...]
    cgroups: tuple[str, ...]  # the cluster's cgroup in each hierarchy; nodes' are below

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network.to_json(),
            "nodes": [n.to_json() for n in self.nodes],
            "cgroups": list(self.cgroups),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RealNodes:
        return cls(
            Network.from_json(data["network"]),
            tuple(RealNode.from_json(n) for n in data["nodes"]),
            tuple(str(c) for c in data.get("cgroups", ())),
        )


def _run(*argv: str, check: bool = True, stdin: Any = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv), capture_output=True, text=stdin is None, stdin=stdin, check=False
    )
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise RealNodesError(f"`{' '.join(argv)}` failed: {err.strip()}")
    return proc


def known_gpu_profiles() -> list[str]:
    """Simulated GPU profiles the agents accept: their data files (testenv sits below the
    simulation in the layers, so it reads the files rather than importing gpu_operator.sim)."""
    folder = resources.files("gpu_operator") / "sim" / "profiles"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def init_script() -> Path:
    return Path(str(resources.files("gpu_operator.testenv") / "node-init.sh"))


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Host-wide: concurrent clusters (other checkouts, parallel sessions) pick distinct
    network slots and make the cgroup levels they share one at a time."""
    with HOST_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cluster_cgroups(state_dir: Path) -> list[str]:
    """This cluster's cgroup in every hierarchy (see nodeconfig.cluster_cgroups)."""
    return nodeconfig.cluster_cgroups(
        Path("/proc/self/mounts").read_text(), Path("/proc/self/cgroup").read_text(), state_dir
    )


def _make_cgroup(path: Path) -> None:
    """mkdir -p a cgroup; in a cpuset hierarchy give each new level its parent's CPUs and
    memory nodes (a v1 cpuset cgroup starts with none and then refuses every process).
    Under the host lock: clusters starting at once share the upper levels, and one must not
    see a level another has made but not yet given its CPUs."""
    with _host_lock():
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for level in reversed(missing):
            level.mkdir(exist_ok=True)  # made by a starter that does not take the lock
            for knob in ("cpuset.cpus", "cpuset.mems"):
                parent_knob = level.parent / knob
                if parent_knob.exists() and (level / knob).exists():
                    (level / knob).write_text(parent_knob.read_text())


def why_unavailable(state_dir: Path | None = None) -> str | None:
    """One line saying why real nodes cannot run on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "real nodes need root (namespaces, mounts, veths, cgroups); run as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [f"{CNI_BIN_DIR}/{p}" for p in CNI_PLUGINS if not Path(CNI_BIN_DIR, p).is_file()]
    if missing:
        return (
            f"real nodes need {', '.join(missing)}: install Debian's "
            f"{' '.join(DEBIAN_PACKAGES)} (`make packages` as root)"
        )
    if not cluster_cgroups(state_dir or Path("/")):
        return "real nodes need cgroups mounted under /sys/fs/cgroup"
    for path in (state_dir, binaries.cache_bin_dir(), binaries.node_dir()):
        if path is not None and any(p == path or p in path.parents for p in NODE_PRIVATE):
            return f"{path} is under {', '.join(map(str, NODE_PRIVATE))}, which nodes mount over"
    probe = _run("unshare", "--pid", "--fork", "--mount", "--net", "--cgroup", "true", check=False)
    if probe.returncode != 0:
        return f"cannot create PID, mount, network and cgroup namespaces: {probe.stderr.strip()}"
    return None


# -- the harness network (root namespace) ----------------------------------------------------
def _links() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def _alias(link: str) -> str:
    try:
        return Path(f"/sys/class/net/{link}/ifalias").read_text().strip()
    except OSError:
        return ""


def allocate_network(state_dir: Path) -> Network:
    """Create this cluster's bridge on a free 10.213.X.0/24 and give it the gateway address.

    The bridge's alias names the state dir, so `cleanup()` finds it even without state.json."""
    with _host_lock():
        out = _run("ip", "-o", "-4", "addr", "show").stdout
        addresses = [line.split()[3] for line in out.splitlines() if len(line.split()) > 3]
        network = nodeconfig.network_for_slot(nodeconfig.pick_slot(addresses, _links()))
        _run("ip", "link", "add", "name", network.bridge, "type", "bridge")
        try:
            _run("ip", "link", "set", "dev", network.bridge, "alias", str(state_dir))
            _sysctl(f"net/ipv6/conf/{network.bridge}/disable_ipv6", "1")
            _run("ip", "addr", "add", f"{network.gateway}/{network.prefix_len}", "dev",
                 network.bridge)  # fmt: skip
            _run("ip", "link", "set", "dev", network.bridge, "up")
        except BaseException:
            _run("ip", "link", "del", network.bridge, check=False)
            raise
    return network


def _sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", key).write_text(value)


# -- starting nodes --------------------------------------------------------------------------
def _kubeconfig(api_url: str, ca: Path, pair: pki.KeyPair, user: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {"server": api_url,
                                                     "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(pair.cert),
                                          "client-key": str(pair.key)}}],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": user}}],
        "current-context": "testenv",
    }  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


def write_node_files(
    node: RealNode,
    network: Network,
    peers: Sequence[RealNode],
    *,
    state_dir: Path,
    api_url: str,
    keys: pki.PKI,
    k8s_bin: Path,
    node_dir: Path,
) -> Path:
    """Lay out a fresh node directory (configs, kubeconfigs, the simulated-GPU marker) and
    return its env file for node-init.sh."""
    shutil.rmtree(node.dir, ignore_errors=True)
    for sub in ("kubelet", "cdi", "nvidia", "gpu-operator-sim", "var-log", "logs", "cni",
                "etc-containerd", "host-driver"):  # fmt: skip
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    (node.dir / "gpu-operator-sim" / nodeconfig.SIM_PROFILE_FILE).write_text(node.gpus + "\n")
    install_host_driver(node)
    resolv = node.dir / "resolv.conf"
    resolv.write_text("# no DNS: nothing outside the testenv is reachable\n")
    ca = keys.ca.cert
    node_pair = pki.node_client(state_dir / "pki", keys.ca, node.name)
    (node.dir / "kubelet.kubeconfig").write_text(
        _kubeconfig(api_url, ca, node_pair, f"system:node:{node.name}")
    )
    (node.dir / "kube-proxy.kubeconfig").write_text(
        _kubeconfig(api_url, ca, keys.clients["kube-proxy"], "kube-proxy")
    )
    kubelet = nodeconfig.kubelet_config(node, ca_file=ca, resolv_conf=resolv)
    (node.dir / "kubelet.yaml").write_text(yaml.safe_dump(kubelet, sort_keys=False))
    proxy = nodeconfig.kube_proxy_config(node, node.dir / "kube-proxy.kubeconfig")
    (node.dir / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy, sort_keys=False))
    (node.dir / "cni" / "10-testenv.conflist").write_text(
        json.dumps(nodeconfig.cni_conflist(node), indent=2) + "\n"
    )
    runc = shutil.which("runc") or "runc"
    script = Path(str(resources.files("gpu_operator.testenv") / "nvidia_runtime.py"))
    nvidia_runtime = node.dir / "nvidia-container-runtime"
    nvidia_runtime.write_text(nodeconfig.nvidia_runtime_wrapper(sys.executable, script, runc))
    nvidia_runtime.chmod(0o755)
    runc_runtime = node.dir / "runc"
    runc_runtime.write_text(nodeconfig.runc_wrapper(sys.executable, script, runc))
    runc_runtime.chmod(0o755)
    ctd = nodeconfig.containerd_config(
        node,
        pause_image=binaries.node_image_name("pause"),
        cni_conf_dir=node.dir / "cni",
        cni_bin_dir=CNI_BIN_DIR,
        runc=str(runc_runtime),
        nvidia_runtime=str(nvidia_runtime),
    )
    (node.dir / "containerd.toml").write_text(nodeconfig.to_toml(ctd))
    env = nodeconfig.init_env(
        node,
        network,
        peers=peers,
        k8s_bin=k8s_bin,
        node_bin=node_dir / "bin",
        images=binaries.node_image_archives(node_dir),
    )
    env_path = node.dir / "node.env"
    env_path.write_text(nodeconfig.env_file(env))
    return env_path


def install_host_driver(node: RealNode) -> None:
    """The node's "preinstalled" SIMULATED driver (nodeconfig.HOST_DRIVER_ON_NODE), laid out by
    the agents' own stub driver: testenv does not import the agents, so through their CLI.
    The node's PCI bus goes beside it (labels.SIMULATED_PCI_ROOT), every GPU on ``nvidia``:
    what the VFIO manager and passthrough plugins move GPUs on."""
    _run(
        sys.executable, "-m", "gpu_operator", "agent", "simulate-driver", "install",
        "--root", str(node.dir / "host-driver"), "--spec", node.gpus, "--seed", node.name,
        "--style", "gke", "--pci",
    )  # fmt: skip


def node_argv(env_path: Path) -> list[str]:
    """`unshare` as the node's outer process: if it dies, the node's init gets SIGKILL, and with
    the init the kernel kills every process in the node's PID namespace. Started inside the
    node's cgroups, so its cgroup namespace is rooted there."""
    return [
        shutil.which("unshare") or "unshare",
        "--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--net", "--cgroup",
        "--propagation", "slave", "--mount-proc",
        shutil.which("bash") or "bash", str(init_script()), str(env_path),
    ]  # fmt: skip


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _init_child(pid: int) -> int | None:
    """The node's init (unshare's only child), from the root PID namespace."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


class Spawn(Protocol):
    def __call__(
        self, name: str, argv: Sequence[str], log: Path, cgroups: Sequence[Path], death_signal: int
    ) -> ProcessRecord: ...


WaitFor = Callable[[str, Callable[[], bool], float], None]


def start_nodes(
    planned: Sequence[RealNode],
    network: Network,
    cgroups: Sequence[str],
    *,
    state_dir: Path,
    api_url: str,
    keys: pki.PKI,
    k8s_bin: Path,
    node_dir: Path,
    spawn: Spawn,
    wait_for: WaitFor,
    deadline: float,
) -> list[ProcessRecord]:
    """Lay out, wire and start every planned node (each node's `unshare` through `spawn`);
    return the nodes' init processes, to record too. Registration and labels:
    `label_and_wait_ready`."""
    records: list[ProcessRecord] = []
    own_netns = _netns(os.getpid())
    for node in planned:
        env_path = write_node_files(
            node, network, planned, state_dir=state_dir, api_url=api_url, keys=keys,
            k8s_bin=k8s_bin, node_dir=node_dir,
        )  # fmt: skip
        _run("ip", "link", "del", node.host_veth, check=False)  # a crashed run's leftover
        _run("ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", node.node_veth)
        _run("ip", "link", "set", node.host_veth, "master", network.bridge, "up")
        _sysctl(f"net/ipv6/conf/{node.host_veth}/disable_ipv6", "1")
        node_cgroups = [Path(c, node.name) for c in cgroups]
        for cgroup in node_cgroups:
            _make_cgroup(cgroup)
        log = node.dir / "logs" / "init.log"
        # SIGKILL if the starter dies: `unshare` ignores SIGTERM while it waits for the init.
        outer = spawn(
            f"{PROCESS_PREFIX}{node.name}", node_argv(env_path), log, node_cgroups, signal.SIGKILL
        )
        wait_for(
            f"{node.name} namespaces",
            lambda pid=outer.pid: (
                _netns(pid) not in (None, own_netns)  # type: ignore[misc]
                and _init_child(pid) is not None
            ),
            deadline,
        )
        _run("ip", "link", "set", node.node_veth, "netns", str(outer.pid))
        init_pid = _init_child(outer.pid)
        assert init_pid is not None
        started = start_time(init_pid)
        records.append(
            ProcessRecord(
                f"{PROCESS_PREFIX}{node.name}/init",
                init_pid,
                started if started is not None else -1,
                outer.log,
            )
        )
    return records


def label_and_wait_ready(
    api: client.ApiClient, planned: Sequence[RealNode], wait_for: WaitFor, deadline: float
) -> None:
    """Once each kubelet has registered its Node, add what NFD and the testenv add (labels,
    the simulated-GPU annotation), then wait until every node is Ready."""
    core = client.CoreV1Api(api)
    pending = {n.name: n for n in planned}

    def registered() -> bool:
        for node in core.list_node().items:
            name = nodes.node_name(node)
            if name in pending:
                planned_node = pending.pop(name)
                core.patch_node(
                    name,
                    {
                        "metadata": {
                            "labels": nodeconfig.node_labels(planned_node),
                            "annotations": nodeconfig.node_annotations(planned_node),
                        }
                    },
                )
        return not pending

    wait_for("real nodes registered", registered, deadline)
    names = {n.name for n in planned}

    def ready() -> bool:
        items = [n for n in core.list_node().items if nodes.node_name(n) in names]
        return len(items) == len(names) and all(nodes.is_settled(n) for n in items)

    wait_for("real nodes Ready", ready, deadline)


# -- using and removing nodes ----------------------------------------------------------------
def load_image(real: RealNodes, records: Sequence[ProcessRecord], archive: Path) -> None:
    """Import an OCI (or docker) image archive into every real node's containerd (k8s.io
    namespace, where the kubelet looks); the names come from the archive's annotations."""
    outers = {r.name: r for r in records}
    node_bin = binaries.node_dir() / "bin"
    for node in real.nodes:
        outer = outers.get(f"{PROCESS_PREFIX}{node.name}")
        if outer is None or start_time(outer.pid) != outer.start_time:
            raise RealNodesError(f"real node {node.name} is not running")
        with archive.open("rb") as data:
            _run(
                "nsenter", "-t", str(outer.pid), "-m", "-n", "--",
                str(node_bin / "ctr"), "--address", nodeconfig.CONTAINERD_SOCKET,
                "-n", "k8s.io", "images", "import", "--local", "-",
                stdin=data,
            )  # fmt: skip


def _cgroup_dirs(state_dir: Path, real: RealNodes | None) -> list[Path]:
    recorded = real.cgroups if real else ()
    return [Path(c) for c in sorted({*recorded, *cluster_cgroups(state_dir)})]


def leftover_cgroups(state_dir: Path, real: RealNodes | None = None) -> list[Path]:
    """The cluster's cgroup directories that still exist (none after `down`)."""
    return [d for d in _cgroup_dirs(state_dir, real) if d.exists()]


def _remove_cgroup_tree(top: Path, deadline: float) -> None:
    """Kill what is still inside (nothing, normally), then rmdir bottom-up."""
    while True:
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError, OSError):
                d.rmdir()
        if not top.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def bridges_of(state_dir: Path) -> list[str]:
    """The harness bridges naming `state_dir` (normally one)."""
    return [
        link
        for link in _links()
        if link.startswith(nodeconfig.BRIDGE_PREFIX) and _alias(link) == str(state_dir)
    ]


def cleanup(state_dir: Path, real: RealNodes | None, timeout: float = 15.0) -> list[str]:
    """After the node processes are gone: remove cgroups, veths and the bridge. Returns what
    could not be removed (empty when the root namespace is as before `up`)."""
    deadline = time.monotonic() + timeout
    for top in _cgroup_dirs(state_dir, real):
        if top.exists():
            _remove_cgroup_tree(top, deadline)
    veths = [n.host_veth for n in real.nodes] if real else []
    for link in veths:
        # Normally gone with the node's network namespace (the kernel frees it asynchronously).
        while link in _links() and time.monotonic() < deadline:
            time.sleep(0.05)
        if link in _links():
            _run("ip", "link", "del", link, check=False)
    bridges = set(bridges_of(state_dir))
    if real:
        bridges.add(real.network.bridge)
    for bridge in bridges:
        if bridge in _links():
            _run("ip", "link", "del", bridge, check=False)
    # The shared parent of every cluster's cgroups goes once empty (another cluster may use it).
    for top in _cgroup_dirs(state_dir, real):
        with contextlib.suppress(OSError):
            top.parent.rmdir()
    left = [str(d) for d in leftover_cgroups(state_dir, real)]
    left += [link for link in (*veths, *bridges) if link in _links()]
    return left
