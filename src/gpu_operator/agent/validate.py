"""The operator validator: is this node's GPU stack usable, step by step?

Checks run in dependency order (driver, toolkit, cuda, plugin); each one that passes writes
NVIDIA's status file ``/run/nvidia/validations/<name>-ready``, which other operands wait for.
When all pass, :data:`READY_MARKER` is written; the validator pod's readiness probe tests that
file, so the pod turns Ready exactly when the node is validated. A check that fails (or later
regresses) removes its file, the marker and every later file, and the loop tries again.

The ``cuda`` check is NVML-level (CUDA driver API version reported, every GPU has a compute
capability): NVIDIA runs a vectorAdd pod for it, which needs a real GPU. It also needs
``/dev/nvidia-uvm``: without the nvidia-uvm module every CUDA program fails although the driver
answers NVML (NVIDIA issue 2685), so the device node must exist, be a character device and open.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator.agent.driverready import DriverLocation
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nodeapi import NodeView
from gpu_operator.agent.nvml import NvmlError
from gpu_operator.labels import DEPLOY_PREFIX

log = logging.getLogger(__name__)

VALIDATIONS_DIR = Path("/run/nvidia/validations")
READY_MARKER = ".ready"  # readiness probe: test -f /run/nvidia/validations/.ready
READY_MARKER_PATH = VALIDATIONS_DIR / READY_MARKER
COMPONENTS = ("driver", "toolkit", "cuda", "plugin")
RUNTIME_CONFIGS = (
    "/etc/containerd/config.toml",
    "/etc/containerd/conf.d/*.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/etc/crio/crio.conf",
    "/etc/crio/crio.conf.d/*",
)
RUNTIME_NAME = "nvidia"
UVM_DEVICE = Path("/dev/nvidia-uvm")
DEVICE_PLUGIN_DEPLOY = DEPLOY_PREFIX + "device-plugin"


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    message: str


def status_file(name: str) -> str:
    return f"{name}-ready"


# -- the checks (pure over what was read) --------------------------------------------------------
def check_driver(inventory: Inventory | None, error: str = "") -> CheckResult:
    if inventory is None:
        return CheckResult("driver", False, f"NVML unavailable: {error}")
    if not inventory.gpus:
        return CheckResult("driver", False, f"driver {inventory.driver_version} sees no GPU")
    return CheckResult(
        "driver", True, f"driver {inventory.driver_version}, {len(inventory.gpus)} GPU(s)"
    )


def _has_runtime(tree: Any, name: str) -> bool:
    """A ``runtimes`` table anywhere in the TOML tree with an entry called ``name``."""
    if isinstance(tree, Mapping):
        runtimes = tree.get("runtimes")
        if isinstance(runtimes, Mapping) and name in runtimes:
            return True
        return any(_has_runtime(v, name) for v in tree.values())
    return False


def runtime_configured(text: str, name: str = RUNTIME_NAME) -> bool:
    """containerd (``...containerd.runtimes.nvidia``) or CRI-O
    (``crio.runtime.runtimes.nvidia``)."""
    try:
        return _has_runtime(tomllib.loads(text), name)
    except tomllib.TOMLDecodeError:
        return False


def check_toolkit(files: Iterable[tuple[Path, str]], name: str = RUNTIME_NAME) -> CheckResult:
    seen = []
    for path, text in files:
        seen.append(str(path))
        if runtime_configured(text, name):
            return CheckResult("toolkit", True, f"runtime {name!r} configured in {path}")
    where = ", ".join(seen) or "no container runtime config found"
    return CheckResult("toolkit", False, f"runtime {name!r} not configured ({where})")


def check_cuda(inventory: Inventory | None) -> CheckResult:
    if inventory is None or inventory.cuda_driver_version <= 0:
        return CheckResult("cuda", False, "the driver reports no CUDA version")
    missing = [g.index for g in inventory.gpus if g.compute_major <= 0]
    if missing:
        return CheckResult("cuda", False, f"GPUs without a compute capability: {missing}")
    return CheckResult(
        "cuda", True, f"CUDA {inventory.cuda_major}.{inventory.cuda_minor} driver API"
    )


def check_uvm(device: Path) -> CheckResult:
    """``device`` exists, is a character device and opens read-write (what CUDA does)."""
    try:
        mode = device.stat().st_mode
    except OSError as exc:
        return CheckResult(
            "cuda",
            False,
            f"{device} missing ({exc.strerror}): load nvidia-uvm (nvidia-modprobe -u)",
        )
    if not stat.S_ISCHR(mode):
        return CheckResult("cuda", False, f"{device} is not a character device")
    try:
        os.close(os.open(device, os.O_RDWR))
    except OSError as exc:
        return CheckResult("cuda", False, f"{device} cannot be opened: {exc.strerror}")
    return CheckResult("cuda", True, f"{device} usable")


def gpu_resources(node: NodeView) -> dict[str, int]:
    """GPU extended resources the Node advertises (allocatable, else capacity)."""
    source = node.allocatable or node.capacity
    found = {}
    for key, value in source.items():
        if key == "nvidia.com/gpu" or key.startswith(("nvidia.com/mig-", "nvidia.com/gpu.")):
            try:
                count = int(value)
            except ValueError:
                continue
            if count > 0:
                found[key] = count
    return found


def check_plugin(node: NodeView | None, error: str = "") -> CheckResult:
    if node is None:
        return CheckResult("plugin", False, f"cannot read the Node: {error}")
    if node.labels.get(DEVICE_PLUGIN_DEPLOY, "").lower() == "false":
        # No device plugin here (opted out, or the node's GPUs are DRA's): nothing to advertise
        return CheckResult("plugin", True, f"no device plugin on node {node.name}: not checked")
    resources = gpu_resources(node)
    if not resources:
        return CheckResult(
            "plugin", False, f"node {node.name} advertises no nvidia.com GPU resource"
        )
    listed = ", ".join(f"{k}={v}" for k, v in sorted(resources.items()))
    return CheckResult("plugin", True, f"node {node.name} advertises {listed}")


# -- running them --------------------------------------------------------------------------------
HOST_ROOT_MOUNT = "/host"  # where the validator's DaemonSet mounts the host's /


def default_host_root() -> str:
    """The host's / as this process sees it: the DaemonSet's /host mount, else / (on a host)."""
    return HOST_ROOT_MOUNT if Path(HOST_ROOT_MOUNT, "etc").is_dir() else "/"


def host_runtime_configs(host_root: str) -> list[str]:
    """The container runtime's config files on the host: inside a pod, the validator's own
    /etc/containerd is the image's, not the node's."""
    return [str(Path(host_root, p.lstrip("/"))) for p in RUNTIME_CONFIGS]


def read_runtime_configs(patterns: Sequence[str]) -> list[tuple[Path, str]]:
    found = []
    for pattern in patterns:
        path = Path(pattern)
        matches = sorted(path.parent.glob(path.name)) if "*" in pattern else [path]
        for match in matches:
            try:
                found.append((match, match.read_text()))
            except OSError:
                continue
    return found


@dataclass
class Validator:
    """Runs the checks in order and keeps the status files in step with the results."""

    read_inventory: Callable[[], Inventory]
    read_node: Callable[[], NodeView] | None = None
    runtime_configs: Sequence[str] = RUNTIME_CONFIGS
    directory: Path = VALIDATIONS_DIR
    components: Sequence[str] = COMPONENTS
    driver_root: str = "/"  # on the host
    container_root: str = "/"  # the same, where this process has it (the driver-ready file)
    # None: not checked (simulated NVML has no devices); a callable: asked at every check (the
    # driver's device nodes may appear only once its container has installed it).
    uvm_device: Path | Callable[[], Path] | None = UVM_DEVICE

    def _run(self, name: str, inventory: Inventory | None, error: str) -> CheckResult:
        if name == "driver":
            return check_driver(inventory, error)
        if name == "toolkit":
            return check_toolkit(read_runtime_configs(self.runtime_configs))
        if name == "cuda":
            result = check_cuda(inventory)
            if not result.ok or self.uvm_device is None:
                return result
            device = self.uvm_device() if callable(self.uvm_device) else self.uvm_device
            uvm = check_uvm(device)
            return result if uvm.ok else uvm
        if name == "plugin":
            if self.read_node is None:
                return check_plugin(None, "no Kubernetes access (NODE_NAME unset?)")
            try:
                return check_plugin(self.read_node())
            except Exception as exc:
                return check_plugin(None, str(exc))
        raise ValueError(f"unknown validation component {name!r}")

    def _write(self, name: str, content: str = "") -> None:
        path = self.directory / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        tmp.replace(path)

    def _remove(self, name: str) -> None:
        (self.directory / name).unlink(missing_ok=True)

    def validate_once(self) -> list[CheckResult]:
        """Run the checks in order, stopping at the first failure; update the files."""
        self.directory.mkdir(parents=True, exist_ok=True)
        inventory: Inventory | None = None
        error = ""
        try:
            inventory = self.read_inventory()
        except NvmlError as exc:
            error = str(exc)
        results: list[CheckResult] = []
        failed = False
        for name in COMPONENTS:
            if name not in self.components:
                continue
            if failed:
                self._remove(status_file(name))
                continue
            result = self._run(name, inventory, error)
            results.append(result)
            if result.ok:
                content = ""
                if name == "driver":
                    content = DriverLocation(self.driver_root, self.container_root).ready_text()
                self._write(status_file(name), content)
            else:
                failed = True
                self._remove(status_file(name))
                log.warning("validation %s failed: %s", name, result.message)
        if failed:
            self._remove(READY_MARKER)
        else:
            self._write(READY_MARKER, "".join(f"{r.name}: {r.message}\n" for r in results))
        return results


def run_validator(
    validator: Validator,
    *,
    interval_s: float = 10.0,
    oneshot: bool = False,
    until_ready: bool = False,
    stop: threading.Event | None = None,
) -> int:
    """Validate until everything passes, then keep re-checking (the marker tracks the state).

    ``oneshot``: one pass; exit status 0 when all passed, 1 otherwise.

    ``until_ready``: until everything passes, then exit 0 (an init container). Without a
    driver yet it keeps trying: NVML is loaded by path from the mounted driver root, where the
    driver's files appear when it is installed (no new container needed, as with a runtime
    hook that hands a container the driver only when it is created).
    """
    stop = stop or threading.Event()
    while True:
        results = validator.validate_once()
        ok = all(r.ok for r in results) and len(results) == len(
            [c for c in COMPONENTS if c in validator.components]
        )
        for result in results:
            log.info("%s: %s (%s)", result.name, "ok" if result.ok else "FAILED", result.message)
        if oneshot or (until_ready and ok):
            return 0 if ok else 1
        if stop.wait(interval_s):
            return 0 if ok else 1
