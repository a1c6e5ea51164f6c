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

Pure: plain data in (what was discovered, where the roots are on the host), a dict out.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_operator.agent.driverroot import DeviceNodes, DriverFiles

CDI_VERSION = "0.6.0"
# Directories the dynamic loader of a glibc image searches by default, per architecture:
# Debian/Ubuntu's multiarch directory, then RHEL/Fedora's lib64.
SONAME_DIRS = {
    "x86_64": ("/usr/lib/x86_64-linux-gnu", "/usr/lib64"),
    "aarch64": ("/usr/lib/aarch64-linux-gnu", "/usr/lib64"),
}
READ_ONLY = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]  # a socket needs write to connect


@dataclass(frozen=True)
class HostDriver:
    """The driver as this process found it, and where its roots are on the host.

    ``files`` and ``devices`` were discovered under the roots as this process sees them (a pod
    has them mounted somewhere); the spec names host paths, which the runtime resolves."""

    files: DriverFiles
    devices: DeviceNodes
    host_root: str  # the driver root on the host
    host_dev_root: str  # the device root on the host

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
    directories), binaries, firmware (read-only) and IPC sockets (writable)."""
    files = driver.files
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
    for path in files.ipc:
        mounts.setdefault(path, _mount(driver.host(path), path, IPC))
    return list(mounts.values())


def driver_hooks(driver: HostDriver) -> list[dict[str, Any]]:
    """NVIDIA's createContainer hook, where the toolkit's hook binary is on the host: refresh
    the container's ld.so.cache for the library directory (ldconfig also makes the soname
    links there)."""
    files = driver.files
    if files.hook is None:
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
