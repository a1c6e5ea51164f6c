"""What some tests need from outside this repository, and the one way to ask for it.

NVIDIA's reference documents sit beside the checkout (``../shared/reference``) in this
project's CI; a user's clone has none. kubectl is on PATH in CI, not on every machine, nor is
gcc (the stub NVIDIA driver is compiled with it). A test that needs one asks here: when it is
absent the test skips with one line saying what is missing, except with ``CI`` set, where it
fails. The session's summary counts those skips once
(``tests/conftest.py``).

The real-GPU tier (``tests/gpu``) is the exception: no CI machine has a GPU, so its tests skip
with :data:`NO_NVIDIA_DRIVER` everywhere, CI included. This module imports only pytest at top
level, so that tier runs on a GPU machine without the testenv's dependencies (kubernetes).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from tests.paths import REPO

REFERENCE = REPO.parent / "shared" / "reference"
NO_REFERENCE = "needs ../shared/reference (NVIDIA's reference documents), absent in this clone"
NO_KUBECTL = "needs kubectl, not on PATH"
NO_GCC = "needs gcc (to build the stub NVIDIA driver), not on PATH"
# tests/gpu: a skip, never a failure, CI included (CI has no GPU).
NO_NVIDIA_DRIVER = "no NVIDIA driver on this machine (no libnvidia-ml.so.1 under /)"
NO_NVIDIA_DEVICE = "NVIDIA driver libraries but no /dev/nvidiactl here (no driver loaded)"
REASONS = (NO_REFERENCE, NO_KUBECTL, NO_GCC, NO_NVIDIA_DRIVER, NO_NVIDIA_DEVICE)


def absent(reason: str) -> NoReturn:
    """Skip with ``reason``; with CI set, fail: there nothing may be silently left out."""
    from gpu_operator.testenv.binaries import in_ci  # its package imports the testenv's deps

    if in_ci():
        pytest.fail(f"CI is set and this test {reason}", pytrace=False)
    pytest.skip(reason)


def reference(*parts: str) -> Path:
    """A file or folder of ``../shared/reference``; a name missing from a present reference
    folder is a failure (a typo or a moved file), never a skip."""
    if not REFERENCE.is_dir():
        absent(NO_REFERENCE)
    path = REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path} is not in the reference documents", pytrace=False)
    return path


def nvidia(name: str) -> Path:
    """One of NVIDIA's documents (``../shared/reference/nvidia/<name>``)."""
    return reference("nvidia", name)


def kubectl() -> str:
    """The kubectl executable."""
    path = shutil.which("kubectl")
    if path is None:
        absent(NO_KUBECTL)
    return path


def gcc() -> str:
    """The C compiler the stub driver is built with (``gpu_operator.sim.stubdriver``)."""
    path = shutil.which("gcc")
    if path is None:
        absent(NO_GCC)
    return path
