"""Every NVIDIADriver setting reaches the driver pod: one case per setting, each failing if
the setting were dropped. Every rendered object also validates against Kubernetes' schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.labels import OS_ID, OS_VERSION
from gpu_operator.render.driver import (
    KERNEL_LABEL,
    POOL_LABEL,
    ExtraConfig,
    Pool,
    driver_names,
    render_driver,
    string_hash,
)
from tests.schema import validate_kubernetes

UBUNTU = Pool("ubuntu", "22.04", node_selector={POOL_LABEL: "a100"})
RHEL = Pool("rhel", "9.4", kernel="5.14.0-427.13.1.el9_4.x86_64")
KEYS = {"repo": ("custom.list",), "certs": ("ca.crt", "other.crt"), "kmod": ("nvidia.conf",)}


def render(spec: dict[str, Any], pool: Pool = UBUNTU) -> list[dict[str, Any]]:
    parsed = parse_driver_spec(spec)
    names = driver_names("pool-a", "3f1c0a4e-uid", parsed, pool)
    return render_driver(parsed, pool, names, ExtraConfig(configmap_keys=KEYS))


def ds(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return daemonset


def pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = ds(objects)["spec"]["template"]["spec"]
    return spec


def container(objects: list[dict[str, Any]], name: str = "nvidia-driver-ctr") -> dict[str, Any]:
    (found,) = [c for c in pod(objects)["containers"] + pod(objects)["initContainers"]
                if c["name"] == name]  # fmt: skip
    return found


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in c.get("env") or []}


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in c["volumeMounts"]}


def volume(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod(objects)["volumes"] if v["name"] == name]
    return found


Check = Callable[[list[dict[str, Any]]], None]


def _rdma(o: list[dict[str, Any]]) -> None:
    peermem = container(o, "nvidia-peermem-ctr")
    assert peermem["args"] == ["reload_nvidia_peermem"]
    assert env(peermem)["USE_HOST_MOFED"] == "true"
    assert env(container(o))["GPU_DIRECT_RDMA_ENABLED"] == "true"


def _gds(o: list[dict[str, Any]]) -> None:
    fs = container(o, "nvidia-fs-ctr")
    assert fs["image"] == "nvcr.io/nvidia/cloud-native/nvidia-fs:2.17.5"
    assert env(container(o))["GDS_ENABLED"] == "true"
    assert {"name": "ngc"} in pod(o)["imagePullSecrets"]


def _gdrcopy(o: list[dict[str, Any]]) -> None:
    gdr = container(o, "nvidia-gdrcopy-ctr")
    assert gdr["image"] == "registry.example/gdrdrv:v2.5"
    assert env(gdr)["X"] == "1"
    assert env(container(o))["GDRCOPY_ENABLED"] == "true"


def _repo(o: list[dict[str, Any]]) -> None:
    m = mounts(container(o))["/etc/apt/sources.list.d/custom.list"]
    assert m["subPath"] == "custom.list" and m["name"] == "repo-config"
    assert volume(o, "repo-config")["configMap"]["name"] == "repo"


def _cert(o: list[dict[str, Any]]) -> None:
    assert "/usr/local/share/ca-certificates/ca.crt" in mounts(container(o))
    assert "/usr/local/share/ca-certificates/other.crt" in mounts(container(o))
    assert volume(o, "cert-config")["configMap"]["name"] == "certs"


def _licensing_secret(o: list[dict[str, Any]]) -> None:
    m = mounts(container(o))
    assert m["/drivers/gridd.conf"]["subPath"] == "gridd.conf"
    assert "/drivers/ClientConfigToken/client_configuration_token.tok" in m
    assert volume(o, "licensing-config")["secret"]["secretName"] == "lic"


def _licensing_configmap(o: list[dict[str, Any]]) -> None:
    m = mounts(container(o))
    assert "/drivers/gridd.conf" in m
    assert "/drivers/ClientConfigToken/client_configuration_token.tok" not in m
    assert volume(o, "licensing-config")["configMap"]["name"] == "lic-cm"


def _kmod(o: list[dict[str, Any]]) -> None:
    assert mounts(container(o))["/drivers/nvidia.conf"]["subPath"] == "nvidia.conf"
    assert volume(o, "kernel-module-config")["configMap"]["name"] == "kmod"


def _topology(o: list[dict[str, Any]]) -> None:
    assert "/etc/nvidia/nvidia-topologyd.conf" in mounts(container(o))
    assert volume(o, "topology-config")["configMap"]["name"] == "topo"


def _secret_env(o: list[dict[str, Any]]) -> None:
    assert container(o)["envFrom"] == [{"secretRef": {"name": "driver-secrets"}}]


def _manager(o: list[dict[str, Any]]) -> None:
    manager = container(o, "k8s-driver-manager")
    assert manager["image"] == "mirror.example/k8s-driver-manager:v0.9.0"
    assert env(manager)["ENABLE_AUTO_DRAIN"] == "true"  # the user's over NVIDIA's default
    assert env(manager)["DRAIN_USE_FORCE"] == "false"  # the defaults stay
    assert manager["args"] == ["uninstall_driver"]


def _precompiled(o: list[dict[str, Any]]) -> None:
    assert container(o)["image"] == "nvcr.io/nvidia/driver:570-5.14.0-427.13.1.el9_4.x86_64-rhel9.4"
    assert pod(o)["nodeSelector"][KERNEL_LABEL] == "5.14.0-427.13.1.el9_4.x86_64"
    labels = ds(o)["metadata"]["labels"]
    assert labels["nvidia.com/precompiled"] == "true"
    assert labels["nvidia.com/precompiled.kernel-version"] == "5.14.0-427.13.1.el9_4.x86_64"


def _startup_probe(o: list[dict[str, Any]]) -> None:
    probe = container(o)["startupProbe"]
    assert probe["failureThreshold"] == 200 and probe["initialDelaySeconds"] == 60


def _resources(o: list[dict[str, Any]]) -> None:
    for name in ("nvidia-driver-ctr", "k8s-driver-manager"):
        assert container(o, name)["resources"] == {"limits": {"memory": "2Gi"}}


def _args_env(o: list[dict[str, Any]]) -> None:
    c = container(o)
    assert c["args"] == ["init", "--debug"]
    assert env(c)["CUSTOM"] == "yes" and env(c)["NVIDIA_VISIBLE_DEVICES"] == "void"


def _labels_annotations(o: list[dict[str, Any]]) -> None:
    meta = ds(o)["spec"]["template"]["metadata"]
    assert meta["labels"]["team"] == "ml"
    assert meta["annotations"]["owner"] == "ml-platform"
    assert meta["labels"]["app.kubernetes.io/component"] == "nvidia-driver"  # NVIDIA's wins


def _tolerations(o: list[dict[str, Any]]) -> None:
    tolerations = pod(o)["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in (
        tolerations
    )
    assert tolerations[0]["key"] == "nvidia.com/gpu"


def _node_affinity(o: list[dict[str, Any]]) -> None:
    affinity = pod(o)["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "zone"
    assert "podAntiAffinity" in affinity


def _pool_selector(o: list[dict[str, Any]]) -> None:
    assert pod(o)["nodeSelector"] == {"nvidia.com/gpu.deploy.driver": "true", POOL_LABEL: "a100"}


def _priority(o: list[dict[str, Any]]) -> None:
    assert pod(o)["priorityClassName"] == "gpu-critical"


def _pod_security(o: list[dict[str, Any]]) -> None:
    assert pod(o)["securityContext"] == {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}


def _pull(o: list[dict[str, Any]]) -> None:
    assert container(o)["imagePullPolicy"] == "Always"
    assert pod(o)["imagePullSecrets"] == [{"name": "ngc"}]


def _host_network(o: list[dict[str, Any]]) -> None:
    assert pod(o)["hostNetwork"] is True and pod(o)["dnsPolicy"] == "ClusterFirstWithHostNet"


def _kernel_module_type(o: list[dict[str, Any]]) -> None:
    assert env(container(o))["KERNEL_MODULE_TYPE"] == "open"


def _image(o: list[dict[str, Any]]) -> None:
    assert container(o)["image"] == "registry.example/nvidia/driver:580.65.06-ubuntu22.04"


def _vgpu_host_manager(o: list[dict[str, Any]]) -> None:
    assert ds(o)["metadata"]["name"].startswith("nvidia-vgpu-manager-ubuntu22.04-")
    assert container(o)["image"] == "nvcr.io/nvidia/vgpu-manager:580.65.06-ubuntu22.04"
    assert pod(o)["nodeSelector"]["nvidia.com/gpu.deploy.vgpu-manager"] == "true"
    assert "/dev/vfio" in mounts(container(o))
    assert "startupProbe" not in container(o)


CASES: dict[str, tuple[dict[str, Any], Pool, Check]] = {
    "rdma": ({"rdma": {"enabled": True, "useHostMofed": True}}, UBUNTU, _rdma),
    "gds": (
        {"gds": {"enabled": True, "version": "2.17.5", "imagePullSecrets": ["ngc"]}},
        UBUNTU,
        _gds,
    ),
    "gdrcopy": (
        {
            "gdrcopy": {
                "enabled": True,
                "repository": "registry.example",
                "image": "gdrdrv",
                "version": "v2.5",
                "env": [{"name": "X", "value": "1"}],
            }
        },
        UBUNTU,
        _gdrcopy,
    ),
    "repoConfig": ({"repoConfig": {"name": "repo"}}, UBUNTU, _repo),
    "certConfig": ({"certConfig": {"name": "certs"}}, UBUNTU, _cert),
    "licensingConfig.secretName": (
        {"driverType": "vgpu", "licensingConfig": {"secretName": "lic", "nlsEnabled": True}},
        UBUNTU,
        _licensing_secret,
    ),
    "licensingConfig.name": (
        {"driverType": "vgpu", "licensingConfig": {"name": "lic-cm", "nlsEnabled": False}},
        UBUNTU,
        _licensing_configmap,
    ),
    "kernelModuleConfig": ({"kernelModuleConfig": {"name": "kmod"}}, UBUNTU, _kmod),
    "virtualTopologyConfig": (
        {"driverType": "vgpu", "virtualTopologyConfig": {"name": "topo"}},
        UBUNTU,
        _topology,
    ),
    "secretEnv": ({"secretEnv": "driver-secrets"}, UBUNTU, _secret_env),
    "manager": (
        {
            "manager": {
                "repository": "mirror.example",
                "image": "k8s-driver-manager",
                "version": "v0.9.0",
                "env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}],
            }
        },
        UBUNTU,
        _manager,
    ),
    "usePrecompiled": ({"usePrecompiled": True, "version": "570"}, RHEL, _precompiled),
    "startupProbe": ({"startupProbe": {"failureThreshold": 200}}, UBUNTU, _startup_probe),
    "resources": ({"resources": {"limits": {"memory": "2Gi"}}}, UBUNTU, _resources),
    "args+env": (
        {"args": ["--debug"], "env": [{"name": "CUSTOM", "value": "yes"}]},
        UBUNTU,
        _args_env,
    ),
    "labels+annotations": (
        {
            "labels": {"team": "ml", "app.kubernetes.io/component": "x"},
            "annotations": {"owner": "ml-platform"},
        },
        UBUNTU,
        _labels_annotations,
    ),
    "tolerations": (
        {
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ]
        },
        UBUNTU,
        _tolerations,
    ),
    "nodeAffinity": (
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        UBUNTU,
        _node_affinity,
    ),
    "nodeSelector (pool)": ({"nodeSelector": {"gpu": "a100"}}, UBUNTU, _pool_selector),
    "priorityClassName": ({"priorityClassName": "gpu-critical"}, UBUNTU, _priority),
    "podSecurityContext": (
        {"podSecurityContext": {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}},
        UBUNTU,
        _pod_security,
    ),
    "imagePullPolicy+Secrets": (
        {"imagePullPolicy": "Always", "imagePullSecrets": ["ngc"]},
        UBUNTU,
        _pull,
    ),
    "hostNetwork": ({"hostNetwork": True}, UBUNTU, _host_network),
    "kernelModuleType": ({"kernelModuleType": "open"}, UBUNTU, _kernel_module_type),
    "repository/image/version": (
        {"repository": "registry.example/nvidia", "image": "driver", "version": "580.65.06"},
        UBUNTU,
        _image,
    ),
    "driverType vgpu-host-manager": (
        {
            "driverType": "vgpu-host-manager",
            "image": "nvcr.io/nvidia/vgpu-manager",
            "version": "580.65.06",
        },
        UBUNTU,
        _vgpu_host_manager,
    ),
}


@pytest.mark.parametrize("setting", sorted(CASES))
def test_setting_reaches_the_pod(setting: str) -> None:
    spec, pool, check = CASES[setting]
    objects = render(spec, pool)
    check(objects)
    for obj in objects:
        assert validate_kubernetes(obj), obj["kind"]


@pytest.mark.parametrize("setting", sorted(CASES))
def test_the_check_fails_without_the_setting(setting: str) -> None:
    """Each check really looks at its setting: on the default spec it fails."""
    _, pool, check = CASES[setting]
    with pytest.raises((AssertionError, KeyError, ValueError)):
        check(render({}, pool if setting != "nodeSelector (pool)" else Pool("ubuntu", "22.04")))


def test_names_are_nvidias() -> None:
    spec = parse_driver_spec({})
    names = driver_names("pool-a", "uid-1", spec, UBUNTU)
    assert names.name == "nvidia-gpu-driver-pool-a-ubuntu22.04"
    assert names.app == f"nvidia-gpu-driver-ubuntu22.04-{string_hash('uid-1')}"
    precompiled = driver_names("pool-a", "uid-1", parse_driver_spec({"usePrecompiled": True}), RHEL)
    assert precompiled.app.endswith(string_hash("uid-1-5.14.0-427.13.1.el9_4.x86_64"))
    assert len(driver_names("x" * 80, "u", spec, Pool("ubuntu", "22.04" + "0" * 60)).app) <= 63


def test_hash_is_kubernetes_safe() -> None:
    digest = string_hash("3f1c0a4e-uid")
    assert digest.isalnum() and not set(digest) & set("aeiou013")


def test_repo_config_on_an_unknown_os_names_the_field() -> None:
    with pytest.raises(ValueError, match="repoConfig"):
        render({"repoConfig": {"name": "r"}}, Pool("plan9", "4"))


def test_pool_from_node_labels() -> None:
    labels = {OS_ID: "rhel", OS_VERSION: "9.4", KERNEL_LABEL: "5.14"}
    pool = Pool.of_node(labels, precompiled=True, pool_label="h100")
    assert pool is not None and pool.os_tag == "rhel9.4" and pool.kernel == "5.14"
    assert pool.node_selector[POOL_LABEL] == "h100"
    assert (
        Pool.of_node({OS_ID: "rhel", OS_VERSION: "9.4"}, precompiled=True, pool_label=None) is None
    )
    assert Pool("rhel", "10.0").os_tag == "rhel10" and Pool("rocky", "9.3").os_tag == "rocky9"


def test_clusterpolicy_driver_section_renders_every_setting_too() -> None:
    """The ClusterPolicy's own driver goes through the same rendering: settings once dropped
    there (manager, rdma, repoConfig, certConfig, licensing, kernel module config,
    secretEnv) now reach its pods."""
    from gpu_operator.api import parse_spec
    from gpu_operator.render import Facts, render

    spec = parse_spec(
        {
            "driver": {
                "manager": {"env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}]},
                "rdma": {"enabled": True},
                "repoConfig": {"configMapName": "repo"},
                "certConfig": {"name": "certs"},
                "licensingConfig": {"configMapName": "lic", "nlsEnabled": True},
                "kernelModuleConfig": {"name": "kmod"},
                "secretEnv": "driver-secrets",
                "env": [{"name": "CUSTOM", "value": "1"}],
            }
        }
    )
    objects = render(spec, Facts())
    (ds,) = [o for o in objects if o["metadata"]["name"] == "nvidia-driver-daemonset-ubuntu22.04"]
    pod_spec = ds["spec"]["template"]["spec"]
    main = pod_spec["containers"][0]
    assert [c["name"] for c in pod_spec["containers"]] == [
        "nvidia-driver-ctr",
        "nvidia-peermem-ctr",
    ]
    assert env(pod_spec["initContainers"][0])["ENABLE_AUTO_DRAIN"] == "true"
    assert main["envFrom"] == [{"secretRef": {"name": "driver-secrets"}}]
    assert env(main)["CUSTOM"] == "1" and env(main)["GPU_DIRECT_RDMA_ENABLED"] == "true"
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["repo-config"]["configMap"]["name"] == "repo"
    assert volumes["cert-config"]["configMap"]["name"] == "certs"
    assert volumes["licensing-config"]["configMap"]["name"] == "lic"
    assert volumes["kernel-module-config"]["configMap"]["name"] == "kmod"
    assert any(o["kind"] == "ConfigMap" and o["metadata"]["name"] == "nvidia-driver-startup-probe"
               for o in objects)  # fmt: skip


def test_clusterpolicy_config_mounts_one_file_per_known_key() -> None:
    """Keys the controller saw (ConfigMap index) become one file each, so /drivers and
    /etc/apt/sources.list.d keep their other files."""
    from gpu_operator.api import parse_spec
    from gpu_operator.render import Facts, render

    spec = parse_spec({"driver": {"kernelModuleConfig": {"name": "kmod"}}})
    facts = Facts(configmap_keys=(("kmod", ("nvidia.conf",)),))
    (ds,) = [o for o in render(spec, facts) if o["metadata"]["name"].startswith("nvidia-driver-d")]
    main = ds["spec"]["template"]["spec"]["containers"][0]
    assert mounts(main)["/drivers/nvidia.conf"]["subPath"] == "nvidia.conf"
    assert "/drivers" not in mounts(main)


def test_with_health_remediation_a_pools_driver_tolerates_the_quarantine_taint() -> None:
    parsed = parse_driver_spec({})
    names = driver_names("pool-a", "3f1c0a4e-uid", parsed, UBUNTU)

    def keys(extra: ExtraConfig) -> set[str]:
        tolerations = pod(render_driver(parsed, UBUNTU, names, extra)).get("tolerations") or []
        return {t["key"] for t in tolerations}

    assert "nvidia.com/gpu.unhealthy" not in keys(ExtraConfig())
    assert "nvidia.com/gpu.unhealthy" in keys(ExtraConfig(quarantine_taint=True))
