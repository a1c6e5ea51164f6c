"""``agent cdi generate`` (what ``nvidia-ctk cdi generate`` writes) and ``agent cdi list`` (the
driver a driver root holds, for humans): both about a driver root, never simulated GPUs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_operator.agent.cli.common import add_driver_root, setup
from gpu_operator.formats import structured

if TYPE_CHECKING:
    from gpu_operator.agent.driver_cdi import HostDriver


def _discover(args: argparse.Namespace) -> HostDriver:
    """The driver under ``--driver-root``; DriverNotFound, saying where it looked, when there
    is none."""
    from gpu_operator.agent.driver_cdi import discover_host_driver

    setup(args)
    return discover_host_driver(args.driver_root, args.host_driver_root or args.driver_root)


def cmd_generate(args: argparse.Namespace) -> int:
    from gpu_operator.agent.driver_cdi import generate_spec
    from gpu_operator.agent.nvml import Nvml, NvmlError

    driver = _discover(args)
    try:
        with Nvml() as nvml:
            inventory = nvml.inventory()
    except NvmlError as exc:
        inventory = None
        print(f"NVML unavailable, the GPUs are the device nodes found: {exc}", file=sys.stderr)
    spec = generate_spec(driver, inventory, kind=args.kind)
    target = args.output_file if args.output_file != "-" else None
    fmt = args.output or ("json" if str(target or "").endswith(".json") else "yaml")
    text = structured(spec, fmt)  # edits shared between devices print without YAML anchors
    if target is None:
        sys.stdout.write(text)
        return 0
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a runtime reading the directory never sees half a spec
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from gpu_operator.agent.driverroot import dev_root_of

    driver = _discover(args)
    if driver.files is None:
        return 1
    files, devices = driver.files, driver.devices
    width = max((len(lib.soname or "") for lib in files.libraries), default=0)
    lines = [
        f"driver {files.version} under {files.root}",
        f"library dir: {files.library_dir}",
        f"libraries ({len(files.libraries)}):",
        *(
            f"  {lib.soname.ljust(width)}  {lib.path}" if lib.soname else f"  {lib.path}"
            for lib in files.libraries
        ),
        f"binaries ({len(files.binaries)}):",
        *(f"  {os.path.basename(path).ljust(width)}  {path}" for path in files.binaries),
        f"firmware ({len(files.firmware)}):",
        *(f"  {path}" for path in files.firmware),
        f"ipc ({len(files.ipc)}):",
        *(f"  {path}" for path in files.ipc),
        f"hook: {files.hook or 'none (the spec mounts libraries at their sonames instead)'}",
    ]
    if dev_root_of(args.driver_root) is None:
        lines.append(
            f"device nodes: none (no dev/nvidiactl in / or {args.driver_root}: no driver loaded)"
        )
    else:
        gpus = " ".join(devices.gpus.values()) or "none"
        lines += [
            f"device nodes (under {devices.dev_root}):",
            f"  GPUs: {gpus}",
            f"  control: {' '.join(devices.control) or 'none'}",
            f"  MIG capability nodes: {len(devices.caps)}",
        ]
    print("\n".join(lines))
    return 0


def _add_roots(p: argparse.ArgumentParser) -> None:
    add_driver_root(p)
    p.add_argument(
        "--host-driver-root",
        metavar="DIR",
        default=None,
        help="where the driver root is on the host: the hostPath side of the spec (default: "
        "the same as --driver-root)",
    )


def register(sub: Any) -> None:
    cdi = sub.add_parser(
        "cdi",
        help="the driver root's CDI spec, as nvidia-ctk cdi generates it",
        description="The driver root as CDI sees it (never simulated GPUs).",
    )
    cdi_sub = cdi.add_subparsers(dest="cdi_command", required=True, metavar="COMMAND")

    p = cdi_sub.add_parser(
        "generate",
        help="the node's CDI spec: every GPU, MIG device, 'all'",
        description="The CDI spec nvidia-ctk cdi generate writes for the driver root: a device "
        "per GPU and MIG device, and 'all'.",
    )
    _add_roots(p)
    p.add_argument("--kind", default="nvidia.com/gpu", help="the spec's kind (nvidia.com/gpu)")
    p.add_argument(
        "--output-file",
        metavar="FILE",
        default=None,
        help="write the spec to FILE, whole or not at all (default: stdout)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default=None,
        help="output format: yaml or json (default: json for a --output-file ending in "
        ".json, else yaml)",
    )
    p.set_defaults(func=cmd_generate)

    p = cdi_sub.add_parser(
        "list",
        help="what the driver root offers containers, as plain text",
        description="The driver's libraries, binaries, firmware and device nodes under the "
        "driver root, as the CDI spec would mount them.",
    )
    _add_roots(p)
    p.set_defaults(func=cmd_list)
