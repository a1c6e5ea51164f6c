"""What goes wrong on a simulated node: return codes a test injects, and reading XID events.

A test makes a named C function fail (``fail("nvmlDeviceGetPowerUsage", NOT_SUPPORTED)``),
always or a number of times; the name also matches the function's versioned variants
(``nvmlInit`` fails ``nvmlInit_v2``).

XIDs are logged per GPU with a sequence number (:mod:`.hwfaults`, shared by the node's
processes). As NVML does, every event set registered for a GPU receives every XID logged after
its registration, once: a set remembers, per GPU, the last sequence number it delivered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    """This process's NVML event sets: per set, its GPUs and the last XID delivered of each."""

    def __init__(self) -> None:
        self._sets: dict[int, dict[int, int]] = {}  # set id -> GPU index -> sequence read
        self._last_id = 0

    def create(self) -> int:
        """A new set's id: never one given before, so a freed id cannot alias a live set."""
        self._last_id += 1
        self._sets[self._last_id] = {}
        return self._last_id

    def register(self, set_id: int, gpu: int, seq: int) -> None:
        """Deliver ``gpu``'s XIDs after sequence number ``seq`` (the latest one now); a GPU
        registered again keeps its place."""
        self._members(set_id).setdefault(gpu, seq)

    def free(self, set_id: int) -> None:
        if self._sets.pop(set_id, None) is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def next_xid(
        self, set_id: int, log: Callable[[int, int], Sequence[tuple[int, int]]]
    ) -> tuple[int, int] | None:
        """(GPU, XID): the oldest XID not yet delivered of the lowest GPU in the set that has
        one, now delivered; None when none waits. ``log(gpu, seq)``: the GPU's XIDs after
        ``seq`` as (sequence number, XID), oldest first."""
        members = self._members(set_id)
        for gpu in sorted(members):
            pending = log(gpu, members[gpu])
            if pending:
                seq, xid = pending[0]
                members[gpu] = seq
                return gpu, xid
        return None

    def _members(self, set_id: int) -> dict[int, int]:
        members = self._sets.get(set_id)
        if members is None:
            raise NvmlFault(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return members
