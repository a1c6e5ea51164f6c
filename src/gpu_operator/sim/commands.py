"""The agent commands that exist only for simulation, added to ``gpu-operator agent`` by the
command line (:mod:`gpu_operator.cli`), above both the agents and the simulation:

- ``agent simulate-driver`` and ``agent simulate-toolkit``: the SIMULATED stand-ins for NVIDIA's
  driver and container-toolkit images (testenv only; :mod:`gpu_operator.sim.operands`). Each
  writes into the host it runs on, so none has a default for where it writes: run by hand
  without its target paths, it refuses with a usage error (exit 2) rather than lay a stub driver
  into /run/nvidia/driver or a containerd drop-in into /etc/containerd. The stand-in images pass
  them.
- ``agent simulate-vfio-manager``, ``simulate-sandbox-validator`` and
  ``simulate-sandbox-device-plugin``: the SIMULATED stand-ins for NVIDIA's VFIO manager, its
  sandbox validator's vfio-pci check and KubeVirt's GPU device plugin
  (:mod:`gpu_operator.sim.sandbox`), on the simulated PCI bus under ``--pci-root``, which none
  defaults either (the stand-in images pass it).
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
    _register_sandbox(sub)
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
            pci=args.pci,
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
    p.add_argument(
        "--pci",
        action="store_true",
        help="install: also the GPUs' PCI bus (sysfs, /dev/vfio) in --root, for passthrough",
    )
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


# -- simulate-vfio-manager, simulate-sandbox-validator, simulate-sandbox-device-plugin -------
def _pci(command: str, args: argparse.Namespace) -> tuple[Any, Path]:
    """The simulated PCI bus under ``--pci-root`` (refused without one: it writes there)."""
    from gpu_operator.agent.dra.vfio import SIMULATED_MARKER, pci_bus

    if not args.pci_root:
        _refuse(command, ["--pci-root"])
    root = Path(args.pci_root)
    if not (root / SIMULATED_MARKER).exists():
        raise UsageProblem(
            f"{command} acts on a simulated PCI bus only",
            f"{root / SIMULATED_MARKER} is missing: the stub driver lays the bus out",
        )
    return pci_bus(root), root


def cmd_simulate_vfio_manager(args: argparse.Namespace) -> int:
    from gpu_operator.sim import sandbox

    if not args.all:
        raise UsageProblem("vfio-manage stand-in: only --all is simulated", "give --all")
    bus, root = _pci("simulate-vfio-manager", args)
    setup(args)
    return sandbox.run_vfio_manage(bus, args.action, root / "dev")


def cmd_simulate_sandbox_validator(args: argparse.Namespace) -> int:
    from gpu_operator import kube
    from gpu_operator.sim import sandbox

    # Only the vfio-pci check reads the bus (its init container alone mounts the host root).
    bus = _pci("simulate-sandbox-validator", args)[0] if args.component == "vfio-pci" else None
    setup(args)
    workload = args.workload
    if not workload:
        if not args.node_name:
            raise UsageProblem("the validator reads the node's workload config", "set NODE_NAME")
        node = kube.connect().get("Node", args.node_name) or {}
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        workload = node_labels.get(labels.WORKLOAD_CONFIG) or args.default_workload
    return sandbox.run_validator(
        args.component, workload, Path(args.output_dir), bus, wait=args.wait
    )


def cmd_simulate_sandbox_device_plugin(args: argparse.Namespace) -> int:
    from gpu_operator.agent.dra.vfio import pci_bus
    from gpu_operator.sim import sandbox

    setup(args)
    root = Path(args.sysfs_root)
    return sandbox.run_device_plugin(pci_bus(root), root, Path(args.socket_dir), args.host_dev_root)


def _add_pci_root(p: Any, what: str) -> None:
    p.add_argument(
        "--pci-root",
        default=os.environ.get("SIMULATED_PCI_ROOT") or None,
        help=f"where the simulated PCI bus (sys/bus/pci, dev/vfio) is, as mounted here: {what} "
        "(env SIMULATED_PCI_ROOT); required",
    )


def _register_sandbox(sub: Any) -> None:
    p = sub.add_parser(
        "simulate-vfio-manager",
        help="SIMULATED NVIDIA VFIO manager, vfio-manage (testenv stand-in images only)",
        description="Bind every NVIDIA GPU of the simulated PCI bus to vfio-pci, or hand them "
        "back to nvidia, as NVIDIA's vfio-manage does on a vm-passthrough node; testenv only.",
    )
    p.add_argument(
        "action",
        choices=["bind", "unbind"],
        help="bind: every NVIDIA GPU to vfio-pci; unbind: those on vfio-pci back to nvidia",
    )
    p.add_argument("--all", action="store_true", help="every NVIDIA GPU (the only choice here)")
    _add_pci_root(p, "its drivers' bind and unbind files are written")
    p.set_defaults(func=cmd_simulate_vfio_manager)

    p = sub.add_parser(
        "simulate-sandbox-validator",
        help="SIMULATED NVIDIA sandbox validator, nvidia-validator (testenv stand-in images only)",
        description="Write the node's workload type and, on a vm-passthrough node, "
        "vfio-pci-ready once every GPU is on vfio-pci; testenv only.",
    )
    p.add_argument(
        "--component",
        default=os.environ.get("COMPONENT", ""),
        help="vfio-pci, vgpu-manager or vgpu-devices (env COMPONENT)",
    )
    p.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("WITH_WAIT", "").lower() == "true",
        help="look again until the GPUs are ready (env WITH_WAIT=true)",
    )
    p.add_argument(
        "--output-dir",
        default=os.environ.get("OUTPUT_DIR") or "/run/nvidia/validations",
        help="where the status files go (default /run/nvidia/validations)",
    )
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="env NODE_NAME")
    p.add_argument("--workload", default=None, help="the node's workload config (default: its "
                   f"{labels.WORKLOAD_CONFIG} label, read through the API)")  # fmt: skip
    p.add_argument(
        "--default-workload",
        default=os.environ.get("DEFAULT_GPU_WORKLOAD_CONFIG") or "container",
        help="when the node has no such label (env DEFAULT_GPU_WORKLOAD_CONFIG)",
    )
    _add_pci_root(p, "read only, by the vfio-pci component")
    p.set_defaults(func=cmd_simulate_sandbox_validator)

    p = sub.add_parser(
        "simulate-sandbox-device-plugin",
        help="SIMULATED KubeVirt GPU device plugin (testenv stand-in images only)",
        description="Advertise the GPUs on vfio-pci to the kubelet as nvidia.com/<PCI device "
        "name>, as KubeVirt's GPU device plugin does; testenv only.",
    )
    p.add_argument(
        "--sysfs-root",
        default="/",
        help="where /sys shows the PCI bus (default /: the testenv's runtime shows the "
        "simulated one there to a container given the node's /dev/vfio)",
    )
    p.add_argument(
        "--host-dev-root",
        default="/",
        help="where the node keeps /dev/vfio, as the kubelet sees it (default /)",
    )
    p.add_argument(
        "--socket-dir",
        default="/var/lib/kubelet/device-plugins",
        help="the kubelet's device-plugin directory (default /var/lib/kubelet/device-plugins)",
    )
    p.set_defaults(func=cmd_simulate_sandbox_device_plugin)


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
