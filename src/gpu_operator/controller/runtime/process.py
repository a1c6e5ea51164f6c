"""How the operator's process is tuned for a fleet of thousands of nodes: its threads named in
the kernel, one malloc arena, rarer garbage collections.

Each is measured in ``benchmarks/README.md``; none changes what the operator decides.
"""

from __future__ import annotations

import ctypes
import gc
from concurrent.futures import ThreadPoolExecutor

M_ARENA_MAX = -8  # glibc's mallopt parameter
PR_SET_NAME = 15  # prctl option: the calling thread's name
GC_THRESHOLDS = (20_000, 20, 20)  # CPython's are (700, 10, 10)


def _libc_call(function: str, *args: object) -> None:
    """Call a C library function where this platform has it (glibc on Linux); else nothing."""
    try:
        fn = getattr(ctypes.CDLL(None), function)
    except (OSError, AttributeError):  # not Linux, or not glibc: nothing to tune
        return
    fn(*args)


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel too (15 bytes kept), so ``top -H`` and
    ``/proc/PID/task/*/comm`` say which watch, or the event loop, spends the CPU."""
    _libc_call("prctl", PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def named_pool(name: str, max_workers: int | None = None) -> ThreadPoolExecutor:
    """A thread pool whose threads carry ``name`` in the kernel too (see
    :func:`name_os_thread`)."""
    return ThreadPoolExecutor(
        max_workers, thread_name_prefix=name, initializer=name_os_thread, initargs=(name,)
    )


def one_malloc_arena() -> None:
    """glibc gives each thread that allocates its own malloc arena and keeps what is freed in
    it: a dozen watch threads parsing thousands of events would hold their peaks each (the
    RSS of a 500-node fleet doubled). One arena serves them all; the GIL serializes them
    anyway."""
    _libc_call("mallopt", M_ARENA_MAX, 1)


def fewer_collections() -> None:
    """Parsing a pod event allocates hundreds of dicts and lists, so CPython's default
    thresholds ran a young collection every event or two, and full ones, which walk every
    object the stores keep (about 100 ms each at 500 nodes): in one 500-node convergence
    measured in-process, 14 of them, 1.5 CPU-seconds that freed almost nothing (what the
    stores drop has no cycles and goes by reference counting). Rarer collections; cyclic
    garbage still goes."""
    gc.set_threshold(*GC_THRESHOLDS)
