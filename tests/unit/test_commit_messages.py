"""Commit messages since the rule began: a subject of at most 72 characters, so that
`git log --oneline` reads as a list, and (merges aside) a body saying why. Earlier history is
left as it was written."""

from __future__ import annotations

import shutil
import subprocess

from tests.paths import REPO
from tests.prerequisites import absent

# The last commit written before the rule: everything after it keeps it.
RULE_SINCE = "5409d37c3ba8a4b9dd13cec3cb9d6dc5a68e8e3b"
SUBJECT_MAX = 72
NO_HISTORY = "needs this checkout's git history (git on PATH, a clone with .git)"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


def _commits() -> list[tuple[str, bool, str, str]]:
    """(hash, is a merge, subject, body) of each commit under the rule; in a clone without the
    rule's first commit (a shallow one), the newest only."""
    if shutil.which("git") is None or _git("rev-parse", "HEAD").returncode != 0:
        absent(NO_HISTORY)
    since = _git("merge-base", "--is-ancestor", RULE_SINCE, "HEAD").returncode == 0
    span = [f"{RULE_SINCE}..HEAD"] if since else ["-1", "HEAD"]
    out = _git("log", "--format=%H%x00%P%x00%s%x00%b%x1e", *span).stdout
    commits = []
    for record in filter(None, (r.strip("\n") for r in out.split("\x1e"))):
        sha, parents, subject, body = record.split("\x00", 3)
        commits.append((sha[:7], len(parents.split()) > 1, subject, body.strip()))
    return commits


def problems(commits: list[tuple[str, bool, str, str]]) -> list[str]:
    """What breaks the rule, one line per commit and problem."""
    found = []
    for sha, merge, subject, body in commits:
        if len(subject) > SUBJECT_MAX:
            found.append(f"{sha}: subject of {len(subject)} characters: {subject}")
        if not merge and not body:
            found.append(f"{sha}: no body saying why: {subject}")
    return found


def test_each_commit_has_a_short_subject_and_says_why_in_its_body() -> None:
    commits = _commits()
    assert commits
    assert problems(commits) == []


def test_a_long_subject_and_a_missing_body_are_named() -> None:
    assert problems([("a", False, "x" * SUBJECT_MAX, "why")]) == []
    assert problems([("b", True, "Merge branch 'x'", "")]) == []
    assert problems([("c", False, "x" * (SUBJECT_MAX + 1), "why")]) == [
        f"c: subject of 73 characters: {'x' * 73}"
    ]
    assert problems([("d", False, "Fix it", "")]) == ["d: no body saying why: Fix it"]
