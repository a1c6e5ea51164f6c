"""The agent commands that exist only for simulation, added to ``gpu-operator agent`` by the
command line (:mod:`gpu_operator.cli`), above both the agents and the simulation:

- ``agent simulate-driver`` and ``agent simulate-toolkit``: the SIMULATED stand-ins for NVIDIA's
  driver and container-toolkit images (testenv only; :mod:`gpu_operator.sim.operands`). Each
  writes into the host it runs on, so none has a default for where it writes: run by hand
  without its target paths, it refuses with a usage error (exit 2) rather than lay a stub driver
  into /run/nvidia/driver or a containerd drop-in into /etc/containerd. The stand-in images pass
  them.
- ``agent simulate-fault``: inject a hardware fault into a SIMULATED GPU, for demos and people.
  It writes the node's simulated NVML state file, so every agent of that node (each with its own
  simulated NVML over the file) reads the fault at its next NVML call. It acts on simulated GPUs
  only: without a state file it refuses.

      gpu-operator agent simulate-fault --simulate-state FILE --gpu 0 xid 79
      gpu-operator agent simulate-fault --simulate-state FILE --gpu GPU-... clear [KIND]

The stand-ins (:mod:`gpu_operator.sim.operands`, which carries the CDI generator) are imported
when they run, not when the parser is built.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from gpu_operator import labels
from gpu_operator.agent.cli.common import setup
from gpu_operator.sim.nvml import (
    ENV_STATE,
    FAULT_KINDS,
    SimulationError,
    clear_faults,
    inject_fault,
)
from gpu_operator.sim.stubdriver import STYLES, StubDriverError
from gpu_operator.usage import UsageProblem

CLEAR = "clear"


def register(sub: Any) -> None:
    """Add the simulation's commands to the ``agent`` sub-parsers ``sub``."""
    _register_standins(sub)
    _register_fault(sub)


# -- simulate-driver, simulate-toolkit --------------------------------------------------------
def _refuse(command: str, missing: list[str]) -> NoReturn:
    """A usage error (exit 2) naming the options the command needs: where it writes."""
    raise UsageProblem(f"{command} needs {', '.join(missing)}", "it writes there")


def cmd_simulate_driver(args: argparse.Namespace) -> int:
    from gpu_operator.sim import operands

    if args.action == "install":
        return _install(args)
    if args.action == "uninstall":
        if not args.root:
            _refuse("simulate-driver uninstall", ["--root"])
        setup(args)
        removed = operands.uninstall_driver(Path(args.root))
        operands.say(f"stub driver removed from {args.root}" if removed else "no stub driver there")
        return 0
    if not args.driver_root:
        _refuse(f"simulate-driver {args.action}", ["--driver-root"])
    setup(args)
    driver_root = Path(args.driver_root)
    if args.action == "manager":
        return operands.run_manager(driver_root)
    sim_dir = Path(args.host_root) / labels.SIMULATED_GPUS_DIR.lstrip("/")
    return operands.run_driver(
        sim_dir / labels.SIMULATED_GPUS_PROFILE,
        driver_root,
        driver_version=args.driver_version or None,
    )


def _install(args: argparse.Namespace) -> int:
    """``install``: lay the stub driver out once (the testenv harness's preinstalled driver)."""
    from gpu_operator.sim import operands

    missing = [f"--{name}" for name in ("root", "spec", "seed") if not getattr(args, name)]
    if missing:
        _refuse("simulate-driver install", missing)
    setup(args)
    root = Path(args.root)
    try:
        info = operands.install_driver(
            args.spec,
            root,
            seed=args.seed,
            driver_version=args.driver_version or None,
            style=args.style,
        )
    except (operands.SimulationError, StubDriverError, ValueError) as exc:
        print(f"{operands.BANNER}: driver not installed: {exc}", file=sys.stderr)
        return 1
    operands.say(
        f"driver {info['driver_version']} installed in {root} with {info['gpus']} simulated "
        f"GPU(s) ({info['spec']})"
    )
    return 0


def cmd_simulate_toolkit(args: argparse.Namespace) -> int:
    from gpu_operator.sim import operands

    if not args.containerd_config:
        _refuse("simulate-toolkit", ["--containerd-config (env CONTAINERD_CONFIG)"])
    setup(args)  # NVML from --driver-root: the CDI spec names the driver's GPUs
    return operands.run_toolkit(
        Path(args.containerd_config),
        args.runtime_class,
        Path(args.cdi_dir) if args.cdi_dir else None,
        args.driver_root,
        args.host_driver_root,
    )


def _register_standins(sub: Any) -> None:
    p = sub.add_parser(
        "simulate-driver",
        help="SIMULATED NVIDIA driver container (testenv stand-in images only)",
        description="Lay a stub driver (real ELF libraries over a simulated NVML) out in a "
        "driver root, as NVIDIA's driver container installs the driver; testenv only.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=["init", "manager", "install", "uninstall"],
        default="init",
        help="init: install from the node's profile and hold the driver until stopped; "
        "manager: unload the previous one; install/uninstall: once, in --root",
    )
    # k8s-driver-manager's own step word (uninstall_driver); the stand-in has only that one.
    p.add_argument("step", nargs="?", help=argparse.SUPPRESS)
    p.add_argument(
        "--host-root",
        default=os.environ.get("HOST_ROOT", "/host"),
        help="where the host's / is mounted: the node's GPU profile is read from it (env "
        "HOST_ROOT; default /host)",
    )
    p.add_argument(
        "--driver-root",
        default=None,
        help=f"init/manager: the driver root to lay out or clear (the driver container's "
        f"is {labels.SIMULATED_DRIVER_ROOT}); required",
    )
    p.add_argument(
        "--driver-version",
        default=os.environ.get("DRIVER_VERSION"),
        help="the version installed (env DRIVER_VERSION, as NVIDIA's driver images set it)",
    )
    p.add_argument("--root", help="install/uninstall: the driver root to lay out or clear")
    p.add_argument("--spec", metavar="PROFILE:COUNT", help="install: the GPUs, e.g. a100-40gb:2")
    p.add_argument("--seed", metavar="NODE", help="install: what the GPU UUIDs derive from")
    p.add_argument("--style", choices=STYLES, default="ubuntu", help="install: the layout")
    p.set_defaults(func=cmd_simulate_driver)

    p = sub.add_parser(
        "simulate-toolkit",
        help="SIMULATED NVIDIA container toolkit (testenv stand-in images only)",
        description="Declare the nvidia runtime in a drop-in beside the containerd config and "
        "keep the node's CDI spec, as NVIDIA's toolkit container does; testenv only.",
    )
    p.add_argument(
        "--containerd-config",
        default=os.environ.get("CONTAINERD_CONFIG") or None,
        help="the containerd config, as mounted here: the drop-in goes into conf.d/ beside "
        "it (env CONTAINERD_CONFIG); required",
    )
    p.add_argument(
        "--runtime-class",
        default=os.environ.get("CONTAINERD_RUNTIME_CLASS", "nvidia"),
        help="the runtime's name (env CONTAINERD_RUNTIME_CLASS; default nvidia)",
    )
    p.add_argument(
        "--cdi-dir",
        default="/var/run/cdi" if os.environ.get("CDI_ENABLED") == "true" else None,
        help="where to keep the node's CDI spec for the driver (default /var/run/cdi when env "
        "CDI_ENABLED is true, else no spec)",
    )
    p.add_argument(
        "--driver-root",
        default=os.environ.get("DRIVER_ROOT_CTR_PATH") or "/driver-root",
        help="the driver root as mounted here (env DRIVER_ROOT_CTR_PATH; default /driver-root)",
    )
    p.add_argument(
        "--host-driver-root",
        default=os.environ.get("NVIDIA_DRIVER_ROOT") or "/run/nvidia/driver",
        help="the driver root on the host, named by the CDI spec (env NVIDIA_DRIVER_ROOT; "
        "default /run/nvidia/driver)",
    )
    p.set_defaults(func=cmd_simulate_toolkit)


# -- simulate-fault ----------------------------------------------------------------------------
def cmd_simulate_fault(args: argparse.Namespace) -> int:
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
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise SimulationError(f"expected a number, not {text!r}") from None


def _register_fault(sub: Any) -> None:
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
