"""The device plugin rendered for the project's image (``gpu-operator agent device-plugin``) and
the MPS control daemon; NVIDIA's image stays the default (its output is in the goldens)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import parse_spec
from gpu_operator.render import DEFAULT_OPERATOR_IMAGE, Facts, mps_configured, render
from tests.unit.render.test_render import by_kind, env_of, main_container, pod

OWN_IMAGE = {"repository": "ghcr.io/gpu-operator", "image": "gpu-operator", "version": "v0.1.0"}
DS = "nvidia-device-plugin-daemonset"
MPS_DS = "nvidia-device-plugin-mps-control-daemon"
MPS_CONFIG = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
)


def objects(device_plugin: dict[str, Any], facts: Facts | None = None, **spec: Any) -> Any:
    return render(parse_spec({"devicePlugin": device_plugin, **spec}), facts or Facts())


def plugin(device_plugin: dict[str, Any], facts: Facts | None = None, **spec: Any) -> Any:
    return by_kind(objects(device_plugin, facts, **spec), "DaemonSet")[DS]


def test_nvidia_image_is_the_default_with_its_own_entrypoint() -> None:
    container = main_container(plugin({}))
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
    assert container["command"] == ["nvidia-device-plugin"]
    assert "GPU_OPERATOR_SIMULATE" not in env_of(container)


def test_the_projects_image_runs_its_agent_without_a_config_manager() -> None:
    ds = plugin({**OWN_IMAGE, "config": {"name": "dp-configs", "default": "shared"}})
    container = main_container(ds)
    assert container["image"] == DEFAULT_OPERATOR_IMAGE
    assert container["command"] == ["gpu-operator", "agent", "device-plugin"]
    assert [c["name"] for c in pod(ds)["containers"]] == ["nvidia-device-plugin"]
    assert "initContainers" not in pod(ds) and "shareProcessNamespace" not in pod(ds)
    env = env_of(container)
    assert env["CONFIG_FILE_SRCDIR"] == "/available-configs"
    assert env["DEFAULT_CONFIG"] == "shared"
    assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["MIG_STRATEGY"] == "single"
    assert "DEVICE_LIST_STRATEGY" not in env  # the chosen config's flags decide
    assert "GPU_OPERATOR_SIMULATE" not in env  # never without the explicit setting
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "device-plugin": "/var/lib/kubelet/device-plugins",
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "cdi-root": "/var/run/cdi",
        "mps-root": "/mps",
        "available-configs": "/available-configs",
        "driver-root": "/driver-root",  # NVML by path, never from a runtime hook
    }
    assert env["CONTAINER_DRIVER_ROOT"] == "/driver-root"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    volumes = {v["name"]: v for v in pod(ds)["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "dp-configs"
    assert container["securityContext"]["runAsUser"] == 0


def test_a_mirrored_project_image_runs_the_agent_too() -> None:
    mirror = "registry.example.com/gpu-operator/gpu-operator:v0.1.0"
    ds = plugin(
        {"repository": "registry.example.com/gpu-operator", "image": "gpu-operator"},
        Facts(operator_image=mirror),
    )
    assert main_container(ds)["image"] == mirror
    assert main_container(ds)["command"] == ["gpu-operator", "agent", "device-plugin"]


@pytest.mark.parametrize(
    ("cdi", "strategy", "cdi_mounted"),
    [
        ({}, "envvar", True),
        ({"default": True}, "cdi-cri", True),
        ({"enabled": False}, "envvar", False),
    ],
)
def test_list_strategy_and_cdi_mount_follow_the_cdi_section(
    cdi: dict[str, Any], strategy: str, cdi_mounted: bool
) -> None:
    ds = plugin(OWN_IMAGE, cdi=cdi)
    assert env_of(main_container(ds))["DEVICE_LIST_STRATEGY"] == strategy
    mounted = any(m["name"] == "cdi-root" for m in main_container(ds)["volumeMounts"])
    assert mounted is cdi_mounted


def test_simulation_only_when_explicitly_set_and_only_for_the_agent() -> None:
    simulated = Facts(simulate_gpus="a100-40gb:8")
    assert env_of(main_container(plugin(OWN_IMAGE, simulated)))["GPU_OPERATOR_SIMULATE"] == (
        "a100-40gb:8"
    )
    assert "GPU_OPERATOR_SIMULATE" not in env_of(main_container(plugin({}, simulated)))


def test_the_agent_may_watch_its_node_and_record_events_only_with_a_config() -> None:
    with_config = by_kind(objects({**OWN_IMAGE, "config": {"name": "c"}}), "ClusterRole")
    rules = with_config["nvidia-device-plugin"]["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    assert "nvidia-device-plugin" not in by_kind(objects(OWN_IMAGE), "ClusterRole")


def test_user_env_and_args_still_apply_to_the_agent() -> None:
    ds = plugin({**OWN_IMAGE, "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "cdi-cri"}]})
    assert env_of(main_container(ds))["DEVICE_LIST_STRATEGY"] == "cdi-cri"


# -- MPS ----------------------------------------------------------------------------------------


def test_mps_configured_reads_only_sharing_mps() -> None:
    assert mps_configured({"mps": MPS_CONFIG, "plain": "version: v1\n"})
    assert not mps_configured({"ts": MPS_CONFIG.replace("mps:", "timeSlicing:")})
    assert not mps_configured({"broken": "mps: [unclosed"})
    assert not mps_configured({})


def test_no_mps_daemon_without_an_mps_config() -> None:
    daemonsets = by_kind(objects({"config": {"name": "dp"}}), "DaemonSet")
    assert MPS_DS not in daemonsets
    daemonsets = by_kind(
        objects({"config": {"name": "dp"}}, Facts(mps_configs={"other"})), "DaemonSet"
    )
    assert MPS_DS not in daemonsets


def test_mps_daemon_as_nvidia_renders_it() -> None:
    facts = Facts(mps_configs={"dp"})
    ds = by_kind(objects({"config": {"name": "dp", "default": "mps"}}, facts), "DaemonSet")[MPS_DS]
    assert ds["metadata"]["labels"]["app"] == MPS_DS
    assert ds["spec"]["template"]["metadata"]["labels"]["app"] == MPS_DS
    spec = pod(ds)
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/mps.capable": "true",
    }
    assert spec["serviceAccountName"] == "nvidia-device-plugin"
    # Its sidecar signals the daemon in the pod; the API server refuses hostPID beside this.
    assert spec["shareProcessNamespace"] is True and "hostPID" not in spec
    assert [c["name"] for c in spec["initContainers"]] == [
        "mps-control-daemon-mounts",
        "config-manager-init",
    ]
    assert spec["initContainers"][0]["command"] == ["mps-control-daemon", "mount-shm"]
    main, sidecar = spec["containers"]
    assert main["name"] == "mps-control-daemon-ctr"
    assert main["command"] == ["mps-control-daemon"]
    assert main["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
    assert env_of(sidecar)["PROCESS_TO_SIGNAL"] == "mps-control-daemon"
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert volumes["mps-root"] == "/run/nvidia/mps"
    assert volumes["mps-shm"] == "/run/nvidia/mps/shm"
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert mounts["mps-shm"] == "/dev/shm" and mounts["mps-root"] == "/mps"


def test_mps_daemon_follows_the_mps_root_setting() -> None:
    facts = Facts(mps_configs={"dp"})
    rendered = objects({"config": {"name": "dp"}, "mps": {"root": "/var/mps"}}, facts)
    ds = by_kind(rendered, "DaemonSet")
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod(ds[MPS_DS])["volumes"]}
    assert volumes["mps-root"] == "/var/mps" and volumes["mps-shm"] == "/var/mps/shm"
    assert env_of(main_container(ds[DS]))["MPS_ROOT"] == "/var/mps"


def test_mps_daemon_of_the_projects_image_is_the_simulated_one() -> None:
    facts = Facts(mps_configs={"dp"}, simulate_gpus="h100-80gb:8")
    ds = by_kind(objects({**OWN_IMAGE, "config": {"name": "dp"}}, facts), "DaemonSet")[MPS_DS]
    (main,) = pod(ds)["containers"]
    assert main["command"] == ["gpu-operator", "agent", "mps-control-daemon", "--simulated"]
    assert env_of(main)["GPU_OPERATOR_SIMULATE"] == "h100-80gb:8"
    assert env_of(main)["CONFIG_FILE_SRCDIR"] == "/available-configs"
    assert "initContainers" not in pod(ds) and "hostPID" not in pod(ds)
    real = by_kind(
        objects({**OWN_IMAGE, "config": {"name": "dp"}}, Facts(mps_configs={"dp"})), "DaemonSet"
    )[MPS_DS]
    assert main_container(real)["command"] == ["gpu-operator", "agent", "mps-control-daemon"]


def test_discovery_of_the_projects_image_reads_the_same_configs_as_the_plugin() -> None:
    """So the labels the MPS daemon is scheduled by (mps.capable) follow the node's config."""
    config = {"config": {"name": "dp-configs", "default": "shared"}}
    gfd = by_kind(objects(config), "DaemonSet")["gpu-feature-discovery"]  # the default image
    container = main_container(gfd)
    assert container["command"] == ["gpu-operator", "agent", "discover"]
    env = env_of(container)
    assert env["CONFIG_FILE_SRCDIR"] == "/available-configs"
    assert env["DEFAULT_CONFIG"] == "shared"
    assert env["NODE_LABEL"] == "nvidia.com/device-plugin.config"
    assert {"name": "available-configs", "mountPath": "/available-configs"} in container[
        "volumeMounts"
    ]
    assert {"name": "available-configs", "configMap": {"name": "dp-configs"}} in pod(gfd)["volumes"]
    nvidia_gfd = {
        "repository": "nvcr.io/nvidia",
        "image": "k8s-device-plugin",
        "version": "v0.17.4",
    }
    nvidias = main_container(
        by_kind(objects(config, gfd=nvidia_gfd), "DaemonSet")["gpu-feature-discovery"]
    )
    assert "CONFIG_FILE_SRCDIR" not in env_of(nvidias)  # NVIDIA's image: unchanged
    no_config = main_container(by_kind(objects({}), "DaemonSet")["gpu-feature-discovery"])
    assert "CONFIG_FILE_SRCDIR" not in env_of(no_config)


@pytest.mark.parametrize("image", [{}, OWN_IMAGE], ids=["nvidia", "project"])
def test_no_pod_asks_for_both_host_pid_and_a_shared_process_namespace(
    image: dict[str, str],
) -> None:
    """A rule of the API server that schema validation does not see (422 on apply)."""
    facts = Facts(mps_configs={"dp"})
    rendered = objects({**image, "config": {"name": "dp", "default": "mps"}}, facts)
    for name, ds in by_kind(rendered, "DaemonSet").items():
        spec = pod(ds)
        assert not (spec.get("hostPID") and spec.get("shareProcessNamespace")), name
