"""The driver found for CDI specs is kept while its root looks the same (asked at every
Allocate), and found again once an install, upgrade or removal changes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_operator.agent import driver_cdi
from gpu_operator.agent.driver_cdi import find_host_driver

from .driver_layouts import VERSION, lib, ubuntu

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def discoveries(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = driver_cdi.discover_driver

    def counting(root: str | Path) -> driver_cdi.DriverFiles:
        calls.append(str(root))
        return real(root)

    monkeypatch.setattr(driver_cdi, "discover_driver", counting)
    return calls


def test_an_unchanged_root_is_not_searched_again(tmp_path: Path, discoveries: list[str]) -> None:
    ubuntu(tmp_path)
    first, missing = find_host_driver(str(tmp_path), "/host")
    assert missing is None and first.files is not None
    for _ in range(5):
        again, _ = find_host_driver(str(tmp_path), "/host")
        assert again is first
    assert len(discoveries) == 1
    other, _ = find_host_driver(str(tmp_path), "/elsewhere")  # another host path: its own
    assert other.host_root == "/elsewhere" and len(discoveries) == 2


def test_an_upgrade_in_place_is_found(tmp_path: Path, discoveries: list[str]) -> None:
    ubuntu(tmp_path)
    before, _ = find_host_driver(str(tmp_path), "/")
    assert before.files is not None and before.files.version == VERSION
    lib(tmp_path, f"{LIBDIR}/libnvidia-encode.so.{VERSION}", "libnvidia-encode.so.1")
    after, _ = find_host_driver(str(tmp_path), "/")
    assert after.files is not None
    assert f"{LIBDIR}/libnvidia-encode.so.{VERSION}" in {x.path for x in after.files.libraries}
    assert len(discoveries) == 2


def test_a_removed_driver_is_noticed_and_a_missing_one_asked_for_each_time(
    tmp_path: Path, discoveries: list[str]
) -> None:
    ubuntu(tmp_path)
    assert find_host_driver(str(tmp_path), "/")[1] is None
    shutil.rmtree(tmp_path / "usr/lib")
    for _ in range(2):
        driver, missing = find_host_driver(str(tmp_path), "/")
        assert driver.files is None and missing is not None
    assert len(discoveries) == 3
