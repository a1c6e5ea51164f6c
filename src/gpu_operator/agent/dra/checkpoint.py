"""Prepared claims, checkpointed on the node so a restarted plugin answers as before.

One JSON file per plugin directory, rewritten atomically (rename) after every change: a plugin
killed between two writes finds either the old or the new state, never half of one.
:class:`ClaimFile` keeps each claim's entry as plain JSON; :class:`Checkpoint` is the GPU
plugin's, whose entries are its prepared devices (the compute-domain plugin has its own entries
in its own directory, :mod:`gpu_operator.agent.dra.computedomain.plugin`).
"""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

from gpu_operator.agent.dra.prepare import PreparedDevice

FILE = "checkpoint.json"
VERSION = 1


class ClaimFile:
    """Each prepared claim's entry (a JSON object) by claim UID, in ``directory``/``FILE``."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"{self.path}: checkpoint version {data.get('version')!r}")
            self._claims = dict(data.get("claims") or {})

    def entry(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._claims.get(uid)
            return copy.deepcopy(found) if found is not None else None

    def set_entry(self, uid: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self._claims[uid] = copy.deepcopy(entry)
            self._save()

    def remove(self, uid: str) -> bool:
        with self._lock:
            if self._claims.pop(uid, None) is None:
                return False
            self._save()
            return True

    def uids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._claims)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE}.tmp")
        tmp.write_text(json.dumps({"version": VERSION, "claims": self._claims}, sort_keys=True))
        os.replace(tmp, self.path)


class Checkpoint(ClaimFile):
    """The GPU plugin's: each claim's namespace, name and prepared devices."""

    def get(self, uid: str) -> tuple[PreparedDevice, ...] | None:
        entry = self.entry(uid)
        if entry is None:
            return None
        return tuple(PreparedDevice.from_json(d) for d in entry["devices"])

    def put(self, uid: str, namespace: str, name: str, devices: tuple[PreparedDevice, ...]) -> None:
        self.set_entry(
            uid, {"namespace": namespace, "name": name, "devices": [d.to_json() for d in devices]}
        )
