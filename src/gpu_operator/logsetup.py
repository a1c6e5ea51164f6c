"""How the operator and the agents log: one set-up for every long-running command.

``LOG_LEVEL`` is read in any case (``debug``, ``INFO``; NVIDIA's chart also allows a number,
which means debug), ``LOG_FORMAT`` is ``text`` (one line: time, level, logger, message) or
``json`` (one object a line, for log collectors). A flag given on the command line wins over
the environment. A bad value is refused with :class:`LogSettingError` before anything runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

__all__ = [
    "FORMATS",
    "JsonFormatter",
    "LogSettingError",
    "add_log_format_option",
    "configure",
    "parse_level",
    "wants_debug",
]


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """``--log-format text|json``, over LOG_FORMAT; :func:`configure` takes what it parsed."""
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=None,
        help="log lines as text or JSON objects (env LOG_FORMAT; default text)",
    )


class LogSettingError(ValueError):
    """LOG_LEVEL or LOG_FORMAT holds a value no logger takes."""


def parse_level(text: str) -> int:
    """The logging level ``text`` names, in any case; a positive number (a verbosity, in
    NVIDIA's chart) means debug."""
    value = text.strip()
    if value.isdigit() and int(value) > 0:
        return logging.DEBUG
    name = value.upper()
    if name == "WARN":
        name = "WARNING"
    if name.lower() not in LEVELS:
        raise LogSettingError(f"LOG_LEVEL={text!r}: expected one of {', '.join(LEVELS)}")
    level: int = getattr(logging, name)
    return level


def parse_format(text: str) -> str:
    value = text.strip().lower()
    if value not in FORMATS:
        raise LogSettingError(f"LOG_FORMAT={text!r}: expected one of {', '.join(FORMATS)}")
    return value


def wants_debug(env: Mapping[str, str] = os.environ) -> bool:
    """Whether LOG_LEVEL asks for debug (never raises: asked while reporting an error)."""
    try:
        return parse_level(env.get("LOG_LEVEL") or "info") == logging.DEBUG
    except LogSettingError:
        return False


class JsonFormatter(logging.Formatter):
    """One JSON object a record: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``,
    and ``exception`` (the formatted traceback) when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs, told apart from anyone else's."""


def configure(
    level: str | None = None, fmt: str | None = None, env: Mapping[str, str] = os.environ
) -> None:
    """Log at ``level`` (else LOG_LEVEL, else info) to stderr in ``fmt`` (else LOG_FORMAT, else
    text). Both are checked first, so a bad value fails the command at once. Logging someone
    else has set up (a test's capture, an embedding program) is left as it is; a second call
    replaces what the first one installed."""
    resolved = parse_level(level or env.get("LOG_LEVEL") or "info")
    chosen = parse_format(fmt or env.get("LOG_FORMAT") or "text")
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _Handler)]
    if len(ours) != len(root.handlers):
        return
    for handler in ours:
        root.removeHandler(handler)
    handler = _Handler()
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(resolved)
