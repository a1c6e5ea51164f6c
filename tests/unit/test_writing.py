"""The written text carries no internal issue numbers: they mean nothing to a reader outside
this project's tracker. An upstream issue is cited with its project (``NVIDIA issue 2288``)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.paths import REPO

WRITTEN = ("src", "tests", "docs", "benchmarks", "hack", "templates", "examples", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".j2", ".yaml", ".c", ".h", ""}
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
# An issue number with its project named just before it is a citation, not an internal one.
UPSTREAM = re.compile(r"(NVIDIA|gpu-operator|k8s-device-plugin|dra-driver|kopf|kubernetes)\S*\s*$")


def internal_references(text: str) -> list[str]:
    """The issue numbers in ``text`` not preceded by the project they belong to."""
    found = []
    for match in ISSUE.finditer(text):
        before = text[max(0, match.start() - 30) : match.start()]
        if not UPSTREAM.search(before):
            found.append(match.group())
    return found


def test_the_rule_tells_a_citation_from_an_internal_number() -> None:
    assert internal_references("as NVIDIA issue 2288 asks; NVIDIA's issue 1262") == []
    assert internal_references("gpu-operator issue 2006 and (issue 16) here") == ["issue 16"]
    assert internal_references("Issue 28, continued") == ["Issue 28"]


def test_no_internal_issue_numbers_in_code_or_docs() -> None:
    offenders = []
    for top in WRITTEN:
        root = REPO / top
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in files:
            if not path.is_file() or path.suffix not in SUFFIXES or "__pycache__" in path.parts:
                continue
            if path == Path(__file__):
                continue  # its own examples
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for ref in internal_references(text):
                offenders.append(f"{path.relative_to(REPO)}: {ref}")
    assert offenders == [], "\n".join(offenders)
