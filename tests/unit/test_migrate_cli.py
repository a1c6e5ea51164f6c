"""`gpu-operator migrate` (migrate_cli): a file's ClusterPolicies rewritten with `migrate`
in place, every comment and the layout of what it leaves kept."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from gpu_operator.api import parse_document
from gpu_operator.api.legacy import migrate
from gpu_operator.cli import main
from gpu_operator.migrate_cli import indentation, migrate_file
from tests.paths import REPO
from tests.unit.api.test_legacy import wild_documents

OLD = """\
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: old}
spec:
  operator: {deployGFD: true}
  gfd: {migStrategy: single}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kept}
"""


def run_cli(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str = ""
) -> tuple[int, str, str]:
    monkey = pytest.MonkeyPatch()
    monkey.setattr("sys.stdin", io.StringIO(stdin))
    try:
        code = main(argv)
    finally:
        monkey.undo()
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_the_rewritten_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(OLD)
    code, out, err = run_cli(["migrate", "-f", str(old)], capsys)
    assert code == 0, err
    policy, configmap = yaml.safe_load_all(out)
    assert policy["spec"] == {
        "operator": {},
        "gfd": {"enabled": True},
        "mig": {"strategy": "single"},
    }
    assert configmap == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept"}}
    assert f"{old}: old: moved spec.operator.deployGFD to spec.gfd.enabled" in err.splitlines()


def test_cli_reads_stdin_and_writes_json(capsys: pytest.CaptureFixture[str]) -> None:
    text = OLD.split("---")[0]
    code, out, _ = run_cli(["migrate", "-f", "-", "-o", "json"], capsys, stdin=text)
    assert code == 0
    assert json.loads(out)["spec"]["mig"] == {"strategy": "single"}


def test_cli_says_what_migration_cannot_fix(capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata: {name: p}\nspec: {drivr: {}}\n"
    )
    code, out, err = run_cli(["migrate", "-f", "-"], capsys, stdin=text)
    assert code == 1
    assert yaml.safe_load(out)["spec"] == {"drivr": {}}
    assert "error: -: p: spec.drivr: unknown field" in err


def test_cli_names_an_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["migrate", "-f", str(tmp_path / "nope.yaml")], capsys)
    assert code == 1 and "cannot read" in err


COMMENTED = """\
# A policy kept in git since 2021
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: old   # the name
spec:
  operator:
    deployGFD: true   # old switch
    # the runtime, by hand
    defaultRuntime: containerd
  # feature discovery
  gfd:
    migStrategy: single
    # GFD ends here
  # the driver, pinned
  driver:
    version: "550.54.15"   # tested
    tolerations:
      - key: dedicated   # our GPU pool
        operator: Exists
---
# kept as it is
apiVersion: v1
kind: ConfigMap
metadata: {name: kept}
"""
REMOVED = ("    deployGFD: true   # old switch", "    migStrategy: single", "    tolerations:")
MOVED = ("      - key: dedicated   # our GPU pool", "        operator: Exists")


def test_cli_keeps_every_comment_and_the_layout_of_what_it_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the lines of the fields that moved change: each other line (comments, quotes,
    flow maps, indentation) is there as it was, in its order; a moved list keeps its comments."""
    old = tmp_path / "old.yaml"
    old.write_text(COMMENTED)
    code, out, err = run_cli(["migrate", "-f", str(old)], capsys)
    assert code == 0, err
    kept = [line for line in COMMENTED.splitlines() if line not in REMOVED + MOVED]
    assert [line for line in out.splitlines() if line in kept] == kept
    assert all(line in out.splitlines() for line in MOVED)
    want = [migrate(d).document if d["kind"] == "ClusterPolicy" else d for d in
            yaml.safe_load_all(COMMENTED)]  # fmt: skip
    assert list(yaml.safe_load_all(out)) == want


def test_wild_documents_are_rewritten_in_place() -> None:
    """Each legacy document of the wild, rewritten in its file, reads as `migrate` decided and
    is valid; none of its comments is lost; a current one is left exactly as it is."""
    for path in wild_documents():
        text = path.read_text()
        migrated = migrate_file(text, path.name)
        if migrated.text is None:
            assert migrated.notes == [], path.name
            continue
        docs = [d for d in yaml.safe_load_all(migrated.text) if d is not None]
        assert docs == [migrate(d).document for d in yaml.safe_load_all(text) if d], path.name
        for doc in docs:
            parse_document(doc)
        comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
        assert all(c in migrated.text for c in comments), path.name


def test_cli_says_nothing_to_migrate_and_prints_the_file_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = tmp_path / "current.yaml"
    text = (REPO / "examples" / "time-slicing.yaml").read_text()
    current.write_text(text)
    code, out, err = run_cli(["migrate", "-f", str(current)], capsys)
    assert (code, out, err) == (0, text, f"{current}: nothing to migrate\n")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"], ids=repr)
def test_cli_refuses_a_file_without_a_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    code, out, err = run_cli(["migrate", "-f", str(empty)], capsys)
    assert (code, out) == (1, "")
    assert err == f"error: {empty}: no document to migrate: expected ClusterPolicy objects\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:\n  b:\n  - c\n", (2, 2, 0)),
        ("a:\n    b: 1\n    c:\n      - d\n", (4, 4, 2)),
        ("a:\n  - b\n", (2, 4, 2)),
        ("a: 1\n", (2, 2, 0)),
    ],
)
def test_indentation_is_the_files_own(text: str, expected: tuple[int, int, int]) -> None:
    assert indentation(text) == expected
