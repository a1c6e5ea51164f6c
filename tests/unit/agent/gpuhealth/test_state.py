"""The GPUHealthy decisions, pure: settings from env, per-GPU health from readings and XIDs
(tables, then properties over random sequences), the condition, its patch and Events, and the
reset handshake."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.agent.gpuhealth import HealthSettings, health_settings
from gpu_operator.agent.gpuhealth.condition import (
    Condition,
    condition_entry,
    node_condition,
    seed,
    transition_event,
)
from gpu_operator.agent.gpuhealth.reset import outcome, pending_request, plan_reset
from gpu_operator.agent.gpuhealth.state import (
    MAX_SEEN,
    FaultKind,
    GpuHealth,
    observe,
    step,
    unhealthy,
)
from gpu_operator.agent.inventory import XidEvent
from gpu_operator.agent.nvml.health import HealthReading
from gpu_operator.labels import HEALTH_RESET_DONE, HEALTH_RESET_REQUESTED

UUID = "GPU-0000aaaa"
T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
DEFAULTS = HealthSettings()
WATCHFUL = HealthSettings(thermal=True, power=True, debounce_s=30, quiet_s=120)


def clean(index: int = 0, uuid: str = UUID, **fields: Any) -> HealthReading:
    return replace(
        HealthReading(
            index,
            uuid,
            ecc_uncorrected=0,
            remap_pending=False,
            remap_failure=False,
            thermal_slowdown=False,
            power_brake=False,
        ),
        **fields,
    )


# -- settings -------------------------------------------------------------------------------------
def test_no_condition_unless_asked() -> None:
    assert health_settings({}) is None
    assert health_settings({"GPU_HEALTH_CONDITION": "false"}) is None


def test_defaults_are_nvidias_fatal_xids_no_slowdowns_30s_and_2m() -> None:
    s = health_settings({"GPU_HEALTH_CONDITION": "true"})
    assert s is not None
    assert (s.thermal, s.power, s.debounce_s, s.quiet_s) == (False, False, 30.0, 120.0)
    assert s.xids.counts(79) and s.xids.counts(48) and s.xids.counts(94)
    assert not any(s.xids.counts(x) for x in (13, 31, 43, 45, 68, 109))


def test_extra_and_ignored_xids_and_durations_as_written() -> None:
    s = health_settings(
        {
            "GPU_HEALTH_CONDITION": "true",
            "GPU_HEALTH_XIDS": "13, 43",
            "GPU_HEALTH_IGNORED_XIDS": "43,92",
            "GPU_HEALTH_THERMAL": "true",
            "GPU_HEALTH_POWER": "false",
            "GPU_HEALTH_DEBOUNCE": "1m30s",
            "GPU_HEALTH_QUIET_PERIOD": "1h",
        }
    )
    assert s is not None
    assert s.xids.counts(13)  # an application XID made to count
    assert not s.xids.counts(43)  # ignored wins over counted
    assert not s.xids.counts(92)
    assert s.xids.counts(79)
    assert (s.thermal, s.power, s.debounce_s, s.quiet_s) == (True, False, 90.0, 3600.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GPU_HEALTH_XIDS", "79,abc"),
        ("GPU_HEALTH_THERMAL", "yes"),
        ("GPU_HEALTH_DEBOUNCE", "30"),
        ("GPU_HEALTH_QUIET_PERIOD", "2 minutes"),
    ],
)
def test_a_malformed_setting_is_named(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        health_settings({"GPU_HEALTH_CONDITION": "true", name: value})


# -- one GPU, step by step ----------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    readings: Sequence[HealthReading | None]  # one per poll, 10 s apart
    xids: Sequence[Sequence[int]] = ()
    settings: HealthSettings = DEFAULTS
    healthy: Sequence[bool] = ()
    kind: FaultKind | None = None  # the most severe kind seen at the end


CASES = [
    Case("clean readings", [clean()] * 3, healthy=[True] * 3),
    Case(
        "a fatal XID",
        [clean()] * 2,
        xids=[[79], []],
        healthy=[False, False],
        kind=FaultKind.XID,
    ),
    Case("an application XID", [clean()], xids=[[13]], healthy=[True]),
    Case(
        "ECC counts start where they are, an increase is a fault",
        [clean(ecc_uncorrected=5), clean(ecc_uncorrected=5), clean(ecc_uncorrected=6)],
        healthy=[True, True, False],
        kind=FaultKind.ECC,
    ),
    Case(
        "a pending remap",
        [clean(remap_pending=True)],
        healthy=[False],
        kind=FaultKind.ROW_REMAP,
    ),
    Case("a failed remap", [clean(remap_failure=True)], healthy=[False], kind=FaultKind.ROW_REMAP),
    Case(
        "no answer from NVML",
        [clean(), HealthReading(0, UUID, error="nvmlDeviceGetUUID: the GPU is lost")],
        healthy=[True, False],
        kind=FaultKind.LOST,
    ),
    Case("gone from the inventory", [clean(), None], healthy=[True, False], kind=FaultKind.LOST),
    Case(
        "NOT_SUPPORTED everywhere is no signal",
        [HealthReading(0, UUID)] * 3,
        healthy=[True] * 3,
    ),
    Case(
        "thermal slowdown not counted unless enabled",
        [clean(thermal_slowdown=True, power_brake=True)] * 5,
        healthy=[True] * 5,
    ),
    Case(
        "thermal slowdown counted once it lasted the debounce",
        [clean(thermal_slowdown=True)] * 5,
        settings=WATCHFUL,
        healthy=[True, True, True, False, False],
        kind=FaultKind.THERMAL,
    ),
    Case(
        "a break restarts the debounce",
        [clean(power_brake=True)] * 3 + [clean()] + [clean(power_brake=True)] * 3,
        settings=WATCHFUL,
        healthy=[True] * 7,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_gpu(case: Case) -> None:
    gpu = GpuHealth(UUID, 0)
    got = []
    for i, reading in enumerate(case.readings):
        xids = case.xids[i] if i < len(case.xids) else ()
        gpu = step(gpu, reading, xids, T0 + 10 * i, case.settings)
        got.append(gpu.healthy)
    assert got == list(case.healthy)
    if case.kind is not None:
        assert max(s.kind for s in gpu.seen) == case.kind


def test_healthy_again_only_after_the_quiet_period_and_clean_now() -> None:
    gpu = step(GpuHealth(UUID, 0), clean(), [79], T0, DEFAULTS)
    gpu = step(gpu, clean(), [], T0 + 119, DEFAULTS)
    assert not gpu.healthy
    gpu = step(gpu, clean(), [], T0 + 120, DEFAULTS)
    assert gpu.healthy and gpu.seen == () and gpu.last_fault_s is None


def test_a_lost_gpu_or_a_pending_remap_never_recovers_by_waiting() -> None:
    for reading in (HealthReading(0, UUID, error="lost"), clean(remap_pending=True)):
        gpu = GpuHealth(UUID, 0)
        for t in range(0, 3600, 60):
            gpu = step(gpu, reading, [], T0 + t, DEFAULTS)
        assert not gpu.healthy


def test_what_was_seen_keeps_its_first_time_and_the_latest_few() -> None:
    gpu = GpuHealth(UUID, 0)
    for t in range(3):
        gpu = step(gpu, clean(remap_pending=True), [79], T0 + t, DEFAULTS)
    assert [(s.what, s.at) for s in gpu.seen] == [("XID 79", T0), ("row remap pending", T0)]
    for x in range(10):
        gpu = step(gpu, clean(), [48 + x], T0 + 10 + x, DEFAULTS)
    assert len(gpu.seen) == MAX_SEEN
    assert gpu.seen[-1].what == "XID 57"


def test_observe_maps_xids_by_index_and_keeps_gpus_that_vanish() -> None:
    gpus = {"GPU-a": 0, "GPU-b": 1}
    state = observe({}, gpus, [clean(0, "GPU-a"), clean(1, "GPU-b")], [], T0, DEFAULTS)
    assert unhealthy(state) == frozenset()
    state = observe(
        state, gpus, [clean(0, "GPU-a"), clean(1, "GPU-b")], [XidEvent(1, 79)], T0 + 1, DEFAULTS
    )
    assert unhealthy(state) == {"GPU-b"}
    # A new inventory without GPU-a (it fell off the bus): still known, and lost.
    state = observe(state, {"GPU-b": 1}, [clean(1, "GPU-b")], [], T0 + 2, DEFAULTS)
    assert unhealthy(state) == {"GPU-a", "GPU-b"}
    assert state["GPU-a"].seen[0].kind == FaultKind.LOST


# -- properties -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Poll:
    gap_s: float
    reading: HealthReading | None
    xids: tuple[int, ...]


readings = st.builds(
    HealthReading,
    index=st.just(0),
    uuid=st.just(UUID),
    error=st.sampled_from([None, None, None, None, "lost"]),
    ecc_uncorrected=st.one_of(st.none(), st.integers(0, 3)),
    remap_pending=st.sampled_from([None, False, False, False, True]),
    remap_failure=st.sampled_from([None, False, False, False, False, True]),
    thermal_slowdown=st.one_of(st.none(), st.booleans()),
    power_brake=st.one_of(st.none(), st.booleans()),
)
polls = st.builds(
    Poll,
    gap_s=st.sampled_from([0.5, 1.0, 5.0, 10.0, 30.0, 60.0]),
    reading=st.one_of(readings, st.just(None), st.just(clean())),
    xids=st.lists(st.sampled_from([13, 43, 48, 79, 94]), max_size=2).map(tuple),
)
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(sequence: Sequence[Poll], s: HealthSettings) -> list[tuple[float, GpuHealth, bool]]:
    """(time, GPU after the poll, whether this poll saw a fault) for each poll."""
    gpu, now, out = GpuHealth(UUID, 0), T0, []
    for poll in sequence:
        now += poll.gap_s
        after = step(gpu, poll.reading, poll.xids, now, s)
        out.append((now, after, after.last_fault_s == now))
        gpu = after
    return out


@PROPS
@given(st.lists(polls, max_size=40), st.booleans())
def test_never_healthy_within_the_quiet_period_of_a_fault(
    sequence: list[Poll], watchful: bool
) -> None:
    s = WATCHFUL if watchful else DEFAULTS
    last_fault = None
    for now, gpu, faulted in run(sequence, s):
        if faulted:
            last_fault = now
        if last_fault is not None and now - last_fault < s.quiet_s:
            assert not gpu.healthy


@PROPS
@given(st.lists(polls, max_size=30), st.lists(st.sampled_from([1.0, 10.0, 45.0]), max_size=20))
def test_always_healthy_after_a_quiet_period_of_clean_readings(
    sequence: list[Poll], clean_gaps: list[float]
) -> None:
    s = WATCHFUL
    gpu, now = GpuHealth(UUID, 0), T0
    for poll in sequence:
        now += poll.gap_s
        gpu = step(gpu, poll.reading, poll.xids, now, s)
    start = now
    for gap in [*clean_gaps, s.quiet_s]:
        now += gap
        gpu = step(gpu, clean(ecc_uncorrected=gpu.ecc_baseline), (), now, s)
        if now - start >= s.quiet_s:
            assert gpu.healthy


@PROPS
@given(st.lists(st.tuples(st.sampled_from([1.0, 5.0, 10.0, 20.0]), st.booleans()), max_size=40))
def test_a_slowdown_counts_only_once_it_lasted_the_debounce(
    sequence: list[tuple[float, bool]],
) -> None:
    s = WATCHFUL
    gpu, now, since = GpuHealth(UUID, 0), T0, None
    for gap, throttled in sequence:
        now += gap
        since = (since if since is not None else now) if throttled else None
        gpu = step(gpu, clean(thermal_slowdown=throttled), (), now, s)
        counted = gpu.last_fault_s == now
        assert counted == (since is not None and now - since >= s.debounce_s)


# -- the condition ------------------------------------------------------------------------------
def sick(uuid: str, index: int, *xids: int, at: float = T0) -> GpuHealth:
    gpu = step(GpuHealth(uuid, index), clean(index, uuid), xids, at, DEFAULTS)
    assert not gpu.healthy
    return gpu


def test_condition_true_names_the_count() -> None:
    state = {"GPU-a": GpuHealth("GPU-a", 0), "GPU-b": GpuHealth("GPU-b", 1)}
    assert node_condition(state) == Condition("True", "GPUsHealthy", "2 GPUs healthy")


def test_condition_false_names_each_gpu_and_the_worst_reason() -> None:
    lost = step(
        GpuHealth("GPU-c", 2), HealthReading(2, "GPU-c", error="lost"), (), T0 + 3, DEFAULTS
    )
    state = {"GPU-b": sick("GPU-b", 1, 79, 48), "GPU-c": lost, "GPU-a": GpuHealth("GPU-a", 0)}
    condition = node_condition(state)
    assert condition.status == "False"
    assert condition.reason == "GPULost"
    assert condition.message == (
        "GPU 1 GPU-b: XID 79 at 22:13:20Z, XID 48 at 22:13:20Z; "
        "GPU 2 GPU-c: not answering NVML (lost) at 22:13:23Z"
    )


@pytest.mark.parametrize(
    ("reading", "reason"),
    [
        (clean(remap_failure=True), "GPURowRemap"),
        (clean(ecc_uncorrected=9), "GPUEccError"),
    ],
)
def test_one_reason_per_kind(reading: HealthReading, reason: str) -> None:
    gpu = step(GpuHealth(UUID, 0, ecc_baseline=0), reading, (), T0, DEFAULTS)
    assert node_condition({UUID: gpu}).reason == reason


def test_the_message_does_not_move_while_the_faults_stay() -> None:
    gpu = GpuHealth(UUID, 0)
    messages = set()
    for t in range(0, 600, 10):
        gpu = step(gpu, clean(remap_pending=True), [79] if t % 100 == 0 else [], T0 + t, DEFAULTS)
        messages.add(node_condition({UUID: gpu}).message)
    assert messages == {f"GPU 0 {UUID}: XID 79 at 22:13:20Z, row remap pending at 22:13:20Z"}


def test_a_restart_keeps_what_the_node_says_and_waits_a_fresh_quiet_period() -> None:
    before = {"GPU-a": GpuHealth("GPU-a", 0), "GPU-b": sick("GPU-b", 1, 79)}
    written = node_condition(before)
    fresh = {"GPU-a": GpuHealth("GPU-a", 0), "GPU-b": GpuHealth("GPU-b", 1)}
    restarted = seed(fresh, written, T0 + 1000)
    assert node_condition(restarted) == written
    state = observe(
        restarted,
        {"GPU-a": 0, "GPU-b": 1},
        [clean(0, "GPU-a"), clean(1, "GPU-b")],
        [],
        T0 + 1060,
        DEFAULTS,
    )
    assert unhealthy(state) == {"GPU-b"}
    state = observe(
        state,
        {"GPU-a": 0, "GPU-b": 1},
        [clean(0, "GPU-a"), clean(1, "GPU-b")],
        [],
        T0 + 1120,
        DEFAULTS,
    )
    assert unhealthy(state) == frozenset()
    assert seed(fresh, Condition("True", "GPUsHealthy", "2 GPUs healthy"), T0) == fresh


def test_the_entry_is_written_only_on_a_change_and_keeps_its_transition_time() -> None:
    bad = Condition("False", "GPUXid", "GPU 0 GPU-a: XID 79 at 10:02:03Z")
    first = condition_entry(bad, None, "2024-01-01T10:02:04Z")
    assert first == {
        "type": "GPUHealthy",
        "status": "False",
        "reason": "GPUXid",
        "message": bad.message,
        "lastHeartbeatTime": "2024-01-01T10:02:04Z",
        "lastTransitionTime": "2024-01-01T10:02:04Z",
    }
    assert condition_entry(bad, first, "2024-01-01T10:05:00Z") is None
    worse = Condition("False", "GPULost", bad.message + "; GPU 1 GPU-b: gone")
    second = condition_entry(worse, first, "2024-01-01T10:06:00Z")
    assert second is not None
    assert second["lastTransitionTime"] == "2024-01-01T10:02:04Z"
    assert second["lastHeartbeatTime"] == "2024-01-01T10:06:00Z"
    good = condition_entry(Condition("True", "GPUsHealthy", "1 GPUs healthy"), second, "T3")
    assert good is not None and good["lastTransitionTime"] == "T3"


def test_events_on_turning_false_and_back_only() -> None:
    bad = Condition("False", "GPUXid", "m")
    good = Condition("True", "GPUsHealthy", "2 GPUs healthy")
    assert transition_event(None, good) is None
    assert transition_event(None, bad) == ("Warning", "GPUUnhealthy", "GPUXid: m")
    assert transition_event(bad, replace(bad, message="n")) is None
    assert transition_event(bad, good) == (
        "Normal",
        "GPUHealthy",
        "GPUs healthy again: 2 GPUs healthy",
    )


# -- reset ----------------------------------------------------------------------------------------
def test_a_request_is_pending_until_answered() -> None:
    assert pending_request({}) is None
    assert pending_request({HEALTH_RESET_REQUESTED: "1700"}) == "1700"
    answered = {HEALTH_RESET_REQUESTED: "1700", HEALTH_RESET_DONE: "1700:reset GPU-a"}
    assert pending_request(answered) is None
    newer = {HEALTH_RESET_REQUESTED: "1800", HEALTH_RESET_DONE: "1700:reset GPU-a"}
    assert pending_request(newer) == "1800"
    assert pending_request({HEALTH_RESET_REQUESTED: "17", HEALTH_RESET_DONE: "1700:x"}) == "17"


def test_only_idle_gpus_are_reset_and_unknown_is_not_idle() -> None:
    plan = plan_reset(
        [(2, "GPU-c"), (0, "GPU-a"), (1, "GPU-b")],
        {"GPU-a": (), "GPU-b": (123, 456), "GPU-c": None},
    )
    assert plan.reset == ((0, "GPU-a"),)
    assert plan.refused == ("GPU-b in use by pid 123,456", "GPU-c processes unknown")
    assert outcome(plan, {}) == (
        False,
        "reset GPU-a; refused: GPU-b in use by pid 123,456, GPU-c processes unknown",
    )
    assert outcome(plan_reset([(0, "GPU-a")], {"GPU-a": ()}), {}) == (True, "reset GPU-a")
    assert outcome(plan_reset([(0, "GPU-a")], {"GPU-a": ()}), {"GPU-a": "boom"}) == (
        False,
        "failed: GPU-a (boom)",
    )
    assert outcome(plan_reset([], {}), {}) == (True, "nothing to reset: no unhealthy GPU")
