"""The process tuning: thread names reach the kernel."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpu_operator.controller.runtime.process import name_os_thread


@pytest.mark.skipif(not Path("/proc/thread-self/comm").exists(), reason="not Linux")
def test_a_named_thread_is_named_in_the_kernel() -> None:
    seen: list[str] = []

    def run() -> None:
        name_os_thread("watch-a-very-long-name")
        seen.append(Path("/proc/thread-self/comm").read_text().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["watch-a-very-lo"]  # the kernel keeps 15 bytes
