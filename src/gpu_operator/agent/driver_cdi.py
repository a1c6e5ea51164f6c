"""The driver's share of a CDI spec: what a container needs besides its device node to run a
CUDA program, found in the driver root (:mod:`gpu_operator.agent.driverroot`).

The file set is NVIDIA's toolkit's (``nvidia-ctk cdi generate``): the driver's libraries at
their paths in the root, its binaries, GSP firmware, IPC sockets and the control device nodes.
NVIDIA's specs then run ``nvidia-cdi-hook`` on the host to make the soname links
(``libcuda.so.1``) and refresh the container's ld.so.cache; where no such hook binary exists
(this project ships none), the spec also mounts each library at its soname in the standard
library directories of Debian-like and RHEL-like images, so that ``dlopen("libcuda.so.1")``
resolves in any glibc image with nothing run on the host. Where the hook is on the host it is
used as NVIDIA's specs use it, in addition.

Pure but for :func:`discover_host_driver`, which reads the roots: plain data in (what was
discovered, where the roots are on the host), dicts out.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.driverroot import (
    DeviceNodes,
    DriverFiles,
    DriverNotFound,
    dev_root_of,
    device_nodes,
    discover_driver,
    mig_device_caps,
    mig_minors_text,
    parse_mig_minors,
)
from gpu_operator.agent.inventory import Inventory

CDI_VERSION = "0.6.0"
MAX_GPUS = 32  # the kernel's mig-minors table always covers this many
# Directories the dynamic loader of a glibc image searches by default, per architecture:
# Debian/Ubuntu's multiarch directory, then RHEL/Fedora's lib64.
SONAME_DIRS = {
    "x86_64": ("/usr/lib/x86_64-linux-gnu", "/usr/lib64"),
    "aarch64": ("/usr/lib/aarch64-linux-gnu", "/usr/lib64"),
}
READ_ONLY = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]  # a socket needs write to connect
# A default PATH (Debian's, and what runtimes set when an image names none).
PATH_DIRS = frozenset(
    ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
)


@dataclass(frozen=True)
class HostDriver:
    """The driver as this process found it, and where its roots are on the host.

    ``files`` and ``devices`` were discovered under the roots as this process sees them (a pod
    has them mounted somewhere); the spec names host paths, which the runtime resolves."""

    files: DriverFiles | None  # None: no driver files found (a simulated NVML in-process)
    devices: DeviceNodes
    host_root: str  # the driver root on the host
    host_dev_root: str  # the device root on the host

    @property
    def present(self) -> frozenset[str]:
        """The device nodes that exist, by their path in a container (``/dev/nvidia0``)."""
        d = self.devices
        return frozenset((*d.gpus.values(), *d.control, *d.caps))

    def host(self, path: str) -> str:
        return _join(self.host_root, path)

    def host_dev(self, path: str) -> str:
        return _join(self.host_dev_root, path)


def _join(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def device_node(driver: HostDriver, path: str) -> dict[str, str]:
    """A CDI device node: its path in the container, and on the host where that differs."""
    host = driver.host_dev(path)
    return {"path": path} if host == path else {"path": path, "hostPath": host}


def _mount(host: str, container: str, options: Sequence[str]) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": list(options)}


def soname_dirs(machine: str | None = None) -> tuple[str, ...]:
    return SONAME_DIRS.get(machine or platform.machine(), SONAME_DIRS["x86_64"])


def driver_mounts(driver: HostDriver, machine: str | None = None) -> list[dict[str, Any]]:
    """Libraries (at their root-relative paths, and at their sonames in the standard library
    directories), binaries (also in /usr/bin when their directory is not on a default PATH),
    firmware (read-only) and IPC sockets (writable)."""
    files = driver.files
    if files is None:
        return []
    mounts: dict[str, dict[str, Any]] = {}
    for lib in files.libraries:
        mounts.setdefault(lib.path, _mount(driver.host(lib.path), lib.path, READ_ONLY))
    for lib in files.libraries:
        if lib.soname and lib.soname != os.path.basename(lib.path):
            for directory in soname_dirs(machine):
                target = f"{directory}/{lib.soname}"
                mounts.setdefault(target, _mount(driver.host(lib.path), target, READ_ONLY))
    for path in (*files.binaries, *files.firmware):
        mounts.setdefault(path, _mount(driver.host(path), path, READ_ONLY))
    for path in files.binaries:
        # A driver under its own prefix (/usr/local/nvidia/bin) is on no image's default PATH:
        # the program goes to /usr/bin too, as the libraries go to their sonames.
        if os.path.dirname(path) not in PATH_DIRS:
            target = f"/usr/bin/{os.path.basename(path)}"
            mounts.setdefault(target, _mount(driver.host(path), target, READ_ONLY))
    for path in files.ipc:
        mounts.setdefault(path, _mount(driver.host(path), path, IPC))
    return list(mounts.values())


def driver_hooks(driver: HostDriver) -> list[dict[str, Any]]:
    """NVIDIA's createContainer hook, where the toolkit's hook binary is on the host: refresh
    the container's ld.so.cache for the library directory (ldconfig also makes the soname
    links there)."""
    files = driver.files
    if files is None or files.hook is None:
        return []
    name = os.path.basename(files.hook)
    prefix = [name] if name == "nvidia-cdi-hook" else [name, "hook"]
    return [
        {
            "hookName": "createContainer",
            "path": driver.host(files.hook),
            "args": [*prefix, "update-ldcache", "--folder", files.library_dir],
        }
    ]


def common_edits(driver: HostDriver, machine: str | None = None) -> dict[str, Any]:
    """The edits every device of the spec shares: control nodes, the driver's files, hooks, and
    ``NVIDIA_VISIBLE_DEVICES=void`` so NVIDIA's legacy runtime hook adds nothing again."""
    edits: dict[str, Any] = {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
    control = [device_node(driver, p) for p in driver.devices.control]
    if control:
        edits["deviceNodes"] = control
    mounts = driver_mounts(driver, machine)
    if mounts:
        edits["mounts"] = mounts
    hooks = driver_hooks(driver)
    if hooks:
        edits["hooks"] = hooks
    return edits


def gpu_nodes(driver: HostDriver, minor: int, caps: Iterable[str] = ()) -> list[dict[str, str]]:
    """One device's nodes: its GPU's ``/dev/nvidia<minor>`` and, for a MIG device, the
    capability nodes of its GPU and compute instance; only those present on the host (a missing
    node would make the runtime refuse the container)."""
    wanted = [f"/dev/nvidia{minor}", *caps]
    present = {*driver.devices.gpus.values(), *driver.devices.caps}
    return [device_node(driver, p) for p in wanted if p in present]


@functools.cache
def mig_minors() -> Mapping[str, int]:
    """The kernel's MIG capability minors (its table is fixed: every GPU slot, always)."""
    return parse_mig_minors(mig_minors_text(MAX_GPUS))


def mig_caps(minors: Mapping[str, int], gpu_minor: int, gi: int, ci: int) -> tuple[str, ...]:
    """A MIG device's capability nodes; none where the table lacks them (not a MIG driver)."""
    try:
        return mig_device_caps(minors, gpu_minor, gi, ci)
    except KeyError:
        return ()


def generate_spec(
    driver: HostDriver,
    inventory: Inventory | None,
    *,
    kind: str = "nvidia.com/gpu",
    machine: str | None = None,
) -> dict[str, Any]:
    """The node-wide spec ``nvidia-ctk cdi generate`` writes: every GPU by index and UUID,
    every MIG device by ``<gpu>:<mig>`` and UUID, ``all``, and the driver's files.

    Without an inventory (NVML unavailable) the GPUs are the device nodes found, by minor."""
    minors = mig_minors()
    devices: list[dict[str, Any]] = []
    everything: list[dict[str, str]] = []

    def add(names: Iterable[str], nodes: list[dict[str, str]]) -> None:
        for name in dict.fromkeys(names):
            devices.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
        everything.extend(n for n in nodes if n not in everything)

    if inventory is None:
        for minor in sorted(driver.devices.gpus):
            add([str(minor)], gpu_nodes(driver, minor))
    else:
        for gpu in inventory.gpus:
            add([str(gpu.index), gpu.uuid], gpu_nodes(driver, gpu.minor_number))
            for i, mig in enumerate(gpu.mig_devices):
                caps = mig_caps(minors, gpu.minor_number, mig.gi_id, mig.ci_id)
                add([f"{gpu.index}:{i}", mig.uuid], gpu_nodes(driver, gpu.minor_number, caps))
    if everything:
        devices.append({"name": "all", "containerEdits": {"deviceNodes": everything}})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices,
        "containerEdits": common_edits(driver, machine),
    }


def discover_host_driver(root: str, host_root: str, host_dev_root: str | None = None) -> HostDriver:
    """The driver under ``root`` as this process sees it (``host_root``: the same directory on
    the host), with its device nodes wherever the driver has them (``dev_root_of``; on the host
    at ``host_dev_root`` when given, as NVIDIA_DEV_ROOT says). Raises DriverNotFound."""
    return _host_driver(discover_driver(root), root, host_root, host_dev_root)


def find_host_driver(
    root: str, host_root: str, host_dev_root: str | None = None
) -> tuple[HostDriver, DriverNotFound | None]:
    """As :func:`discover_host_driver`, but a root without a driver gives one without files
    (device nodes only) and the reason, for callers that can still work without them.

    Asked at every Allocate and claim prepare, so a found driver is kept while its root looks
    the same (:func:`root_fingerprint`): discovery reads the ld.so.cache and every library's ELF
    header, about 8 ms on a real driver; the fingerprint is a few ``stat`` calls."""
    key = (root, host_root, host_dev_root)
    cached = _found.get(key)
    if cached is not None and cached[0] == root_fingerprint(root, cached[1].files):
        return cached[1], None
    try:
        driver = _host_driver(discover_driver(root), root, host_root, host_dev_root)
    except DriverNotFound as exc:
        _found.pop(key, None)
        return _host_driver(None, root, host_root, host_dev_root), exc
    _found[key] = (root_fingerprint(root, driver.files), driver)
    return driver, None


_found: dict[tuple[str, str, str | None], tuple[tuple[Any, ...], HostDriver]] = {}


def root_fingerprint(root: str, files: DriverFiles | None) -> tuple[Any, ...]:
    """What changes when a driver is installed, upgraded or removed under ``root``, its device
    nodes come or go, or a daemon's socket appears: the ld.so.cache, the library directory and
    the driver library, the IPC and device directories."""
    paths = ["etc/ld.so.cache", "run", "var/run", "tmp/nvidia-mps"]
    if files is not None:
        paths.append(files.library_dir)
        paths += [lib.path for lib in files.libraries if "libcuda.so." in lib.path]
    dev_root = dev_root_of(root)
    stamps: list[Any] = [_stamp(os.path.join(dev_root or "/", "dev"))]
    stamps += [_stamp(os.path.join(root, p.lstrip("/"))) for p in paths]
    return tuple(stamps)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _host_driver(
    files: DriverFiles | None, root: str, host_root: str, host_dev_root: str | None
) -> HostDriver:
    dev_root = dev_root_of(root)
    own = dev_root is not None and dev_root != "/"
    devices = device_nodes(dev_root or "/")
    if host_dev_root is None:
        host_dev_root = host_root if own else "/"
    return HostDriver(files, devices, host_root, host_dev_root)
