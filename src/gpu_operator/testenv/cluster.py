"""Start, describe and stop a real control plane on loopback: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (which plays the simulated nodes' kubelets),
optionally with real nodes (kubelet, containerd, runc, kube-proxy; see `realnodes`), for which
the API server listens on the harness bridge instead of loopback.

All state lives in one directory (default `.testenv/` in the checkout): PKI, kubeconfigs, etcd
data, logs, the audit log and `state.json`, which records ports and PIDs so that `stop()` from
any later process tears down exactly what `start()` left running.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from kubernetes import client

from . import binaries, nodeconfig, nodes, pki, realnodes
from .processes import (
    ProcessRecord,
    alive,
    cmdline,
    find_strays,
    free_ports,
    spawn,
    terminate,
    wait_ports_free,
)

SERVICE_CIDR = nodeconfig.SERVICE_CIDR
POD_CIDR = "10.128.0.1/14"
# Every request at Metadata level, except the kubelets' (kwok's) node Lease renewals: one per
# node every 10 s, 13,000 a minute at 2,000 nodes, which no test reads.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  namespaces: [kube-node-lease]
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: Metadata
"""
# The parallelism (default 4) bounds how fast hundreds of nodes and their pods turn Ready.
#
# The node stages are our own, because kwok 0.7 picks its default node stages backwards: given
# --node-lease-duration-seconds it renews the Leases *and* posts every node's status every
# 20-45 s (the stage meant for nodes without Leases), 1,700 node updates a minute at 500 nodes.
# A kubelet that renews a Lease posts its status only when it changes or every
# nodeStatusReportFrequency (5 min), so the heartbeat stage below does the same. Pod stages
# stay kwok's defaults (a kind with no Stage here gets them).
_NODE_STATUS = """\
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
      {{ end }}
      addresses:
      {{ with .status.addresses }}
      {{ YAML . 1 }}
      {{ else }}
      - type: InternalIP
        address: {{ NodeIP | Quote }}
      - type: Hostname
        address: {{ NodeName | Quote }}
      {{ end }}
      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
"""
# What the node's creator set (GPU nodes carry nvidia.com/gpu), else room for any pod.
_NODE_RESOURCES = """\
      {field}:
      {{{{ with .status.{field} }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{{{ end }}}}
"""
KWOK_CONFIG = f"""\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodePlayStageParallelism: 16
  podPlayStageParallelism: 16
  nodeLeaseParallelism: 16
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-node-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
{_NODE_STATUS}\
      {{{{ $info := .status.nodeInfo }}}}
      {{{{ $kwok := printf "kwok-%s" Version }}}}
      nodeInfo:
        architecture: {{{{ or $info.architecture "amd64" }}}}
        operatingSystem: {{{{ or $info.operatingSystem "linux" }}}}
        kubeletVersion: {{{{ or $info.kubeletVersion $kwok }}}}
        containerRuntimeVersion: {{{{ or $info.containerRuntimeVersion $kwok }}}}
        kernelVersion: {{{{ or $info.kernelVersion $kwok }}}}
        kubeProxyVersion: {{{{ or $info.kubeProxyVersion $kwok }}}}
        osImage: {{{{ or $info.osImage `""` }}}}
        machineID: {{{{ or $info.machineID `""` }}}}
        systemUUID: {{{{ or $info.systemUUID `""` }}}}
        bootID: {{{{ or $info.bootID `""` }}}}
{_NODE_RESOURCES.format(field="allocatable")}\
{_NODE_RESOURCES.format(field="capacity")}\
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-node-status-report
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay:
    durationMilliseconds: 300000
    jitterDurationMilliseconds: 330000
  next:
    statusTemplate: |
{_NODE_STATUS}"""
STATE_FILE = "state.json"
START_TIMEOUT = 120.0


class TestenvError(RuntimeError):
    """The control plane could not be started or reached; the message says why."""


def default_state_dir() -> Path:
    """`$TESTENV_STATE_DIR`, else `.testenv/` in the checkout (or the cwd outside one)."""
    env = os.environ.get("TESTENV_STATE_DIR")
    if env:
        return Path(env).resolve()
    root = binaries.repo_root()
    return (root or Path.cwd()) / ".testenv"


@dataclass(frozen=True)
class Clients:
    """The typed API objects tests use, sharing one ApiClient, plus a working namespace."""

    api: client.ApiClient
    core: client.CoreV1Api
    apps: client.AppsV1Api
    custom: client.CustomObjectsApi
    apiext: client.ApiextensionsV1Api
    namespace: str = "default"

    @classmethod
    def for_api(cls, api: client.ApiClient, namespace: str = "default") -> Clients:
        return cls(
            api,
            client.CoreV1Api(api),
            client.AppsV1Api(api),
            client.CustomObjectsApi(api),
            client.ApiextensionsV1Api(api),
            namespace,
        )


@dataclass
class Cluster:
    """A handle on a running testenv; cheap to rebuild from `state.json` with `load()`."""

    state_dir: Path
    api_url: str
    ports: dict[str, int]
    processes: list[ProcessRecord]
    bin_dir: Path
    # Seconds from the start of `start()` until each milestone (apiserver ready, nodes, ...).
    timings: dict[str, float] = field(default_factory=dict)
    real: realnodes.RealNodes | None = None
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON lines, one per request at level Metadata: count by `user.username`/`userAgent`."""
        return self.state_dir / "audit.log"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.crt"

    @property
    def admin_cert(self) -> pki.KeyPair:
        return pki.KeyPair(
            self.state_dir / "pki" / "client-admin.crt", self.state_dir / "pki" / "client-admin.key"
        )

    def api_client(self, *, pool_size: int = 32) -> client.ApiClient:
        """A fresh cluster-admin ApiClient; callers own it (close() it when done)."""
        config = client.Configuration(
            host=self.api_url,
            ssl_ca_cert=str(self.ca_file),
            cert_file=str(self.admin_cert.cert),
            key_file=str(self.admin_cert.key),
            connection_pool_maxsize=pool_size,
        )
        return client.ApiClient(config)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.admin_cert.cert), str(self.admin_cert.key))
        return ctx

    def get(self, path: str, timeout: float = 5.0) -> str:
        """GET a raw apiserver path (e.g. /readyz?verbose) as cluster-admin."""
        with urllib.request.urlopen(
            self.api_url + path, context=self.ssl_context(), timeout=timeout
        ) as resp:
            return str(resp.read().decode())

    def apiserver_metrics(self) -> str:
        """Prometheus text from the apiserver's /metrics (apiserver_request_total etc.)."""
        return self.get("/metrics", timeout=30.0)

    def running(self) -> bool:
        components = [
            p
            for p in self.processes
            if p.name in binaries.COMPONENTS or p.name.startswith(realnodes.PROCESS_PREFIX)
        ]
        return bool(components) and all(alive(p) for p in components)

    # Real nodes ----------------------------------------------------------------------------

    @property
    def real_nodes(self) -> list[str]:
        """Names of the real (kubelet) nodes, in order; kwok nodes are not listed."""
        return [n.name for n in self.real.nodes] if self.real else []

    def real_node_dir(self, name: str) -> Path:
        """The node's directory: bound on /var/lib/kubelet (`kubelet/`), /var/run/cdi (`cdi/`),
        /run/nvidia (`nvidia/`) and the simulated-GPU marker dir on that node; logs in `logs/`."""
        for node in self.real.nodes if self.real else ():
            if node.name == name:
                return node.dir
        raise KeyError(f"no real node {name!r} (real nodes: {self.real_nodes})")

    def load_image(self, archive: Path) -> None:
        """Import an image archive into every real node's containerd (nothing is ever pulled)."""
        if self.real is None:
            raise TestenvError("this cluster has no real nodes to load an image into")
        realnodes.load_image(self.real, self.processes, archive)

    def adopt(self, record: ProcessRecord) -> None:
        """Tie another process (the demo's operator and agents) to this cluster: `stop()` and
        `hack/testenv down` end it together with the components."""
        self.processes.append(record)
        (self.state_dir / STATE_FILE).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    def healthy(self) -> bool:
        try:
            return self.running() and self.get("/readyz").strip() == "ok"
        except (OSError, urllib.error.URLError):
            return False

    # Nodes ---------------------------------------------------------------------------------

    def create_gpu_node(
        self,
        name: str,
        os_id: str = "ubuntu",
        os_version: str = "22.04",
        extra_labels: Mapping[str, str] | None = None,
        *,
        wait: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Create one kwok-managed GPU node (see nodes.node_manifest) and wait for Ready."""
        manifest = nodes.node_manifest(
            name, gpu=True, os_id=os_id, os_version=os_version, extra_labels=extra_labels, **kwargs
        )
        self.create_nodes([manifest], wait=wait)
        return manifest

    def create_cpu_node(
        self,
        name: str,
        extra_labels: Mapping[str, str] | None = None,
        *,
        wait: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Create one kwok-managed node without NVIDIA hardware and wait for Ready."""
        manifest = nodes.node_manifest(name, gpu=False, extra_labels=extra_labels, **kwargs)
        self.create_nodes([manifest], wait=wait)
        return manifest

    def create_nodes(
        self,
        manifests: Sequence[Mapping[str, Any]],
        *,
        wait: bool = True,
        timeout: float = 120.0,
    ) -> list[str]:
        """Create many Nodes concurrently, then (by default) wait until kwok has them Ready."""
        with self.api_client() as api:
            names = nodes.create_nodes(api, manifests)
            if wait:
                nodes.wait_nodes_ready(api, names, timeout=timeout)
        return names

    def add_nodes(self, gpu: int = 0, cpu: int = 0, *, wait: bool = True) -> list[str]:
        """Add `gpu-node-N` / `cpu-node-N` nodes, numbering on from those that exist."""
        with self.api_client() as api:
            existing = {nodes.node_name(n) for n in client.CoreV1Api(api).list_node().items}
        manifests: list[dict[str, Any]] = []
        for prefix, count, is_gpu in (("gpu-node", gpu, True), ("cpu-node", cpu, False)):
            i = 0
            while count:
                name = f"{prefix}-{i}"
                i += 1
                if name not in existing:
                    manifests.append(nodes.node_manifest(name, gpu=is_gpu))
                    count -= 1
        return self.create_nodes(manifests, wait=wait) if manifests else []

    # Faults (the chaos suite) ---------------------------------------------------------------

    def _apiserver(self) -> ProcessRecord:
        return next(p for p in self.processes if p.name == "kube-apiserver" and alive(p))

    def kill_apiserver(self) -> list[str]:
        """SIGKILL the API server (no goodbye) and wait until it is gone; its argv, to start
        it again with :meth:`start_apiserver`."""
        record = self._apiserver()
        argv = cmdline(record.pid)
        os.kill(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(record) and time.monotonic() < deadline:
            for proc in self.popens:
                proc.poll()  # reap it if it is our child
            time.sleep(0.05)
        self.processes.remove(record)
        wait_ports_free([self.ports["kube-apiserver"]], timeout=30)
        return argv

    def start_apiserver(self, argv: Sequence[str], timeout: float = 90.0) -> None:
        """Start the API server again with ``argv`` (same ports, state and audit log) and wait
        for /readyz."""
        die_with_parent = threading.current_thread() is threading.main_thread()
        proc, record = spawn(
            "kube-apiserver",
            argv,
            self.state_dir / "logs" / "kube-apiserver.log",
            die_with_parent=die_with_parent,
            cwd=self.state_dir,
        )
        self.popens.append(proc)
        self.processes.append(record)
        (self.state_dir / STATE_FILE).write_text(json.dumps(self.to_json(), indent=2) + "\n")
        deadline = time.monotonic() + timeout
        ctx = self.ssl_context()
        while not https_ok(self.api_url + "/readyz", ctx):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TestenvError(
                    f"kube-apiserver did not come back; last lines of its log:\n{_tail(record.log)}"
                )
            time.sleep(0.1)

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """SIGKILL the API server, leave it down ``down_s`` seconds, start it again."""
        argv = self.kill_apiserver()
        time.sleep(down_s)
        self.start_apiserver(argv)

    def signal_apiserver(self, sig: int) -> None:
        """Send ``sig`` to the API server (SIGSTOP freezes it, SIGCONT thaws it)."""
        os.kill(self._apiserver().pid, sig)

    # Lifecycle -----------------------------------------------------------------------------

    def stop(self, *, remove_state: bool = False) -> None:
        """Kill every component (and any stray mentioning our state dir); wait for the ports.

        `remove_state` then deletes the state dir (logs included) for throwaway clusters."""
        stop(self.state_dir)
        if remove_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        for proc in self.popens:
            proc.poll()
        self.popens.clear()

    def to_json(self) -> dict[str, Any]:
        return {
            "api_url": self.api_url,
            "kubeconfig": str(self.kubeconfig),
            "audit_log": str(self.audit_log),
            "bin_dir": str(self.bin_dir),
            "ports": self.ports,
            "processes": [p.to_json() for p in self.processes],
            "timings": self.timings,
            "real_nodes": self.real.to_json() if self.real else None,
        }


def claim_state_dir(parent: Path, name: str) -> tuple[Path, IO[str]]:
    """Lock `parent/name` (else `name-1`, `name-2`, ...) for this process, so concurrent test
    sessions never stop each other's cluster. Keep the returned file open while using the dir;
    the kernel drops the lock when the process exits, however it exits."""
    for i in range(64):
        candidate = parent / (name if i == 0 else f"{name}-{i}")
        candidate.mkdir(parents=True, exist_ok=True)
        lock = (candidate / ".lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return candidate.resolve(), lock
    raise TestenvError(f"no free state dir {parent / name}-N (64 sessions hold one)")


def load(state_dir: Path | None = None) -> Cluster | None:
    """The cluster recorded in `state_dir`, or None if nothing was ever started there."""
    state_dir = (state_dir or default_state_dir()).resolve()
    try:
        data = json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return Cluster(
        state_dir=state_dir,
        api_url=str(data["api_url"]),
        ports={str(k): int(v) for k, v in data["ports"].items()},
        processes=[ProcessRecord.from_json(p) for p in data["processes"]],
        bin_dir=Path(data["bin_dir"]),
        timings={str(k): float(v) for k, v in data.get("timings", {}).items()},
        real=realnodes.RealNodes.from_json(data["real_nodes"]) if data.get("real_nodes") else None,
    )


def stray_markers(state_dir: Path) -> list[str]:
    """Paths that appear in the arguments of exactly this state dir's components (and not in
    those of a state dir nested inside it)."""
    names = ("etcd", "pki/", "kwok.yaml", "kwok.kubeconfig", "kube-controller-manager.kubeconfig")
    return [
        f"{state_dir}{os.sep}{name}" for name in (*names, "kube-scheduler.kubeconfig", "nodes/")
    ]


STRAY_NAMES = (*binaries.COMPONENTS, "unshare", "sh")  # sh: the loop of :func:`restarted`

# The kubelet's part for a control plane's static pods: started again when it exits (after 1,
# 2, 4, then every 8 seconds). The loop forwards SIGTERM, so nothing outlives it.
_RESTART_LOOP = (
    "trap 'kill \"$pid\" 2>/dev/null; exit 143' TERM INT; delay=1; "
    'while :; do "$@" & pid=$!; wait "$pid"; '
    'echo "testenv: ${1##*/} exited ($?), starting it again in ${delay}s" >&2; '
    'sleep "$delay"; [ "$delay" -lt 8 ] && delay=$((delay * 2)); done'
)


def restarted(argv: Sequence[str]) -> list[str]:
    """``argv`` run by a loop that starts it again whenever it exits.

    kube-controller-manager and kube-scheduler are leader-elected, as in a production control
    plane: when the API server is gone for longer than their renew deadline (10 s) they exit,
    and the kubelet starts them again with caches listed afresh. Run once and never restarted
    (as testenv used to), they live through a long outage with informers that resume minutes
    late, and kcm's DaemonSet controller then works from a stale cache (issue 16's outage).
    """
    return ["/bin/sh", "-c", _RESTART_LOOP, "testenv-restart", *argv]


def stop(state_dir: Path | None = None) -> None:
    """Tear down whatever was started in `state_dir`, even by a process that has since died.

    Raises TestenvError if a port is still bound afterwards.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    cluster = load(state_dir)
    records = cluster.processes if cluster else []
    # Strays: components whose arguments mention this state dir but that state.json missed
    # (e.g. the starter was killed between spawning and writing the file).
    strays = find_strays(STRAY_NAMES, stray_markers(state_dir))
    # etcd last: an API server that publishes its endpoint lease (real nodes) removes it on
    # SIGTERM and would wait out the grace period for an etcd already gone.
    etcd = [r for r in records if r.name == "etcd"]
    terminate([r for r in records if r.name != "etcd"], strays)
    terminate(etcd)
    if os.geteuid() == 0:
        # Cgroups, veths and the bridge of real nodes (also a crashed `up`'s, found by name).
        leftovers = realnodes.cleanup(state_dir, cluster.real if cluster else None)
        if leftovers:
            raise TestenvError(f"could not remove {', '.join(leftovers)}")
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if cluster:
        busy = wait_ports_free(cluster.ports.values())
        # Once our processes are gone a listener can only be someone else's that picked the
        # freed port (other clusters choose free ports too); only ours would be an error.
        left = find_strays(STRAY_NAMES, stray_markers(state_dir))
        if busy and left:
            raise TestenvError(f"ports {busy} still held by testenv processes {left}")


def _kubeconfig(api_url: str, ca: Path, pair: pki.KeyPair, user: str) -> str:
    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "testenv",
                "cluster": {"server": api_url, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pair.cert),
                    "client-key-data": b64(pair.key),
                },
            }
        ],
        "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": user}}],
        "current-context": "testenv",
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _tail(path: str, lines: int = 25) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class _Starter:
    """Spawns components and fails fast with the log tail when one of them exits."""

    def __init__(
        self, state_dir: Path, bin_dir: Path, die_with_parent: bool, timings: dict[str, float]
    ) -> None:
        self.t0 = time.monotonic()
        self.timings = timings
        self.state_dir = state_dir
        self.bin_dir = bin_dir
        self.die_with_parent = die_with_parent
        self.records: list[ProcessRecord] = []
        self.popens: list[subprocess.Popen[bytes]] = []
        # Processes to record and stop that this object did not spawn (real nodes' inits).
        self.adopted: list[ProcessRecord] = []

    def spawn(self, name: str, args: Sequence[str], *, restart: bool = False) -> None:
        argv = [str(self.bin_dir / name), *args]
        self.spawn_argv(
            name, restarted(argv) if restart else argv, self.state_dir / "logs" / f"{name}.log"
        )

    def spawn_argv(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        cgroups: Sequence[Path] = (),
        death_signal: int = signal.SIGTERM,
    ) -> ProcessRecord:
        proc, record = spawn(
            name,
            argv,
            log,
            die_with_parent=self.die_with_parent,
            cwd=self.state_dir,
            cgroups=cgroups,
            death_signal=death_signal,
        )
        self.popens.append(proc)
        self.records.append(record)
        return record

    def check(self) -> None:
        for proc, record in zip(self.popens, self.records, strict=True):
            if proc.poll() is not None:
                raise TestenvError(
                    f"{record.name} exited with code {proc.returncode} during startup; "
                    f"last lines of {record.log}:\n{_tail(record.log)}"
                )

    def wait_for(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while True:
            self.check()
            if ready():
                self.timings[what] = round(time.monotonic() - self.t0, 3)
                return
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {r.log}\n{_tail(r.log, 10)}" for r in self.records)
                raise TestenvError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.1)


def start(
    state_dir: Path | None = None,
    *,
    gpu_nodes: int = 0,
    cpu_nodes: int = 0,
    real_nodes: int = 0,
    real_node_gpus: Sequence[str] = nodeconfig.DEFAULT_GPUS,
    bin_dir: Path | None = None,
    detach: bool = False,
    timeout: float = START_TIMEOUT,
) -> Cluster:
    """Start a fresh control plane in `state_dir` (wiping earlier state) and wait until it is
    usable: apiserver ready, controllers and scheduler healthy, the `default` ServiceAccount in
    place (pods can be created) and the requested nodes Ready.

    `real_nodes` adds that many real nodes (`real-node-N`: kubelet, containerd, runc,
    kube-proxy), given simulated GPUs from `real_node_gpus` in turn (`a100-40gb:8`); they need
    root and the packages `realnodes.why_unavailable()` checks for.

    `detach=False` (called from the main thread) ties the components to this process's lifetime
    (PR_SET_PDEATHSIG) so a killed test run leaves nothing behind; `detach=True` (the CLI's
    `up`) lets them outlive it. Either way `stop()` finds them from `state.json`.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    bin_dir = bin_dir or binaries.ensure_binaries()
    node_dir: Path | None = None
    if real_nodes:
        reason = realnodes.why_unavailable(state_dir)
        if reason:
            raise TestenvError(f"real nodes cannot run here: {reason}")
        try:
            node_dir = binaries.ensure_node_runtime()
        except binaries.BinariesError as exc:
            raise TestenvError(f"real nodes cannot run here: {exc}") from exc
    nodes_wanted = _NodesWanted(gpu_nodes, cpu_nodes, real_nodes, tuple(real_node_gpus), node_dir)
    for attempt in range(3):
        try:
            return _start_once(state_dir, nodes_wanted, bin_dir, detach, timeout)
        except TestenvError as exc:
            # A port chosen as free can be taken by another process (e.g. a concurrent
            # cluster) before our component binds it; pick new ports and try again.
            if attempt == 2 or "address already in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class _NodesWanted:
    gpu: int
    cpu: int
    real: int
    real_gpus: tuple[str, ...]
    node_dir: Path | None  # the real nodes' runtime (containerd, images), when real > 0


def _start_once(
    state_dir: Path, wanted: _NodesWanted, bin_dir: Path, detach: bool, timeout: float
) -> Cluster:
    stop(state_dir)  # never two clusters on one state dir; also clears what a crash left
    for sub in ("etcd", "logs", "kcm", "scheduler", "nodes"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    for name in ("audit.log", "kubeconfig"):
        (state_dir / name).unlink(missing_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / ".gitignore").write_text("*\n")

    deadline = time.monotonic() + timeout
    network = realnodes.allocate_network(state_dir) if wanted.real else None
    # With real nodes the API server listens on the harness bridge, where the nodes reach it.
    host = network.gateway if network else "127.0.0.1"
    try:
        keys = pki.load_or_generate(state_dir / "pki", server_ips=(host,) if network else ())
    except BaseException:
        if network:
            realnodes.cleanup(state_dir, None)
        raise
    names = ("etcd", "etcd-peer", "kube-apiserver", "kcm", "scheduler", "kwok")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    api_url = f"https://{host}:{ports['kube-apiserver']}"
    ca = keys.ca.cert

    kubeconfigs = {}
    for user in ("admin", "kube-controller-manager", "kube-scheduler", "kwok"):
        path = state_dir / ("kubeconfig" if user == "admin" else f"{user}.kubeconfig")
        path.write_text(_kubeconfig(api_url, ca, keys.clients[user], user))
        path.chmod(0o600)
        kubeconfigs[user] = path
    audit_policy = state_dir / "audit-policy.yaml"
    audit_policy.write_text(AUDIT_POLICY)

    cluster = Cluster(state_dir, api_url, ports, [], bin_dir)
    planned: list[nodeconfig.RealNode] = []
    if network:
        planned = nodeconfig.plan_nodes(wanted.real, wanted.real_gpus, network, state_dir / "nodes")
        cluster.real = realnodes.RealNodes(
            network, tuple(planned), tuple(realnodes.cluster_cgroups(state_dir))
        )
    # PR_SET_PDEATHSIG fires when the spawning *thread* exits, so only the main thread can
    # tie the components' lifetime to the process; other threads rely on stop()/strays.
    die_with_parent = not detach and threading.current_thread() is threading.main_thread()
    starter = _Starter(state_dir, bin_dir, die_with_parent, cluster.timings)
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"

    def record_state() -> None:
        cluster.processes = [*starter.records, *starter.adopted]
        (state_dir / STATE_FILE).write_text(json.dumps(cluster.to_json(), indent=2) + "\n")

    try:
        starter.spawn(
            "etcd",
            [
                "--name=testenv",
                f"--data-dir={state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=testenv={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # throwaway data: skip fsync, much faster writes
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        record_state()
        starter.spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={ports['kube-apiserver']}",
                f"--cert-dir={state_dir / 'pki'}",
                f"--tls-cert-file={keys.apiserver.cert}",
                f"--tls-private-key-file={keys.apiserver.key}",
                f"--client-ca-file={ca}",
                f"--requestheader-client-ca-file={keys.front_proxy_ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={keys.front_proxy_client.cert}",
                f"--proxy-client-key-file={keys.front_proxy_client.key}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={keys.sa_pub}",
                f"--service-account-signing-key-file={keys.sa_key}",
                # Loopback is not a valid Endpoints address: without real nodes nothing
                # in-cluster dials the `kubernetes` Service, so don't publish the apiserver as
                # its endpoint; with real nodes it is the bridge address kube-proxy DNATs to.
                f"--endpoint-reconciler-type={'lease' if network else 'none'}",
                # logs/exec/port-forward: the apiserver dials kubelets at their InternalIP
                # (kwok nodes have loopback addresses, so nothing leaves the machine).
                f"--kubelet-client-certificate={keys.clients['kubelet-client'].cert}",
                f"--kubelet-client-key={keys.clients['kubelet-client'].key}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={cluster.audit_log}",
                # 0 would mean the default, 100 MB, and then a rotation that readers of
                # audit.log miss (a 2,000-node benchmark writes more than that).
                "--audit-log-maxsize=1000000",
                "--audit-log-maxbackup=0",
                "--profiling=false",
            ],
        )
        record_state()
        admin_ctx = cluster.ssl_context()
        starter.wait_for(
            "kube-apiserver /readyz", lambda: https_ok(api_url + "/readyz", admin_ctx), deadline
        )
        kcm_kc = kubeconfigs["kube-controller-manager"]
        starter.spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kcm']}",
                f"--cert-dir={state_dir / 'kcm'}",
                "--leader-elect=true",  # and restarted: see restarted()
                f"--service-account-private-key-file={keys.sa_key}",
                f"--root-ca-file={ca}",
                f"--cluster-signing-cert-file={ca}",
                f"--cluster-signing-key-file={keys.ca.key}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Defaults (20/30) throttle the DaemonSet controller on hundreds of nodes.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                # A CPU-starved kwok renews hundreds of node Leases late; past the default 50 s
                # the node lifecycle controller marks the nodes' pods NotReady, and kwok never
                # readies a started pod again: a large fleet would never converge. Longer than
                # the chaos suite's 5-minute API server outage too, for the same reason (a
                # kubelet would report its pods Ready again after one; kwok does not).
                "--node-monitor-grace-period=10m",
                "--controllers=*",
                "--profiling=false",
            ],
            restart=True,
        )
        sched_kc = kubeconfigs["kube-scheduler"]
        starter.spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={state_dir / 'scheduler'}",
                "--leader-elect=true",  # and restarted: see restarted()
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--profiling=false",
            ],
            restart=True,
        )
        kwok_config = state_dir / "kwok.yaml"
        # An explicit config keeps a developer's ~/.kwok/kwok.yaml out of the picture.
        kwok_config.write_text(KWOK_CONFIG)
        starter.spawn(
            "kwok",
            [
                f"--kubeconfig={kubeconfigs['kwok']}",
                f"--config={kwok_config}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                # Renew a Lease per node like a kubelet does (0 would mean status heartbeats).
                "--node-lease-duration-seconds=40",
                f"--cidr={POD_CIDR}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
            ],
        )
        record_state()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs of kcm and scheduler
        for what, port in (("kube-controller-manager", "kcm"), ("kube-scheduler", "scheduler")):
            url = f"https://127.0.0.1:{ports[port]}/healthz"
            starter.wait_for(
                f"{what} /healthz", functools.partial(https_ok, url, insecure), deadline
            )
        starter.wait_for("kwok /healthz", lambda: _http_ok(ports["kwok"]), deadline)
        with cluster.api_client() as api:
            core = client.CoreV1Api(api)
            starter.wait_for("the default ServiceAccount", lambda: _has_default_sa(core), deadline)
        cluster.popens = starter.popens
        if planned and network and wanted.node_dir:
            starter.adopted.extend(
                realnodes.start_nodes(
                    planned,
                    network,
                    cluster.real.cgroups if cluster.real else (),
                    state_dir=state_dir,
                    api_url=api_url,
                    keys=keys,
                    k8s_bin=bin_dir,
                    node_dir=wanted.node_dir,
                    spawn=starter.spawn_argv,
                    wait_for=starter.wait_for,
                    deadline=deadline,
                )
            )
            record_state()
        if wanted.gpu or wanted.cpu:
            # kwok nodes come up while the kubelets register.
            cluster.add_nodes(gpu=wanted.gpu, cpu=wanted.cpu)
            cluster.timings["nodes Ready"] = round(time.monotonic() - starter.t0, 3)
        if planned:
            with cluster.api_client() as api:
                realnodes.label_and_wait_ready(api, planned, starter.wait_for, deadline)
    except BaseException:
        record_state()
        try:
            stop(state_dir)
        finally:
            for proc in starter.popens:
                proc.poll()
        raise
    record_state()
    return cluster


def _http_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _has_default_sa(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespaced_service_account("default", "default")
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True
