"""Starting a testenv: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on
loopback (the API server on the harness bridge when real nodes join), the PKI and kubeconfigs
they use, waits until each is ready, then the requested kwok and real nodes.

The procedure only: what it returns is a `handle.Cluster`, and `handle.stop()` undoes it.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client

from . import binaries, nodeconfig, pki, realnodes, releases
from .handle import Cluster, https_ok, stop
from .kwokconfig import AUDIT_POLICY, KWOK_CONFIG
from .launch import Starter
from .processes import free_ports
from .statedir import STATE_FILE, TestenvError, default_state_dir

SERVICE_CIDR = nodeconfig.SERVICE_CIDR
POD_CIDR = "10.128.0.1/14"
START_TIMEOUT = 120.0


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
    starter = Starter(state_dir, bin_dir, die_with_parent, cluster.timings)
    # What this release needs turned on (the same gates for every component): releases.py.
    gates = releases.feature_gates(bin_dir)
    gate_flags = [f"--feature-gates={gates}"] if gates else []
    api = releases.runtime_config(releases.release_of(bin_dir), gates)
    release_flags = [*gate_flags, *([f"--runtime-config={api}"] if api else [])]
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
                *release_flags,
                "--profiling=false",
            ],
            # Killed with its starter: SIGTERM's graceful shutdown waits on etcd, which dies
            # with the starter too (1.37 keeps retrying it past 15 s); nothing here needs it.
            death_signal=signal.SIGKILL,
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
                *gate_flags,
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
                *gate_flags,
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
