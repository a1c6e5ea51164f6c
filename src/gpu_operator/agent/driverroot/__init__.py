"""What a driver root holds for containers, found the way NVIDIA's container toolkit finds it.

A *driver root* is a directory laid out like a root filesystem that holds an NVIDIA driver: ``/``
for a preinstalled driver, ``/run/nvidia/driver`` for NVIDIA's driver container,
``/home/kubernetes/bin/nvidia`` on GKE, or wherever a pod mounts one of those. Pure functions
over paths: :mod:`rootfs` (symlinks followed inside the root), :mod:`elf` (class, machine,
soname), :mod:`ldcache` (glibc's ld.so.cache), :mod:`libraries` (the library search),
:mod:`discover` (libraries, binaries, firmware, IPC, hook), :mod:`devices` (device nodes, MIG
capability minors, IMEX channels, ``/proc/devices`` majors). Every miss says what was searched,
so "no driver" is never a guess.
"""

from gpu_operator.agent.driverroot.devices import (
    IMEX_CHANNELS_DEVICE,
    IMEX_CHANNELS_DIR,
    DeviceNodes,
    char_device_majors,
    dev_root_of,
    device_nodes,
    imex_channel_path,
    mig_device_caps,
    mig_minors_text,
    parse_mig_minors,
)
from gpu_operator.agent.driverroot.discover import DriverFiles, Library, discover_driver
from gpu_operator.agent.driverroot.libraries import DriverNotFound, find_library

__all__ = [
    "IMEX_CHANNELS_DEVICE",
    "IMEX_CHANNELS_DIR",
    "DeviceNodes",
    "DriverFiles",
    "DriverNotFound",
    "Library",
    "char_device_majors",
    "dev_root_of",
    "device_nodes",
    "discover_driver",
    "find_library",
    "imex_channel_path",
    "mig_device_caps",
    "mig_minors_text",
    "parse_mig_minors",
]
