"""A driver rollout behind a canary, wired into a pass (pure): the settings rendered (the spec's,
or the last good ones while a failed rollout is rolled back or held), whether the cluster shows
them yet, and the rollout's Events and retry bookkeeping as API actions. The decisions are
:func:`gpu_operator.upgrade.canary.decide_rollout`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpu_operator.api.spec import UpgradePolicy
from gpu_operator.controller.notices import object_event
from gpu_operator.controller.runtime.actions import Action, Create, Patch
from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.labels import COMPONENT, UPGRADE_RETRY
from gpu_operator.upgrade.canary import Rollout, RolloutDecision, settings_digest
from gpu_operator.upgrade.fleet import DRIVER_COMPONENTS

PHASES_ON_STABLE = ("rollingBack", "held")


def settings_of(wire: Mapping[str, Any]) -> dict[str, Any]:
    """The driver settings a rollout carries: the driver section less its upgrade policy."""
    return {k: v for k, v in wire.items() if k != "upgradePolicy"}


def with_settings(
    settings: Mapping[str, Any], upgrade_policy: UpgradePolicy | None
) -> dict[str, Any]:
    """A driver section of ``settings`` under today's upgrade policy (wire form)."""
    wire = dict(settings)
    if upgrade_policy is not None:
        wire["upgradePolicy"] = upgrade_policy.to_wire()
    return wire


def renders_stable(previous: Rollout | None, settings: Mapping[str, Any], retry: bool) -> bool:
    """Whether the last pass rendered the stable settings, and this one would too unless the
    rollout moves: a failed rollout of these very settings is being rolled back or held."""
    return (
        previous is not None
        and previous.phase in PHASES_ON_STABLE
        and previous.stable_spec is not None
        and previous.target == settings_digest(settings)
        and not retry
    )


def drivers_synced(
    desired: Iterable[Mapping[str, Any]],
    applies: Iterable[Mapping[str, Any]],
    daemonsets: Sequence[Mapping[str, Any]],
) -> bool:
    """The driver DaemonSets rendered now are on the server as rendered, and their controller
    has seen them (so the newest revision, and who is current, says something about them)."""

    def is_driver(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return (
            obj.get("kind", "DaemonSet") == "DaemonSet"
            and labels.get(COMPONENT) in DRIVER_COMPONENTS
        )

    names = {o["metadata"]["name"] for o in desired if is_driver(o)}
    if any(is_driver(o) for o in applies):
        return False
    seen = {d["metadata"]["name"]: d for d in daemonsets if d["metadata"]["name"] in names}
    if set(seen) != names:
        return False
    return all(
        int((d.get("status") or {}).get("observedGeneration") or 0)
        >= int(d["metadata"].get("generation") or 0)
        for d in seen.values()
    )


def rollout_actions(
    decision: RolloutDecision,
    owner: Mapping[str, Any],
    stamp: str,
    config: OperatorConfig,
) -> list[Action]:
    """The rollout's Events about its owner (a failure counted by gate) and, when a retry was
    taken up, the retry annotation taken off."""
    actions: list[Action] = []
    about = {k: owner[k] for k in ("apiVersion", "kind", "metadata")}
    for etype, reason, message in decision.events:
        tally = None
        failure = decision.rollout.failure
        if reason == "UpgradeFailed" and failure is not None:
            tally = ("rollout_failures", failure.gate)
        actions.append(Create(object_event(about, etype, reason, message, stamp, config), tally))
    if decision.consume_retry:
        body = {"metadata": {"annotations": {UPGRADE_RETRY: None}}}
        actions.append(Patch(owner["kind"], owner["metadata"]["name"], body, "upgrade"))
    return actions


def retry_requested(owner: Mapping[str, Any]) -> bool:
    return UPGRADE_RETRY in ((owner.get("metadata") or {}).get("annotations") or {})
