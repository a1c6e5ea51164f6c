"""One logging set-up: LOG_LEVEL in any case, text or JSON lines, bad values refused first."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpu_operator import logsetup


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("debug", logging.DEBUG),
        ("DEBUG", logging.DEBUG),
        ("Info", logging.INFO),
        ("warn", logging.WARNING),
        ("error", logging.ERROR),
        ("4", logging.DEBUG),  # NVIDIA's chart: a number is a debug verbosity
    ],
)
def test_levels_in_any_case(text: str, level: int) -> None:
    assert logsetup.parse_level(text) == level


@pytest.mark.parametrize("env", [{"LOG_LEVEL": "loud"}, {"LOG_LEVEL": "0"}, {"LOG_FORMAT": "xml"}])
def test_a_bad_value_is_refused_before_anything_is_set_up(env: dict[str, str]) -> None:
    with pytest.raises(logsetup.LogSettingError, match=next(iter(env))):
        logsetup.configure(env=env)


def test_wants_debug_never_raises() -> None:
    assert logsetup.wants_debug({"LOG_LEVEL": "Debug"})
    assert not logsetup.wants_debug({"LOG_LEVEL": "loud"})
    assert not logsetup.wants_debug({})


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger as a fresh process has it, no handlers, for the block (pytest's own
    handlers are put back in the same list, where pytest takes them out again)."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        yield root
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_json_lines_for_log_collectors() -> None:
    with bare_root() as root:
        logsetup.configure("info", "json", env={})
        logsetup.configure("debug", "json", env={})  # a second call replaces the first
        (handler,) = root.handlers
        stream = io.StringIO()
        handler.setStream(stream)  # type: ignore[attr-defined]
        logging.getLogger("gpu_operator.test").debug("hello %s", "there")
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "DEBUG" and entry["message"] == "hello there"
    assert entry["logger"] == "gpu_operator.test" and entry["time"].endswith("+00:00")


def test_the_environment_is_read_when_no_flag_says() -> None:
    with bare_root() as root:
        logsetup.configure(env={"LOG_LEVEL": "warning", "LOG_FORMAT": "TEXT"})
        assert root.level == logging.WARNING
        assert not isinstance(root.handlers[0].formatter, logsetup.JsonFormatter)


def test_someone_elses_logging_is_left_alone() -> None:
    with bare_root() as root:
        theirs = logging.NullHandler()
        root.addHandler(theirs)
        logsetup.configure("debug", "json", env={})
        assert root.handlers == [theirs]
