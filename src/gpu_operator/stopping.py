"""How a long-running process (the operator, an agent) stops: SIGTERM or SIGINT sets an event
its main thread waits on."""

from __future__ import annotations

import signal
import threading

WAKE_S = 1.0


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """``stop`` (a new event when None), set by SIGTERM and SIGINT; the handlers are installed
    only from the main thread, the one Python runs them in (an agent run in a test's thread
    keeps the test's event)."""
    stop = stop if stop is not None else threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return stop


def wait_until(stop: threading.Event) -> None:
    """Block until ``stop`` is set, waking every second. A signal the kernel hands to another
    thread (gRPC's, say) does not interrupt the main thread's untimed wait, and the handler
    that would set ``stop`` runs only once the main thread wakes: a device-plugin agent and the
    operator each once sat through SIGTERM until a test's timeout, where a kubelet would have
    SIGKILLed them."""
    while not stop.wait(WAKE_S):
        pass
