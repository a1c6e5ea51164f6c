"""SIMULATED stand-ins for NVIDIA's driver and container-toolkit containers.

Only the testenv's and demo's stand-in images (`make standins`) run these, as the entrypoints of
images named like NVIDIA's; nothing in a real deployment selects them. They leave on the node
what the real containers leave for the rest of the stack, so every agent of the project's own
image runs unmodified:

- the driver (`nvidia-driver init`): the driver root (`/run/nvidia/driver`) with a descriptor
  of the node's simulated NVML (what the node's `nvidia` runtime hands to containers, as the
  real runtime hands them `libnvidia-ml.so.1` from that root), made from the GPU profile the
  harness wrote on the node; removed again when the container stops, like an unloaded driver.
- `nvidia-smi` (the driver's startup probe): the simulated GPUs, or failure without a driver.
- the toolkit: the `nvidia` runtime declared in the node's containerd config drop-in, which is
  what the validator's toolkit check reads.

Every line they print starts with SIMULATED.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from gpu_operator import labels
from gpu_operator.agent.simnvml import (
    ENV_DRIVER,
    ENV_SEED,
    ENV_SIMULATE,
    ENV_STATE,
    build_simulated_nvml,
)

BANNER = "SIMULATED"
TOOLKIT_DROP_IN = "99-nvidia-simulated.toml"


def say(message: str) -> None:
    print(f"{BANNER}: {message}", flush=True)


class SimulationError(RuntimeError):
    """The simulated operand cannot do its job; the message says what is missing."""


def descriptor_text(spec: str, state_file: str, seed: str, driver_version: str) -> str:
    """`KEY=value` lines: the environment a container needs for the node's simulated NVML (the
    seed makes every container on the node see the same GPU UUIDs, as on a real machine; the
    driver version is the one installed, which NVML reports)."""
    return (
        f"{ENV_SIMULATE}={spec}\n{ENV_STATE}={state_file}\n{ENV_SEED}={seed}\n"
        f"{ENV_DRIVER}={driver_version}\n"
    )


def parse_descriptor(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            env[key] = value
    return env


def read_profile(path: Path) -> str:
    """The node's simulated GPUs (`a100-40gb:8`), as the testenv harness wrote them."""
    try:
        spec = path.read_text().strip()
    except OSError as exc:
        raise SimulationError(
            f"no simulated GPU profile at {path} ({exc.strerror}): the SIMULATED driver runs "
            "only on testenv real nodes (hack/testenv up --real-nodes N)"
        ) from exc
    if not spec:
        raise SimulationError(f"{path} is empty: expected a profile such as a100-40gb:8")
    return spec


def install_driver(
    profile_file: Path, driver_root: Path, sim_dir: Path, driver_version: str | None = None
) -> dict[str, str]:
    """Lay out the driver root: the simulated NVML's descriptor and a README saying what it is.

    The NVML is built once here, so a bad profile fails the driver container (as a driver that
    cannot load would), and the MIG state file the node's agents share is created.
    ``driver_version``: the version this image installs (NVIDIA's driver images say it in
    DRIVER_VERSION; the stand-ins too); None: the simulation's default."""
    spec = read_profile(profile_file)
    state_file = f"{labels.SIMULATED_GPUS_DIR}/{labels.SIMULATED_NVML_STATE}"
    # The state file as this container sees it (sim_dir is the node's SIMULATED_GPUS_DIR).
    seed = os.environ.get("NODE_NAME") or os.uname().nodename
    sim = build_simulated_nvml(
        spec,
        state_file=sim_dir / labels.SIMULATED_NVML_STATE,
        seed=seed,
        driver_version=driver_version,
    )
    driver_root.mkdir(parents=True, exist_ok=True)
    (driver_root / "README.SIMULATED").write_text(
        "SIMULATED NVIDIA driver root (gpu-operator testenv): no kernel module, no libraries;\n"
        f"NVML is simulated from {labels.SIMULATED_NVML_DESCRIPTOR}.\n"
    )
    descriptor = driver_root / labels.SIMULATED_NVML_DESCRIPTOR
    tmp = descriptor.with_name(descriptor.name + ".tmp")
    version = sim.node.driver_version
    tmp.write_text(descriptor_text(spec, state_file, seed, version))
    tmp.replace(descriptor)
    return {"spec": spec, "driver_version": version, "gpus": str(len(sim.node.gpus))}


def uninstall_driver(driver_root: Path) -> None:
    (driver_root / labels.SIMULATED_NVML_DESCRIPTOR).unlink(missing_ok=True)


def run_manager(driver_root: Path) -> int:
    """k8s-driver-manager's `uninstall_driver` before a driver pod starts: the real one evicts
    the node's GPU pods and unloads the old kernel modules; here the operator has already
    drained the node (its upgrade controller), so unloading is forgetting the old descriptor."""
    say("k8s-driver-manager stand-in from the gpu-operator image")
    loaded = (driver_root / labels.SIMULATED_NVML_DESCRIPTOR).exists()
    uninstall_driver(driver_root)
    say("previous driver 'unloaded'" if loaded else "no driver loaded; nothing to unload")
    return 0


def run_driver(
    profile_file: Path,
    driver_root: Path,
    sim_dir: Path,
    stop: threading.Event | None = None,
    driver_version: str | None = None,
) -> int:
    """`nvidia-driver init`: install, then hold the driver until told to stop (SIGTERM)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    say("NVIDIA driver stand-in from the gpu-operator image; no kernel module is loaded")
    try:
        info = install_driver(profile_file, driver_root, sim_dir, driver_version)
    except SimulationError as exc:
        say(f"driver not installed: {exc}")
        return 1
    say(
        f"driver {info['driver_version']} 'installed' with {info['gpus']} simulated GPU(s) "
        f"({info['spec']}); driver root {driver_root}"
    )
    stop.wait()
    uninstall_driver(driver_root)
    say("driver 'unloaded'")
    return 0


def load_descriptor(driver_root: Path) -> dict[str, str]:
    path = driver_root / labels.SIMULATED_NVML_DESCRIPTOR
    try:
        return parse_descriptor(path.read_text())
    except OSError as exc:
        raise SimulationError(f"no driver: {path} missing ({exc.strerror})") from exc


def smi_lines(env: Mapping[str, str], state_dir: Path) -> list[str]:
    """What `nvidia-smi -L` prints, for the simulated GPUs of the descriptor."""
    sim = build_simulated_nvml(
        env[ENV_SIMULATE],
        state_file=state_dir / labels.SIMULATED_NVML_STATE,
        seed=env.get(ENV_SEED),
        driver_version=env.get(ENV_DRIVER),
    )
    return [f"GPU {g.index}: {g.model.name} (UUID: {g.uuid})" for g in sim.node.gpus]


def toolkit_drop_in(runtime: str, handler_binary: str) -> str:
    """A containerd config drop-in naming the `nvidia` runtime, as NVIDIA's toolkit writes."""
    table = 'plugins."io.containerd.cri.v1.runtime".containerd.runtimes'
    return (
        "# SIMULATED container toolkit (gpu-operator testenv)\n"
        "version = 3\n"
        f"[{table}.{runtime}]\n"
        'runtime_type = "io.containerd.runc.v2"\n'
        f"[{table}.{runtime}.options]\n"
        f'BinaryName = "{handler_binary}"\n'
    )


def run_toolkit(config_file: Path, runtime: str, stop: threading.Event | None = None) -> int:
    """The toolkit stand-in: declare the runtime in a drop-in beside the containerd config,
    then stay up (NVIDIA's toolkit container runs until it is told to undo its changes)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    say("NVIDIA container toolkit stand-in from the gpu-operator image")
    drop_in = config_file.parent / "conf.d" / TOOLKIT_DROP_IN
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(
        toolkit_drop_in(runtime, "/usr/local/nvidia/toolkit/nvidia-container-runtime")
    )
    say(f"runtime {runtime!r} declared in {drop_in}")
    stop.wait()
    drop_in.unlink(missing_ok=True)
    say(f"runtime {runtime!r} removed from {drop_in.parent}")
    return 0


def main_smi(driver_root: Path, state_dir: Path) -> int:
    try:
        env = load_descriptor(driver_root)
        lines = smi_lines(env, state_dir)
    except (SimulationError, KeyError) as exc:
        print(f"{BANNER}: NVIDIA-SMI has failed: {exc}", file=sys.stderr)
        return 9
    for line in lines:
        say(line)
    return 0
