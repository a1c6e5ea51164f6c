"""Session-wide: how tests are shared among pytest-xdist workers, and one summary line per
missing prerequisite (``tests/prerequisites.py``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.prerequisites import REASONS

REAL_NODES = "real-nodes"
REAL_NODE_MODULES = "test_real_"  # every test on real kubelet nodes lives in a module named so
# The longest groups (minutes each), handed out first so that none waits behind another.
LONGEST_FIRST = (REAL_NODES, "tests/chaos/test_chaos.py", "tests/chaos/test_chaos_outage.py")


def xdist_group(nodeid: str) -> str:
    """Which worker-sized unit a test belongs to: its module (a module-scoped cluster starts
    once), except that every real-node test shares one: they use one real-node cluster, and two
    such clusters at once would compete for the same host."""
    module = nodeid.split("::", 1)[0]
    return REAL_NODES if Path(module).name.startswith(REAL_NODE_MODULES) else module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = [
        i.nodeid
        for i in items
        if i.get_closest_marker("real_nodes") and xdist_group(i.nodeid) != REAL_NODES
    ]
    if misplaced:
        raise pytest.UsageError(
            f"tests marked real_nodes must live in a module named {REAL_NODE_MODULES}*.py "
            f"(parallel runs keep them on one worker by that name): {misplaced}"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs on several pytest-xdist workers; each takes whole groups."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            for group in reversed(LONGEST_FIRST):
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
            super()._assign_work_unit(node)

    return ByGroup(config, log)


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
