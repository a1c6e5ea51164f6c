"""What goes wrong on a simulated node: return codes a test injects, and XID error events.

A test makes a named C function fail (``fail("nvmlDeviceGetPowerUsage", NOT_SUPPORTED)``),
always or a number of times; the name also matches the function's versioned variants
(``nvmlInit`` fails ``nvmlInit_v2``). XIDs wait per GPU until an event set registered for that
GPU is read, as NVML delivers them.
"""

from __future__ import annotations

import pynvml

from .devices import NvmlFault


class InjectedFailures:
    def __init__(self) -> None:
        self._codes: dict[str, tuple[int, int | None]] = {}

    def add(self, function: str, code: int, times: int | None = None) -> None:
        """Make ``function`` return ``code``: ``times`` calls, or every call when None."""
        self._codes[function] = (code, times)

    def clear(self) -> None:
        self._codes.clear()

    def take(self, function: str) -> int | None:
        """The code a call of ``function`` returns now, counting it against ``times``."""
        for key in (function, function.split("_v")[0], function.rstrip("V")):
            entry = self._codes.get(key)
            if entry is None:
                continue
            code, times = entry
            if times is not None:
                if times <= 1:
                    del self._codes[key]
                else:
                    self._codes[key] = (code, times - 1)
            return code
        return None


class EventSets:
    """NVML event sets (the GPUs registered in each) and the XIDs not yet read."""

    def __init__(self) -> None:
        self._sets: dict[int, set[int]] = {}
        self._xids: dict[int, list[int]] = {}
        self._last_id = 0

    def create(self) -> int:
        """A new set's id: never one given before, so a freed id cannot alias a live set."""
        self._last_id += 1
        self._sets[self._last_id] = set()
        return self._last_id

    def register(self, set_id: int, gpu: int) -> None:
        self._members(set_id).add(gpu)

    def free(self, set_id: int) -> None:
        if self._sets.pop(set_id, None) is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._xids.setdefault(gpu, []).append(xid)

    def first_with_xid(self, set_id: int) -> int | None:
        """The lowest GPU registered in the set with an XID not yet read."""
        return next((gpu for gpu in sorted(self._members(set_id)) if self._xids.get(gpu)), None)

    def take_xid(self, gpu: int) -> int:
        """The oldest unread XID of ``gpu``, now read."""
        return self._xids[gpu].pop(0)

    def _members(self, set_id: int) -> set[int]:
        members = self._sets.get(set_id)
        if members is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return members
