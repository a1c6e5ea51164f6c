"""A simulated node's MIG state and injected faults in a JSON file, so several processes see
one node.

On a real node the MIG manager, discovery and the exporter are separate processes reading one
driver. Here each has its own simulated library; they share MIG mode, instances and hardware
faults through a state file: every change is made under an exclusive ``flock`` on
``<file>.lock`` after re-reading the file, then written atomically (write and rename); reads
re-load the file when its inode, mtime or size moved (a rename makes a new inode, so two writes
within one coarse mtime tick are still seen).

The document: ``{"gpus": [{"model", "uuid", "mig_current", "mig_pending", "gis": [...],
"faults": {...}, "fabric": {...}}]}``, one entry per GPU in index order; ``faults`` is
:func:`.hwfaults.to_doc` (absent in files from before faults: a healthy GPU), ``fabric``
:func:`.fabric.to_doc` (null: no NVLink fabric).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import fabric, hwfaults
from .devices import SimCi, SimGi, SimGpu
from .profiles import SimulationError


def dump(gpus: Sequence[SimGpu]) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "model": g.model.key,
                "uuid": g.uuid,
                "mig_current": g.mig_current,
                "mig_pending": g.mig_pending,
                "gis": [
                    {
                        "id": gi.id,
                        "profile_index": gi.profile_index,
                        "start": gi.start,
                        "size": gi.size,
                        "cis": [{"id": c.id, "profile_index": c.profile_index} for c in gi.cis],
                    }
                    for gi in g.gis
                ],
                "faults": hwfaults.to_doc(g.faults),
                "fabric": fabric.to_doc(g.fabric),
            }
            for g in gpus
        ]
    }


def load(gpus: Sequence[SimGpu], doc: dict[str, Any]) -> bool:
    """Take MIG state from ``doc`` into ``gpus`` in place; False (and no change) when ``doc``
    describes other GPU models: that file belongs to another layout and will be overwritten."""
    saved = doc.get("gpus", [])
    if [g.get("model") for g in saved] != [g.model.key for g in gpus]:
        return False
    for gpu, state in zip(gpus, saved, strict=True):
        gpu.mig_current = bool(state["mig_current"])
        gpu.mig_pending = bool(state["mig_pending"])
        gpu.gis = [
            SimGi(
                id=gi["id"],
                profile_index=gi["profile_index"],
                start=gi["start"],
                size=gi["size"],
                cis=[SimCi(c["id"], c["profile_index"]) for c in gi["cis"]],
            )
            for gi in state["gis"]
        ]
        gpu.faults = hwfaults.from_doc(state.get("faults"))
        if "fabric" in state:  # a file from before fabrics: as booted
            gpu.fabric = fabric.from_doc(state["fabric"])
    return True


def read_doc(path: Path) -> dict[str, Any]:
    """The document of an existing state file (whole: files are replaced by rename)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise _missing(path) from None
    except ValueError as exc:
        raise SimulationError(f"{path} is not a simulated NVML state: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        raise SimulationError(f"{path} is not a simulated NVML state: no GPU list")
    return doc


def _missing(path: Path) -> SimulationError:
    return SimulationError(
        f"no simulated NVML state at {path}: the node's simulated NVML writes it when its first "
        "agent starts"
    )


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) last read/written

    def sync(self, gpus: Sequence[SimGpu]) -> None:
        """Re-read the file if another process changed it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            load(gpus, json.loads(self.path.read_text()))
            self._seen = seen

    @contextmanager
    def update(self, gpus: Sequence[SimGpu]) -> Iterator[None]:
        """Change ``gpus`` inside the block from the latest state; written unless it raises."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            self._seen = None
            self.sync(gpus)
            yield
            self._write(dump(gpus))

    @contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        """Change the document itself, for a process that does not have the node's GPUs (fault
        injection); written unless the block raises. The file must exist: only the node's
        simulated NVML knows its GPUs, and a file made here would be overwritten by it."""
        if not self.path.exists():
            raise _missing(self.path)  # before the lock: leave no lock file behind
        with self._locked():
            doc = read_doc(self.path)
            yield doc
            self._write(doc)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, doc: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)
        st = self.path.stat()
        self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
