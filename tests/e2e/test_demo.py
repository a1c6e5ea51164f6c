"""`make demo`, one of the README's two commands, run as written in its short form: the whole
simulated stack comes up, every GPU node is discovered and advertises its GPUs, the policy is
ready, one GPU pod runs on each GPU node, and the cluster goes down again leaving no process
behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpu_operator.testenv.demo import GPU_NODES
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


def test_make_demo_short_reaches_ready_and_goes_down(testenv_bin_dir: Path, tmp_path: Path) -> None:
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
    for name, (gpus, _, _) in GPU_NODES.items():
        assert name in rows, table
        _, product, count, *_, allocatable, gpu_pod = rows[name].split()
        assert product not in ("?", "-"), rows[name]  # discovery labelled the product ...
        assert count == gpus.split(":")[1], rows[name]  # ... and the simulated GPU count
        assert allocatable == count, rows[name]  # the simulated capacity, as the plugin counts
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
