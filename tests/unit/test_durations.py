"""Durations as Helm and kubectl users write them, and bare seconds for what always took them."""

from __future__ import annotations

import argparse

import pytest

from gpu_operator.durations import duration_arg, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m0s", 300.0),
        ("1h2m3.5s", 3723.5),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        ("90", 90.0),
        ("2.5", 2.5),
        ("60s", 60.0),
        ("1500us", 0.0015),
        ("2µs", 2e-6),
        ("10ns", 1e-8),
        ("0", 0.0),
        (" 5m ", 300.0),
    ],
)
def test_go_durations_and_bare_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "-1s", "m", "1d", "5 m", "1h-2m", "s5"])
def test_anything_else_is_refused_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match=f"{text!r} is not a duration"):
        parse_duration(text)
    with pytest.raises(argparse.ArgumentTypeError):
        duration_arg(text)
