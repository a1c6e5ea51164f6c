"""Fields NVIDIA moved or removed: the error says where each went, `migrate` carries it there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import PolicyError, parse_document, parse_spec
from gpu_operator.api.crd import clusterpolicy_crd
from gpu_operator.api.legacy import BY_PATH, MIGRATE, migrate, migrate_spec
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
