"""The MIG manager: apply the layout named by the node label ``nvidia.com/mig.config``.

:func:`step` is the whole state machine as a pure function: node labels and annotations, the
pods on the node, the GPU inventory and the parsed config in; actions out (patch the node, wait
for pods, apply a plan). All state lives on the Node, so a restarted manager carries on where
the old one stopped:

1. no ``nvidia.com/mig.config`` label: nothing to do;
2. the config cannot apply to this hardware: ``failed`` with the reason (no pause);
3. the GPUs already match: ``success`` (and nothing else changes);
4. otherwise ``pending``: remember the operands' deploy labels in an annotation and set them
   to ``paused-for-mig-change`` (a ``false`` stays ``false``), in one patch;
5. wait until the device plugin, feature discovery, DCGM and its exporter pods left the node;
6. apply the plan through NVML;
7. restore the deploy labels exactly, drop the annotation, ``success`` (or ``failed`` + reason).

A failed config is not retried until the label changes or the manager restarts, so a broken
layout does not pause and unpause the node's operands forever.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_operator.agent import nodeapi
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.migparted import (
    MigBackend,
    MigPartedConfig,
    MigPlan,
    MigPlanError,
    apply_plan,
    plan,
)
from gpu_operator.agent.nodeapi import PodView
from gpu_operator.labels import (
    DEPLOY_PREFIX,
    MIG_CONFIG,
    MIG_CONFIG_STATE,
    MIG_FAILED_CONFIG,
    MIG_PAUSED_LABELS,
    MIG_STATE_REASON,
)

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

PAUSED = "paused-for-mig-change"
DEPLOY_LABELS = tuple(
    DEPLOY_PREFIX + name
    for name in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm")
)
OPERAND_APPS = frozenset(
    {
        "nvidia-device-plugin-daemonset",
        "gpu-feature-discovery",
        "nvidia-dcgm-exporter",
        "nvidia-dcgm",
    }
)
DEFAULT_WAIT_TIMEOUT_S = 600.0
EVENT_COMPONENT = "nvidia-mig-manager"  # the source of its Events
DEFAULT_NAMESPACE = "gpu-operator"  # where the operands to pause run


# -- observations and actions --------------------------------------------------------------------
@dataclass(frozen=True)
class MigObservation:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    pods: Sequence[PodView]
    inventory: Inventory
    config: MigPartedConfig | None
    config_error: str = ""  # why the config file could not be read, when config is None
    now: float = 0.0
    apply_error: str = ""  # the previous ApplyMig failed with this
    first_pass: bool = False  # just started: retry a config that failed before


@dataclass(frozen=True)
class PatchNode:
    labels: Mapping[str, str | None] = field(default_factory=dict)
    annotations: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class WaitForPods:
    pods: tuple[str, ...]


@dataclass(frozen=True)
class ApplyMig:
    plan: MigPlan


@dataclass(frozen=True)
class RecordEvent:
    """An Event on the Node, so `kubectl describe node` tells the story of a change."""

    type: str  # Normal | Warning
    reason: str
    message: str


Action = PatchNode | WaitForPods | ApplyMig | RecordEvent


@dataclass(frozen=True)
class Step:
    phase: str  # idle | failed | success | pausing | waiting | applying
    actions: tuple[Action, ...] = ()
    reason: str = ""

    @property
    def idle(self) -> bool:
        return not self.actions


@dataclass(frozen=True)
class Paused:
    """What the manager remembers on the Node while operands are paused."""

    config: str
    since: float
    labels: Mapping[str, str | None]

    def encode(self) -> str:
        return json.dumps(
            {"config": self.config, "since": self.since, "labels": dict(self.labels)},
            sort_keys=True,
        )

    @staticmethod
    def decode(text: str | None) -> Paused | None:
        if not text:
            return None
        try:
            doc = json.loads(text)
            labels = {str(k): (None if v is None else str(v)) for k, v in doc["labels"].items()}
            return Paused(str(doc["config"]), float(doc["since"]), labels)
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring unreadable %s annotation: %r", MIG_PAUSED_LABELS, text)
            return None


# -- the state machine ---------------------------------------------------------------------------
def _finish(obs: MigObservation, paused: Paused | None, state: str | None, reason: str) -> Step:
    """Restore paused labels (where still paused by us), then record the outcome."""
    labels: dict[str, str | None] = {}
    annotations: dict[str, str | None] = {}
    if paused is not None:
        for key, original in paused.labels.items():
            current = obs.labels.get(key)
            if current == PAUSED and current != original:
                labels[key] = original
        annotations[MIG_PAUSED_LABELS] = None
    if state is not None and obs.labels.get(MIG_CONFIG_STATE) != state:
        labels[MIG_CONFIG_STATE] = state
    if state == "failed":
        if obs.annotations.get(MIG_STATE_REASON) != reason:
            annotations[MIG_STATE_REASON] = reason
        if obs.annotations.get(MIG_FAILED_CONFIG) != obs.labels.get(MIG_CONFIG):
            annotations[MIG_FAILED_CONFIG] = obs.labels.get(MIG_CONFIG)
    else:
        for key in (MIG_STATE_REASON, MIG_FAILED_CONFIG):
            if key in obs.annotations:
                annotations[key] = None
    actions: tuple[Action, ...] = ()
    if labels or annotations:
        actions = (PatchNode(labels=labels, annotations=annotations),)
    if MIG_CONFIG_STATE in labels:  # the outcome changed: say so once
        desired = obs.labels.get(MIG_CONFIG)
        if state == "failed":
            event = RecordEvent("Warning", "MIGConfigFailed", f"MIG config {desired}: {reason}")
        else:
            event = RecordEvent("Normal", "MIGConfigApplied", f"MIG config {desired} applied")
        actions = (*actions, event)
    return Step(phase=state or "idle", actions=actions, reason=reason)


def _pause_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Deploy labels to pause: ``true`` or unset. ``false`` stays ``false``, and another
    component's pause (``paused-for-driver-upgrade``) is left alone."""
    return {k: PAUSED for k in DEPLOY_LABELS if labels.get(k) in (None, "", "true")}


def blocking_pods(pods: Sequence[PodView]) -> list[PodView]:
    """Operand pods still on the node (finished pods no longer hold the GPUs)."""
    return [
        p
        for p in pods
        if p.labels.get("app") in OPERAND_APPS and p.phase not in ("Succeeded", "Failed")
    ]


def step(obs: MigObservation, *, wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S) -> Step:
    """One decision of the MIG manager from what it observes now."""
    desired = obs.labels.get(MIG_CONFIG)
    paused = Paused.decode(obs.annotations.get(MIG_PAUSED_LABELS))
    if not desired:
        return _finish(obs, paused, None, "") if paused else Step("idle")
    if (
        not obs.first_pass
        and obs.labels.get(MIG_CONFIG_STATE) == "failed"
        and obs.annotations.get(MIG_FAILED_CONFIG) == desired
        and paused is None
    ):
        return Step("failed", reason=obs.annotations.get(MIG_STATE_REASON, ""))
    if obs.config is None:
        return _finish(obs, paused, "failed", obs.config_error or "no MIG config file")
    try:
        mig_plan = plan(obs.inventory, obs.config, desired)
    except MigPlanError as exc:
        return _finish(obs, paused, "failed", str(exc))
    if mig_plan.already_applied:
        return _finish(obs, paused, "success", "")
    if obs.apply_error:
        return _finish(obs, paused, "failed", obs.apply_error)
    if paused is None:
        original = {k: obs.labels.get(k) for k in DEPLOY_LABELS}
        record = Paused(config=desired, since=obs.now, labels=original)
        labels: dict[str, str | None] = {MIG_CONFIG_STATE: "pending", **_pause_labels(obs.labels)}
        annotations: dict[str, str | None] = {MIG_PAUSED_LABELS: record.encode()}
        for key in (MIG_STATE_REASON, MIG_FAILED_CONFIG):
            if key in obs.annotations:
                annotations[key] = None
        pausing = RecordEvent(
            "Normal",
            "MIGConfigPending",
            f"MIG config {desired}: pausing GPU operands to repartition the GPUs",
        )
        return Step("pausing", (PatchNode(labels=labels, annotations=annotations), pausing))
    # Paused: keep the pause in force (someone may have reset a label), then wait or apply.
    reassert: dict[str, str | None] = dict(_pause_labels(obs.labels))
    if obs.labels.get(MIG_CONFIG_STATE) != "pending":
        reassert[MIG_CONFIG_STATE] = "pending"
    prefix: tuple[Action, ...] = (PatchNode(labels=reassert),) if reassert else ()
    waiting = blocking_pods(obs.pods)
    if waiting:
        if obs.now - paused.since > wait_timeout_s:
            names = ", ".join(f"{p.namespace}/{p.name}" for p in waiting)
            return _finish(
                obs, paused, "failed", f"timed out after {wait_timeout_s:.0f}s waiting for {names}"
            )
        names_t = tuple(f"{p.namespace}/{p.name}" for p in waiting)
        return Step("waiting", (*prefix, WaitForPods(names_t)))
    return Step("applying", (*prefix, ApplyMig(mig_plan)))


# -- the loop ------------------------------------------------------------------------------------
ConfigSource = MigPartedConfig | Callable[[], MigPartedConfig]


def _read_config(source: ConfigSource) -> tuple[MigPartedConfig | None, str]:
    if isinstance(source, MigPartedConfig):
        return source, ""
    try:
        return source(), ""
    except Exception as exc:  # unreadable file: report it on the node, keep running
        return None, f"cannot read MIG config: {exc}"


def reconcile(
    api: Kube,
    node_name: str,
    config: ConfigSource,
    nvml: MigBackend,
    *,
    first_pass: bool = False,
    namespace: str = DEFAULT_NAMESPACE,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    poll_interval_s: float = 2.0,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.time,
    max_steps: int = 10_000,
) -> Step:
    """Run steps until the manager is idle (or only waiting and ``stop`` is set)."""
    return _reconcile(
        api,
        node_name,
        config,
        nvml,
        first_pass=first_pass,
        namespace=namespace,
        wait_timeout_s=wait_timeout_s,
        poll_interval_s=poll_interval_s,
        stop=stop,
        clock=clock,
        max_steps=max_steps,
    )[0]


def _reconcile(
    api: Kube,
    node_name: str,
    config: ConfigSource,
    nvml: MigBackend,
    *,
    first_pass: bool,
    namespace: str,
    wait_timeout_s: float,
    poll_interval_s: float,
    stop: threading.Event | None,
    clock: Callable[[], float],
    max_steps: int,
) -> tuple[Step, str]:
    """:func:`reconcile`, and the resourceVersion of the Node its last decision was made from:
    the watch for the next change starts there, so a change made just after that read is not
    missed (read again after the pass, it would be taken for already seen)."""
    stop = stop or threading.Event()
    apply_error = ""
    for _ in range(max_steps):
        node = nodeapi.read_node(api, node_name)
        paused = MIG_PAUSED_LABELS in node.annotations
        pods = nodeapi.pods_on_node(api, node_name, namespace) if paused else []
        cfg, cfg_error = _read_config(config)
        result = step(
            MigObservation(
                labels=node.labels,
                annotations=node.annotations,
                pods=pods,
                inventory=nvml.inventory(),
                config=cfg,
                config_error=cfg_error,
                now=clock(),
                apply_error=apply_error,
                first_pass=first_pass,
            ),
            wait_timeout_s=wait_timeout_s,
        )
        apply_error = ""
        if result.phase in ("failed", "success") and result.actions:
            log.info(
                "node %s: MIG config %s -> %s %s",
                node_name,
                node.labels.get(MIG_CONFIG),
                result.phase,
                result.reason,
            )
        waiting = False
        for action in result.actions:
            if isinstance(action, PatchNode):
                nodeapi.patch_node_metadata(
                    api, node_name, labels=action.labels, annotations=action.annotations
                )
            elif isinstance(action, RecordEvent):
                nodeapi.record_node_event(
                    api,
                    node_name,
                    action.type,
                    action.reason,
                    action.message,
                    component=EVENT_COMPONENT,
                )
            elif isinstance(action, ApplyMig):
                log.info("node %s: applying MIG config %s", node_name, action.plan.config)
                try:
                    apply_plan(nvml, action.plan)
                except Exception as exc:
                    log.warning("node %s: applying MIG config failed: %s", node_name, exc)
                    apply_error = str(exc)
            else:
                waiting = True
        if result.idle:
            return result, node.resource_version
        first_pass = False
        if waiting and stop.wait(poll_interval_s):
            return result, node.resource_version
    raise RuntimeError(f"node {node_name}: MIG manager did not settle in {max_steps} steps")


def run_mig_manager(
    api: Kube,
    node_name: str,
    config: ConfigSource,
    nvml: MigBackend,
    *,
    stop: threading.Event | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    resync_s: int = 60,
    poll_interval_s: float = 2.0,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
) -> None:
    """Reconcile now, then again whenever the Node changes (watch), at least every ``resync_s``."""
    stop = stop or threading.Event()
    first = True
    while not stop.is_set():
        try:
            _, version = _reconcile(
                api,
                node_name,
                config,
                nvml,
                first_pass=first,
                namespace=namespace,
                wait_timeout_s=wait_timeout_s,
                poll_interval_s=poll_interval_s,
                stop=stop,
                clock=time.time,
                max_steps=10_000,
            )
            first = False
        except Exception as exc:  # API hiccups: log, back off, retry
            log.warning("node %s: MIG manager pass failed: %s", node_name, exc)
            stop.wait(poll_interval_s)
            continue
        if stop.is_set():
            return
        if not nodeapi.wait_for_node_change(api, node_name, version, resync_s):
            stop.wait(poll_interval_s)
