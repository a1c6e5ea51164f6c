"""``agent simulate-fault``: inject a hardware fault into a SIMULATED GPU, for demos and people.

(The simulated NVML is imported inside the functions: the agents' parser loads it anyway, for
``--simulate``.)

It writes the node's simulated NVML state file, so every agent of that node (each with its own
simulated NVML over the file) reads the fault at its next NVML call. It acts on simulated GPUs
only: without a state file it refuses.

    gpu-operator agent simulate-fault --simulate-state FILE --gpu 0 xid 79
    gpu-operator agent simulate-fault --simulate-state FILE --gpu GPU-... clear [KIND]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gpu_operator.usage import UsageProblem

CLEAR = "clear"


def cmd_simulate_fault(args: argparse.Namespace) -> int:
    from gpu_operator.sim.nvml import (
        ENV_STATE,
        FAULT_KINDS,
        SimulationError,
        clear_faults,
        inject_fault,
    )

    if not args.simulate_state:
        raise UsageProblem(
            "simulate-fault acts on simulated GPUs only",
            f"give --simulate-state FILE (or env {ENV_STATE})",
        )
    if args.kind == CLEAR:
        if args.value is not None and args.value not in FAULT_KINDS:
            raise SimulationError(f"clear takes one of {', '.join(FAULT_KINDS)}, or nothing")
        index = clear_faults(args.simulate_state, args.gpu, args.value)
        done = f"cleared {args.value or 'every fault'}"
    else:
        value = _number(args.value)
        index = inject_fault(args.simulate_state, args.gpu, args.kind, value)
        done = f"injected {args.kind}" + ("" if value is None else f" {value}")
    print(f"SIMULATED GPU {index} of {args.simulate_state}: {done}")
    return 0


def _number(text: str | None) -> int | None:
    from gpu_operator.sim.nvml import SimulationError

    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise SimulationError(f"expected a number, not {text!r}") from None


def register(sub: Any) -> None:
    from gpu_operator.sim.nvml import ENV_STATE, FAULT_KINDS

    p = sub.add_parser(
        "simulate-fault",
        help="inject a hardware fault into a SIMULATED GPU (XID, ECC, row remap, lost, slowdown)",
        description="Write a fault into a simulated node's NVML state file; every agent of "
        "that node sees it. xid VALUE: the XID number; ecc/remap-* VALUE: how many errors or "
        "rows (default 1); clear [KIND]: one fault, or every fault.",
    )
    p.add_argument(
        "--simulate-state",
        metavar="FILE",
        default=os.environ.get(ENV_STATE) or None,
        help=f"the node's simulated NVML state file (env {ENV_STATE})",
    )
    p.add_argument("--gpu", required=True, metavar="INDEX_OR_UUID", help="e.g. 0 or GPU-...")
    p.add_argument("kind", choices=[*FAULT_KINDS, CLEAR], help="the fault, or clear")
    p.add_argument("value", nargs="?", help="the XID, a count, or the kind to clear")
    p.set_defaults(func=cmd_simulate_fault)
