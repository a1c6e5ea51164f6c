"""Hardware faults on a testenv node's SIMULATED GPUs: where its NVML state is, and injecting.

Every agent of a node runs its own simulated NVML over one state file; a fault written there
reaches all of them. Where the file is:

- a kwok node (the demo's): the agents run on this machine with
  ``--simulate-state <state dir>/<node>.nvml.json`` (:func:`kwok_state_file`);
- a real node: in its driver root's ``dev/`` (the agents' loader keeps the simulated GPUs'
  state beside their device nodes), so on this machine under the node's directory: the driver
  container's root (``/run/nvidia/driver`` on the node) when it has one, else the node's
  preinstalled host driver.

testenv does not import the agents (see the import contracts), so injecting goes through their
command line, ``gpu-operator agent simulate-fault``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cluster import Cluster

# The simulated NVML's `sim.nvml.SIM_STATE`, under a driver root's dev/ (a test keeps them equal).
SIM_STATE_IN_DEV = "gpu-operator-sim/nvml-state.json"
# A real node's driver roots as this machine sees them, inside the node's directory: its
# /run/nvidia is the node's `nvidia/` (node-init.sh), the driver container's root is
# /run/nvidia/driver on the node, and the preinstalled host driver is the node's `host-driver/`.
REAL_NODE_DRIVER_ROOTS = ("nvidia/driver", "host-driver")


class GpuFaultError(RuntimeError):
    """The fault could not be injected: the message says why (the CLI's own)."""


def kwok_state_file(cluster: Cluster, node_name: str) -> Path:
    """The NVML state file of a kwok node's simulated GPUs (agents run here, by the demo)."""
    return cluster.state_dir / f"{node_name}.nvml.json"


def real_node_state_file(node_dir: Path) -> Path:
    """A real node's NVML state file on this machine: the first of its driver roots that has
    one (the driver container's, else the host driver's); the first when none has yet."""
    candidates = [node_dir / root / "dev" / SIM_STATE_IN_DEV for root in REAL_NODE_DRIVER_ROOTS]
    return next((path for path in candidates if path.exists()), candidates[0])


def state_file(cluster: Cluster, node_name: str) -> Path:
    """The NVML state file of ``node_name``'s simulated GPUs, a real node or a kwok one."""
    if node_name in cluster.real_nodes:
        return real_node_state_file(cluster.real_node_dir(node_name))
    return kwok_state_file(cluster, node_name)


def inject(
    cluster: Cluster, node_name: str, gpu: int | str, fault: str, value: int | None = None
) -> str:
    """Inject ``fault`` (xid, ecc, remap-pending, remap-failure, lost, thermal, power) into GPU
    ``gpu`` (index or UUID) of ``node_name``; returns what the CLI said."""
    extra = [] if value is None else [str(value)]
    return _simulate_fault(state_file(cluster, node_name), gpu, [fault, *extra])


def clear(cluster: Cluster, node_name: str, gpu: int | str, kind: str | None = None) -> str:
    """Take fault ``kind`` (None: every fault) off GPU ``gpu`` of ``node_name``."""
    extra = [] if kind is None else [kind]
    return _simulate_fault(state_file(cluster, node_name), gpu, ["clear", *extra])


def _simulate_fault(path: Path, gpu: int | str, words: list[str]) -> str:
    argv = [sys.executable, "-m", "gpu_operator", "agent", "simulate-fault"]
    argv += ["--simulate-state", str(path), "--gpu", str(gpu), *words]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise GpuFaultError(done.stderr.strip() or f"simulate-fault exited {done.returncode}")
    return done.stdout.strip()
