"""The health monitor's settings, from the env the operator renders from
``spec.healthRemediation.signals`` (names in :mod:`gpu_operator.labels`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_operator.agent.deviceplugin.health import APPLICATION_XIDS, XidPolicy
from gpu_operator.api.formats import duration_seconds
from gpu_operator.labels import (
    HEALTH_ENV_CONDITION,
    HEALTH_ENV_DEBOUNCE,
    HEALTH_ENV_IGNORED_XIDS,
    HEALTH_ENV_POWER,
    HEALTH_ENV_QUIET_PERIOD,
    HEALTH_ENV_THERMAL,
    HEALTH_ENV_XIDS,
)

DEFAULT_DEBOUNCE_S = 30.0
DEFAULT_QUIET_S = 120.0


@dataclass(frozen=True)
class HealthSettings:
    # NVIDIA's rule by default: every XID counts but the application ones.
    xids: XidPolicy = field(default_factory=XidPolicy)
    thermal: bool = False  # a thermal slowdown lasting ``debounce_s`` is a fault
    power: bool = False  # a power-brake slowdown lasting ``debounce_s`` is a fault
    debounce_s: float = DEFAULT_DEBOUNCE_S
    quiet_s: float = DEFAULT_QUIET_S  # fault-free this long (and clean now): healthy again


def xid_policy(extra: frozenset[int], ignored: frozenset[int]) -> XidPolicy:
    """NVIDIA's fatal set, plus ``extra``, minus ``ignored`` (which wins over ``extra``)."""
    return XidPolicy(disabled=APPLICATION_XIDS | ignored, enabled=extra - ignored)


def _xids(name: str, value: str | None) -> frozenset[int]:
    items = [t.strip() for t in (value or "").split(",") if t.strip()]
    bad = [t for t in items if not t.isdigit()]
    if bad:
        raise ValueError(f"{name}: {bad[0]!r} is not an XID (a comma-separated list of numbers)")
    return frozenset(int(t) for t in items)


def _bool(name: str, value: str | None) -> bool:
    text = (value or "").strip().lower()
    if text not in ("", "true", "false"):
        raise ValueError(f"{name}: {value!r} is neither true nor false")
    return text == "true"


def _seconds(name: str, value: str | None, default: float) -> float:
    text = (value or "").strip()
    if not text:
        return default
    try:
        return duration_seconds(text)
    except ValueError:
        raise ValueError(
            f'{name}: {value!r} is not a duration such as "30s", "2m" or "1h"'
        ) from None


def health_settings(env: Mapping[str, str]) -> HealthSettings | None:
    """The settings, or None when GPU_HEALTH_CONDITION is not true (no condition published).
    Raises ValueError naming the variable that is malformed."""
    if not _bool(HEALTH_ENV_CONDITION, env.get(HEALTH_ENV_CONDITION)):
        return None
    return HealthSettings(
        xids=xid_policy(
            _xids(HEALTH_ENV_XIDS, env.get(HEALTH_ENV_XIDS)),
            _xids(HEALTH_ENV_IGNORED_XIDS, env.get(HEALTH_ENV_IGNORED_XIDS)),
        ),
        thermal=_bool(HEALTH_ENV_THERMAL, env.get(HEALTH_ENV_THERMAL)),
        power=_bool(HEALTH_ENV_POWER, env.get(HEALTH_ENV_POWER)),
        debounce_s=_seconds(HEALTH_ENV_DEBOUNCE, env.get(HEALTH_ENV_DEBOUNCE), DEFAULT_DEBOUNCE_S),
        quiet_s=_seconds(
            HEALTH_ENV_QUIET_PERIOD, env.get(HEALTH_ENV_QUIET_PERIOD), DEFAULT_QUIET_S
        ),
    )
