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

Run by the containerd shim as the runtime binary, through a two-line wrapper that
`realnodes` writes: `python -I nvidia_runtime.py RUNC ARGS...`. Only the standard library, so
each call starts fast.
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
    runc, args = argv[0], argv[1:]
    bundle = bundle_of(args)
    if bundle is not None:
        config = Path(bundle, "config.json")
        spec = json.loads(config.read_text())
        names = requested(spec.get("process", {}).get("env") or [])
        if names and NODE_SPEC.exists():
            try:
                inject(spec, json.loads(NODE_SPEC.read_text()), names)
            except (CdiError, OSError) as exc:
                print(f"nvidia runtime (testenv): {exc}", file=sys.stderr)
                sys.exit(1)
            config.write_text(json.dumps(spec))
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
