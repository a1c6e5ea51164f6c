"""The IMEX daemon stand-in a ComputeDomain's daemon pods run (``agent compute-domain-daemon``).

It stands in for NVIDIA's compute-domain-daemon and the ``nvidia-imex`` it launches, for what
the cluster can see of them: ``run`` reads the node's NVLink fabric through NVML (the real one on
a real node) and refuses to start, with a one-line reason in the pod's termination message,
when the fabric is not ready or names another clique than the kubelet plugin prepared
(``CLIQUE_ID``); otherwise it writes the IMEX nodes config of its peers (``nodes.cfg``, one IP a
line, as NVIDIA's daemon writes for ``nvidia-imex``) and a status file in the domain directory,
and keeps both current until SIGTERM, exiting with a reason if the fabric fails meanwhile.
``check`` (the pod's probes) passes only while ``run`` is up and ready, and prints the nodes as
``nvidia-imex-ctl -N`` lists them.

What it does not do: it starts no ``nvidia-imex``, connects to no peer and exports no memory,
so a peer listed is configured, never known to be connected. Its peers are the daemons of its
clique that the ComputeDomain's ``status.nodes`` lists (:func:`peers_from_domain`, read each
pass where the pod can reach the API server), or else a file, ``<domain dir>/peers`` by default
(one IP a line, ``#`` comments); this pod's own IP is always among them. The pure decisions
(:func:`start_decision`, :func:`nodes_config`, :func:`check_report`) are apart from the loop
(:func:`run_daemon`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpu_operator.agent.nvml import FabricError, GpuFabric, NvmlError, node_clique

log = logging.getLogger(__name__)

DOMAIN_DIR = Path("/imexd")  # where NVIDIA's kubelet plugin mounts the domain's directory
NODES_CONFIG = "nodes.cfg"  # NVIDIA's daemon's name for it there (nodes_config.cfg on a host)
STATUS_FILE = "status.json"
PEERS_FILE = "peers"
TERMINATION_LOG = Path("/dev/termination-log")  # a container's terminationMessagePath default
CANNOT_START = "the IMEX daemon cannot start"
READY, NOT_READY = "READY", "NOT_READY"


@dataclass(frozen=True)
class Identity:
    """Who this daemon is: the environment NVIDIA's DaemonSet and kubelet plugin give it."""

    domain_uuid: str
    domain_name: str = ""
    domain_namespace: str = ""
    node_name: str = ""
    pod_ip: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    max_nodes: int = 18
    clique_id: str | None = None  # CLIQUE_ID as prepared; None when not injected

    @staticmethod
    def from_env(env: Mapping[str, str]) -> Identity:
        raw_max = env.get("MAX_NODES_PER_IMEX_DOMAIN", "") or "18"
        return Identity(
            domain_uuid=env.get("COMPUTE_DOMAIN_UUID", ""),
            domain_name=env.get("COMPUTE_DOMAIN_NAME", ""),
            domain_namespace=env.get("COMPUTE_DOMAIN_NAMESPACE", ""),
            node_name=env.get("NODE_NAME", ""),
            pod_ip=env.get("POD_IP", ""),
            pod_name=env.get("POD_NAME", ""),
            pod_namespace=env.get("POD_NAMESPACE", ""),
            max_nodes=int(raw_max) if raw_max.isdigit() else 18,
            clique_id=env.get("CLIQUE_ID"),
        )


@dataclass(frozen=True)
class Status:
    """What ``run`` last saw, in the status file ``check`` reads."""

    pid: int
    state: str  # READY or NOT_READY
    clique: str | None
    domain_uuid: str
    node_name: str
    nodes: tuple[str, ...] = ()  # the IPs of nodes.cfg, in its order
    own_ip: str = ""
    reason: str = ""
    updated: float = 0.0

    def dump(self) -> str:
        return json.dumps({**asdict(self), "nodes": list(self.nodes)}, sort_keys=True)

    @staticmethod
    def load(text: str) -> Status:
        doc = json.loads(text)
        doc["nodes"] = tuple(doc.get("nodes", ()))
        known = set(Status.__dataclass_fields__)
        return Status(**{k: v for k, v in doc.items() if k in known})


# -- decisions ---------------------------------------------------------------------------------
def start_decision(
    fabrics: Sequence[GpuFabric | None], identity: Identity
) -> tuple[str | None, str | None]:
    """(the clique to serve, None) or (None, the one-line reason it cannot start).

    No fabric is no clique and no failure: as NVIDIA's daemon without a clique ID, the daemon
    then idles (``check`` passes). A fabric not ready, GPUs that disagree, a missing domain, or
    a clique other than the ``CLIQUE_ID`` the kubelet plugin prepared are reasons.
    """
    if not identity.domain_uuid:
        return None, f"COMPUTE_DOMAIN_UUID is not set: {CANNOT_START} outside a ComputeDomain"
    try:
        clique = node_clique(fabrics)
    except FabricError as exc:
        return None, f"{exc}: {CANNOT_START}"
    if identity.clique_id is not None and identity.clique_id != (clique or ""):
        return None, (
            f"the GPUs' NVLink clique {clique or '(none)'} is not CLIQUE_ID "
            f"{identity.clique_id or '(none)'} the kubelet plugin prepared: {CANNOT_START}"
        )
    return clique, None


def parse_peers(text: str) -> list[str]:
    """The peer IPs of a peers file: one a line, ``#`` comments and blank lines skipped;
    ValueError names a line that is not an IP address."""
    peers = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            peers.append(str(ipaddress.ip_address(line)))
        except ValueError:
            raise ValueError(f"line {number}: {line!r} is not an IP address") from None
    return peers


def peers_from_domain(domain: Mapping[str, object] | None, clique: str | None) -> list[str]:
    """The IPs of the daemons the domain's ``status.nodes`` lists in ``clique`` (an IMEX domain
    never spans two cliques), those without an address yet left out."""
    status = (domain or {}).get("status")
    nodes = status.get("nodes") if isinstance(status, Mapping) else None
    peers = []
    for node in nodes if isinstance(nodes, list) else ():
        if isinstance(node, Mapping) and node.get("cliqueID") == clique and node.get("ipAddress"):
            peers.append(str(node["ipAddress"]))
    return peers


def nodes_config(own_ip: str, peers: Sequence[str], max_nodes: int) -> tuple[str, ...]:
    """The IMEX domain's node IPs: this pod's and its peers', each once, in address order so
    that every daemon of the domain writes the same node map (``nvidia-imex`` refuses peers
    whose map differs); at most ``max_nodes``, this pod's always kept."""
    own = [str(ipaddress.ip_address(own_ip))] if own_ip else []
    others = sorted({str(ipaddress.ip_address(ip)) for ip in peers} - set(own), key=_address)
    if max_nodes > 0:
        others = others[: max(max_nodes - len(own), 0)]
    return tuple(sorted([*own, *others], key=_address))


def _address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(ip)


def nodes_config_text(nodes: Sequence[str]) -> str:
    return "".join(f"{ip}\n" for ip in nodes)


def check_report(status: Status | None, running: bool) -> tuple[int, str]:
    """(exit code, text) of ``check``: 0 only when ``run`` is up (``running``) and ready.

    The text lists the nodes as ``nvidia-imex-ctl -N`` does (``Node #<i> - <ip> - <state>``):
    this node READY, its peers CONFIGURED (the stand-in never connects to them)."""
    if status is None:
        return 1, "NOT_READY: the compute-domain daemon has not started (no status file)\n"
    if status.state != READY:
        return 1, f"NOT_READY: {status.reason or 'not ready'}\n"
    if not running:
        return 1, f"NOT_READY: the compute-domain daemon (pid {status.pid}) is not running\n"
    if status.clique is None:
        return 0, "READY (no NVLink clique on this node: nothing to serve)\n"
    lines = [READY, f"Clique: {status.clique}", "Nodes:"]
    for index, ip in enumerate(status.nodes):
        state = "READY" if ip == status.own_ip else "CONFIGURED"
        lines.append(f"Node #{index:<3} - {ip:<15} - {state}")
    return 0, "\n".join(lines) + "\n"


# -- the process -------------------------------------------------------------------------------
def write_termination_message(path: Path, reason: str) -> None:
    """The one line the pod's status shows for this container's exit (best effort)."""
    try:
        path.write_text(reason.splitlines()[0] if reason else "")
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", path, exc)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_status(domain_dir: Path) -> Status | None:
    try:
        return Status.load((domain_dir / STATUS_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def check_daemon(domain_dir: Path, running: Callable[[int], bool] = pid_running) -> tuple[int, str]:
    """``check``: :func:`check_report` of the status file ``run`` keeps in ``domain_dir``."""
    status = read_status(domain_dir)
    return check_report(status, status is not None and running(status.pid))


def _peers(path: Path) -> list[str]:
    try:
        return parse_peers(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("peers file %s not used: %s", path, exc)
        return []


PeersOf = Callable[[str], list[str] | None]  # a clique -> its peers, None when unknown


def run_pass(
    read_fabrics: Callable[[], Sequence[GpuFabric | None]],
    identity: Identity,
    domain_dir: Path,
    peers_file: Path,
    read_peers: PeersOf | None = None,
) -> Status:
    """One pass of ``run``: the fabric decided, and when it serves, nodes.cfg and the status
    file written (nodes.cfg only when it changed). The status says NOT_READY with the reason
    when the daemon cannot serve."""
    try:
        clique, reason = start_decision(read_fabrics(), identity)
    except NvmlError as exc:
        clique, reason = None, f"reading the GPU fabric failed: {exc}: {CANNOT_START}"
    nodes: tuple[str, ...] = ()
    if reason is None and clique is not None:
        known = read_peers(clique) if read_peers is not None else None
        peers = known if known is not None else _peers(peers_file)
        nodes = nodes_config(identity.pod_ip, peers, identity.max_nodes)
        text = nodes_config_text(nodes)
        config = domain_dir / NODES_CONFIG
        if not config.is_file() or config.read_text() != text:
            _replace(config, text)
            log.info("IMEX nodes config %s: %s", config, ", ".join(nodes) or "(empty)")
    status = Status(
        pid=os.getpid(),
        state=READY if reason is None else NOT_READY,
        clique=clique,
        domain_uuid=identity.domain_uuid,
        node_name=identity.node_name,
        nodes=nodes,
        own_ip=identity.pod_ip,
        reason=reason or "",
        updated=time.time(),
    )
    _replace(domain_dir / STATUS_FILE, status.dump())
    return status


def run_daemon(
    read_fabrics: Callable[[], Sequence[GpuFabric | None]],
    identity: Identity,
    *,
    domain_dir: Path = DOMAIN_DIR,
    peers_file: Path | None = None,
    read_peers: PeersOf | None = None,
    termination_log: Path = TERMINATION_LOG,
    interval_s: float = 5.0,
    stop: threading.Event | None = None,
) -> int:
    """``run``: a pass every ``interval_s`` until ``stop``; 1, with the reason in the
    termination log (and the NOT_READY status left for ``check`` to show), as soon as a pass
    says the daemon cannot serve. A stop takes the status file away: ``check`` then fails."""
    stop = stop or threading.Event()
    domain_dir.mkdir(parents=True, exist_ok=True)
    peers = peers_file if peers_file is not None else domain_dir / PEERS_FILE
    while True:
        status = run_pass(read_fabrics, identity, domain_dir, peers, read_peers)
        if status.state != READY:
            log.error("%s", status.reason)
            write_termination_message(termination_log, status.reason)
            return 1
        if stop.wait(interval_s):
            (domain_dir / STATUS_FILE).unlink(missing_ok=True)
            return 0
