"""The handle on a running testenv, what tests, benchmarks and the demo hold: its kubeconfig and
API clients, raw apiserver GETs, kwok nodes to create, the real nodes (their directories, image
loading), the chaos suite's API server faults, and `stop()`.

Cheap to rebuild from `state.json` with `load()`, in any later process; `stop()` tears down
exactly what `state.json` (and a search for strays) says was started. Starting a cluster is
`startup`'s job.
"""

from __future__ import annotations

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from . import binaries, nodes, pki, realnodes, releases
from .processes import (
    ProcessRecord,
    alive,
    cmdline,
    find_strays,
    spawn,
    terminate,
    wait_ports_free,
)
from .statedir import (
    STATE_FILE,
    STRAY_NAMES,
    TestenvError,
    default_state_dir,
    stray_markers,
    tail_log,
)


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
        """Create many Nodes concurrently, then (by default) wait until kwok has them Ready.
        Their kubelet version is the cluster's release, as a real node's would be."""
        release = releases.release_of(self.bin_dir)
        with self.api_client() as api:
            names = nodes.create_nodes(
                api, [nodes.with_kubelet_version(m, release) for m in manifests]
            )
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
                    "kube-apiserver did not come back; last lines of its log:\n"
                    + tail_log(record.log)
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


def https_ok(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False
