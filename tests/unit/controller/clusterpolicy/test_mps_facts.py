"""The operator learns which device-plugin ConfigMap configures MPS from its watch (kept as a
flag beside the content hash) and renders the MPS control daemon only for that config."""

from __future__ import annotations

from gpu_operator.api import parse_spec
from gpu_operator.controller.clusterpolicy.facts import gather_facts
from gpu_operator.controller.runtime.watch import trim

MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n"


def test_the_watch_keeps_an_mps_flag_only_for_mps_configs() -> None:
    mps = trim("configmaps", {"metadata": {"name": "a"}, "data": {"shared": MPS}})
    plain = trim("configmaps", {"metadata": {"name": "b"}, "data": {"k": "version: v1"}})
    assert mps["mps"] is True
    assert "mps" not in plain


def test_facts_name_the_mps_config_only_when_the_policy_uses_it() -> None:
    spec = parse_spec({"devicePlugin": {"config": {"name": "dp"}}})
    facts = gather_facts(
        [], spec, namespace="ns", configmap_hashes={}, mps_configmaps=frozenset({"dp", "x"})
    )
    assert facts.mps_configs == frozenset({"dp"})
    none = gather_facts([], parse_spec({}), namespace="ns", configmap_hashes={},
                        mps_configmaps=frozenset({"dp"}))  # fmt: skip
    assert none.mps_configs == frozenset()
    assert none.simulate_gpus is None
