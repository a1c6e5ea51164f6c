"""A given file that is not UTF-8 text, or not valid YAML, is named with what it is instead."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
import yaml

from gpu_operator.textfiles import FileProblem, parse_file, read_text


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("a: 1\n".encode("utf-16-le"), "NUL bytes"),  # decodes, but is no text
        ("a: 1\n".encode("utf-16"), "UTF-16 little-endian text"),
        (codecs.BOM_UTF16_BE + "a: 1\n".encode("utf-16-be"), "UTF-16 big-endian text"),
        ("a: 1\n".encode("utf-32"), "UTF-32 little-endian text"),
        ("café: 1\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 3)"),
    ],
)
def test_what_a_file_that_is_not_utf8_holds(tmp_path: Path, data: bytes, said: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_bytes(data)
    with pytest.raises(FileProblem) as raised:
        read_text(path)
    assert raised.value.path == str(path) and said in raised.value.problem
    assert raised.value.hint == "save it as UTF-8 text"


def test_a_utf8_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_text(path) == "a: 1\n"


class NotAConfig(ValueError):
    pass


def test_yaml_errors_and_the_parsers_own_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\nb: [\n")
    with pytest.raises(FileProblem, match=r"config.yaml: not valid YAML at line 3, column 1"):
        parse_file(path, yaml.safe_load)

    def refuse(_: str) -> None:
        raise NotAConfig("version: unsupported 'v2'\n(expected v1)")

    valid = tmp_path / "valid.yaml"
    valid.write_text("a: 1\n")
    with pytest.raises(FileProblem, match=r"valid.yaml: version: unsupported 'v2' \(expected v1\)"):
        parse_file(valid, refuse, (NotAConfig,))
    with pytest.raises(FileNotFoundError):
        parse_file(tmp_path / "missing.yaml", yaml.safe_load)
