"""Session-wide: how tests are shared among pytest-xdist workers, and one summary line per
missing prerequisite (``tests/prerequisites.py``)."""

from __future__ import annotations

import os

# Before any test imports grpc: its fork handlers restart gRPC's poller threads in a forked
# child, and a child that runs Python before exec (subprocess's preexec_fn: testenv's
# processes, chroot) closes their epoll descriptor under them; the child then aborts (SIGABRT,
# "epoll_wait error: Bad file descriptor"), about once in 150 spawns from a pytest worker that
# ran a gRPC server. No test uses gRPC in a forked child.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.testenv.releases import OLDEST
from tests.prerequisites import REASONS

REAL_NODES = "real-nodes"
REAL_NODES_DRIVER = "real-nodes-driver"
REAL_NODES_OWN = "real-nodes-own-clusters"
REAL_NODE_MODULES = "test_real_"  # every test on real kubelet nodes lives in a module named so
# Real-node modules on the session's real-node cluster (`real_cluster`, one per worker) come in
# two groups: the driver, DRA and NVIDIA-defaults modules here, the rest in REAL_NODES. Each
# group starts its cluster on its own worker, so the two overlap instead of queueing on one.
DRIVER_REAL_CLUSTER = frozenset(
    {
        "test_real_driver.py",
        "test_real_node_dra.py",
        "test_real_node_dynamic_mig.py",
        "test_real_helm_default.py",
    }
)
# Real-node modules that start real-node clusters of their own rather than share the session's
# (`real_cluster`): they run as a group of their own, beside the two above. Each cluster takes
# its own bridge subnet.
OWN_REAL_CLUSTERS = frozenset(
    {
        "test_real_demo.py",
        "test_real_operator.py",
        "test_real_nodes_lifecycle.py",
        "test_real_canary.py",
    }
)
# Real-node modules that start a cluster of their own and run as a group of their own, so they
# overlap with the three groups above instead of queueing behind one of them.
SOLO_REAL_CLUSTERS = frozenset({"test_real_computedomain.py"})
# The longest groups, longest first, handed out before the rest (which come in the seed's
# order): a long group left for last ran alone at the end. Minutes of each in a fresh-clone CI
# run (2 cores, 5 workers) in the comments, from the summary's "longest groups" line. Replaying
# two earlier runs' group times through this scheduling for 200 seeds gave medians of 19.2 and
# 19.5 minutes with only the first four listed, 17.7 and 18.4 with these twelve (4 workers).
REAL_NODE_GROUPS = (REAL_NODES_DRIVER, REAL_NODES, REAL_NODES_OWN)
UNIT_TESTS = "tests/unit/"
LONGEST_FIRST = (
    *REAL_NODE_GROUPS,  # 7.6, 14.6, 13.2 before test_real_helm_default (4.9) moved
    *(f"tests/e2e/{name}" for name in sorted(SOLO_REAL_CLUSTERS)),
    "tests/chaos/test_chaos_outage.py",  # 7.8
    "tests/e2e/test_install_rbac.py",  # 7.0
    "tests/chaos/test_chaos.py",  # 7.6
    "tests/e2e/test_operator.py",  # 5.0
    f"tests/e2e/test_operator.py@{OLDEST}",
    "tests/e2e/test_testenv_lifecycle.py",  # 2.7
    "tests/e2e/test_helm.py",  # 2.5
    "tests/unit/test_fuzz_policies.py",  # 2.1
    "tests/e2e/test_health_remediation.py",  # 2.3
    "tests/e2e/test_canary.py",  # 1.6
    "tests/e2e/test_nvidiadriver.py",  # 2.2
)


def hand_out_order(groups: list[str]) -> list[str]:
    """The order idle workers take ``groups`` in: LONGEST_FIRST, then the other end-to-end and
    chaos modules, then the unit modules, each part in the order given (the seed's). Unit
    modules take seconds each, so they fill the run's tail instead of a minute-long e2e module
    handed out last and running alone."""
    longest = [g for g in LONGEST_FIRST if g in groups]
    rest = [g for g in groups if g not in longest]
    unit = [g for g in rest if g.startswith(UNIT_TESTS)]
    return longest + [g for g in rest if not g.startswith(UNIT_TESTS)] + unit


def xdist_group(nodeid: str) -> str:
    """Which worker-sized unit a test belongs to: its module (a module-scoped cluster starts
    once; its tests on the oldest release are a unit of their own), except that the real-node
    tests sharing a session's real-node cluster are two units (each cluster starts once, on its
    own worker), and those that start their own are another."""
    module = nodeid.split("::", 1)[0]
    name = Path(module).name
    if OLDEST in nodeid:  # a module's tests on the oldest release: a unit beside its default's
        return f"{module}@{OLDEST}"
    if not name.startswith(REAL_NODE_MODULES) or name in SOLO_REAL_CLUSTERS:
        return module
    if name in OWN_REAL_CLUSTERS:
        return REAL_NODES_OWN
    return REAL_NODES_DRIVER if name in DRIVER_REAL_CLUSTER else REAL_NODES


def _selects_real_nodes(config: pytest.Config) -> bool:
    """Whether the run's paths hold real-node modules (the controller collects nothing: it
    judges by the arguments)."""
    e2e = Path(__file__).parent / "e2e"
    for arg in config.args:
        path = Path(arg.split("::", 1)[0]).resolve()
        if path == e2e or path in e2e.parents:
            return True
        if path.parent == e2e and path.name.startswith(REAL_NODE_MODULES):
            return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """The real-node tests' images (the project's and the stand-ins) start building before the
    workers are up: a worker that asks for them waits on the build's lock, then finds them
    current, instead of building after its cluster is up, on the suite's longest path."""
    config = session.config
    if hasattr(config, "workerinput") or not _selects_real_nodes(config):
        return
    from gpu_operator import testenv  # the testenv's dependencies: only where it is used

    if testenv.realnodes.why_unavailable() is not None:
        return  # the real-node tests say why, once
    log = testenv.default_state_dir() / "images-prebuild.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    taken = threading.Event()

    def build() -> None:
        with log.open("w") as out:
            try:
                testenv.binaries.ensure_project_images(out, taken=taken)
            except testenv.BinariesError as exc:  # a worker builds again and names its log
                out.write(f"prebuild failed: {exc}\n")
            finally:
                taken.set()

    threading.Thread(target=build, name="images-prebuild", daemon=True).start()
    taken.wait(30)  # the lock is held before any worker can ask


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    misplaced = [
        i.nodeid
        for i in items
        if i.get_closest_marker("real_nodes")
        and xdist_group(i.nodeid) not in REAL_NODE_GROUPS
        and Path(i.nodeid.split("::", 1)[0]).name not in SOLO_REAL_CLUSTERS
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
            for group in hand_out_order(list(self.workqueue)):
                self.workqueue.move_to_end(group)
            super()._assign_work_unit(node)

    return ByGroup(config, log)


# Each group's wall span (first test's start to last test's end, setup and teardown included)
# and the worker it ran on, for the summary: what the suite's length is made of.
_SPANS: dict[str, list[Any]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    if worker is None:
        return  # not under xdist: one process, nothing to share out
    group, module = xdist_group(report.nodeid), report.nodeid.split("::", 1)[0]
    for key in {group, f"{group} > {module}"} if group != module else {group}:
        span = _SPANS.setdefault(key, [report.start, report.stop, worker])
        span[0], span[1] = min(span[0], report.start), max(span[1], report.stop)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SPANS:
        start = min(s[0] for s in _SPANS.values())

        def spans(items: list[tuple[str, list[Any]]]) -> str:
            return "; ".join(
                f"{key} {(s[0] - start) / 60:.1f}+{(s[1] - s[0]) / 60:.1f} {s[2]}"
                for key, s in sorted(items, key=lambda kv: kv[1][0] - kv[1][1])
            )

        groups = [kv for kv in _SPANS.items() if " > " not in kv[0]]
        groups = sorted(groups, key=lambda kv: kv[1][0] - kv[1][1])[: len(LONGEST_FIRST)]
        terminalreporter.write_line(
            "longest groups (minutes into the run it began + its length, worker): " + spans(groups)
        )
        everything = [kv for kv in _SPANS.items() if " > " not in kv[0]]
        last = sorted(everything, key=lambda kv: -kv[1][1])[:6]  # what the run waited on last
        terminalreporter.write_line("last to end: " + spans(last))
        for group in REAL_NODE_GROUPS:  # the groups of several modules
            inside = [kv for kv in _SPANS.items() if kv[0].startswith(f"{group} > ")]
            if inside:
                terminalreporter.write_line(f"  {group}, by module: {spans(inside)}")
    counts: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason in REASONS:
            counts[reason] += 1
    for reason, count in counts.items():
        terminalreporter.write_line(f"{count} skipped: {reason}", yellow=True)
