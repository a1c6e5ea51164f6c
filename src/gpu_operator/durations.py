"""Durations as people who use Helm and kubectl write them: Go's ``time.ParseDuration`` syntax
(``5m0s``, ``1h2m3.5s``, ``300ms``), and a bare number of seconds (``90``, ``2.5``) for the
options and environment variables that always took one.

One parser for every option and variable that takes a time, so ``--timeout 5m`` means the same
wherever it is written.
"""

from __future__ import annotations

import argparse
import re

# Go's units, in seconds; "µs" and "μs" are Go's two spellings of microseconds.
UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})(ns|us|µs|μs|ms|s|m|h)")
_GO = re.compile(rf"(?:{_NUMBER}(?:ns|us|µs|μs|ms|s|m|h))+")
EXAMPLES = "e.g. 90s, 5m0s, 1h2m3.5s, 300ms, or a number of seconds"


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a Go duration or a bare number of seconds, never negative.
    Raises ValueError naming the text and the accepted forms."""
    value = text.strip()
    if re.fullmatch(_NUMBER, value):
        return float(value)
    if not _GO.fullmatch(value):
        raise ValueError(f"{text!r} is not a duration ({EXAMPLES})")
    return sum(float(number) * UNITS[unit] for number, unit in _PART.findall(value))


def duration_arg(text: str) -> float:
    """:func:`parse_duration` as an argparse ``type``: a bad value is a usage error (exit 2)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
