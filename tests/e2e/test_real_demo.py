"""`make demo`, one of the README's two commands, run as written in its short form: the whole
simulated stack comes up on two real nodes and four kwok GPU nodes, the table says which are
which, every GPU node is discovered and advertises its GPUs, the policy is ready, one GPU pod
runs on each GPU node, and the cluster goes down again leaving no process behind.

It starts real nodes, so it lives with the other real-node tests (one worker, one real-node
cluster at a time)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpu_operator.testenv.demo import GPU_NODES, REAL_NODES
from gpu_operator.testenv.processes import cmdline
from tests.paths import REPO


def _processes_naming(path: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            args = " ".join(cmdline(int(entry.name)))
            if str(path) in args:
                found.append(args)
    return found


pytestmark = pytest.mark.real_nodes
# The real nodes' simulated GPUs, in testenv's default order (A100 x8, H100 x8).
REAL_GPUS = {"real-node-0": "8", "real-node-1": "8"}


def test_make_demo_short_reaches_ready_and_goes_down(
    testenv_bin_dir: Path, real_nodes_runtime: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "demo"
    done = subprocess.run(
        ["make", "--no-print-directory", "demo", "DEMO_ARGS=--short"],
        cwd=REPO,
        env={**os.environ, "TESTENV_STATE_DIR": str(state_dir)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    assert "ClusterPolicy ready" in out
    table = out[out.index("NODE") :].split("\n\n")[0]
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    assert "a GPU pod runs on each GPU node" in out
    assert len(REAL_GPUS) == REAL_NODES
    expected = {
        **{n: ("real", count) for n, count in REAL_GPUS.items()},
        **{n: ("kwok", gpus.split(":")[1]) for n, (gpus, _, _) in GPU_NODES.items()},
    }
    for name, (kind, gpus) in expected.items():
        assert name in rows, table
        _, shown_kind, product, count, *_, allocatable, gpu_pod = rows[name].split()
        assert shown_kind == kind, rows[name]  # which nodes are real and which kwok
        assert product not in ("?", "-"), rows[name]  # discovery labelled the product ...
        assert count == gpus, rows[name]  # ... and the simulated GPU count
        assert allocatable == count, rows[name]  # the capacity the plugin registered
        assert gpu_pod == "Running", rows[name]  # its 1-GPU pod, placed by the scheduler
    # DRA: every GPU node's pool, published by its DRA plugin process.
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "GENERATION" in line)
    dra_rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        dra_rows[line.split()[0]] = line
    for name in GPU_NODES:
        assert "gpu.nvidia.com" in dra_rows.get(name, ""), lines[start:]
    assert "the cluster is down again" in out
    assert not state_dir.exists()
    assert _processes_naming(state_dir) == []
