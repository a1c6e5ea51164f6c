"""Every benchmark still imports: they run as scripts from benchmarks/ (`python bench_x.py`),
outside the suite, so a renamed or moved module broke one unnoticed until someone ran it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import REPO

BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmark_imports_as_its_readme_runs_it(script: str) -> None:
    module = script.removesuffix(".py")
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=REPO / "benchmarks", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]


def test_every_benchmark_is_found() -> None:
    assert len(BENCHMARKS) >= 9
