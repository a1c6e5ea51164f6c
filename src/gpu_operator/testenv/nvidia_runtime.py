"""The testenv's stand-in for NVIDIA's container runtime: the `nvidia` handler of a real node's
containerd (the RuntimeClass `nvidia` the rendered DaemonSets name).

NVIDIA's runtime is runc plus a step that hands a container the driver's NVML from the driver
root. This one is runc plus the same step for the simulated driver: on `create` it reads the
descriptor the SIMULATED driver left in the node's driver root and adds its environment
(GPU_OPERATOR_SIMULATE...) and the node's simulated-GPU directory (the shared MIG state) to the
container's OCI spec, then runs runc. Without a driver there is nothing to add, as with a real
node whose driver is not loaded; `NVIDIA_VISIBLE_DEVICES=void` or `none` opts a container out.

Run by the containerd shim as the runtime binary, through a two-line wrapper that
`realnodes` writes: `python -I nvidia_runtime.py RUNC ARGS...`. Only the standard library and
`gpu_operator.labels`, so each call starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from gpu_operator import labels

OPT_OUT = ("void", "none")


def descriptor_env(driver_root: Path) -> list[str]:
    """`KEY=value` lines of the simulated driver's descriptor; none without a driver."""
    try:
        text = (driver_root / labels.SIMULATED_NVML_DESCRIPTOR).read_text()
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if "=" in line and line.strip()[0] != "#"]


def patch_spec(spec: dict[str, Any], env: list[str], sim_dir: str) -> bool:
    """Add the simulated NVML to an OCI runtime spec in place; False when it is left alone."""
    process = spec.setdefault("process", {})
    current = process.setdefault("env", [])
    values = dict(e.split("=", 1) for e in current if "=" in e)
    if not env or values.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower() in OPT_OUT:
        return False
    keys = {e.split("=", 1)[0] for e in env}
    process["env"] = [e for e in current if e.split("=", 1)[0] not in keys] + env
    mounts = spec.setdefault("mounts", [])
    if not any(m.get("destination") == sim_dir for m in mounts):
        mounts.append(
            {"destination": sim_dir, "type": "bind", "source": sim_dir,
             "options": ["rbind", "rw", "nosuid", "nodev"]}
        )  # fmt: skip
    return True


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
        env = descriptor_env(Path(labels.SIMULATED_DRIVER_ROOT))
        if patch_spec(spec, env, labels.SIMULATED_GPUS_DIR):
            config.write_text(json.dumps(spec))
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
