"""Fields NVIDIA moved or removed: the error says where each went, `migrate` carries it there."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import PolicyError, parse_document, parse_spec
from gpu_operator.api.crd import clusterpolicy_crd
from gpu_operator.api.legacy import BY_PATH, MIGRATE, migrate, migrate_spec
from gpu_operator.cli import main
from gpu_operator.migrate_cli import indentation, migrate_file
from tests import prerequisites
from tests.paths import REPO

SAMPLE = {
    "boolean": True,
    "string": "x",
    "integer": 60,
    "array": [{"key": "k", "operator": "Exists"}],
    "object": {"a": "b"},
}


def wild_documents() -> list[Path]:
    """ClusterPolicies found in the wild, beside the checkout (a reference document)."""
    return sorted(prerequisites.reference("wild-clusterpolicies").glob("[0-9][0-9]-*.yaml"))


def sample(schema: dict[str, Any]) -> Any:
    return schema["enum"][-1] if "enum" in schema else SAMPLE[schema["type"]]


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def problems(spec: dict[str, Any]) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_spec(spec)
    return caught.value.problems


@pytest.mark.parametrize("path", sorted(BY_PATH), ids=".".join)
def test_each_legacy_field_is_refused_with_where_it_went(path: tuple[str, ...]) -> None:
    entry = BY_PATH[path]
    found = problems(nested(path, sample(entry.schema)))
    assert found == [f"spec.{'.'.join(path)}: {entry.hint}", MIGRATE]
    assert (
        "moved to spec." in entry.hint
        or "renamed to spec." in entry.hint
        or ("removed" in entry.hint or "not a" in entry.hint or "never in" in entry.hint)
    )


def test_an_unknown_field_is_still_a_spelling_error() -> None:
    assert problems({"driver": {"verison": "1"}}) == [
        "spec.driver.verison: unknown field (check its spelling against the ClusterPolicy schema)"
    ]


@pytest.mark.parametrize("path", sorted(BY_PATH), ids=".".join)
def test_the_crd_keeps_each_legacy_field_instead_of_pruning_it(path: tuple[str, ...]) -> None:
    node = clusterpolicy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in ("spec", *path):
        node = node["properties"][part]
    assert node["type"] == BY_PATH[path].schema["type"]
    assert BY_PATH[path].hint in node["description"]


def test_null_means_absent_as_in_nvidias_own_sample() -> None:
    """NVIDIA's sample has `validator: {plugin: null, env: [...]}`; the apiserver drops nulls."""
    spec = parse_spec({"validator": {"plugin": None, "env": [{"name": "WITH_WORKLOAD"}]}})
    assert spec.validator.plugin is None
    assert spec.validator.env is not None and spec.validator.env[0].name == "WITH_WORKLOAD"


MOVES = [
    (
        {"driver": {"use_ocp_driver_toolkit": True}},
        {"driver": {}, "operator": {"use_ocp_driver_toolkit": True}},
    ),
    ({"operator": {"deployGFD": False}}, {"operator": {}, "gfd": {"enabled": False}}),
    ({"gfd": {"migStrategy": "mixed"}}, {"gfd": {}, "mig": {"strategy": "mixed"}}),
    (
        {"gfd": {"migStrategy": "mixed"}, "mig": {"strategy": "single"}},
        {"gfd": {}, "mig": {"strategy": "single"}},
    ),
    (
        {"gfd": {"sleepInterval": "30s"}},
        {"gfd": {"env": [{"name": "GFD_SLEEP_INTERVAL", "value": "30s"}]}},
    ),
    (
        {"gfd": {"discoveryIntervalSeconds": 90, "env": [{"name": "A", "value": "1"}]}},
        {
            "gfd": {
                "env": [{"name": "A", "value": "1"}, {"name": "GFD_SLEEP_INTERVAL", "value": "90s"}]
            }
        },
    ),
    (
        {
            "driver": {"tolerations": [{"key": "a", "operator": "Exists"}]},
            "gfd": {"tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b"}]},
            "daemonsets": {"tolerations": [{"key": "b"}]},
        },
        {
            "driver": {},
            "gfd": {},
            "daemonsets": {"tolerations": [{"key": "b"}, {"key": "a", "operator": "Exists"}]},
        },
    ),
    (
        {"validator": {"priorityClassName": "p", "nodeSelector": {"a": "b"}}},
        {"validator": {}, "daemonsets": {"priorityClassName": "p"}},
    ),
    (
        {"driver": {"upgradePolicy": {"drain": {"enabled": True, "force": True}}}},
        {"driver": {"upgradePolicy": {"drain": {"force": True, "enable": True}}}},
    ),
    (
        {"devicePlugin": {"args": ["--mig-strategy=mixed", "--pass-device-specs", "-v"]}},
        {
            "devicePlugin": {
                "args": ["-v"],
                "env": [{"name": "PASS_DEVICE_SPECS", "value": "true"}],
            },
            "mig": {"strategy": "mixed"},
        },
    ),
    (
        {
            "devicePlugin": {
                "args": ["--nvidia-driver-root=/run/nvidia/driver"],
                "env": [{"name": "NVIDIA_DRIVER_ROOT", "value": "/"}],
            }
        },
        {"devicePlugin": {"env": [{"name": "NVIDIA_DRIVER_ROOT", "value": "/"}]}},
    ),
]


@pytest.mark.parametrize(("old", "new"), MOVES)
def test_migrate_carries_each_value_to_its_place(old: dict[str, Any], new: dict[str, Any]) -> None:
    spec, notes = migrate_spec(old)
    assert spec == new
    assert notes, "every change is said"
    parse_spec(spec)


def test_a_value_already_at_the_new_place_wins_and_the_clash_is_said() -> None:
    _, notes = migrate_spec({"gfd": {"migStrategy": "mixed"}, "mig": {"strategy": "single"}})
    assert notes == [
        "removed spec.gfd.migStrategy: spec.mig.strategy is already set to 'single', which wins"
    ]


def test_migrate_leaves_a_current_document_alone() -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc.get("kind") == "ClusterPolicy":
                result = migrate(doc)
                assert result.document == doc and result.notes == (), path.name


def test_migrate_does_not_touch_its_input() -> None:
    doc = {"kind": "ClusterPolicy", "spec": {"driver": {"use_ocp_driver_toolkit": True}}}
    migrate(doc)
    assert doc["spec"]["driver"] == {"use_ocp_driver_toolkit": True}


def test_wild_documents_that_fail_get_hints_and_migrate_fixes_them() -> None:
    """Every wild document refused today is refused only for fields NVIDIA moved or removed,
    each line saying where it went; `migrate` then makes it valid."""
    refused = []
    for path in wild_documents():
        doc = yaml.safe_load(path.read_text())
        try:
            parse_document(doc)
        except PolicyError as exc:
            refused.append(path.name[:2])
            assert exc.problems[-1] == MIGRATE, path.name
            for line in exc.problems[:-1]:
                field, _, message = line.partition(": ")
                key = tuple(field.removeprefix("spec.").split("."))
                assert message == BY_PATH[key].hint, (path.name, line)
        result = migrate(doc)
        parse_document(result.document)
        assert migrate(result.document).notes == (), f"{path.name}: migrate is not idempotent"
    # The 1.x documents, and the later ones that kept driver.use_ocp_driver_toolkit or pasted
    # Helm values (drain.enabled, gfd.sleepInterval) into a ClusterPolicy.
    assert refused == ["02", "03", "04", "05", "06", "07", "08", "10", "17", "24", "25"]


def test_use_ocp_driver_toolkit_names_its_new_place_in_every_wild_document() -> None:
    for path in wild_documents():
        doc = yaml.safe_load(path.read_text())
        if "use_ocp_driver_toolkit" not in (doc.get("spec") or {}).get("driver", {}):
            continue
        with pytest.raises(PolicyError, match=r"moved to spec\.operator\.use_ocp_driver_toolkit"):
            parse_document(doc)
        moved = migrate(doc).document["spec"]["operator"]["use_ocp_driver_toolkit"]
        assert moved == doc["spec"]["driver"]["use_ocp_driver_toolkit"]


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
