"""NodePrepareResources and NodeUnprepareResources of ``compute-domain.nvidia.com``: the thin
shell over :mod:`.decide` (the API reads and writes, the files, the waiting).

A channel claim is tried in rounds, the plugin's lock held only for one round at a time: the
IMEX daemon the claim waits for is itself prepared by this plugin (its daemon claim) while the
channel waits, as NVIDIA's plugin lets both through at once. A round that is told to wait
sleeps (backing off) and tries again until ``Waiting.timeout_s`` has gone by, then answers the
kubelet with the reason, and the kubelet asks again. NVIDIA's plugin retries the same way, for
45 s, the kubelet's own call timeout; 40 s here, so the answer arrives before that.

Labelling the node is recorded in the checkpoint first (the claim ``PrepareStarted``, NVIDIA's
state), so a claim the kubelet lets go of before it was ever prepared still has its label taken
off at Unprepare.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.agent.dra.checkpoint import ClaimFile
from gpu_operator.agent.dra.computedomain import decide
from gpu_operator.agent.dra.computedomain.decide import (
    CHANNEL,
    DAEMON,
    Asked,
    ChannelConfig,
    ChannelSeen,
    CharDevice,
    DaemonConfig,
    Label,
    PreparedDomainDevice,
    Refuse,
    Refused,
    Wait,
)
from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.dra.server import KubeletServer, PluginPaths, Registrations
from gpu_operator.agent.driver_cdi import HostDriver
from gpu_operator.api import PolicyError
from gpu_operator.api.computedomain import ComputeDomain, parse_computedomain
from gpu_operator.labels import COMPUTE_DOMAIN

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"  # NVIDIA's checkpoint states


class NotReady(PrepareError):
    """Not prepared yet, for a reason that passes (the daemon is starting): the kubelet asks
    again."""


@dataclass(frozen=True)
class Waiting:
    """How long one NodePrepareResources call waits for a channel's IMEX daemon."""

    # Under the kubelet's 45 s call timeout (NVIDIA's ErrorRetryMaxTimeout is the same 45 s),
    # so the reason reaches the pod's events rather than the kubelet's own deadline error.
    timeout_s: float = 40.0
    first_s: float = 0.25
    most_s: float = 5.0


@dataclass(frozen=True)
class HostFiles:
    """Where the kernel's device majors and the IMEX management capability are read."""

    proc_devices: Path = Path("/proc/devices")
    imex_mgmt: Path = Path(decide.IMEX_MGMT_CAPABILITY)


class DomainCheckpoint(ClaimFile):
    """Each claim's state: ``PrepareStarted`` with the domains it labelled the node for, or
    ``PrepareCompleted`` with its prepared devices."""

    def completed(self, uid: str) -> tuple[PreparedDomainDevice, ...] | None:
        entry = self.entry(uid)
        if entry is None or entry.get("state") != COMPLETED:
            return None
        return tuple(PreparedDomainDevice.from_json(d) for d in entry.get("devices") or ())

    def start(self, uid: str, namespace: str, name: str, domain: str) -> None:
        entry = self.entry(uid) or {"namespace": namespace, "name": name, "state": STARTED}
        if entry.get("state") == COMPLETED:
            return
        domains = sorted({*entry.get("domains", ()), domain})
        self.set_entry(uid, {**entry, "domains": domains})

    def complete(
        self, uid: str, namespace: str, name: str, devices: Iterable[PreparedDomainDevice]
    ) -> None:
        self.set_entry(
            uid,
            {
                "namespace": namespace,
                "name": name,
                "state": COMPLETED,
                "devices": [d.to_json() for d in devices],
            },
        )

    def channel_domains(self, uid: str) -> set[str]:
        """The domains whose label ``uid`` put (or would have put) on the node."""
        entry = self.entry(uid) or {}
        if entry.get("state") != COMPLETED:
            return set(entry.get("domains") or ())
        return {str(d["domainID"]) for d in entry.get("devices") or () if d.get("type") == CHANNEL}

    def channel_holder(self, but: str) -> str | None:
        """A prepared claim other than ``but`` holding channel 0 (NVIDIA's check: the channel
        is the node's one, whatever the allocation mode)."""
        for uid in sorted(self.uids() - {but}):
            for d in self.completed(uid) or ():
                if d.kind == CHANNEL:
                    return uid
        return None

    def daemon_domains(self) -> set[str]:
        return {
            d.domain_id
            for uid in self.uids()
            for d in self.completed(uid) or ()
            if d.kind == DAEMON
        }


@dataclass
class DomainPlugin:
    """Prepares and unprepares claims of ``compute-domain.nvidia.com``; :meth:`start` serves it
    to the kubelet. ``clique``: the node's clique now (None without one)."""

    kube: Kube
    node: str
    paths: PluginPaths
    clique: Callable[[], str | None]
    driver: Callable[[], HostDriver]
    files: HostFiles = field(default_factory=HostFiles)
    waiting: Waiting = field(default_factory=Waiting)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.paths = replace(self.paths, driver=decide.DRIVER)
        self.checkpoint = DomainCheckpoint(self.paths.plugin_dir)
        self.registrations = Registrations()
        self._server = KubeletServer(self.paths, self, self.registrations)
        self._lock = threading.Lock()

    @property
    def host_plugin_dir(self) -> str:
        """The plugin directory as the host (the runtime) names it."""
        return str(self.paths.kubelet_plugin_dir or self.paths.plugin_dir)

    # -- the kubelet's two calls ---------------------------------------------------------------
    def prepare(self, namespace: str, name: str, uid: str) -> tuple[PreparedDomainDevice, ...]:
        with self._lock:
            done = self.checkpoint.completed(uid)
            if done is not None:
                self._write_spec(uid, done)  # a lost spec file comes back
                return done
        claim = self.kube.get("ResourceClaim", name, namespace)
        if claim is None:
            raise PrepareError(f"ResourceClaim {namespace}/{name} not found")
        wanted = decide.asked(claim, uid, self.node)
        deadline = self.clock() + self.waiting.timeout_s
        delay = self.waiting.first_s
        while True:
            with self._lock:
                outcome = self._attempt(namespace, name, uid, wanted)
            if not isinstance(outcome, Wait):
                return outcome
            if self.clock() + delay > deadline:
                raise NotReady(outcome.reason)
            log.info("claim %s/%s: %s", namespace, name, outcome.reason)
            self.sleep(delay)
            delay = min(delay * 2, self.waiting.most_s)

    def unprepare(self, uid: str) -> None:
        with self._lock:
            domains = self.checkpoint.channel_domains(uid)
            if domains:  # the label first: a failure keeps the claim for the kubelet's retry
                held = {d for other in self.checkpoint.uids() - {uid} for d in self._held(other)}
                labels = self._node_labels()
                for domain in sorted(domains):
                    patch = decide.domain_unlabel(labels, domain, held)
                    if patch is not None:
                        self.kube.merge_patch("Node", self.node, patch)
            (self.paths.cdi_dir / decide.spec_file_name(uid)).unlink(missing_ok=True)
            self.checkpoint.remove(uid)

    # -- one round -----------------------------------------------------------------------------
    def _attempt(
        self, namespace: str, name: str, uid: str, wanted: tuple[Asked, ...]
    ) -> tuple[PreparedDomainDevice, ...] | Wait:
        done = self.checkpoint.completed(uid)
        if done is not None:
            return done
        clique = self.clique()
        prepared: list[PreparedDomainDevice] = []
        for asked in wanted:
            if isinstance(asked.config, ChannelConfig):
                got = self._channel(namespace, name, uid, asked, asked.config, clique)
            else:
                got = self._daemon(uid, asked, asked.config, clique)
            if isinstance(got, Wait):
                return got
            prepared.append(got)
        self._write_spec(uid, tuple(prepared))
        self.checkpoint.complete(uid, namespace, name, prepared)
        log.info("prepared claim %s/%s: %s", namespace, name, [p.device for p in prepared])
        return tuple(prepared)

    def _channel(
        self,
        namespace: str,
        name: str,
        uid: str,
        asked: Asked,
        config: ChannelConfig,
        clique: str | None,
    ) -> PreparedDomainDevice | Wait:
        for _ in range(2):  # once more after labelling the node
            doc = self._domain(config.domain_id, namespace)
            seen = ChannelSeen(
                claim_namespace=namespace,
                domain=_parsed(doc),
                daemon_ready=doc is not None and decide.node_ready(doc, self.node),
                node_label=self._node_labels().get(COMPUTE_DOMAIN),
                holder=self.checkpoint.channel_holder(uid),
            )
            step = decide.decide_channel(config, seen, self.node, clique)
            if isinstance(step, Refuse):
                raise Refused(step.reason)
            if isinstance(step, Wait):
                return step
            if isinstance(step, Label):
                self.checkpoint.start(uid, namespace, name, config.domain_id)
                self.kube.merge_patch("Node", self.node, step.patch)
                log.info("labelled node %s %s=%s", self.node, COMPUTE_DOMAIN, config.domain_id)
                continue
            major = self._channel_major() if step.channels else 0
            return decide.prepared_channel(uid, asked, self.node, step.channels, major)
        return Wait(f"node {self.node} does not show its {COMPUTE_DOMAIN} label yet")

    def _daemon(
        self, uid: str, asked: Asked, config: DaemonConfig, clique: str | None
    ) -> PreparedDomainDevice | Wait:
        domain = decide.decide_daemon(config, _parsed(self._domain(config.domain_id, None)))
        if isinstance(domain, Wait):
            return domain
        (self.paths.plugin_dir / decide.DOMAINS_DIR / domain.uid).mkdir(parents=True, exist_ok=True)
        mgmt = self._imex_mgmt() if clique else None
        return decide.prepared_daemon(uid, asked, self.node, domain, clique, mgmt)

    # -- reads ---------------------------------------------------------------------------------
    def _domain(self, uid: str, namespace: str | None) -> Mapping[str, Any] | None:
        """The ComputeDomain with ``uid``: looked for in ``namespace`` first (a channel's must
        be there), then in every namespace (to say where it is when it is elsewhere)."""
        for ns in dict.fromkeys((namespace, None)):
            for doc in self.kube.list_objects("ComputeDomain", ns):
                if (doc.get("metadata") or {}).get("uid") == uid:
                    return doc
        return None

    def _node_labels(self) -> dict[str, str]:
        node = self.kube.get("Node", self.node)
        if node is None:
            raise PrepareError(f"node {self.node} not found: is NODE_NAME right?")
        return dict((node.get("metadata") or {}).get("labels") or {})

    def _held(self, uid: str) -> set[str]:
        return self.checkpoint.channel_domains(uid)

    def _proc_devices(self) -> str:
        try:
            return self.files.proc_devices.read_text()
        except OSError as exc:
            raise PrepareError(f"cannot read {self.files.proc_devices}: {exc.strerror}") from None

    def _channel_major(self) -> int:
        major = decide.device_major(self._proc_devices(), decide.CHANNELS_MAJOR)
        if major is None:
            raise PrepareError(
                f"{self.files.proc_devices} has no {decide.CHANNELS_MAJOR} devices: the NVIDIA "
                "driver registers them when it loads with IMEX support; is it loaded?"
            )
        return major

    def _imex_mgmt(self) -> CharDevice:
        path = self.files.imex_mgmt
        major = decide.device_major(self._proc_devices(), decide.CAPS_MAJOR)
        try:
            if major is None:
                raise ValueError(f"{self.files.proc_devices} has no {decide.CAPS_MAJOR} devices")
            return decide.capability_device(path.read_text(), major)
        except (OSError, ValueError) as exc:
            raise PrepareError(
                f"the IMEX daemon needs the fabric-imex-mgmt capability ({path}): "
                f"{getattr(exc, 'strerror', None) or exc}; is the NVIDIA driver loaded?"
            ) from None

    # -- files ---------------------------------------------------------------------------------
    def _write_spec(self, uid: str, prepared: tuple[PreparedDomainDevice, ...]) -> None:
        daemon = any(p.kind == DAEMON for p in prepared)
        spec = decide.cdi_spec(
            uid, prepared, self.host_plugin_dir, self.driver() if daemon else None
        )
        directory = self.paths.cdi_dir
        path = directory / decide.spec_file_name(uid)
        if spec is None:
            path.unlink(missing_ok=True)
            return
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{path.name}.tmp"
        tmp.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def remove_stale_domain_dirs(self, live: Iterable[str]) -> list[str]:
        """Remove the directories of domains that are gone and that no prepared daemon claim
        holds (NVIDIA's periodic cleanup); returns their uids."""
        root = self.paths.plugin_dir / decide.DOMAINS_DIR
        with self._lock:
            present = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
            stale = decide.stale_domains(present, live, self.checkpoint.daemon_domains())
            for uid in stale:
                shutil.rmtree(root / uid, ignore_errors=True)
        return stale

    # -- serving -------------------------------------------------------------------------------
    def start(self) -> DomainPlugin:
        self.paths.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> DomainPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parsed(doc: Mapping[str, Any] | None) -> ComputeDomain | None:
    """A ComputeDomain as the API holds it; None for none."""
    if doc is None:
        return None
    try:
        return parse_computedomain(doc)
    except PolicyError as exc:  # the CRD's schema keeps these out; an older CRD may not
        meta = doc.get("metadata") or {}
        raise Refused(
            f"ComputeDomain {meta.get('namespace')}/{meta.get('name')} cannot be read: "
            f"{'; '.join(exc.problems)}"
        ) from None
