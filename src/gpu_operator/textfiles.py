"""Reading the files a command is given: a file that is not UTF-8 text, or not valid YAML, is
refused with :class:`FileProblem`, which names the file, what is wrong (the encoding its
byte-order mark shows; the line and column of a YAML error) and what to do, in one line."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml

T = TypeVar("T")

# UTF-32's little-endian mark begins with UTF-16's: the longer marks are tried first.
BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32 little-endian"),
    (codecs.BOM_UTF32_BE, "UTF-32 big-endian"),
    (codecs.BOM_UTF16_LE, "UTF-16 little-endian"),
    (codecs.BOM_UTF16_BE, "UTF-16 big-endian"),
)
SAVE_AS_UTF8 = "save it as UTF-8 text"
FIX_YAML = "fix the YAML there"
FIX_FILE = "fix the file"


class FileProblem(ValueError):
    """A file the command cannot use as given: ``problem`` says why, ``hint`` what to do."""

    def __init__(self, path: str | Path, problem: str, hint: str) -> None:
        self.path, self.problem, self.hint = str(path), problem, hint
        super().__init__(f"{path}: {problem}")


def decode_problem(exc: UnicodeDecodeError) -> str:
    """What a file that failed to decode as UTF-8 holds instead, as far as its bytes show."""
    data = bytes(exc.object)
    for mark, name in BYTE_ORDER_MARKS:
        if data.startswith(mark):
            return f"{name} text (its byte-order mark says so), not UTF-8"
    if b"\x00" in data[:4096]:
        return "binary data, not UTF-8 text"
    return f"not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line, with where it is (line and column, counted from 1)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {problem}"


def read_text(path: str | Path) -> str:
    """The file's text (a UTF-8 byte-order mark dropped); OSError as the system says it."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileProblem(path, decode_problem(exc), SAVE_AS_UTF8) from None
    if "\x00" in text:  # valid UTF-8, but no text: binary, or UTF-16 without its mark
        problem = "NUL bytes in it: binary, or UTF-16/32 without a byte-order mark, not UTF-8"
        raise FileProblem(path, problem, SAVE_AS_UTF8)
    return text


def parse_file(
    path: str | Path,
    parse: Callable[[str], T],
    problems: tuple[type[Exception], ...] = (),
) -> T:
    """``parse`` of the file's text. A YAML error on the way, or one of ``problems`` (the
    parser's own errors, which cannot know the file's name), is a FileProblem naming it."""
    text = read_text(path)
    try:
        return parse(text)
    except yaml.YAMLError as exc:
        raise FileProblem(path, yaml_problem(exc), FIX_YAML) from None
    except problems as exc:
        raise FileProblem(path, " ".join(str(exc).split()), FIX_FILE) from None
