"""Session-wide: one summary line per missing prerequisite (``tests/prerequisites.py``)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.prerequisites import REASONS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason in REASONS:
            counts[reason] += 1
    for reason, count in counts.items():
        terminalreporter.write_line(f"{count} skipped: {reason}", yellow=True)
