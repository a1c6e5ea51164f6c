"""Summaries of wall-time samples, shared by the benchmarks' reports."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Milliseconds."""

    n: int
    median: float
    p95: float
    min: float
    max: float


def summarize(samples: list[float]) -> Summary:
    """``samples`` in seconds; p95 is the nearest-rank value."""
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return Summary(len(ms), statistics.median(ms), p95, ms[0], ms[-1])
