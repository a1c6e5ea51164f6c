"""While events keep coming, passes are spread so they take a bounded share of a CPU."""

from __future__ import annotations

import pytest

from gpu_operator.controller.runtime.config import OperatorConfig
from gpu_operator.controller.runtime.loop import (
    MAX_SETTLE_S,
    PASS_CPU_SHARE,
    ROLLOUT_SETTLE_S,
    settle_time,
)

CONFIG = OperatorConfig(debounce_seconds=0.5)


@pytest.mark.parametrize("cpu_s", [0.0, 0.01, 0.1, 0.4, 1.0, 2.0])
def test_passes_take_at_most_their_share_of_a_cpu(cpu_s: float) -> None:
    settle = settle_time(cpu_s, CONFIG)
    assert settle >= ROLLOUT_SETTLE_S  # a rollout's burst always gets to settle
    assert settle <= MAX_SETTLE_S  # a rollout's status moves on (an urgent change cuts it)
    if settle < MAX_SETTLE_S:
        assert cpu_s / (cpu_s + settle) <= PASS_CPU_SHARE + 1e-9


def test_cheap_passes_still_let_a_rollout_settle() -> None:
    assert settle_time(0.02, CONFIG) == ROLLOUT_SETTLE_S
    assert settle_time(100.0, CONFIG) == MAX_SETTLE_S
