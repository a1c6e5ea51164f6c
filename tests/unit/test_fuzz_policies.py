"""Fuzzed ClusterPolicies from the CRD's own schema (issue 16): whatever the API server would
accept is either refused by the operator with the field named, or renders manifests that pass
Kubernetes' own schemas, with no object and no field but the expected ones; nothing crashes.

At least ``FUZZ_EXAMPLES`` (2,000) policies per run, seeded: ``FUZZ_SEED`` picks the seed (a
new one each run otherwise) and a failure prints it, so ``FUZZ_SEED=<seed>`` replays the run.
"""

from __future__ import annotations

import os
import random
from typing import Any

from hypothesis import HealthCheck, given, note, seed, settings

from gpu_operator.api import PolicyError, parse_spec
from gpu_operator.api.crd import clusterpolicy_crd
from gpu_operator.render import Facts, render
from tests.schema import validate_kubernetes
from tests.unit.fuzz_schema import from_schema

SEED = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 2000)
# Kinds the renderer makes; anything else in its output was injected.
KINDS = {
    "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
    "DaemonSet", "Service", "ServiceMonitor", "RuntimeClass", "PrometheusRule",
}  # fmt: skip
SPEC_SCHEMA = clusterpolicy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
    "spec"
]
FACTS = Facts()


def _json_key(obj: dict[str, Any]) -> str:
    import json

    return json.dumps(obj, sort_keys=True)


def check(spec: dict[str, Any], validated: set[str], outcome: dict[str, int]) -> None:
    """One generated spec: refused with a field named, or rendered into valid manifests."""
    note(f"FUZZ_SEED={SEED} (replay with this environment variable)")
    try:
        policy = parse_spec(spec)
    except PolicyError as exc:
        assert exc.problems, "a refusal that names nothing"
        for problem in exc.problems:
            assert problem.startswith(("spec", "Run ")) or "gpu-operator migrate" in problem, (
                f"refusal without a field: {problem!r}"
            )
        outcome["refused"] += 1
        return
    objects = render(policy, FACTS)
    kinds = {o["kind"] for o in objects}
    assert kinds <= KINDS, f"unexpected kinds {kinds - KINDS}"
    for obj in objects:
        key = _json_key(obj)
        if key in validated:
            continue
        validate_kubernetes(obj)  # raises naming the manifest field
        validated.add(key)
    outcome["rendered"] += 1


def test_every_accepted_policy_renders_valid_manifests_or_is_refused_by_field() -> None:
    validated: set[str] = set()
    outcome = {"refused": 0, "rendered": 0}

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(spec=from_schema(SPEC_SCHEMA))
    def run(spec: dict[str, Any]) -> None:
        check(spec, validated, outcome)

    try:
        run()
    except BaseException as exc:
        exc.add_note(f"FUZZ_SEED={SEED}")
        raise
    print(f"FUZZ_SEED={SEED}: {outcome}")
    assert outcome["refused"] + outcome["rendered"] >= EXAMPLES
    assert outcome["rendered"] >= EXAMPLES // 10, "almost every policy refused: a useless fuzz"
