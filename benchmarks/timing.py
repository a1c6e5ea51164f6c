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
    p99: float = 0.0


def summarize(samples: list[float]) -> Summary:
    """``samples`` in seconds; p95 and p99 are nearest-rank values."""
    ms = sorted(s * 1000 for s in samples)

    def rank(q: float) -> float:
        return ms[min(len(ms) - 1, round(q * (len(ms) - 1)))]

    return Summary(len(ms), statistics.median(ms), rank(0.95), ms[0], ms[-1], rank(0.99))
