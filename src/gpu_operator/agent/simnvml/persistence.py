"""A simulated node's MIG state in a JSON file, so several processes see one node.

On a real node the MIG manager, discovery and the exporter are separate processes reading one
driver. Here each has its own simulated library; they share MIG mode and instances through a
state file: every change is made under an exclusive ``flock`` on ``<file>.lock`` after
re-reading the file, then written atomically (write and rename); reads re-load the file when
its mtime or size moved.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .devices import SimCi, SimGi, SimGpu


def dump(gpus: Sequence[SimGpu]) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "model": g.model.key,
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
    return True


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) last read or written

    def sync(self, gpus: Sequence[SimGpu]) -> None:
        """Re-read the file if another process changed it."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._seen:
            load(gpus, json.loads(self.path.read_text()))
            self._seen = seen

    @contextmanager
    def update(self, gpus: Sequence[SimGpu]) -> Iterator[None]:
        """Change ``gpus`` inside the block from the latest state; written unless it raises."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._seen = None
                self.sync(gpus)
                yield
                tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(dump(gpus)))
                os.replace(tmp, self.path)
                st = self.path.stat()
                self._seen = (st.st_mtime_ns, st.st_size)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
