"""What the compute-domain plugin publishes and what it does with a claim, as pure functions.

The pool is NVIDIA's: ``channel-0`` and ``daemon-0`` (attributes ``type`` and ``id``) on every
node the plugin runs on, with or without an NVLink fabric. NVIDIA's plugin counts 2048 IMEX
channels but publishes only channel 0: a claim's ``allocationMode: All`` gives every channel
through that one device, and the others are not scheduled one by one.

A claim's allocation results (this driver's, in this node's pool) each get a config, NVIDIA's
way: the allocation's opaque configs of this driver, the class's before the claim's, each
decoded strictly; a result takes the last one naming its request, else the last one naming no
request that is of its device's kind. A channel then goes through :func:`decide_channel` on
each attempt (refused, wait, label the node, or ready), a daemon through
:func:`decide_daemon`; :func:`cdi_spec` is the claim's CDI spec once they are ready.

A channel is given to a container as a character device node with its major and minor
(``nvidia-caps-imex-channels`` in ``/proc/devices``), which the container runtime creates in
the container, as NVIDIA's plugin writes it: the host needs no node of its own for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.driver_cdi import CDI_VERSION, HostDriver, common_edits, device_node
from gpu_operator.api.computedomain import (
    ALL,
    API_VERSION,
    CHANNEL_CONFIG,
    DAEMON_CONFIG,
    DRIVER_NAME,
    READY,
    SINGLE,
    ComputeDomain,
    claim_allowed,
)
from gpu_operator.labels import COMPUTE_DOMAIN, GPU_CLIQUE

DRIVER = DRIVER_NAME
CHANNEL, DAEMON = "channel", "daemon"  # the devices' ``type`` attribute
MAX_CHANNELS = 2048  # NVIDIA's IMEX channel count (its plugin does not read the driver's)
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
CHANNELS_MAJOR = "nvidia-caps-imex-channels"  # their name in /proc/devices
CAPS_MAJOR = "nvidia-caps"
CAPS_DIR = "/dev/nvidia-caps"
IMEX_MGMT_CAPABILITY = "/proc/driver/nvidia/capabilities/fabric-imex-mgmt"
CHANNEL_MODE = 0o666
DOMAINS_DIR = "domains"  # under the plugin's directory: one directory per domain, by uid
DAEMON_CONFIG_DIR = "/imexd"  # where the daemon container has its domain's directory
CDI_VENDOR = f"k8s.{DRIVER}"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


class Refused(PrepareError):
    """The claim cannot be prepared, and asking again will not change that: the message (the
    pod's events show it) says why and what to do."""


def channel_device(index: int) -> str:
    return f"{CHANNEL}-{index}"


def daemon_device(index: int) -> str:
    return f"{DAEMON}-{index}"


PUBLISHED = {channel_device(0): CHANNEL, daemon_device(0): DAEMON}


def pool_devices() -> list[dict[str, Any]]:
    """The node's devices, as NVIDIA's plugin publishes them."""
    return [
        {"name": name, "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
        for name, kind in PUBLISHED.items()
    ]


# -- configs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChannelConfig:
    domain_id: str
    allocation_mode: str = SINGLE

    @property
    def kind(self) -> str:
        return CHANNEL


@dataclass(frozen=True)
class DaemonConfig:
    domain_id: str

    @property
    def kind(self) -> str:
        return DAEMON


Config = ChannelConfig | DaemonConfig
FIELDS = {
    CHANNEL_CONFIG: {"apiVersion", "kind", "domainID", "allocationMode"},
    DAEMON_CONFIG: {"apiVersion", "kind", "domainID"},
}


def domain_id_problem(value: object) -> str | None:
    """Why ``value`` cannot be a domainID (NVIDIA's rule: it names a directory on the node and
    labels the node, so one path segment and a label value), or None."""
    if not isinstance(value, str) or not value:
        return "domainID cannot be empty"
    if value in (".", "..") or "/" in value or "%" in value:
        return f"domainID {value!r} is not a single path segment"
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        return f"domainID {value!r} is not a label value (63 characters of [-A-Za-z0-9_.])"
    return None


def parse_config(params: object, where: str) -> Config:
    """One opaque config of this driver, decoded strictly (unknown fields refused) as NVIDIA's
    plugin decodes it; its domainID is checked once it applies (:func:`checked`)."""
    if not isinstance(params, Mapping):
        raise Refused(f"{where}: the parameters must be an object")
    if params.get("apiVersion") != API_VERSION:
        raise Refused(
            f"{where}: apiVersion must be {API_VERSION} (got {params.get('apiVersion')!r})"
        )
    kind = params.get("kind")
    if kind not in FIELDS:
        raise Refused(f"{where}: kind must be {CHANNEL_CONFIG} or {DAEMON_CONFIG} (got {kind!r})")
    unknown = sorted(set(params) - FIELDS[str(kind)])
    if unknown:
        raise Refused(f"{where}: unknown field(s) {', '.join(unknown)} in a {kind}")
    domain = params.get("domainID")
    domain_id = domain if isinstance(domain, str) else ""
    if kind == DAEMON_CONFIG:
        return DaemonConfig(domain_id)
    mode = params.get("allocationMode") or SINGLE
    if mode not in (SINGLE, ALL):
        raise Refused(f"{where}: allocationMode must be {SINGLE} or {ALL} (got {mode!r})")
    return ChannelConfig(domain_id, str(mode))


def checked(config: Config, request: str) -> Config:
    problem = domain_id_problem(config.domain_id)
    if problem:
        raise Refused(
            f"request {request}: {problem}: a {config.kind} "
            "claim comes from its ComputeDomain's ResourceClaimTemplate, which names the domain"
        )
    return config


@dataclass(frozen=True)
class Asked:
    """One allocated device of the claim, with the config that applies to it."""

    request: str
    device: str
    config: Config


def _allocation(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}


def _configs(entries: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[str, ...], Config]]:
    """This driver's configs, lowest precedence first: the classes', then the claim's."""
    indexed = list(enumerate(entries))
    ordered = [(i, e) for i, e in indexed if e.get("source") == "FromClass"]
    ordered += [(i, e) for i, e in indexed if e.get("source") != "FromClass"]
    found = []
    for i, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        config = parse_config(opaque.get("parameters"), f"status.allocation.devices.config[{i}]")
        found.append((tuple(entry.get("requests") or ()), config))
    return found


def _names(requests: tuple[str, ...], request: str) -> bool:
    """Whether a config's ``requests`` names ``request`` (or, for a subrequest
    ``parent/sub`` of firstAvailable, its parent)."""
    return request in requests or request.split("/", 1)[0] in requests


def asked(claim: Mapping[str, Any], uid: str, node: str) -> tuple[Asked, ...]:
    """This driver's allocated devices of ``claim`` (uid ``uid``) in ``node``'s pool, each with
    its config. Refused: another claim's uid, nothing of this driver here, a device this
    plugin does not publish, a config that is bad or of the wrong kind, more than one channel
    or daemon, a missing or bad domainID."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise Refused(f"claim UID {uid} is not the claim's ({meta.get('uid')})")
    allocation = _allocation(claim)
    results = [
        r
        for r in allocation.get("results") or ()
        if r.get("driver") == DRIVER and r.get("pool") == node
    ]
    if not results:
        raise Refused(f"claim has no allocation of {DRIVER} devices on node {node}")
    configs = _configs(allocation.get("config") or ())
    found: list[Asked] = []
    for result in results:
        request, device = str(result.get("request")), str(result.get("device"))
        kind = PUBLISHED.get(device)
        if kind is None:
            raise Refused(f"device {device} is not one this plugin publishes on node {node}")
        chosen: Config | None = None
        for requests, config in reversed(configs):
            if requests and _names(requests, request):
                if config.kind != kind:
                    raise Refused(
                        f"a {CHANNEL_CONFIG if config.kind == CHANNEL else DAEMON_CONFIG} "
                        f"cannot apply to request {request}: it is given a {kind}"
                    )
                chosen = config
                break
            if not requests and config.kind == kind:
                chosen = config
                break
        if chosen is None:
            chosen = ChannelConfig("") if kind == CHANNEL else DaemonConfig("")
        found.append(Asked(request, device, checked(chosen, request)))
    for kind in (CHANNEL, DAEMON):
        if sum(1 for a in found if a.config.kind == kind) > 1:
            raise Refused(f"claim asks for more than one {kind}: one claim has one {kind}")
    return tuple(found)


# -- decisions on each attempt ----------------------------------------------------------------
@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Wait:
    """Not yet: asked again (by the plugin, then by the kubelet) until it is."""

    reason: str


@dataclass(frozen=True)
class Label:
    """Label the node for the domain first (its IMEX daemon is scheduled by that label)."""

    patch: dict[str, Any]


@dataclass(frozen=True)
class Ready:
    """The channel can be handed out: ``channels`` of them (0 on a node without a clique, 1
    for Single, every one for All)."""

    channels: int


@dataclass(frozen=True)
class ChannelSeen:
    """What one attempt at a channel claim observed."""

    claim_namespace: str
    domain: ComputeDomain | None  # the domain with the config's uid, None when none has it
    daemon_ready: bool  # this node's entry in the domain's status.nodes says Ready
    node_label: str | None  # the node's resource.nvidia.com/computeDomain label
    holder: str | None  # another prepared claim that holds channel 0 on this node


def node_ready(domain: Mapping[str, Any], node: str) -> bool:
    """Whether ``domain``'s ``status.nodes`` lists ``node`` with status Ready (what the domain's
    daemon on that node reports, through the controller)."""
    for entry in (domain.get("status") or {}).get("nodes") or ():
        if isinstance(entry, Mapping) and entry.get("name") == node:
            return entry.get("status") == READY
    return False


def decide_channel(
    config: ChannelConfig, seen: ChannelSeen, node: str, clique: str | None
) -> Refuse | Wait | Label | Ready:
    """One attempt at a channel claim, as NVIDIA's plugin makes it: the domain must be the
    claim's namespace's; channel 0 must be free; the node is labelled for the domain (so its
    IMEX daemon comes) and a node labelled for another domain waits for that one to go; then
    the daemon here must be Ready. A node without a clique gets no channel device, as NVIDIA's
    plugin does (the claim is prepared, with nothing to inject)."""
    problem = claim_allowed(seen.domain, seen.claim_namespace)
    if problem is not None or seen.domain is None:
        return Refuse(
            f"{problem}: use the ResourceClaimTemplate the ComputeDomain names "
            "(spec.channel.resourceClaimTemplate.name), in its namespace"
        )
    domain = seen.domain
    name = f"{domain.namespace}/{domain.name}"
    if seen.holder is not None:
        return Wait(
            f"IMEX channel 0 on node {node} is held by claim {seen.holder}: this claim is "
            "prepared once that one is unprepared"
        )
    if seen.node_label != domain.uid:
        if seen.node_label:
            return Wait(
                f"node {node} runs the IMEX daemon of another ComputeDomain (label "
                f"{COMPUTE_DOMAIN}={seen.node_label}): this claim is prepared once that "
                "domain's workload here has ended"
            )
        return Label(domain_label(domain.uid))
    if not seen.daemon_ready:
        return Wait(
            f"the IMEX daemon of ComputeDomain {name} on node {node} is not Ready yet "
            "(its status.nodes): the kubelet asks again; see the domain's Ready condition "
            "if it stays so"
        )
    if clique is None:
        return Ready(0)
    return Ready(MAX_CHANNELS if config.allocation_mode == ALL else 1)


def decide_daemon(config: DaemonConfig, domain: ComputeDomain | None) -> Wait | ComputeDomain:
    """A daemon claim's domain, or wait for it (a claim the controller made from a domain the
    plugin has not seen yet)."""
    if domain is None:
        return Wait(f"no ComputeDomain has uid {config.domain_id} (yet)")
    return domain


# -- node labels ------------------------------------------------------------------------------
def domain_label(uid: str) -> dict[str, Any]:
    """The merge patch that labels the node for domain ``uid`` (that label only)."""
    return {"metadata": {"labels": {COMPUTE_DOMAIN: uid}}}


def domain_unlabel(
    labels: Mapping[str, str], uid: str, held: Iterable[str]
) -> dict[str, Any] | None:
    """The merge patch that takes the node's label for domain ``uid`` off once no prepared
    channel claim of that domain is left on the node (``held``: the domains of those left);
    None when there is nothing to take off (the label is another domain's, or gone)."""
    if labels.get(COMPUTE_DOMAIN) != uid or uid in set(held):
        return None
    return {"metadata": {"labels": {COMPUTE_DOMAIN: None}}}


def clique_label(labels: Mapping[str, str], clique: str | None) -> dict[str, Any] | None:
    """The merge patch that makes the node's ``nvidia.com/gpu.clique`` say ``clique`` (removed
    when there is none); None when it already does."""
    if labels.get(GPU_CLIQUE) == clique:
        return None
    if clique is None and GPU_CLIQUE not in labels:
        return None
    return {"metadata": {"labels": {GPU_CLIQUE: clique}}}


def stale_domains(present: Iterable[str], live: Iterable[str], held: Iterable[str]) -> list[str]:
    """The domain directories to remove: those of domains no longer in the cluster that no
    prepared daemon claim on the node holds."""
    keep = {*live, *held}
    return sorted(uid for uid in present if uid not in keep)


# -- device nodes -----------------------------------------------------------------------------
def device_major(proc_devices: str, name: str) -> int | None:
    """The major of character device ``name`` in a ``/proc/devices`` text; None if absent."""
    section = proc_devices.split("Block devices:", 1)[0]
    if "Character devices:" in section:
        section = section.split("Character devices:", 1)[1]
    for line in section.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == name and fields[0].isdigit():
            return int(fields[0])
    return None


@dataclass(frozen=True)
class CharDevice:
    """A character device node the runtime creates in the container (no host node needed)."""

    path: str
    major: int
    minor: int
    mode: int

    def to_cdi(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "type": "c",
            "major": self.major,
            "minor": self.minor,
            "fileMode": self.mode,
        }

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "major": self.major, "minor": self.minor, "mode": self.mode}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CharDevice:
        return cls(str(data["path"]), int(data["major"]), int(data["minor"]), int(data["mode"]))


def channel_nodes(major: int, count: int) -> list[dict[str, Any]]:
    """Channels 0..count-1 as CDI device nodes."""
    return [
        CharDevice(f"{CHANNEL_DIR}/channel{i}", major, i, CHANNEL_MODE).to_cdi()
        for i in range(count)
    ]


def capability_device(text: str, caps_major: int) -> CharDevice:
    """A capability's device node from its ``/proc/driver/nvidia/capabilities/...`` file
    (``DeviceFileMinor``, ``DeviceFileMode``); ValueError without a minor."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    if "DeviceFileMinor" not in values:
        raise ValueError("no DeviceFileMinor")
    minor = values["DeviceFileMinor"]
    return CharDevice(
        f"{CAPS_DIR}/nvidia-cap{minor}", caps_major, minor, values.get("DeviceFileMode", 0o400)
    )


# -- what a prepared claim holds, and its CDI spec --------------------------------------------
@dataclass(frozen=True)
class PreparedDomainDevice:
    """One prepared device of a claim: what the kubelet is told, and what its CDI spec is made
    from again when it is lost (a rebooted node's /var/run)."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    kind: str  # channel or daemon
    domain_id: str
    channels: int = 0  # channel: how many are given
    channel_major: int = 0
    domain_name: str = ""  # daemon: the domain's identity and the node's clique, for its env
    domain_namespace: str = ""
    clique: str = ""
    imex_mgmt: CharDevice | None = None  # daemon on a clique: fabric-imex-mgmt

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdiIDs": list(self.cdi_ids),
            "type": self.kind,
            "domainID": self.domain_id,
        }
        if self.kind == CHANNEL:
            out.update(channels=self.channels, channelMajor=self.channel_major)
        else:
            out.update(
                domainName=self.domain_name,
                domainNamespace=self.domain_namespace,
                clique=self.clique,
            )
            if self.imex_mgmt is not None:
                out["imexMgmt"] = self.imex_mgmt.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedDomainDevice:
        mgmt = data.get("imexMgmt")
        return cls(
            requests=tuple(data["requests"]),
            pool=str(data["pool"]),
            device=str(data["device"]),
            cdi_ids=tuple(data["cdiIDs"]),
            kind=str(data["type"]),
            domain_id=str(data["domainID"]),
            channels=int(data.get("channels") or 0),
            channel_major=int(data.get("channelMajor") or 0),
            domain_name=str(data.get("domainName") or ""),
            domain_namespace=str(data.get("domainNamespace") or ""),
            clique=str(data.get("clique") or ""),
            imex_mgmt=CharDevice.from_json(mgmt) if mgmt else None,
        )


def spec_file_name(claim_uid: str) -> str:
    """The transient spec name the CDI library uses: ``<vendor>-<class>_<id>.json``."""
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def cdi_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_ids(claim_uid: str, device: str, edits: bool) -> tuple[str, ...]:
    """The CDI device the kubelet hands the runtime; none for a device with nothing to inject
    (a channel on a node without a clique), as NVIDIA's plugin answers."""
    return (f"{CDI_KIND}={cdi_name(claim_uid, device)}",) if edits else ()


def prepared_channel(
    claim_uid: str, asked: Asked, node: str, channels: int, major: int
) -> PreparedDomainDevice:
    return PreparedDomainDevice(
        requests=(asked.request,),
        pool=node,
        device=asked.device,
        cdi_ids=cdi_ids(claim_uid, asked.device, channels > 0),
        kind=CHANNEL,
        domain_id=asked.config.domain_id,
        channels=channels,
        channel_major=major,
    )


def prepared_daemon(
    claim_uid: str,
    asked: Asked,
    node: str,
    domain: ComputeDomain,
    clique: str | None,
    imex_mgmt: CharDevice | None,
) -> PreparedDomainDevice:
    return PreparedDomainDevice(
        requests=(asked.request,),
        pool=node,
        device=asked.device,
        cdi_ids=cdi_ids(claim_uid, asked.device, True),
        kind=DAEMON,
        domain_id=domain.uid,
        domain_name=domain.name,
        domain_namespace=domain.namespace,
        clique=clique or "",
        imex_mgmt=imex_mgmt,
    )


def daemon_env(p: PreparedDomainDevice) -> list[str]:
    """The daemon container's identity, NVIDIA's names (its daemon reads them)."""
    return [
        f"CLIQUE_ID={p.clique}",
        f"COMPUTE_DOMAIN_UUID={p.domain_id}",
        f"COMPUTE_DOMAIN_NAME={p.domain_name}",
        f"COMPUTE_DOMAIN_NAMESPACE={p.domain_namespace}",
    ]


def domain_dir(host_plugin_dir: str, uid: str) -> str:
    """A domain's directory on the host: what its daemon container has at /imexd."""
    return f"{host_plugin_dir.rstrip('/')}/{DOMAINS_DIR}/{uid}"


def device_edits(p: PreparedDomainDevice, host_plugin_dir: str) -> dict[str, Any] | None:
    """One prepared device's CDI edits; None for a channel with nothing to inject."""
    if p.kind == CHANNEL:
        return {"deviceNodes": channel_nodes(p.channel_major, p.channels)} if p.channels else None
    edits: dict[str, Any] = {
        "env": daemon_env(p),
        "mounts": [
            {
                "hostPath": domain_dir(host_plugin_dir, p.domain_id),
                "containerPath": DAEMON_CONFIG_DIR,
                "options": ["rw", "nosuid", "nodev", "bind"],
            }
        ],
    }
    if p.imex_mgmt is not None:
        edits["deviceNodes"] = [p.imex_mgmt.to_cdi()]
    return edits


def daemon_common_edits(driver: HostDriver) -> dict[str, Any]:
    """What a daemon container gets besides its domain: the driver (its files, control nodes)
    and every GPU node present, as NVIDIA's base spec (``device=all``) gives it: the IMEX
    daemon runs the driver's nvidia-imex."""
    edits = common_edits(driver)
    gpus = [device_node(driver, path) for path in driver.devices.gpus.values()]
    if gpus:
        edits["deviceNodes"] = [*(edits.get("deviceNodes") or []), *gpus]
    return edits


def cdi_spec(
    claim_uid: str,
    prepared: Sequence[PreparedDomainDevice],
    host_plugin_dir: str,
    driver: HostDriver | None = None,
) -> dict[str, Any] | None:
    """The claim's CDI spec; None when no device has anything to inject (no spec is written).
    ``driver``: for a daemon's spec, the driver it is given."""
    entries = []
    for p in prepared:
        edits = device_edits(p, host_plugin_dir)
        if edits is not None:
            entries.append({"name": cdi_name(claim_uid, p.device), "containerEdits": edits})
    if not entries:
        return None
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}
    if driver is not None and any(p.kind == DAEMON for p in prepared):
        spec["containerEdits"] = daemon_common_edits(driver)
    return spec
