"""The Helm chart's values: NVIDIA's keys are all accepted, nothing else is, the README says how
each is handled, and the chart's objects are deploy/'s. Rendering with helm is in
tests/e2e/test_helm.py (the helm binary comes with the local control plane)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.install import helm, manifests, rbac
from gpu_operator.install.helm_values import (
    MOVES,
    VALUES_KEYS,
    default_values,
    handled,
    key_table,
    key_table_markdown,
    values_schema,
)
from tests.paths import REPO
from tests.unit.install.values_data import NVIDIA_KEYS, keys_file, nvidia_values

CHART = REPO / helm.CHART_DIR


def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text()))


def test_the_schema_is_valid_draft_7() -> None:
    jsonschema.Draft7Validator.check_schema(values_schema())


def test_nvidias_default_values_are_accepted_unchanged() -> None:
    errors = [f"{list(e.path)}: {e.message}" for e in validator().iter_errors(nvidia_values())]
    assert not errors


def test_the_charts_own_defaults_are_accepted() -> None:
    assert not list(validator().iter_errors(default_values()))


def test_every_nvidia_key_is_handled_and_said_how() -> None:
    found: dict[str, list[str]] = {}
    for key in keys_file(NVIDIA_KEYS):
        how = handled(key)
        assert how is not None, key
        found.setdefault(how, []).append(key)
    # The figures the README's table stands for (NVIDIA's chart v26.3.1, 270 keys).
    assert {how: len(keys) for how, keys in found.items()} == {
        "ClusterPolicy": 216,
        "accepted, not implemented": 16,
        "chart": 18,
        "ignored": 20,
    }
    assert "nfd.enabled" in found["ignored"] and "operator.cleanupCRD" in found["chart"]
    assert "operator.logging.develMode" in found["chart"]


@pytest.mark.parametrize(
    ("values", "where", "named"),
    [
        ({"bogus": 1}, [], "bogus"),
        ({"driver": {"verison": "1"}}, ["driver"], "verison"),
        ({"operator": {"replicas": 3}}, ["operator"], "replicas"),
        ({"devicePlugin": {"config": {"nmae": "x"}}}, ["devicePlugin", "config"], "nmae"),
        # The ClusterPolicy's own names for the two keys NVIDIA's chart renames:
        ({"driver": {"useNvidiaDriverCRD": True}}, ["driver"], "useNvidiaDriverCRD"),
        (
            {"driver": {"upgradePolicy": {"podDeletion": {}}}},
            ["driver", "upgradePolicy"],
            "podDeletion",
        ),
        # A field NVIDIA moved is refused here too, rather than written into the policy.
        ({"driver": {"use_ocp_driver_toolkit": True}}, ["driver"], "use_ocp_driver_toolkit"),
    ],
)
def test_any_other_key_is_refused_by_name(
    values: dict[str, Any], where: list[str], named: str
) -> None:
    errors = list(validator().iter_errors(values))
    assert len(errors) == 1
    assert list(errors[0].path) == where and named in errors[0].message
    path = ".".join([*where, named])
    assert handled(path) is None, path


@pytest.mark.parametrize(
    "values",
    [
        {"mig": {"strategy": "bogus"}},
        {"driver": {"enabled": "yes"}},
        {"operator": {"logging": {"level": "verbose"}}},
        {"extraObjects": ["kind: ConfigMap"]},
    ],
)
def test_values_of_the_wrong_kind_are_refused(values: dict[str, Any]) -> None:
    assert list(validator().iter_errors(values))


@pytest.mark.parametrize(
    "values",
    [
        {"driver": {"version": 550}},  # Helm reads `--set driver.version=550` as a number
        {"daemonsets": {"rollingUpdate": {"maxUnavailable": 1}}},
        {"mig": {"strategy": ""}},  # NVIDIA's "not set"
        {"operator": {"logging": {"level": 4}}},
    ],
)
def test_what_helm_users_write_is_accepted(values: dict[str, Any]) -> None:
    assert not list(validator().iter_errors(values))


def test_the_readme_table_is_the_charts() -> None:
    readme = (REPO / "README.md").read_text()
    table = readme.split("<!-- helm-values-table:start -->\n")[1].split("<!-- helm-values")[0]
    assert table == key_table_markdown(), "run `make manifests`"
    assert key_table_markdown() in (CHART / "README.md").read_text()


def test_the_table_names_every_key_the_chart_has_besides_clusterpolicy_fields() -> None:
    listed = " ".join(row.keys for row in key_table())
    for key in VALUES_KEYS:
        assert f"`{key.path}" in listed, key.path
    for source, _ in MOVES:
        assert f"`{source}" in listed, source


def _embedded(template: str) -> list[Any]:
    """The JSON literals (Go raw strings) a committed template embeds."""
    text = (CHART / "templates" / template).read_text()
    return [json.loads(m) for m in re.findall(r"`(\[\{.*?\}\])`", text)]


def _filled(obj: Any, namespace: str, image: str) -> Any:
    text = json.dumps(obj)
    text = text.replace(json.dumps(helm.NAMESPACE), json.dumps(namespace))
    return json.loads(text.replace(json.dumps(helm.IMAGE), json.dumps(image)))


CRD_FILES = ("clusterpolicy.yaml", "gpucluster.yaml", "nvidiadriver.yaml")


def test_the_charts_operator_objects_are_deploys() -> None:
    """One source: the committed template embeds exactly what deploy/ applies."""
    (objects,) = _embedded("operator.yaml")
    deploy = [
        d
        for p in sorted((REPO / "deploy").glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
    ]
    wanted = [d for d in deploy if d["kind"] not in ("Namespace", "CustomResourceDefinition")]
    wanted.append(_filled(helm.leader_lease(), manifests.NAMESPACE, ""))
    image = wanted[[d["kind"] for d in wanted].index("Deployment")]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    assert sorted(_filled(objects, manifests.NAMESPACE, image), key=json.dumps) == sorted(
        wanted, key=json.dumps
    )
    crds = [yaml.safe_load((CHART / "crds" / f).read_text()) for f in CRD_FILES]
    assert crds == list(yaml.safe_load_all((REPO / "deploy" / "01-crd.yaml").read_text()))


def test_hooks_hold_only_the_rules_they_need() -> None:
    crd_hook, with_crd, without_crd = _embedded("hooks.yaml")

    def rules(objects: list[dict[str, Any]], kind: str = "ClusterRole") -> list[dict[str, Any]]:
        found = [rule for o in objects if o["kind"] == kind for rule in o["rules"]]
        return found

    def k8s(*rules: rbac.Rule) -> list[dict[str, Any]]:
        return [r.to_k8s() for r in rules]

    assert rules(crd_hook) == k8s(*rbac.CRD_RULES)
    assert rules(crd_hook, "Role") == []
    assert rules(without_crd) == k8s(*rbac.UNINSTALL_RULES)
    assert rules(without_crd, "Role") == k8s(*rbac.UNINSTALL_NAMESPACE_RULES)
    # Deleting the CRDs waits until garbage collection has removed what the resources owned.
    assert rules(with_crd) == k8s(
        *rbac.UNINSTALL_RULES, rbac.CRD_DELETE_RULE, *rbac.CREATED_CLUSTER_RULES
    )
    assert rules(with_crd, "Role") == k8s(
        *rbac.UNINSTALL_NAMESPACE_RULES, *rbac.CREATED_NAMESPACE_RULES
    )
    assert all(r["verbs"] == ["list"] for r in k8s(*rbac.CREATED_NAMESPACE_RULES))
    (crd_pod,) = [o for o in crd_hook if o["kind"] == "Pod"]
    (uninstall_pod,) = [o for o in with_crd if o["kind"] == "Pod"]
    assert crd_pod["spec"]["containers"][0]["args"] == ["crd", "--apply"]
    assert uninstall_pod["spec"]["containers"][0]["args"][:2] == ["uninstall", "--wait"]
    assert "--delete-crd" in uninstall_pod["spec"]["containers"][0]["args"]
    for pod in (crd_pod, uninstall_pod):
        assert pod["spec"]["containers"][0]["securityContext"] == manifests.CONTAINER_SECURITY
        annotations = pod["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"


def test_the_chart_owns_the_lease_the_operator_takes() -> None:
    """So that `helm uninstall` leaves no Lease behind."""
    from gpu_operator.controller.runtime.leader import LeaderElector

    name = {f.name: f.default for f in dataclasses.fields(LeaderElector)}["name"]
    assert helm.leader_lease()["metadata"]["name"] == name
