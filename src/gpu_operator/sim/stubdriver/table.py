"""The GPU table the stub libraries carry, and patching it into a library file.

libnvidia-ml and libcuda each hold a fixed-size array (:data:`TABLE_SIZE` bytes) that starts
with :data:`TABLE_MARKER`; :func:`patch_table` rewrites that array in a copy of the library, so
a node's GPUs are set without a compiler. The text, NUL-terminated and NUL-padded, one record a
line (``c/stubdriver.h`` reads the same format)::

    GPU_OPERATOR_STUB_GPU_TABLE_V1
    driver 580.95.05
    cuda 13000
    gpu <minor> <uuid> <memory MiB> <pci bus id> <name, spaces allowed>
    simulate a100-40gb:2      (optional: the sim.nvml spec these GPUs were made from)
    seed node-1               (optional: what their UUIDs derive from, in sim.nvml)

Unknown lines are ignored by both readers, so the format can grow (the C side reads only
``driver``, ``cuda`` and ``gpu``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TABLE_MARKER = b"GPU_OPERATOR_STUB_GPU_TABLE_V1"
TABLE_SIZE = 65536  # STUB_TABLE_SIZE in c/stubdriver.h
MAX_GPUS = 64  # STUB_MAX_GPUS
MAX_NAME = 95  # STUB_NAME_LEN - 1
MAX_VERSION = 79  # STUB_VERSION_LEN - 1
# The symbol every stub library exports (a loader tells the stub by it: the NVML loader spells
# it too, a test keeps them equal), and its value.
STUB_MARKER = "gpu_operator_stub_driver"
DRIVER_MARKER = "gpu-operator SIMULATED stub driver 1"  # STUB_DRIVER_MARKER

_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PCI = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")


class StubDriverError(Exception):
    """The stub driver cannot be built, patched or laid out as asked."""


@dataclass(frozen=True)
class StubGpu:
    """One GPU of the node: ``/dev/nvidia<minor>``, with what NVML and CUDA report for it."""

    minor: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str

    def validate(self) -> None:
        """Raise :class:`StubDriverError` unless the table (and C's parser) can hold it."""
        if not 0 <= self.minor <= 254:  # 255 is nvidiactl's minor
            raise StubDriverError(f"GPU minor {self.minor}: not in 0..254")
        if not _UUID.fullmatch(self.uuid):
            raise StubDriverError(f"GPU UUID {self.uuid!r}: not GPU-xxxxxxxx-xxxx-...")
        if not _PCI.fullmatch(self.pci_bus_id):
            raise StubDriverError(f"PCI bus id {self.pci_bus_id!r}: not 00000000:07:00.0")
        if not self.name or len(self.name) > MAX_NAME or not self.name.isprintable():
            raise StubDriverError(f"GPU name {self.name!r}: 1 to {MAX_NAME} printable chars")
        if self.name != self.name.strip():
            raise StubDriverError(f"GPU name {self.name!r}: leading or trailing space")
        if self.memory_mib <= 0:
            raise StubDriverError(f"GPU memory {self.memory_mib} MiB: not positive")


@dataclass(frozen=True)
class StubTable:
    """What the stub libraries know of the node."""

    driver_version: str
    cuda_version: int
    gpus: tuple[StubGpu, ...] = ()
    simulate: str = ""  # the sim.nvml spec behind the GPUs, where they came from one
    seed: str | None = None  # and the seed of their UUIDs

    def validate(self) -> None:
        """Raise :class:`StubDriverError` unless every field fits the table."""
        check_version(self.driver_version)
        for label, word in (("simulate", self.simulate), ("seed", self.seed or "")):
            if word and (not word.isprintable() or word != word.strip()):
                raise StubDriverError(f"{label} {word!r}: not one printable line")
        if self.cuda_version < 0:
            raise StubDriverError(f"CUDA version {self.cuda_version}: negative")
        if len(self.gpus) > MAX_GPUS:
            raise StubDriverError(f"{len(self.gpus)} GPUs: the stub driver holds {MAX_GPUS}")
        minors = [gpu.minor for gpu in self.gpus]
        if len(set(minors)) != len(minors):
            raise StubDriverError(f"GPU minors repeat: {minors}")
        for gpu in self.gpus:
            gpu.validate()


def check_version(version: str) -> None:
    """A driver version fit for file names and the table (``580.95.05``)."""
    if not _VERSION.fullmatch(version) or len(version) > MAX_VERSION:
        raise StubDriverError(f"driver version {version!r}: not like 580.95.05")


def encode_table(table: StubTable) -> bytes:
    """The table as the libraries hold it: exactly :data:`TABLE_SIZE` bytes."""
    table.validate()
    lines = [
        TABLE_MARKER.decode(),
        f"driver {table.driver_version}",
        f"cuda {table.cuda_version}",
        *(f"gpu {g.minor} {g.uuid} {g.memory_mib} {g.pci_bus_id} {g.name}" for g in table.gpus),
        *([f"simulate {table.simulate}"] if table.simulate else []),
        *([f"seed {table.seed}"] if table.seed else []),
    ]
    text = ("\n".join(lines) + "\n").encode()
    if len(text) >= TABLE_SIZE:  # keep one NUL at least
        raise StubDriverError(f"the GPU table needs {len(text)} bytes, over {TABLE_SIZE - 1}")
    return text.ljust(TABLE_SIZE, b"\0")


def parse_table(data: bytes) -> StubTable:
    """The table in ``data``: a library file's bytes or an encoded table."""
    start = _marker_offset(data)
    text = data[start : start + TABLE_SIZE].split(b"\0", 1)[0].decode()
    driver, cuda, gpus, simulate, seed = "0.0", 0, [], "", None
    for line in text.splitlines()[1:]:
        word, _, rest = line.partition(" ")
        if word == "driver":
            driver = rest
        elif word == "cuda":
            cuda = int(rest)
        elif word == "gpu":
            minor, uuid, memory, pci, name = rest.split(" ", 4)
            gpus.append(StubGpu(int(minor), uuid, name, int(memory), pci))
        elif word == "simulate":
            simulate = rest
        elif word == "seed":
            seed = rest
    return StubTable(driver, cuda, tuple(gpus), simulate, seed)


def read_table(path: Path) -> StubTable:
    """The table in a stub library file (libnvidia-ml or libcuda)."""
    return parse_table(path.read_bytes())


def patch_table(data: bytes, table: StubTable) -> bytes:
    """``data`` (a stub library's bytes) with its table replaced by ``table``."""
    start = _marker_offset(data)
    if start + TABLE_SIZE > len(data):
        raise StubDriverError("the GPU table runs past the end of the file")
    return data[:start] + encode_table(table) + data[start + TABLE_SIZE :]


def _marker_offset(data: bytes) -> int:
    start = data.find(TABLE_MARKER)
    if start < 0:
        raise StubDriverError("no GPU table in this file: not a stub driver library")
    if data.find(TABLE_MARKER, start + 1) >= 0:
        raise StubDriverError("two GPU table markers in this file: cannot tell which to patch")
    return start
