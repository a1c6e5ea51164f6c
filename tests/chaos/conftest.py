"""The chaos suite: every test here is marked ``chaos`` and runs against the real
local control plane, with Toxiproxy built into the testenv cache. Outside CI a machine that
cannot build the binaries skips the suite with one line; under CI that fails."""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_operator import testenv
from tests.chaos.harness import ChaosEnv

CHAOS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(CHAOS_DIR):
            item.add_marker(pytest.mark.chaos)


@pytest.fixture(scope="session")
def chaos_bin_dir() -> Path:
    try:
        bin_dir = testenv.ensure_binaries()
        testenv.binaries.ensure_toxiproxy(bin_dir)
    except testenv.BinariesError as exc:
        if testenv.binaries.in_ci():
            pytest.fail(f"chaos suite unavailable: {exc}", pytrace=False)
        pytest.skip(f"chaos suite unavailable: {exc}")
    return bin_dir


@pytest.fixture(scope="module")
def env(chaos_bin_dir: Path, request: pytest.FixtureRequest) -> Iterator[ChaosEnv]:
    """A converged 6-GPU-node cluster with one operator; torn down after the module. Its logs
    (operators', components', the audit log) are kept only when a test failed meanwhile."""
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{uuid.uuid4().hex[:8]}-"))
    failed_before = request.session.testsfailed
    chaos = ChaosEnv(chaos_bin_dir, workdir)
    broke = True  # until the module's tests ran: a failed start keeps its logs too
    try:
        chaos.start_operator("a")
        chaos.converge("the first convergence", timeout=300)
        yield chaos
        broke = False
    finally:
        chaos.close()
        if not broke and request.session.testsfailed == failed_before:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            sys.stderr.write(f"chaos logs kept in {workdir}\n")
