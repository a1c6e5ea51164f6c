"""The NVIDIA device nodes a container needs, and the MIG capability minors that name them.

Device nodes are looked up under a *dev root* (a directory whose ``dev/`` holds them: ``/`` on a
host, the driver container's root when it created them). Only character devices count: a
regular file left where a node should be would make the runtime hand the container a file
that no driver answers.

MIG devices are guarded by capability nodes ``/dev/nvidia-caps/nvidia-cap<minor>``. The kernel
module numbers them once, at load, from a fixed table (``nv-caps.c``): nvlink's fabric-mgmt
takes minor 0, ``config`` 1, ``monitor`` 2, then for each of 32 GPUs, 15 GPU instances, each
its ``access`` followed by the ``access`` of its 8 compute instances. So::

    gpu<G>/gi<I>/access        = 3 + 135*G + 9*I
    gpu<G>/gi<I>/ci<C>/access  = 4 + 135*G + 9*I + C

and ``/proc/driver/nvidia-caps/mig-minors`` lists them all, whatever GPUs are present.

IMEX channels (multi-node NVLink, GB200/GB300) are ``/dev/nvidia-caps-imex-channels/channel<N>``,
minor N, of the dynamic major ``/proc/devices`` names ``nvidia-caps-imex-channels``. The driver
makes only ``channel0`` (with ``NVreg_CreateImexChannel0=1``); whoever hands out others makes
their nodes from that major.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpu_operator.agent.driverroot import rootfs

CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
CAPS_DIR = "/dev/nvidia-caps"
IMEX_CHANNELS_DEVICE = "nvidia-caps-imex-channels"  # its name in /proc/devices
IMEX_CHANNELS_DIR = f"/dev/{IMEX_CHANNELS_DEVICE}"
GPU_NODE = re.compile(r"nvidia(\d+)")
CAP_NODE = re.compile(r"nvidia-cap(\d+)")

MIG_GPUS = 32  # the kernel's table: capabilities exist for gpu0..gpu31
MIG_GPU_INSTANCES = 15  # gi0..gi14
MIG_COMPUTE_INSTANCES = 8  # ci0..ci7
MIG_FIRST_MINOR = 3  # after fabric-mgmt (0), config (1), monitor (2)
MIG_PER_GI = 1 + MIG_COMPUTE_INSTANCES
MIG_PER_GPU = MIG_GPU_INSTANCES * MIG_PER_GI


@dataclass(frozen=True)
class DeviceNodes:
    dev_root: str
    gpus: Mapping[int, str]  # minor -> "/dev/nvidia<minor>" (container path)
    control: tuple[str, ...]  # "/dev/nvidiactl", ... (present ones)
    caps: tuple[str, ...]  # "/dev/nvidia-caps/nvidia-cap<M>" (present ones)

    def host_path(self, path: str) -> str:
        """``/dev/nvidia0`` -> where that node is on this machine."""
        return rootfs.host_path(self.dev_root, path)


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _numbered(dev_root: str, directory: str, pattern: re.Pattern[str]) -> dict[int, str]:
    """The character devices in ``directory`` named by ``pattern``, by their number."""
    try:
        names = os.listdir(rootfs.host_path(dev_root, directory))
    except OSError:
        return {}
    found: dict[int, str] = {}
    for name in names:
        match = pattern.fullmatch(name)
        path = f"{directory}/{name}"
        if match and _is_char_device(rootfs.host_path(dev_root, path)):
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def device_nodes(dev_root: str | Path) -> DeviceNodes:
    """The NVIDIA character devices present under ``dev_root``/dev."""
    root = str(dev_root)
    control = tuple(p for p in CONTROL_NODES if _is_char_device(rootfs.host_path(root, p)))
    return DeviceNodes(
        dev_root=root,
        gpus=MappingProxyType(_numbered(root, "/dev", GPU_NODE)),
        control=control,
        caps=tuple(_numbered(root, CAPS_DIR, CAP_NODE).values()),
    )


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as {"gpu0/gi1/ci0/access": 13, ...}. Lines that
    are not "<name> <minor>" are skipped, as NVIDIA's parsers do: a newer kernel may add kinds."""
    minors: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            minors[fields[0]] = int(fields[1])
    return minors


def char_device_majors(text: str) -> dict[str, int]:
    """The character devices of a ``/proc/devices`` text, name -> major (``nvidia-caps-imex-
    channels`` -> 234); block devices and lines that are not "<major> <name>" are skipped."""
    majors: dict[str, int] = {}
    for line in text.split("\nBlock devices:", 1)[0].splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def imex_channel_path(channel: int) -> str:
    """``/dev/nvidia-caps-imex-channels/channel<channel>``."""
    return f"{IMEX_CHANNELS_DIR}/channel{channel}"


def gi_key(gpu: int, gi: int) -> str:
    return f"gpu{gpu}/gi{gi}/access"


def ci_key(gpu: int, gi: int, ci: int) -> str:
    return f"gpu{gpu}/gi{gi}/ci{ci}/access"


def mig_minors_text(gpu_count: int) -> str:
    """The kernel's mig-minors file, for a simulated node, limited to its first ``gpu_count``
    GPUs (the minors do not depend on the count; ``mig_minors_text(32)`` is the real file)."""
    if not 0 <= gpu_count <= MIG_GPUS:
        raise ValueError(f"the driver numbers MIG capabilities for 0..{MIG_GPUS} GPUs")
    lines = ["config 1", "monitor 2"]
    minor = MIG_FIRST_MINOR
    for gpu in range(gpu_count):
        for gi in range(MIG_GPU_INSTANCES):
            lines.append(f"{gi_key(gpu, gi)} {minor}")
            minor += 1
            for ci in range(MIG_COMPUTE_INSTANCES):
                lines.append(f"{ci_key(gpu, gi, ci)} {minor}")
                minor += 1
    return "\n".join(lines) + "\n"


def cap_path(minor: int) -> str:
    return f"{CAPS_DIR}/nvidia-cap{minor}"


def mig_device_caps(minors: Mapping[str, int], gpu: int, gi: int, ci: int) -> tuple[str, str]:
    """The capability nodes a MIG device needs: its GPU instance's and its compute instance's
    ``access`` (the device plugin's and nvidia-ctk's choice). KeyError names a missing entry."""
    keys = (gi_key(gpu, gi), ci_key(gpu, gi, ci))
    missing = [key for key in keys if key not in minors]
    if missing:
        raise KeyError(f"mig-minors has no {' or '.join(missing)}")
    return cap_path(minors[keys[0]]), cap_path(minors[keys[1]])


def dev_root_of(driver_root: str | Path) -> str | None:
    """Where the driver's device nodes are: the driver root when its own ``dev/nvidiactl``
    exists (a driver container's nodes, or a simulated driver's: NVIDIA's toolkit takes the dev
    root to be the driver root), else ``/`` when ``/dev/nvidiactl`` exists (a host with the
    driver loaded; a privileged container sees the host's ``/dev``); None when neither has it:
    no driver loaded. The stub driver's libraries decide the same way
    (``sim/stubdriver/c/stubdriver.h``)."""
    for root in (str(driver_root), "/"):
        if os.path.exists(os.path.join(root, "dev", "nvidiactl")):
            return root
    return None
