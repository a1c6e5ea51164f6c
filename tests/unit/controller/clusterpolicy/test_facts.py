"""From observed nodes and the spec to rendering facts and the node policy."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import parse_spec
from gpu_operator.controller.clusterpolicy.facts import (
    detect_runtime,
    gather_facts,
    nfd_present,
    node_os,
    node_policy,
)
from gpu_operator.node_labels import Taint
from gpu_operator.render.facts import NodeOS
from gpu_operator.render.user_configs import referenced_configmaps
from gpu_operator.views import NodeView
from tests.unit.controller.builders import NAMESPACE, cpu_node, gpu_node


@pytest.mark.parametrize(
    ("os", "expected"),
    [
        (("Ubuntu", "22.04"), NodeOS("ubuntu", "22.04")),
        (("rhel", "9.4"), NodeOS("rhel", "9.4")),
        (None, None),
        (("ubuntu", ""), None),
    ],
)
def test_node_os(os: tuple[str, str] | None, expected: NodeOS | None) -> None:
    assert node_os(gpu_node(os=os)) == expected


@pytest.mark.parametrize(
    ("runtimes", "expected"),
    [
        (["containerd://1.7.27"], "containerd"),
        (["cri-o://1.30.0", "cri-o://1.30.0", "containerd://1.7"], "crio"),  # most nodes
        (["docker://24.0.7"], "docker"),
        (["rkt://1.0", ""], "containerd"),  # nothing known: the fallback
        ([], "containerd"),
    ],
)
def test_detect_runtime(runtimes: list[str], expected: str) -> None:
    nodes = [gpu_node(f"n{i}", runtime=r) for i, r in enumerate(runtimes)]
    assert detect_runtime(nodes, "containerd") == expected


def test_referenced_configmaps_name_the_users_configs() -> None:
    spec = parse_spec({
        "devicePlugin": {"config": {"name": "dp-config", "default": "any"}},
        "migManager": {"config": {"name": "mig-parted"}},
        "dcgmExporter": {"config": {"name": "metrics"}},
        "vgpuDeviceManager": {"config": {"name": "vgpu-layouts"}},
    })  # fmt: skip
    assert referenced_configmaps(spec) == ("dp-config", "mig-parted", "metrics", "vgpu-layouts")
    assert referenced_configmaps(parse_spec({})) == ()


def test_gather_facts_reads_gpu_nodes_only() -> None:
    spec = parse_spec({"devicePlugin": {"config": {"name": "dp-config"}}})
    nodes = [
        gpu_node("a", os=("ubuntu", "22.04"), runtime="cri-o://1.30"),
        gpu_node("b", os=("ubuntu", "22.04")),
        gpu_node("c", os=("rhel", "9.4"), runtime="cri-o://1.30"),
        gpu_node("d", os=None),
        cpu_node("e", labels={"feature.node.kubernetes.io/system-os_release.ID": "debian",
                              "feature.node.kubernetes.io/system-os_release.VERSION_ID": "12"}),
    ]  # fmt: skip
    facts = gather_facts(
        nodes,
        spec,
        namespace=NAMESPACE,
        configmap_hashes={"dp-config": "h1", "unrelated": "h2"},
        operator_image="example.com/op:1",
        image_env={"DRIVER_IMAGE": "example.com/d:2"},
    )
    assert facts.node_oses == (NodeOS("rhel", "9.4"), NodeOS("ubuntu", "22.04"))
    assert facts.runtime == "crio"
    assert facts.config_hashes == {"dp-config": "h1"}
    assert facts.namespace == NAMESPACE
    assert facts.operator_image == "example.com/op:1"
    assert facts.image_env == {"DRIVER_IMAGE": "example.com/d:2"}


def test_the_default_runtime_applies_when_no_node_says() -> None:
    spec = parse_spec({"operator": {"defaultRuntime": "docker"}})
    facts = gather_facts([cpu_node()], spec, namespace=NAMESPACE, configmap_hashes={})
    assert facts.runtime == "docker"


@pytest.mark.parametrize(
    ("spec", "deploys", "taint", "mig_config"),
    [
        ({}, "dcgm-exporter", Taint("nvidia.com/gpu", "present", "NoSchedule"), "all-disabled"),
        ({"gpuNodeTaint": {"enabled": False}, "dcgmExporter": {"enabled": False}},
         None, None, "all-disabled"),
        # an empty default: leave MIG layouts to the user
        ({"migManager": {"config": {"name": "c", "default": ""}}}, "mig-manager",
         Taint("nvidia.com/gpu", "present", "NoSchedule"), None),
    ],
)  # fmt: skip
def test_node_policy(
    spec: dict[str, Any], deploys: str | None, taint: Taint | None, mig_config: str | None
) -> None:
    result = node_policy(parse_spec(spec))
    if deploys is not None:
        assert deploys in result.deploy
    else:
        assert "dcgm-exporter" not in result.deploy
    assert "mig-manager" in result.mig_only
    assert result.taint == taint
    assert result.default_mig_config == mig_config


def test_nfd_present() -> None:
    assert nfd_present([cpu_node()])
    assert not nfd_present([])
    assert not nfd_present([NodeView("plain", labels={"kubernetes.io/os": "linux"})])
