"""The testenv's stand-in for NVIDIA's container runtime: the `nvidia` handler of a real node's
containerd (the RuntimeClass `nvidia` the rendered DaemonSets name).

NVIDIA's runtime in CDI mode is runc plus one step: a container that asks for GPUs through
``NVIDIA_VISIBLE_DEVICES`` (``all``, indexes, UUIDs) gets those devices of the node's CDI spec,
which NVIDIA's toolkit generated from the driver (here the toolkit stand-in writes it:
``/var/run/cdi/nvidia.json``), applied to its OCI spec: the spec-wide edits (the driver's
libraries, binaries, firmware, control device nodes) and each device's. This does the same on
``create``, then runs runc. A container that does not ask (unset, ``void``, ``none``) gets
nothing, nor does any container while no spec exists (no toolkit or no driver yet). A device
the spec does not have fails the container, as with NVIDIA's runtime.

Both handlers, ``runc`` too, also give what a GPU node's kernel shows every process holding
its devices (:func:`kernel_view`): the simulated GPUs' own state, MIG devices made at run time
among it, which a real kernel keeps and the stub driver keeps beside its device nodes; and to a
container given the host's ``/dev/vfio`` (KubeVirt's device plugin), the node's simulated PCI
bus where a kernel shows it (:func:`pci_view`).

Run by the containerd shim as the runtime binary, through a wrapper that `realnodes` writes:
`python -I nvidia_runtime.py [--kernel-only] RUNC ARGS...` (``--kernel-only``: the ``runc``
handler, no CDI step). Only the standard library, so each call starts fast.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

NODE_SPEC = Path("/var/run/cdi/nvidia.json")
OPT_OUT = ("", "void", "none")
# The stub driver's state beside its device nodes, and the library directories its C library
# strips to find the driver root (STUB_LIB_DIRS in the agents' stubdriver.h: keep in step;
# testenv does not import the agents).
SIM_STATE = "gpu-operator-sim"
CONTROL_DEVICE = "/dev/nvidiactl"
# The node's simulated PCI bus (labels.SIMULATED_PCI_ROOT: keep in step), and what of it a
# kernel shows in /sys and /dev; its marker file (agent.dra.vfio.SIMULATED_MARKER).
PCI_ROOT = "/var/lib/testenv-host-driver"
PCI_MARKER = "sys/bus/pci/SIMULATED"
PCI_SYSFS = ("sys/bus/pci", "sys/kernel/iommu_groups")
VFIO_DIR = "/dev/vfio"
STUB_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib",
)  # fmt: skip


class CdiError(Exception):
    """The container asked for something the node's spec cannot give."""


def requested(env: Sequence[str]) -> list[str]:
    """The devices ``NVIDIA_VISIBLE_DEVICES`` asks for; none when unset or opted out."""
    values = dict(e.split("=", 1) for e in env if "=" in e)
    value = values.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value.lower() in OPT_OUT:
        return []
    return [d.strip() for d in value.split(",") if d.strip()]


def _device(node: Mapping[str, Any]) -> dict[str, Any]:
    """An OCI device for a CDI device node, typed and numbered from the host's node."""
    host = node.get("hostPath") or node["path"]
    st = os.stat(host)
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise CdiError(f"CDI device node {host} is not a device")
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
    return {
        "path": node["path"],
        "type": kind,
        "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev),
        "fileMode": stat.S_IMODE(st.st_mode),
        "uid": 0,
        "gid": 0,
    }


def apply_edits(spec: dict[str, Any], edits: Mapping[str, Any]) -> None:
    """One CDI containerEdits into an OCI runtime spec, in place."""
    process = spec.setdefault("process", {})
    env = process.setdefault("env", [])
    for entry in edits.get("env") or []:
        key = entry.split("=", 1)[0]
        env[:] = [e for e in env if e.split("=", 1)[0] != key] + [entry]
    linux = spec.setdefault("linux", {})
    for node in edits.get("deviceNodes") or []:
        device = _device(node)
        linux.setdefault("devices", [])
        if not any(d.get("path") == device["path"] for d in linux["devices"]):
            linux["devices"].append(device)
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": device["type"], "major": device["major"],
             "minor": device["minor"], "access": "rwm"}
        )  # fmt: skip
    mounts = spec.setdefault("mounts", [])
    for mount in edits.get("mounts") or []:
        mounts[:] = [m for m in mounts if m.get("destination") != mount["containerPath"]]
        mounts.append(
            {"destination": mount["containerPath"], "type": "bind",
             "source": mount["hostPath"], "options": list(mount.get("options") or ["rbind"])}
        )  # fmt: skip
    for hook in edits.get("hooks") or []:
        entry = {k: v for k, v in hook.items() if k in ("path", "args", "env", "timeout")}
        spec.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(entry)


def inject(spec: dict[str, Any], cdi: Mapping[str, Any], names: Sequence[str]) -> None:
    """The spec-wide edits and those of each named device; CdiError for an unknown name."""
    devices = {d["name"]: d for d in cdi.get("devices") or []}
    missing = [n for n in names if n not in devices]
    if missing:
        raise CdiError(
            f"unresolvable CDI devices {cdi.get('kind')}={','.join(missing)} "
            f"(the node's spec has {', '.join(devices) or 'none'})"
        )
    apply_edits(spec, cdi.get("containerEdits") or {})
    for name in names:
        apply_edits(spec, devices[name].get("containerEdits") or {})


def driver_root_of(library: str) -> str | None:
    """The driver root a host ``libnvidia-ml`` lies under: its directory less a library
    directory, as the stub's C library finds its own."""
    directory = os.path.dirname(library)
    for suffix in STUB_LIB_DIRS:
        if directory.endswith(suffix):
            return directory[: len(directory) - len(suffix)] or "/"
    return None


def kernel_view(spec: dict[str, Any]) -> None:
    """A container given the control device and a stub driver's ``libnvidia-ml`` sees that
    driver's simulated GPU state, read-only, at ``/dev/gpu-operator-sim``: where its library
    looks, beside the device nodes, for what a kernel would tell it (the MIG devices that
    exist now, the compute policy). Other containers are left as they are."""
    devices = (spec.get("linux") or {}).get("devices") or []
    if not any(d.get("path") == CONTROL_DEVICE for d in devices):
        return
    mounts = spec.setdefault("mounts", [])
    target = f"/dev/{SIM_STATE}"
    if any(m.get("destination") == target for m in mounts):
        return
    for mount in list(mounts):
        if not os.path.basename(mount.get("destination", "")).startswith("libnvidia-ml.so"):
            continue
        root = driver_root_of(str(mount.get("source", "")))
        state = os.path.join(root, "dev", SIM_STATE) if root else None
        if state and os.path.isdir(state):
            mounts.append(
                {"destination": target, "type": "bind", "source": state,
                 "options": ["rbind", "ro", "nosuid", "noexec"]}
            )  # fmt: skip
            return


def pci_view(spec: dict[str, Any], root: str = PCI_ROOT, host: str = "/") -> None:
    """A container that binds the host's ``/dev/vfio`` looks at the GPUs' PCI functions: with
    a simulated PCI bus under ``root``, it gets that bus's ``/dev/vfio`` instead, and its
    ``/sys/bus/pci`` and ``/sys/kernel/iommu_groups`` (read-only) over the container's sysfs,
    where the ones the host's sysfs has (``host``: where that is). Others are left alone."""
    if not os.path.isfile(os.path.join(root, PCI_MARKER)):
        return
    mounts = spec.get("mounts") or []
    vfio = [m for m in mounts if m.get("type") == "bind" and m.get("source") == VFIO_DIR]
    if not vfio:
        return
    for mount in vfio:
        mount["source"] = os.path.join(root, VFIO_DIR.lstrip("/"))
    for rel in PCI_SYSFS:
        target = f"/{rel}"
        if any(m.get("destination") == target for m in mounts):
            continue
        if os.path.isdir(os.path.join(host, rel)):  # a mount point the container's sysfs has
            mounts.append(
                {"destination": target, "type": "bind", "source": os.path.join(root, rel),
                 "options": ["rbind", "ro", "nosuid", "noexec"]}
            )  # fmt: skip


def bundle_of(argv: list[str]) -> str | None:
    """The `--bundle` of a `runc ... create ...` call (the shim's other calls are passed on)."""
    if "create" not in argv:
        return None
    args = argv[argv.index("create") + 1 :]
    for i, arg in enumerate(args):
        if arg in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return "."


def main(argv: list[str]) -> None:
    cdi = argv[:1] != ["--kernel-only"]
    runc, args = (argv[0], argv[1:]) if cdi else (argv[1], argv[2:])
    bundle = bundle_of(args)
    if bundle is not None:
        config = Path(bundle, "config.json")
        spec = json.loads(config.read_text())
        names = requested(spec.get("process", {}).get("env") or []) if cdi else []
        if names and NODE_SPEC.exists():
            try:
                inject(spec, json.loads(NODE_SPEC.read_text()), names)
            except (CdiError, OSError) as exc:
                print(f"nvidia runtime (testenv): {exc}", file=sys.stderr)
                sys.exit(1)
        kernel_view(spec)
        pci_view(spec)
        config.write_text(json.dumps(spec))
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
