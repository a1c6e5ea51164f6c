"""Laying out a driver root as NVIDIA's installer does, from the built stub artefacts.

:func:`plan_layout` says what goes where (pure); :func:`lay_out` writes it. For each library:
the versioned file (``libcuda.so.580.95.05``, the artefact with the node's GPU table patched
in), the soname link (``libcuda.so.1 ->``) and, for libcuda and libnvidia-ml, the development
link (``libcuda.so -> libcuda.so.1``). Programs: ``nvidia-smi`` and ``gpu-operator-cuda-probe``.
GSP firmware files (they say SIMULATED), a ``README.SIMULATED``, and device nodes under
``<root>/dev``: ``nvidia<minor>`` (195:minor), ``nvidiactl`` (195:255), ``nvidia-uvm`` and
``nvidia-uvm-tools`` (openable: /dev/null's numbers, see UVM), the MIG capabilities and, on a
node with an NVLink fabric, ``nvidia-caps-imex-channels/channel0``, made only as root; and
``dev/gpu-operator-sim/proc-devices``, the majors ``/proc/devices`` would list.

Every file and link is written beside its place and renamed over it, so laying out again (the
same or another version, other GPUs) never leaves a half-written library, and a process that has
the old one loaded keeps it. Another version's stub files are removed (only files that carry the
stub marker; NVIDIA's are never touched). Device nodes that no longer belong are left alone.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpu_operator.agent.driverroot import (
    IMEX_CHANNELS_DEVICE,
    imex_channel_path,
    mig_minors_text,
    parse_mig_minors,
)

from .build import build_stubs
from .compute import SIM_DIR
from .libraries import (
    BIN_DIRS,
    FIRMWARE_DIR,
    FIRMWARE_FILES,
    LIB_DIRS,
    LIBRARIES,
    PROGRAMS,
    Style,
    set_soname_version,
)
from .table import DRIVER_MARKER, StubGpu, StubTable, patch_table

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
CTL_MINOR = 255
# nvidia-uvm's major is dynamic on a real node. Here it is /dev/null's numbers, so that opening
# it works as with a loaded nvidia-uvm module (the validator opens it, as every CUDA program
# does); no process reads or writes it.
UVM = (1, 3)
CAPS_MAJOR = 236  # nvidia-caps: dynamic too
IMEX_CHANNELS_MAJOR = 234  # nvidia-caps-imex-channels: dynamic too
# The fabric-imex-mgmt capability an IMEX daemon is given: its /proc file (read by the DRA
# plugin, under the driver root on a simulated node) and the nvidia-caps minor it names, one
# above every MIG minor (a choice of this simulation, not a number taken from NVIDIA's table).
IMEX_MGMT_FILE = "proc/driver/nvidia/capabilities/fabric-imex-mgmt"
IMEX_MGMT_MINOR = 4094
# The character devices /proc/devices would list for this driver, beside the GPUs' simulated
# state (a container's /proc/devices is the host's: this is what NVIDIA's DRA driver reads as
# ALT_PROC_DEVICES_PATH on nodes without its kernel module). nvidia-uvm is not listed: its node
# has /dev/null's numbers here.
PROC_DEVICES = f"dev/{SIM_DIR}/proc-devices"
README = "README.SIMULATED"
FIRMWARE_TEXT = "gpu-operator SIMULATED stub driver {version}: not NVIDIA GSP firmware ({name})\n"

EntryKind = Literal["library", "program", "link", "text", "node"]


@dataclass(frozen=True)
class Entry:
    """One thing in the driver root, at ``path`` (root-relative)."""

    kind: EntryKind
    path: str
    source: str = ""  # library, program: the artefact's file name
    target: str = ""  # link
    text: str = ""  # text
    device: tuple[int, int] = (0, 0)  # node: major, minor
    mode: int = 0o644


def plan_layout(
    *,
    version: str,
    cuda_version: int,
    gpus: Sequence[StubGpu],
    style: Style = "ubuntu",
    device_nodes: bool = True,
    imex_channels: int = 0,
) -> list[Entry]:
    """What :func:`lay_out` writes, in order (files before the links to them). ``imex_channels``:
    how many IMEX channel nodes the driver made (1: ``channel0``, as NVIDIA's driver does with
    ``NVreg_CreateImexChannel0=1``), on a node with an NVLink fabric; 0: no IMEX channels device."""
    StubTable(version, cuda_version, tuple(gpus)).validate()
    lib_dir, bin_dir = LIB_DIRS[style], BIN_DIRS[style]
    plan: list[Entry] = []
    for lib in LIBRARIES:
        file_name, soname = lib.file_name(version), lib.soname_for(version)
        plan.append(Entry("library", f"{lib_dir}/{file_name}", source=lib.artefact, mode=0o755))
        if soname != file_name:
            plan.append(Entry("link", f"{lib_dir}/{soname}", target=file_name))
        if lib.dev_link:
            plan.append(Entry("link", f"{lib_dir}/{lib.stem}.so", target=soname))
    for program in PROGRAMS:
        plan.append(Entry("program", f"{bin_dir}/{program.name}", source=program.name, mode=0o755))
    for name in FIRMWARE_FILES:
        text = FIRMWARE_TEXT.format(version=version, name=name)
        plan.append(Entry("text", f"{FIRMWARE_DIR}/{version}/{name}", text=text))
    plan.append(Entry("text", README, text=_readme(version, cuda_version, gpus, style)))
    plan.append(Entry("text", PROC_DEVICES, text=proc_devices_text(imex_channels > 0)))
    if device_nodes:
        for gpu in sorted(gpus, key=lambda g: g.minor):
            plan.append(Entry("node", f"dev/nvidia{gpu.minor}", device=(NVIDIA_MAJOR, gpu.minor)))
        plan.append(Entry("node", "dev/nvidiactl", device=(NVIDIA_MAJOR, CTL_MINOR)))
        plan.append(Entry("node", "dev/nvidia-uvm", device=UVM))
        plan.append(Entry("node", "dev/nvidia-uvm-tools", device=UVM))
        plan.extend(_mig_cap_nodes(gpus))
        for channel in range(imex_channels):
            path = imex_channel_path(channel).lstrip("/")
            plan.append(Entry("node", path, device=(IMEX_CHANNELS_MAJOR, channel), mode=0o666))
        if imex_channels:
            cap = f"dev/nvidia-caps/nvidia-cap{IMEX_MGMT_MINOR}"
            plan.append(Entry("node", cap, device=(CAPS_MAJOR, IMEX_MGMT_MINOR), mode=0o400))
    if imex_channels:
        text = f"DeviceFileMinor: {IMEX_MGMT_MINOR}\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
        plan.append(Entry("text", IMEX_MGMT_FILE, text=text))
    return plan


def proc_devices_text(imex: bool) -> str:
    """``/proc/devices`` as far as this driver goes: its character devices and their majors,
    ``nvidia-caps-imex-channels`` only where the GPUs have an NVLink fabric."""
    rows = [(NVIDIA_MAJOR, "nvidia-frontend"), (CAPS_MAJOR, "nvidia-caps")]
    if imex:
        rows.append((IMEX_CHANNELS_MAJOR, IMEX_CHANNELS_DEVICE))
    lines = ["Character devices:", *(f"{major:3d} {name}" for major, name in sorted(rows))]
    return "\n".join(lines) + "\n"


def _mig_cap_nodes(gpus: Sequence[StubGpu]) -> list[Entry]:
    """The MIG capability nodes of the node's GPUs (``/dev/nvidia-caps/nvidia-cap<minor>``, the
    minors from the kernel's mig-minors table), as a driver with MIG-capable GPUs has them: a
    MIG device's CDI entry names its GPU and compute instance's access nodes."""
    minors = parse_mig_minors(mig_minors_text(max((g.minor for g in gpus), default=-1) + 1))
    wanted = {f"gpu{g.minor}/" for g in gpus}
    entries = [
        Entry("node", f"dev/nvidia-caps/nvidia-cap{minor}", device=(CAPS_MAJOR, minor), mode=0o444)
        for key, minor in sorted(minors.items(), key=lambda kv: kv[1])
        if "/" not in key or key[: key.index("/") + 1] in wanted
    ]
    return entries


def lay_out(
    root: Path,
    *,
    version: str,
    cuda_version: int,
    gpus: Sequence[StubGpu],
    style: Style = "ubuntu",
    artefacts: Path | None = None,
    device_nodes: bool = True,
    simulate: str = "",
    seed: str | None = None,
    pci: bool = False,
    imex_channels: int = 0,
) -> list[str]:
    """Write a stub driver root at ``root``; return what it wrote, root-relative, in order:
    every file, link and device node it wrote or kept, each directory it made listed before
    what is in it. Device nodes need root; without it (or ``device_nodes=False``), none.
    ``simulate`` and ``seed`` go into the GPU table as they are (see :class:`StubTable`).
    ``pci``: also the GPUs' PCI functions in sysfs and ``/dev/vfio`` (:mod:`gpu_operator.sim.pci`),
    for passthrough. ``imex_channels``: see :func:`plan_layout`."""
    table = StubTable(version, cuda_version, tuple(gpus), simulate, seed)
    table.validate()
    nodes = device_nodes and os.geteuid() == 0
    plan = plan_layout(
        version=version,
        cuda_version=cuda_version,
        gpus=gpus,
        style=style,
        device_nodes=nodes,
        imex_channels=imex_channels,
    )
    built = artefacts if artefacts is not None else build_stubs()
    by_artefact = {lib.artefact: lib for lib in LIBRARIES}
    root.mkdir(parents=True, exist_ok=True)
    created: list[str] = []
    for entry in plan:
        path = root / entry.path
        created.extend(_make_parents(root, path.parent))
        if entry.kind == "library":
            lib = by_artefact[entry.source]
            data = (built / entry.source).read_bytes()
            data = patch_table(data, table) if lib.table else data
            replace_file(path, set_soname_version(data, lib, version), entry.mode)
        elif entry.kind == "program":
            replace_file(path, (built / entry.source).read_bytes(), entry.mode)
        elif entry.kind == "text":
            replace_file(path, entry.text.encode(), entry.mode)
        elif entry.kind == "link":
            _replace_link(path, entry.target)
        elif not _replace_node(path, *entry.device):
            continue
        created.append(entry.path)
    _remove_other_versions(root, style, version)
    if pci:
        from gpu_operator.sim.pci import PciGpu, lay_out_pci

        created.extend(lay_out_pci(root, [PciGpu(g.pci_bus_id, g.name) for g in gpus]))
    return created


def remove(root: Path, created: Sequence[str], *, device_nodes: bool = False) -> None:
    """Undo :func:`lay_out` (``created`` is what it returned): files and links go, then the
    directories it made if empty. Device nodes stay unless ``device_nodes``: unloading a real
    driver leaves ``/dev/nvidia*`` behind too, and a container may still be using them."""
    for rel in reversed(created):
        path = root / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if not any(path.iterdir()):
                path.rmdir()
        elif device_nodes or not stat.S_ISCHR(st.st_mode):
            path.unlink()


def _readme(version: str, cuda: int, gpus: Sequence[StubGpu], style: str) -> str:
    rows = "".join(f"  /dev/nvidia{g.minor}: {g.name} {g.uuid}\n" for g in gpus)
    return (
        "SIMULATED NVIDIA driver root, laid out by gpu-operator for tests.\n"
        "Nothing here is NVIDIA software: the libraries are stubs that only know the GPUs\n"
        "below (a table patched into libnvidia-ml and libcuda), nvidia-smi is a stand-in,\n"
        "and the firmware files are text.\n\n"
        f"driver {version}, CUDA {cuda // 1000}.{cuda % 1000 // 10}, layout {style}\n{rows}"
    )


def _make_parents(root: Path, folder: Path) -> list[str]:
    """Make ``folder`` and its missing parents; those made, root-relative, parents first."""
    missing: list[Path] = []
    while not folder.exists():  # stops at root, which exists
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return [path.relative_to(root).as_posix() for path in reversed(missing)]


def _temporary(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    return tmp


def replace_file(path: Path, data: bytes, mode: int) -> None:
    """Write through a temporary and rename: a reader polling ``path`` sees none or all of it."""
    tmp = _temporary(path)
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _replace_link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = _temporary(path)
    tmp.symlink_to(target)
    os.replace(tmp, path)


def _replace_node(path: Path, major: int, minor: int) -> bool:
    """A character device at ``path``; False when this process may not make one."""
    want = os.makedev(major, minor)
    try:
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return True
    except FileNotFoundError:
        pass
    tmp = _temporary(path)
    try:
        os.mknod(tmp, stat.S_IFCHR | 0o666, want)
    except PermissionError as err:
        log.info("stub driver: no device node %s: %s", path, err)
        return False
    tmp.chmod(0o666)
    os.replace(tmp, path)
    return True


def _remove_other_versions(root: Path, style: Style, version: str) -> None:
    """Another version's stub libraries and firmware (never a file without the marker)."""
    lib_dir = root / LIB_DIRS[style]
    keep = {lib.file_name(version) for lib in LIBRARIES}
    for lib in LIBRARIES:
        if not lib.versioned_file:
            continue
        for path in lib_dir.glob(f"{lib.stem}.so.*"):
            if path.name not in keep and _is_stub_file(path, DRIVER_MARKER.encode()):
                path.unlink()
    for folder in (root / FIRMWARE_DIR).glob("*"):
        if folder.name == version or not folder.is_dir() or folder.is_symlink():
            continue
        for name in FIRMWARE_FILES:
            if _is_stub_file(folder / name, b"SIMULATED stub driver"):
                (folder / name).unlink()
        if not any(folder.iterdir()):
            folder.rmdir()


def _is_stub_file(path: Path, marker: bytes) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    return marker in path.read_bytes()
