"""testenv starts each Kubernetes release with the gates the project needs there, read against
that release's own ``--help``, and nothing else."""

from __future__ import annotations

import pytest

from gpu_operator.install.manifests import MIN_KUBE_VERSION
from gpu_operator.testenv import releases

HELP_1_37 = """\
      --feature-gates colonSeparatedMultimapStringString   Comma-separated list of ...
                         kube:AllAlpha=true|false (ALPHA - default=false)
                         kube:DRAPartitionableDevices=true|false (BETA - default=true)
                         kube:DRAWorkloadResourceClaims=true|false (BETA - default=false)
"""
HELP_1_34 = """\
      --feature-gates mapStringBool   A set of key=value pairs that describe feature gates ...
                AllAlpha=true|false (ALPHA - default=false)
                DRADeviceTaints=true|false (ALPHA - default=false)
                DRAPartitionableDevices=true|false (ALPHA - default=false)
"""


def test_only_the_wanted_gates_off_by_default_are_turned_on() -> None:
    wanted = releases.DRA_GATES
    assert releases.gates_off_by_default(HELP_1_34, wanted) == list(wanted)
    # 1.37: partitionable devices beta and on, device taints GA (not listed): nothing to give
    assert releases.gates_off_by_default(HELP_1_37, wanted) == []
    assert releases.gates_off_by_default(HELP_1_37, ["DRAWorkloadResourceClaims"]) == [
        "DRAWorkloadResourceClaims"
    ]


def test_dra_gates_are_wanted_only_where_dras_ga_api_is() -> None:
    assert releases.wanted_gates("v1.33.13") == ()  # no resource.k8s.io/v1: no DRA here
    assert releases.wanted_gates("v1.34.4") == releases.DRA_GATES
    assert releases.wanted_gates("v1.37.2") == releases.DRA_GATES


def test_device_taint_rules_are_served_where_the_gate_is_given() -> None:
    assert releases.runtime_config("v1.34.4", "DRADeviceTaints=true") == (
        "resource.k8s.io/v1alpha3=true"
    )
    assert releases.runtime_config("v1.37.2", "") == ""
    assert releases.runtime_config("v1.34.4", "DRAPartitionableDevices=true") == ""
    with pytest.raises(releases.ReleaseError, match=r"add it to releases\._TAINT_RULE_API"):
        releases.runtime_config("v1.36.3", "DRADeviceTaints=true")


def test_a_release_is_read_from_a_version_line() -> None:
    assert releases.parse_release("Kubernetes v1.37.2\n") == "v1.37.2"
    assert releases.minor("v1.33.13") == 33
    with pytest.raises(releases.ReleaseError, match="no Kubernetes version"):
        releases.parse_release("kube-apiserver: not found")


def test_the_oldest_release_run_is_the_one_the_chart_and_bundle_claim() -> None:
    assert releases.minor(releases.OLDEST) == int(MIN_KUBE_VERSION.split(".")[1])
