"""Prepared claims, checkpointed on the node so a restarted plugin answers as before.

One JSON file, rewritten atomically (rename) after every change: a plugin killed between two
writes finds either the old or the new state, never half of one.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from gpu_operator.agent.dra.prepare import PreparedDevice

FILE = "checkpoint.json"
VERSION = 1


class Checkpoint:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"{self.path}: checkpoint version {data.get('version')!r}")
            self._claims = dict(data.get("claims") or {})

    def get(self, uid: str) -> tuple[PreparedDevice, ...] | None:
        with self._lock:
            entry = self._claims.get(uid)
        if entry is None:
            return None
        return tuple(PreparedDevice.from_json(d) for d in entry["devices"])

    def put(self, uid: str, namespace: str, name: str, devices: tuple[PreparedDevice, ...]) -> None:
        with self._lock:
            self._claims[uid] = {
                "namespace": namespace,
                "name": name,
                "devices": [d.to_json() for d in devices],
            }
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
