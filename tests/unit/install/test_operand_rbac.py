"""Every Role and ClusterRole the operator renders for its operands grants only what the operator
itself holds: Kubernetes refuses (403) a Role wider than its author's rules, so an extra verb
in a template would leave that operand without its RBAC on a real cluster. OpenShift's SCC and
ClusterVersion rules are left out: those come from the OpenShift bundle's own permissions."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpu_operator.api.gpucluster import parse_gpucluster
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.install.rbac import (
    CLUSTER_RULES,
    DRA_CLUSTER_RULES,
    DRA_NAMESPACE_RULES,
    NAMESPACE_RULES,
    Rule,
)
from gpu_operator.render import Facts, render
from gpu_operator.render.driver import ExtraConfig, Pool, driver_names, render_driver
from gpu_operator.render.gpucluster import render_gpucluster
from tests.paths import REPO
from tests.unit.rbac_grants import Grant, grants
from tests.unit.render.render_cases import CASES_DIR, load_policy

OPENSHIFT_ONLY = {"security.openshift.io", "config.openshift.io"}


def held(rules: tuple[Rule, ...]) -> set[Grant]:
    return grants(r.to_k8s() for r in rules)


CLUSTER = held(CLUSTER_RULES + DRA_CLUSTER_RULES)
NAMESPACE = CLUSTER | held(NAMESPACE_RULES + DRA_NAMESPACE_RULES)


def not_held(obj: dict[str, Any]) -> list[Grant]:
    """The grants of a Role or ClusterRole the operator could not give."""
    have = CLUSTER if obj["kind"] == "ClusterRole" else NAMESPACE
    return sorted(
        g
        for g in grants(obj.get("rules") or [])
        if g[0] not in OPENSHIFT_ONLY and g not in have and (*g[:3], "") not in have
    )


def _roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Role", "ClusterRole")]


def clusterpolicy_roles() -> list[dict[str, Any]]:
    objects = [
        obj
        for case in ("everything-on.yaml", "sandbox-workloads.yaml", "sandbox-kata.yaml")
        for obj in render(load_policy(CASES_DIR / case), Facts())
    ]
    return _roles(objects)


def nvidiadriver_objects(openshift: bool = False) -> list[dict[str, Any]]:
    """The first NVIDIADriver of the example, rendered for one ubuntu22.04 pool."""
    doc = next(
        d
        for d in yaml.safe_load_all((REPO / "examples" / "nvidiadriver-pools.yaml").read_text())
        if d and d.get("kind") == "NVIDIADriver"
    )
    spec = parse_driver_spec(doc["spec"])
    pool = Pool("ubuntu", "22.04")
    names = driver_names("pool", "uid", spec, pool)
    return render_driver(spec, pool, names, ExtraConfig(openshift=openshift))


def nvidiadriver_roles() -> list[dict[str, Any]]:
    return _roles(nvidiadriver_objects())


def gpucluster_roles() -> list[dict[str, Any]]:
    """The example's, and with ComputeDomains on (the controller's and daemons' roles)."""
    doc = yaml.safe_load((REPO / "examples" / "gpucluster.yaml").read_text())
    roles = _roles(render_gpucluster(parse_gpucluster(doc), Facts()))
    doc["spec"]["draDriver"]["computeDomains"] = {"enabled": True}
    return roles + _roles(render_gpucluster(parse_gpucluster(doc), Facts()))


SOURCES = {
    "clusterpolicy": clusterpolicy_roles,
    "nvidiadriver": nvidiadriver_roles,
    "gpucluster": gpucluster_roles,
}


@pytest.mark.parametrize("source", SOURCES)
def test_operand_roles_grant_only_what_the_operator_holds(source: str) -> None:
    roles = SOURCES[source]()
    assert roles, f"{source} renders no Role or ClusterRole: the check would pass vacuously"
    wider = {f"{o['kind']}/{o['metadata']['name']}": not_held(o) for o in roles}
    assert {k: v for k, v in wider.items() if v} == {}


def test_the_check_sees_a_verb_the_operator_lacks() -> None:
    role = {"kind": "ClusterRole", "rules": [{"apiGroups": [""], "resources": ["nodes"],
                                              "verbs": ["update"]}]}  # fmt: skip
    assert not_held(role) == [("", "nodes", "update", "")]


def test_openshift_rules_render_only_on_openshift() -> None:
    def groups(openshift: bool) -> set[str]:
        return {g for o in _roles(nvidiadriver_objects(openshift)) for g, *_ in grants(o["rules"])}

    assert groups(True) & OPENSHIFT_ONLY == OPENSHIFT_ONLY
    assert groups(False) & OPENSHIFT_ONLY == set()
