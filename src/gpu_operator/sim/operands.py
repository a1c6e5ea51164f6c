"""SIMULATED stand-ins for NVIDIA's driver and container-toolkit containers.

Only the testenv's and demo's stand-in images (`make standins`) run these, as the entrypoints of
images named like NVIDIA's; nothing in a real deployment selects them. They leave on the node
what the real containers leave, so every agent runs unmodified and gets the driver the way it
would on a GPU node:

- the driver (`nvidia-driver init`): a driver root (`/run/nvidia/driver`) laid out like a real
  driver's, with the stub driver (:mod:`gpu_operator.sim.stubdriver`): `libnvidia-ml.so.1`,
  `libcuda.so.1` and the rest of NVIDIA's libraries as real ELF files carrying the node's GPU
  table, `nvidia-smi`, GSP firmware, and the device nodes under the root's `dev/`; made from
  the GPU profile the harness wrote on the node, and taken away again when the container stops
  (but the device nodes and the GPUs' MIG state, which a real node keeps too). The same layout
  serves a "preinstalled" host driver (`install-host`), which testenv lays out itself.
- the toolkit: the `nvidia` runtime declared in the node's containerd config drop-in (what the
  validator's toolkit check reads) and, as NVIDIA's toolkit does with CDI on, the node's CDI
  spec for the driver in `/var/run/cdi/nvidia.json`, from which the testenv's `nvidia` runtime
  (testenv/nvidia_runtime.py) hands containers that ask for GPUs by NVIDIA_VISIBLE_DEVICES
  their devices and the driver's files. The spec also hands them the simulated GPUs' state
  directory, the one thing a real GPU keeps in hardware.

Every line they print starts with SIMULATED.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from gpu_operator.agent.driver_cdi import discover_host_driver, generate_spec
from gpu_operator.agent.driverroot import DriverNotFound
from gpu_operator.agent.nvml import Nvml, NvmlError
from gpu_operator.sim.nvml import DEFAULT_CUDA, SIM_STATE, build_simulated_nvml
from gpu_operator.sim.stubdriver import StubGpu, lay_out, remove, replace_file
from gpu_operator.sim.stubdriver.libraries import Style
from gpu_operator.stopping import stop_on_signals, wait_until

BANNER = "SIMULATED"
TOOLKIT_DROP_IN = "99-nvidia-simulated.toml"
MANIFEST = ".gpu-operator-stub-files.json"  # what the install laid out, for the uninstall
CDI_SPEC = "nvidia.json"
# The stub artefacts inside the stand-in images (no compiler there); elsewhere they are built.
ENV_ARTEFACTS = "GPU_OPERATOR_STUB_ARTEFACTS"


def say(message: str) -> None:
    print(f"{BANNER}: {message}", flush=True)


class SimulationError(RuntimeError):
    """The simulated operand cannot do its job; the message says what is missing."""


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


def _artefacts() -> Path | None:
    value = os.environ.get(ENV_ARTEFACTS)
    return Path(value) if value else None


def install_driver(
    spec: str,
    driver_root: Path,
    *,
    seed: str,
    driver_version: str | None = None,
    style: Style = "ubuntu",
    pci: bool = False,
) -> dict[str, str]:
    """Lay out the stub driver for the GPUs of ``spec`` in ``driver_root`` (``pci``: and the
    node's PCI bus beside it, :mod:`gpu_operator.sim.pci`, as the harness does on real nodes).

    The NVML is built first, so a bad profile fails the driver container (as a driver that
    cannot load would), and the GPUs' MIG state file is made beside the device nodes.
    ``seed``: what the GPU UUIDs derive from (the node's name). ``driver_version``: the version
    this image installs (NVIDIA's driver images say it in DRIVER_VERSION); None: the default."""
    sim = build_simulated_nvml(
        spec,
        state_file=driver_root / "dev" / SIM_STATE,
        seed=seed,
        driver_version=driver_version,
    )
    gpus = [
        StubGpu(g.index, g.uuid, g.model.name, g.model.memory_mib, g.pci_bus_id)
        for g in sim.node.gpus
    ]
    version = sim.node.driver_version
    created = lay_out(
        driver_root,
        version=version,
        cuda_version=sim.node.cuda_version or DEFAULT_CUDA,
        gpus=gpus,
        style=style,
        artefacts=_artefacts(),
        simulate=spec,
        seed=seed,
        pci=pci,
        imex_channels=1 if any(g.fabric is not None for g in sim.node.gpus) else 0,
    )
    # Whole or absent: the manifest's presence is what says the install is done.
    replace_file(driver_root / MANIFEST, json.dumps(created).encode(), 0o644)
    return {"spec": spec, "driver_version": version, "gpus": str(len(gpus))}


def uninstall_driver(driver_root: Path) -> bool:
    """Take away what :func:`install_driver` laid out; False when nothing was there."""
    manifest = driver_root / MANIFEST
    try:
        created = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    remove(driver_root, created)
    manifest.unlink(missing_ok=True)
    return True


def run_manager(driver_root: Path) -> int:
    """k8s-driver-manager's `uninstall_driver` before a driver pod starts: the real one evicts
    the node's GPU pods and unloads the old kernel modules; here the operator has already
    drained the node (its upgrade controller), so unloading is taking the old files away."""
    say("k8s-driver-manager stand-in from the gpu-operator image")
    loaded = uninstall_driver(driver_root)
    say("previous driver 'unloaded'" if loaded else "no driver loaded; nothing to unload")
    return 0


def run_driver(
    profile_file: Path,
    driver_root: Path,
    stop: threading.Event | None = None,
    driver_version: str | None = None,
) -> int:
    """`nvidia-driver init`: install, then hold the driver until told to stop (SIGTERM)."""
    stop = stop_on_signals(stop)
    say("NVIDIA driver stand-in from the gpu-operator image; no kernel module is loaded")
    seed = os.environ.get("NODE_NAME") or os.uname().nodename
    try:
        info = install_driver(
            read_profile(profile_file), driver_root, seed=seed, driver_version=driver_version
        )
    except (SimulationError, ValueError) as exc:
        say(f"driver not installed: {exc}")
        return 1
    say(
        f"driver {info['driver_version']} 'installed' with {info['gpus']} simulated GPU(s) "
        f"({info['spec']}); stub driver root {driver_root}"
    )
    wait_until(stop)
    uninstall_driver(driver_root)
    say("driver 'unloaded'")
    return 0


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


def node_cdi_spec(driver_root: str, host_driver_root: str) -> dict[str, object] | None:
    """The node's spec, as NVIDIA's toolkit generates it with CDI on, plus the simulated GPUs'
    state directory (their hardware); None while no driver is installed, or while its install
    is still laying files out (its manifest comes last): a spec read from half a driver would
    miss devices, as NVIDIA's toolkit waits for the driver container's ready mark."""
    if not (Path(driver_root) / MANIFEST).is_file():
        return None
    try:
        driver = discover_host_driver(driver_root, host_driver_root)
    except DriverNotFound:  # no driver yet: the toolkit tries again
        return None
    with Nvml() as nvml:
        inventory = nvml.inventory()
    spec = generate_spec(driver, inventory)
    state = os.path.dirname(f"/dev/{SIM_STATE}")
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    edits.setdefault("mounts", []).append(
        {
            "hostPath": driver.host_dev(state),
            "containerPath": state,
            "options": ["rbind", "rw", "nosuid", "nodev"],
        }
    )
    return spec


def run_toolkit(
    config_file: Path,
    runtime: str,
    cdi_dir: Path | None = None,
    driver_root: str = "/driver-root",
    host_driver_root: str = "/run/nvidia/driver",
    stop: threading.Event | None = None,
    interval_s: float = 2.0,
) -> int:
    """The toolkit stand-in: declare the runtime in a drop-in beside the containerd config and
    keep the node's CDI spec in step with the driver (written once the driver is there,
    rewritten when it changes); stay up until told to undo it all."""
    stop = stop_on_signals(stop)
    say("NVIDIA container toolkit stand-in from the gpu-operator image")
    drop_in = config_file.parent / "conf.d" / TOOLKIT_DROP_IN
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    # Whole or absent (a reader polls for it); the temporary's name is no conf.d/*.toml.
    text = toolkit_drop_in(runtime, "/usr/local/nvidia/toolkit/nvidia-container-runtime")
    replace_file(drop_in, text.encode(), 0o644)
    say(f"runtime {runtime!r} declared in {drop_in}")
    written = ""
    while True:
        if cdi_dir is not None:
            written = _write_cdi_spec(cdi_dir, driver_root, host_driver_root, written)
        if stop.wait(interval_s):
            break
    drop_in.unlink(missing_ok=True)
    if cdi_dir is not None:
        (cdi_dir / CDI_SPEC).unlink(missing_ok=True)
    say(f"runtime {runtime!r} removed from {drop_in.parent}")
    return 0


def _write_cdi_spec(cdi_dir: Path, driver_root: str, host_driver_root: str, last: str) -> str:
    try:
        spec = node_cdi_spec(driver_root, host_driver_root)
    except NvmlError as exc:  # the driver half-installed: the next round tries again
        say(f"CDI spec not written yet: {exc}")
        return last
    text = json.dumps(spec, indent=2, sort_keys=True) + "\n" if spec else ""
    if text == last:
        return last
    path = cdi_dir / CDI_SPEC
    if text:
        cdi_dir.mkdir(parents=True, exist_ok=True)
        replace_file(path, text.encode(), 0o644)
        say(f"CDI spec for the driver written to {path}")
    else:
        path.unlink(missing_ok=True)
    return text
