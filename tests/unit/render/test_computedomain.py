"""A ComputeDomain's objects: valid Kubernetes objects with NVIDIA's names, labels, device
classes and opaque configs; the daemon container this project's stand-in or NVIDIA's own."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api.computedomain import parse_computedomain
from gpu_operator.render.computedomain import (
    NVIDIA_DAEMON_COMMAND,
    STANDIN_DAEMON_COMMAND,
    DaemonSettings,
    daemon_name,
    render_domain,
)
from tests.schema import validate_kubernetes

UID = "0d5c6a36-3f1b-4c43-9a53-7a1d1f0f2b11"
SETTINGS = DaemonSettings(namespace="gpu-operator", image="example.com/gpu-operator:1")


def domain(mode: str | None = None, **meta: Any) -> Any:
    chan: dict[str, Any] = {"resourceClaimTemplate": {"name": "imex-channel"}}
    if mode:
        chan["allocationMode"] = mode
    return parse_computedomain(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": "training", "namespace": "team-a", "uid": UID, **meta},
            "spec": {"numNodes": 0, "channel": chan},
        }
    )


def objects(settings: DaemonSettings = SETTINGS, mode: str | None = None) -> dict[str, Any]:
    out = {}
    for obj in render_domain(domain(mode), settings):
        target = obj["metadata"]["labels"].get("resource.nvidia.com/computeDomainTarget")
        out[target or obj["kind"]] = obj
    return out


def test_every_object_is_valid_kubernetes() -> None:
    for obj in render_domain(domain(), SETTINGS):
        assert validate_kubernetes(obj), obj["kind"]


def test_the_order_is_daemon_template_daemonset_workload_template() -> None:
    kinds = [(o["kind"], o["metadata"]["namespace"]) for o in render_domain(domain(), SETTINGS)]
    assert kinds == [
        ("ResourceClaimTemplate", "gpu-operator"),
        ("DaemonSet", "gpu-operator"),
        ("ResourceClaimTemplate", "team-a"),
    ]


def test_the_daemonset_is_nvidias_shape() -> None:
    ds = objects()["DaemonSet"]
    assert ds["metadata"]["name"] == daemon_name(UID) == f"computedomain-daemon-{UID}"
    assert ds["metadata"]["labels"] == {"resource.nvidia.com/computeDomain": UID}
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"resource.nvidia.com/computeDomain": UID}
    assert ds["spec"]["template"]["metadata"]["labels"] == ds["spec"]["selector"]["matchLabels"]
    assert pod["resourceClaims"] == [
        {"name": "compute-domain-daemon", "resourceClaimTemplateName": daemon_name(UID)}
    ]
    (container,) = pod["containers"]
    assert container["resources"]["claims"] == [{"name": "compute-domain-daemon"}]
    assert {t["effect"] for t in pod["tolerations"]} == {"NoSchedule", "NoExecute",
                                                         "PreferNoSchedule"}  # fmt: skip
    assert all(t["operator"] == "Exists" and "key" not in t for t in pod["tolerations"])
    assert pod["dnsConfig"] == {"options": [{"name": "ndots", "value": "1"}]}
    assert container["startupProbe"]["failureThreshold"] == 1200


def test_the_daemon_knows_its_domain_and_its_limits() -> None:
    (container,) = objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["COMPUTE_DOMAIN_UUID"] == UID
    assert env["COMPUTE_DOMAIN_NAME"] == "training"
    assert env["COMPUTE_DOMAIN_NAMESPACE"] == "team-a"
    assert env["MAX_NODES_PER_IMEX_DOMAIN"] == "18"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "FEATURE_GATES" not in env


def test_feature_gates_reach_the_daemon_sorted() -> None:
    settings = DaemonSettings(feature_gates={"IMEXDaemonsWithDNSNames": True, "A": False})
    (container,) = objects(settings)["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FEATURE_GATES"] == "A=false,IMEXDaemonsWithDNSNames=true"


def test_the_stand_in_runs_from_this_projects_image() -> None:
    (container,) = objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/gpu-operator:1"
    assert tuple(container["command"]) == STANDIN_DAEMON_COMMAND


def test_nvidias_daemon_runs_nvidias_command() -> None:
    settings = DaemonSettings.nvidia(
        "nvidia-dra-driver-gpu", "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.8.0"
    )
    ds = objects(settings)["DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert ds["metadata"]["namespace"] == "nvidia-dra-driver-gpu"
    assert container["command"] == ["compute-domain-daemon", "-v", "$(LOG_VERBOSITY)", "run"]
    assert tuple(container["command"]) == NVIDIA_DAEMON_COMMAND
    assert container["readinessProbe"]["exec"]["command"][-1] == "check"


def test_pull_secrets_and_priority_class_when_asked() -> None:
    settings = DaemonSettings(image_pull_secrets=("regcred",), priority_class_name="high")
    pod = objects(settings)["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "high"
    assert "priorityClassName" not in objects()["DaemonSet"]["spec"]["template"]["spec"]


def test_the_daemon_template_asks_for_a_daemon_device_of_this_domain() -> None:
    rct = objects()["Daemon"]
    assert rct["metadata"]["name"] == daemon_name(UID)
    assert rct["metadata"]["namespace"] == "gpu-operator"
    devices = rct["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {"name": "daemon", "exactly": {"deviceClassName": "compute-domain-daemon.nvidia.com"}}
    ]
    assert devices["config"] == [
        {
            "requests": ["daemon"],
            "opaque": {
                "driver": "compute-domain.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "ComputeDomainDaemonConfig",
                    "domainID": UID,
                },
            },
        }
    ]


@pytest.mark.parametrize(("mode", "expected"), [(None, "Single"), ("Single", "Single"),
                                                ("All", "All")])  # fmt: skip
def test_the_workload_template_carries_the_domain_and_its_allocation_mode(
    mode: str | None, expected: str
) -> None:
    rct = objects(mode=mode)["Workload"]
    assert (rct["metadata"]["name"], rct["metadata"]["namespace"]) == ("imex-channel", "team-a")
    assert rct["metadata"]["labels"] == {
        "resource.nvidia.com/computeDomain": UID,
        "resource.nvidia.com/computeDomainTarget": "Workload",
    }
    devices = rct["spec"]["spec"]["devices"]
    assert devices["requests"] == [
        {
            "name": "channel",
            "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"},
        }
    ]
    (config,) = devices["config"]
    assert config["requests"] == ["channel"]
    assert config["opaque"]["driver"] == "compute-domain.nvidia.com"
    assert config["opaque"]["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": UID,
        "allocationMode": expected,
    }
