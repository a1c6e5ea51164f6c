"""An agent's stop: SIGTERM sets it, and the main thread's wait for it wakes by itself."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from gpu_operator import stopping


@pytest.fixture
def handlers() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_set_the_stop_of_the_main_thread(
    handlers: None, signum: signal.Signals
) -> None:
    stop = stopping.stop_on_signals()
    handler = signal.getsignal(signum)
    assert callable(handler)
    handler(signum, None)  # what Python runs when the signal comes (not sent: this is a worker)
    stopping.wait_until(stop)
    assert stop.is_set()


def test_from_another_thread_the_given_event_is_kept_and_no_handler_installed(
    handlers: None,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    mine = threading.Event()
    got: list[threading.Event] = []
    thread = threading.Thread(target=lambda: got.append(stopping.stop_on_signals(mine)))
    thread.start()
    thread.join()
    assert got == [mine] and signal.getsignal(signal.SIGTERM) is before


def test_the_wait_wakes_on_its_own_to_let_a_pending_handler_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handed to another thread leaves the main thread's untimed wait asleep: the
    wait must come back to Python now and then, so it is made of timed waits."""
    waits: list[float | None] = []

    class Counting(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            if len(waits) == 3:
                self.set()  # as a handler run between two waits would
            return super().wait(0)

    stopping.wait_until(Counting())
    assert waits == [stopping.WAKE_S] * 3
