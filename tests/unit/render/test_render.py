"""Behaviour of ``render``: what the operator deploys for a given policy and cluster."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
import yaml

from gpu_operator.api import ClusterPolicySpec, parse_spec
from gpu_operator.labels import CONFIG_HASH, OPERATOR_LABELS
from gpu_operator.render import (
    Facts,
    NodeOS,
    config_hash,
    default_policy,
    render,
    render_components,
)
from gpu_operator.render.components import REGISTRY, component, section
from gpu_operator.render.engine import environment, templates
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from tests import prerequisites
from tests.unit.render.render_cases import CASES, case

Obj = dict[str, Any]


def by_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def daemonsets(
    policy: ClusterPolicySpec | None = None, facts: Facts | None = None
) -> dict[str, Obj]:
    return by_kind(render(policy or default_policy(), facts or Facts()), "DaemonSet")


def pod(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def main_container(ds: Obj) -> Obj:
    container: Obj = pod(ds)["containers"][0]
    return container


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- registry -------------------------------------------------------------------------------------


def test_registry_order_names_and_labels() -> None:
    assert [c.name for c in REGISTRY] == [
        "driver",
        "container-toolkit",
        "operator-validator",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "gpu-feature-discovery",
        "mig-manager",
        "vfio-manager",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "sandbox-device-plugin",
        "kata-sandbox-device-plugin",
        "kata-manager",
        "cc-manager",
    ]
    assert [c.name for c in REGISTRY if c.sandbox] == [c.name for c in REGISTRY][8:]
    assert component("device-plugin").deploy_label == "nvidia.com/gpu.deploy.device-plugin"
    assert [c.name for c in REGISTRY if c.mig_capable_only] == ["mig-manager"]
    with pytest.raises(KeyError, match="known"):
        component("nope")


def test_every_component_has_a_template_folder_with_a_daemonset() -> None:
    for comp in REGISTRY:
        names = templates(comp.name)
        assert any(n.endswith("_daemonset.yaml.j2") for n in names), comp.name


def test_section_maps_wire_names() -> None:
    policy = parse_spec({"devicePlugin": {"enabled": False}, "dcgm": {"enabled": True}})
    assert section(policy, component("device-plugin")).enabled is False
    assert section(policy, component("dcgm")).enabled is True


# -- the default stack ----------------------------------------------------------------------------


def test_default_images_when_no_image_fields_at_all() -> None:
    images = {p.component.name: p.images for p in render_components(default_policy(), Facts())}
    project = DEFAULT_OPERATOR_IMAGE
    assert images == {
        "driver": ("nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",),
        "container-toolkit": ("nvcr.io/nvidia/k8s/container-toolkit:v1.17.8",),
        "operator-validator": (project,),
        "device-plugin": ("nvcr.io/nvidia/k8s-device-plugin:v0.17.4",),
        "dcgm": (),  # off by default
        "dcgm-exporter": (project,),
        "gpu-feature-discovery": (project,),
        "mig-manager": (project,),
        # the sandbox operands: only with sandboxWorkloads enabled
        **{c.name: () for c in REGISTRY if c.sandbox},
    }
    for name, ds in daemonsets().items():
        for container in pod(ds).get("initContainers", []) + pod(ds)["containers"]:
            assert container["imagePullPolicy"] == "IfNotPresent", name


def test_default_mig_strategy_is_single() -> None:
    ds = daemonsets()
    assert env_of(main_container(ds["nvidia-device-plugin-daemonset"]))["MIG_STRATEGY"] == "single"
    assert env_of(main_container(ds["gpu-feature-discovery"]))["MIG_STRATEGY"] == "single"


def test_image_env_fallback_fills_what_the_spec_leaves_out() -> None:
    facts = Facts(image_env={"DEVICE_PLUGIN_IMAGE": "mirror.io/nv/k8s-device-plugin:v9"})
    ds = daemonsets(parse_spec({"devicePlugin": {"version": "v10"}}), facts)
    assert main_container(ds["nvidia-device-plugin-daemonset"])["image"] == (
        "mirror.io/nv/k8s-device-plugin:v10"
    )


# -- labels, namespaces, order, purity ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_object_is_labelled_and_namespaced(name: str) -> None:
    policy, facts = case(name)
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "RuntimeClass"}
    for obj in render(policy, facts):
        meta = obj["metadata"]
        assert meta["labels"].items() >= OPERATOR_LABELS.items(), obj["kind"]
        assert meta["labels"]["app.kubernetes.io/component"] in {c.name for c in REGISTRY}
        assert "ownerReferences" not in meta
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta
        else:
            assert meta["namespace"] == facts.namespace
        if obj["kind"] == "DaemonSet":
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert pod_labels.items() >= OPERATOR_LABELS.items()
            assert pod_labels.items() >= obj["spec"]["selector"]["matchLabels"].items()


def test_render_is_stable_and_pure() -> None:
    policy, facts = case("everything-on")
    before = policy.to_wire()
    first = render(policy, facts)
    assert render(policy, facts) == first
    assert policy.to_wire() == before
    # node OS order as observed must not reorder the output
    shuffled = Facts(
        namespace=facts.namespace,
        node_oses=tuple(reversed(facts.node_oses)),
        openshift=facts.openshift,
        config_hashes=facts.config_hashes,
    )
    assert render(policy, shuffled) == first


def test_facts_are_hashable_and_compare_by_value() -> None:
    a = Facts(image_env={"GFD_IMAGE": "x"}, node_oses=[NodeOS("rhel", "9.4")])  # type: ignore[arg-type]
    b = Facts(image_env={"GFD_IMAGE": "x"}, node_oses=(NodeOS("rhel", "9.4"),))
    assert a == b and hash(a) == hash(b)
    assert isinstance(a.node_oses, tuple)
    assert a != Facts(image_env={"GFD_IMAGE": "y"}, node_oses=(NodeOS("rhel", "9.4"),))


def test_object_order_follows_registry_then_template_number() -> None:
    components = [
        o["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in render(default_policy(), Facts())
    ]
    order = [c.name for c in REGISTRY]
    assert components == sorted(components, key=order.index)
    kinds = [
        o["kind"]
        for o in render(default_policy(), Facts())
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "mig-manager"
    ]
    assert kinds == [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "DaemonSet",
    ]


# -- enabling and disabling -----------------------------------------------------------------------


@pytest.mark.parametrize("comp", [c for c in REGISTRY if not c.sandbox], ids=lambda c: c.name)
def test_a_disabled_component_renders_nothing(comp: Any) -> None:
    policy = parse_spec({comp.spec_field: {"enabled": False}})
    parts = {p.component.name: p for p in render_components(policy, Facts())}
    assert parts[comp.name].enabled is False
    assert parts[comp.name].objects == ()
    labels = [
        o["metadata"]["labels"]["app.kubernetes.io/component"] for o in render(policy, Facts())
    ]
    assert comp.name not in labels
    # the others are unaffected
    assert {p.component.name for p in parts.values() if p.enabled} == {
        c.name for c in REGISTRY if c.name not in {comp.name, "dcgm"} and not c.sandbox
    }


def test_dcgm_is_off_by_default_and_wires_the_exporter_when_on() -> None:
    assert "nvidia-dcgm" not in daemonsets()
    assert "DCGM_REMOTE_HOSTENGINE_INFO" not in env_of(
        main_container(daemonsets()["nvidia-dcgm-exporter"])
    )
    objects = render(parse_spec({"dcgm": {"enabled": True, "hostPort": 5600}}), Facts())
    dcgm = by_kind(objects, "DaemonSet")["nvidia-dcgm"]
    assert main_container(dcgm)["ports"][0]["hostPort"] == 5600
    assert by_kind(objects, "Service")["nvidia-dcgm"]["spec"]["ports"][0]["port"] == 5555
    exporter = env_of(main_container(by_kind(objects, "DaemonSet")["nvidia-dcgm-exporter"]))
    assert exporter["DCGM_REMOTE_HOSTENGINE_INFO"] == "$(NODE_IP):5600"


def test_node_status_exporter_is_not_rendered() -> None:
    policy = parse_spec({"nodeStatusExporter": {"enabled": True}})
    assert render(policy, Facts()) == render(default_policy(), Facts())


# -- the driver -----------------------------------------------------------------------------------


def test_one_driver_daemonset_per_os_tag() -> None:
    policy, facts = case("multi-os")
    drivers = {n: d for n, d in daemonsets(policy, facts).items() if n.startswith("nvidia-driver")}
    assert sorted(drivers) == [
        "nvidia-driver-daemonset-rhel9",
        "nvidia-driver-daemonset-ubuntu22.04",
        "nvidia-driver-daemonset-ubuntu24.04",
    ]
    rhel = drivers["nvidia-driver-daemonset-rhel9"]
    terms = pod(rhel)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = {e["key"]: e for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}
    assert expressions["feature.node.kubernetes.io/system-os_release.ID"]["values"] == ["rhel"]
    assert expressions["feature.node.kubernetes.io/system-os_release.VERSION_ID"]["values"] == [
        "9.2",
        "9.4",
    ]
    assert main_container(rhel)["image"] == "nvcr.io/nvidia/driver:580.95.05-rhel9"
    ubuntu = drivers["nvidia-driver-daemonset-ubuntu24.04"]
    assert main_container(ubuntu)["image"] == "nvcr.io/nvidia/driver:580.95.05-ubuntu24.04"
    # selectors are disjoint, so no DaemonSet adopts another's pods
    selectors = [tuple(d["spec"]["selector"]["matchLabels"].items()) for d in drivers.values()]
    assert len(set(selectors)) == 3


def test_no_driver_daemonset_without_known_node_os() -> None:
    names = [o["metadata"]["name"] for o in render(default_policy(), Facts(node_oses=()))]
    assert "nvidia-driver" in names  # the ServiceAccount stays
    assert not [n for n in names if n.startswith("nvidia-driver-daemonset")]


def test_driver_digest_gets_no_os_suffix() -> None:
    digest = "sha256:" + "0" * 64
    ds = daemonsets(parse_spec({"driver": {"version": digest}}), case("multi-os")[1])
    images = {main_container(d)["image"] for n, d in ds.items() if n.startswith("nvidia-driver")}
    assert images == {f"nvcr.io/nvidia/driver@{digest}"}


@pytest.mark.parametrize("strategy", [None, "RollingUpdate", "OnDelete"])
def test_driver_is_always_on_delete(strategy: str | None) -> None:
    spec: dict[str, Any] = {"daemonsets": {"rollingUpdate": {"maxUnavailable": "3"}}}
    if strategy:
        spec["daemonsets"]["updateStrategy"] = strategy
    for name, ds in daemonsets(parse_spec(spec)).items():
        if name.startswith("nvidia-driver") or strategy == "OnDelete":
            assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
        else:
            assert ds["spec"]["updateStrategy"] == {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 3},
            }


def test_percent_max_unavailable_stays_a_string() -> None:
    spec = parse_spec({"daemonsets": {"rollingUpdate": {"maxUnavailable": "25%"}}})
    ds = daemonsets(spec)["gpu-feature-discovery"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}


def test_driver_startup_probe_merges_spec_over_nvidia_defaults() -> None:
    spec = parse_spec({"driver": {"startupProbe": {"initialDelaySeconds": 5}}})
    probe = main_container(daemonsets(spec)["nvidia-driver-daemonset-ubuntu22.04"])["startupProbe"]
    assert probe["initialDelaySeconds"] == 5
    assert probe["failureThreshold"] == 120
    assert probe["periodSeconds"] == 10
    assert "exec" in probe
    default = main_container(daemonsets()["nvidia-driver-daemonset-ubuntu22.04"])
    assert default["startupProbe"]["initialDelaySeconds"] == 60
    assert "livenessProbe" not in default and "readinessProbe" not in default


def test_driver_is_privileged_with_host_pid_and_mounts() -> None:
    ds = daemonsets()["nvidia-driver-daemonset-ubuntu22.04"]
    assert pod(ds)["hostPID"] is True
    assert main_container(ds)["securityContext"]["privileged"] is True
    mounts = {m["mountPath"]: m for m in main_container(ds)["volumeMounts"]}
    assert {"/run/nvidia", "/var/log", "/host"} <= set(mounts)
    assert mounts["/run/nvidia"]["mountPropagation"] == "Bidirectional"
    assert "runtimeClassName" not in pod(ds)


# -- common DaemonSet settings --------------------------------------------------------------------


def test_common_settings_reach_every_daemonset() -> None:
    policy, facts = case("everything-on")
    for name, ds in daemonsets(policy, facts).items():
        p = pod(ds)
        comp = ds["metadata"]["labels"]["app.kubernetes.io/component"]
        assert p["nodeSelector"] == {f"nvidia.com/gpu.deploy.{comp}": "true"}, name
        assert p["tolerations"][0] == {"key": "nvidia.com/gpu", "operator": "Exists"}
        assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in (
            p["tolerations"]
        )
        assert p["priorityClassName"] == "gpu-critical"
        assert p["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert ds["metadata"]["labels"]["team"] == "gpu-platform"
        assert ds["spec"]["template"]["metadata"]["labels"]["team"] == "gpu-platform"
        assert ds["spec"]["template"]["metadata"]["annotations"]["example.com/owner"] == "gpu-team"


def test_default_priority_class_and_taint_toleration() -> None:
    for ds in daemonsets().values():
        assert pod(ds)["priorityClassName"] == "system-node-critical"
        assert pod(ds)["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_custom_taint_key_is_tolerated_and_duplicates_dropped() -> None:
    spec = parse_spec(
        {
            "gpuNodeTaint": {"key": "example.com/gpu", "enabled": False},
            "daemonsets": {"tolerations": [{"key": "example.com/gpu", "operator": "Exists"}]},
        }
    )
    for ds in daemonsets(spec).values():
        assert pod(ds)["tolerations"] == [{"key": "example.com/gpu", "operator": "Exists"}]


def test_user_labels_cannot_take_over_our_labels() -> None:
    spec = parse_spec(
        {"daemonsets": {"labels": {"app": "mine", "app.kubernetes.io/managed-by": "helm"}}}
    )
    ds = daemonsets(spec)["gpu-feature-discovery"]
    for labels in (ds["metadata"]["labels"], ds["spec"]["template"]["metadata"]["labels"]):
        assert labels["app"] == "gpu-feature-discovery"
        assert labels["app.kubernetes.io/managed-by"] == "gpu-operator"


def test_component_pull_secrets_resources_host_network_and_policy() -> None:
    spec = parse_spec(
        {
            "gfd": {
                "imagePullSecrets": ["a", "b"],
                "imagePullPolicy": "Always",
                "resources": {"limits": {"memory": "64Mi"}},
                "hostNetwork": True,
            }
        }
    )
    ds = daemonsets(spec)
    gfd = pod(ds["gpu-feature-discovery"])
    assert gfd["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert gfd["hostNetwork"] is True and gfd["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert gfd["containers"][0]["imagePullPolicy"] == "Always"
    assert gfd["containers"][0]["resources"] == {"limits": {"memory": "64Mi"}}
    other = pod(ds["nvidia-device-plugin-daemonset"])
    assert "imagePullSecrets" not in other and "hostNetwork" not in other
    assert "resources" not in other["containers"][0]


def test_env_merge_overrides_by_name_keeps_order_appends_new() -> None:
    spec = parse_spec(
        {
            "devicePlugin": {
                "env": [
                    {"name": "NEW_ONE", "value": "1"},
                    {"name": "PASS_DEVICE_SPECS", "value": "false"},
                ]
            }
        }
    )
    default = main_container(daemonsets()["nvidia-device-plugin-daemonset"])["env"]
    merged = main_container(daemonsets(spec)["nvidia-device-plugin-daemonset"])["env"]
    assert [e["name"] for e in merged] == [e["name"] for e in default] + ["NEW_ONE"]
    assert env_of({"env": merged})["PASS_DEVICE_SPECS"] == "false"


def test_validator_check_env_joins_and_component_env_wins() -> None:
    policy, facts = case("everything-on")
    env = env_of(main_container(daemonsets(policy, facts)["nvidia-operator-validator"]))
    assert env["WITH_WORKLOAD"] == "false"  # validator.env over validator.plugin.env
    assert env["CUDA_TIMEOUT"] == "300"


def test_args_replace_template_args() -> None:
    spec = parse_spec({"dcgm": {"enabled": True, "args": ["-n"]}})
    assert main_container(daemonsets(spec)["nvidia-dcgm"])["args"] == ["-n"]
    assert main_container(daemonsets(parse_spec({"dcgm": {"enabled": True}}))["nvidia-dcgm"])[
        "args"
    ] == ["-n", "-b", "ALL"]


# -- project image vs NVIDIA image ----------------------------------------------------------------


def test_agents_run_the_project_command_on_the_project_image() -> None:
    ds = daemonsets()
    expected = {
        "nvidia-operator-validator": "validate",
        "nvidia-dcgm-exporter": "exporter",
        "gpu-feature-discovery": "discover",
        "nvidia-mig-manager": "mig-manager",
    }
    for name, agent in expected.items():
        assert main_container(ds[name])["command"] == ["gpu-operator", "agent", agent]


def test_agents_follow_the_operator_image_from_facts() -> None:
    facts = Facts(operator_image="registry.local/gpu-operator:dev")
    gfd = main_container(daemonsets(facts=facts)["gpu-feature-discovery"])
    assert gfd["image"] == "registry.local/gpu-operator:dev"
    assert gfd["command"] == ["gpu-operator", "agent", "discover"]
    # another tag of the project image is still the project image
    spec = parse_spec({"gfd": {"version": "v0.0.9"}})
    assert main_container(daemonsets(spec)["gpu-feature-discovery"])["command"][:2] == [
        "gpu-operator",
        "agent",
    ]


def test_nvidia_images_keep_nvidia_entrypoints() -> None:
    spec = parse_spec(
        {
            "gfd": {
                "repository": "nvcr.io/nvidia",
                "image": "k8s-device-plugin",
                "version": "v0.17.4",
            },
            "migManager": {"repository": "nvcr.io/nvidia/cloud-native", "image": "k8s-mig-manager"},
            "dcgmExporter": {"repository": "nvcr.io/nvidia/k8s", "image": "dcgm-exporter"},
        }
    )
    ds = daemonsets(spec)
    gfd = main_container(ds["gpu-feature-discovery"])
    assert gfd["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.4"
    assert gfd["command"] == ["gpu-feature-discovery"]
    assert env_of(gfd)["GFD_SLEEP_INTERVAL"] == "60s"
    assert "command" not in main_container(ds["nvidia-mig-manager"])
    assert "command" not in main_container(ds["nvidia-dcgm-exporter"])
    assert env_of(main_container(ds["nvidia-dcgm-exporter"]))["DCGM_EXPORTER_LISTEN"] == ":9400"


def test_nvidia_validator_image_is_replaced_by_the_project_image() -> None:
    spec = parse_spec(
        {"validator": {"repository": "nvcr.io/nvidia", "image": "gpu-operator", "version": "v25"}}
    )
    validator = main_container(daemonsets(spec)["nvidia-operator-validator"])
    assert validator["image"] == DEFAULT_OPERATOR_IMAGE
    assert validator["command"] == ["gpu-operator", "agent", "validate"]


# -- per-component content ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ("containerd", {"CONTAINERD_CONFIG", "CONTAINERD_SOCKET", "CONTAINERD_RUNTIME_CLASS"}),
        ("crio", {"CRIO_CONFIG"}),
        ("docker", {"DOCKER_CONFIG", "DOCKER_SOCKET"}),
    ],
)
def test_toolkit_runtime_settings(runtime: Any, expected: set[str]) -> None:
    objects = render(default_policy(), Facts(runtime=runtime))
    toolkit = main_container(by_kind(objects, "DaemonSet")["nvidia-container-toolkit-daemonset"])
    env = env_of(toolkit)
    assert env["RUNTIME"] == runtime
    assert env["CDI_ENABLED"] == "true"
    runtime_env = {n for n in env if n.startswith(("CONTAINERD_", "CRIO_", "DOCKER_"))}
    assert runtime_env == expected
    runtime_class = by_kind(objects, "RuntimeClass")["nvidia"]
    assert runtime_class["handler"] == "nvidia"
    gpu_pods = [pod(d).get("runtimeClassName") for d in by_kind(objects, "DaemonSet").values()]
    assert ("nvidia" in gpu_pods) == (runtime == "containerd")


def test_runtime_class_name_follows_the_operator_setting() -> None:
    objects = render(parse_spec({"operator": {"runtimeClass": "nvidia-cdi"}}), Facts())
    assert by_kind(objects, "RuntimeClass")["nvidia-cdi"]["handler"] == "nvidia-cdi"
    assert (
        env_of(main_container(by_kind(objects, "DaemonSet")["nvidia-container-toolkit-daemonset"]))[
            "CONTAINERD_RUNTIME_CLASS"
        ]
        == "nvidia-cdi"
    )
    daemonsets = by_kind(objects, "DaemonSet")
    # NVIDIA's device plugin image (the default) gets the driver from NVIDIA's runtime ...
    assert pod(daemonsets["nvidia-device-plugin-daemonset"])["runtimeClassName"] == "nvidia-cdi"
    # ... the project's agents load it themselves from the driver root they mount: no runtime
    # class (nor a toolkit having configured it) needed to start them.
    for name in ("gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-operator-validator"):
        assert "runtimeClassName" not in pod(daemonsets[name]), name


def test_without_the_toolkit_pods_use_the_host_default_runtime() -> None:
    objects = render(parse_spec({"toolkit": {"enabled": False}}), Facts())
    assert "RuntimeClass" not in {o["kind"] for o in objects}
    assert all("runtimeClassName" not in pod(d) for d in by_kind(objects, "DaemonSet").values())


def test_device_plugin_config_mounts_the_users_configmap() -> None:
    policy, facts = case("time-slicing")
    objects = render(policy, facts)
    dp = by_kind(objects, "DaemonSet")["nvidia-device-plugin-daemonset"]
    assert env_of(main_container(dp))["CONFIG_FILE"] == "/config/config.yaml"
    volumes = {v["name"]: v for v in pod(dp)["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == "time-slicing-config"
    init = pod(dp)["initContainers"][0]
    assert init["name"] == "config-manager-init"
    assert env_of(init)["DEFAULT_CONFIG"] == "any"
    assert [c["name"] for c in pod(dp)["containers"]] == ["nvidia-device-plugin", "config-manager"]
    assert pod(dp)["shareProcessNamespace"] is True
    assert "nvidia-device-plugin" in by_kind(objects, "ClusterRole")
    assert "time-slicing-config" not in by_kind(objects, "ConfigMap")  # the user's, not ours


def test_device_plugin_without_config_needs_no_api_access() -> None:
    objects = render(default_policy(), Facts())
    dp = by_kind(objects, "DaemonSet")["nvidia-device-plugin-daemonset"]
    assert "CONFIG_FILE" not in env_of(main_container(dp))
    assert "initContainers" not in pod(dp)
    assert "nvidia-device-plugin" not in by_kind(objects, "ClusterRole")


def test_config_hash_rolls_pods_when_a_mounted_configmap_changes() -> None:
    policy, _ = case("time-slicing")

    def annotation(facts: Facts) -> str | None:
        ds = by_kind(render(policy, facts), "DaemonSet")["nvidia-device-plugin-daemonset"]
        annotations = ds["spec"]["template"]["metadata"].get("annotations") or {}
        return annotations.get(CONFIG_HASH)

    one = annotation(Facts(config_hashes={"time-slicing-config": "aaaa"}))
    two = annotation(Facts(config_hashes={"time-slicing-config": "bbbb"}))
    assert one and two and one != two
    assert annotation(Facts()) is None  # unknown content: no annotation rather than a wrong one
    # pods that mount no ConfigMap carry none
    gfd = daemonsets()["gpu-feature-discovery"]["spec"]["template"]["metadata"]
    assert CONFIG_HASH not in (gfd.get("annotations") or {})


def test_generated_configmaps_are_hashed_too() -> None:
    objects = render(default_policy(), Facts())
    cm = by_kind(objects, "ConfigMap")["default-mig-parted-config"]
    assert config_hash(cm) == config_hash({"data": dict(cm["data"])})
    ds = by_kind(objects, "DaemonSet")["nvidia-mig-manager"]
    assert CONFIG_HASH in ds["spec"]["template"]["metadata"]["annotations"]


def test_exporter_service_and_metrics_configmap() -> None:
    objects = render(default_policy(), Facts())
    service = by_kind(objects, "Service")["nvidia-dcgm-exporter"]
    assert service["spec"]["ports"] == [
        {"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert service["spec"]["type"] == "ClusterIP"
    assert "ServiceMonitor" not in {o["kind"] for o in objects}
    exporter = main_container(by_kind(objects, "DaemonSet")["nvidia-dcgm-exporter"])
    assert exporter["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert exporter["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9400}
    assert env_of(exporter)["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"
    assert "nvidia-dcgm-exporter" not in by_kind(objects, "ClusterRole")
    csv_text = by_kind(objects, "ConfigMap")["nvidia-dcgm-exporter-metrics"]["data"][
        "dcgm-metrics.csv"
    ]
    nvidia_fields = {
        row[0].strip().lstrip("# ").strip()
        for row in csv.reader(
            io.StringIO(prerequisites.nvidia("dcgm-exporter-default-counters.csv").read_text())
        )
        if row and row[0].strip().lstrip("#").strip().startswith("DCGM_")
    }
    rows = [r for r in csv.reader(io.StringIO(csv_text)) if r and not r[0].startswith("#")]
    assert len(rows) >= 15
    for field, kind, help_text in ([c.strip() for c in r] for r in rows):
        assert field in nvidia_fields
        assert kind in {"gauge", "counter", "label"}
        assert help_text


def test_users_metrics_configmap_is_referenced_not_generated() -> None:
    objects = render(parse_spec({"dcgmExporter": {"config": {"name": "my-metrics"}}}), Facts())
    assert "ConfigMap" not in {
        o["kind"]
        for o in objects
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "dcgm-exporter"
    }
    volumes = pod(by_kind(objects, "DaemonSet")["nvidia-dcgm-exporter"])["volumes"]
    assert {"name": "metrics-config", "configMap": {"name": "my-metrics"}} in volumes


def test_service_monitor_shape() -> None:
    policy, facts = case("everything-on")
    objects = render(policy, facts)
    monitor = by_kind(objects, "ServiceMonitor")["nvidia-dcgm-exporter"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "nvidia-gpu"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["nvidia-gpu"]}
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "gpu-metrics",
            "path": "/metrics",
            "interval": "15s",
            "honorLabels": True,
            "relabelings": [
                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
            ],
        }
    ]
    service = by_kind(objects, "Service")["nvidia-dcgm-exporter"]
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert "nvidia-dcgm-exporter" in by_kind(objects, "ClusterRole")  # pod labels need pods


def _slices(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


def test_default_mig_parted_config() -> None:
    objects = render(default_policy(), Facts())
    text = by_kind(objects, "ConfigMap")["default-mig-parted-config"]["data"]["config.yaml"]
    config = yaml.safe_load(text)
    assert config["version"] == "v1"
    configs = config["mig-configs"]
    for name in [
        "all-disabled",
        "all-enabled",
        "all-1g.5gb",
        "all-1g.10gb",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-7g.40gb",
        "all-balanced",
    ]:
        assert name in configs, name
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    known_ids = {"0x20B010DE", "0x20B210DE", "0x20B510DE", "0x233010DE", "0x233110DE"}
    for name, entries in configs.items():
        for entry in entries:
            assert entry["devices"] == "all"
            assert set(entry.get("device-filter", [])) <= known_ids
            devices = entry.get("mig-devices", {})
            assert sum(_slices(p) * n for p, n in devices.items()) <= 7, name
    # a profile only for the GPUs that have it: 1g.5gb exists only on A100-40GB
    assert [e["device-filter"] for e in configs["all-1g.5gb"]] == [["0x20B010DE"]]
    assert configs["all-1g.10gb"][0]["mig-devices"] == {"1g.10gb": 4}  # 40 GB: 4 max
    assert configs["all-1g.10gb"][1]["mig-devices"] == {"1g.10gb": 7}  # 80 GB: 7 max
    balanced_40 = configs["all-balanced"][0]
    assert balanced_40["mig-devices"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    mig = by_kind(objects, "DaemonSet")["nvidia-mig-manager"]
    assert env_of(main_container(mig))["DEFAULT_MIG_CONFIG"] == "all-disabled"


def test_users_mig_config_is_referenced_not_generated() -> None:
    policy, facts = case("mig-mixed")
    objects = render(policy, facts)
    assert "default-mig-parted-config" not in by_kind(objects, "ConfigMap")
    mig = pod(by_kind(objects, "DaemonSet")["nvidia-mig-manager"])
    assert {"name": "mig-parted-config", "configMap": {"name": "custom-mig-parted-config"}} in (
        mig["volumes"]
    )
    dp = main_container(by_kind(objects, "DaemonSet")["nvidia-device-plugin-daemonset"])
    assert env_of(dp)["MIG_STRATEGY"] == "mixed"


def test_least_privilege_rbac() -> None:
    objects = render(default_policy(), Facts())
    roles = {
        (o["kind"], o["metadata"]["name"]): [
            (tuple(r["resources"]), tuple(r["verbs"])) for r in o["rules"]
        ]
        for o in objects
        if o["kind"] in {"ClusterRole", "Role"}
    }
    assert roles == {
        ("ClusterRole", "nvidia-operator-validator"): [(("nodes",), ("get",))],
        ("Role", "nvidia-operator-validator"): [(("pods",), ("list",))],
        ("ClusterRole", "nvidia-gpu-feature-discovery"): [(("nodes",), ("get", "patch"))],
        ("ClusterRole", "nvidia-mig-manager"): [
            (("nodes",), ("get", "list", "watch", "patch")),
            (("events",), ("create",)),
        ],
        ("Role", "nvidia-mig-manager"): [(("pods",), ("list", "watch"))],
    }
    for binding in [o for o in objects if o["kind"].endswith("Binding")]:
        assert binding["subjects"][0]["namespace"] == "gpu-operator"


def test_openshift_binds_every_service_account_to_the_privileged_scc() -> None:
    objects = render(default_policy(), Facts(openshift=True))
    bindings = by_kind(objects, "RoleBinding")
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for account in accounts:
        assert bindings[f"{account}-scc"]["subjects"][0]["name"] == account
    assert not [
        o for o in render(default_policy(), Facts()) if o["metadata"]["name"].endswith("-scc")
    ]


def test_host_paths_are_honoured() -> None:
    policy, facts = case("disabled")
    objects = render(policy, facts)
    exporter_off = "nvidia-dcgm-exporter" not in by_kind(objects, "DaemonSet")
    assert exporter_off
    dp = pod(by_kind(objects, "DaemonSet")["nvidia-device-plugin-daemonset"])
    volumes = {v["name"]: v for v in dp["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == (
        "/var/snap/microk8s/common/var/lib/kubelet/device-plugins"
    )
    # no driver container: operands look for the driver on the host root
    assert volumes["driver-install-dir"]["hostPath"]["path"] == "/"
    assert env_of(dp["containers"][0])["MIG_STRATEGY"] == "none"


@pytest.mark.parametrize("name", ["nvidia-helm-default", "nvidia-sample"])
def test_nvidia_documents_render_a_full_stack(name: str) -> None:
    policy, facts = case(name)
    ds = daemonsets(policy, facts)
    expected = {
        "nvidia-driver-daemonset-ubuntu22.04",
        "nvidia-container-toolkit-daemonset",
        "nvidia-operator-validator",
        "nvidia-device-plugin-daemonset",
        "nvidia-dcgm-exporter",
        "gpu-feature-discovery",
        "nvidia-mig-manager",
    }
    assert expected <= set(ds)
    assert ("nvidia-dcgm" in ds) == (name == "nvidia-sample")


# -- templates ------------------------------------------------------------------------------------

EXPRESSION = re.compile(r"\{\{.*?\}\}")
# After each expression is replaced by X: ``key: X``, ``- X``, ``- key: X``, ``X: X`` or ``X:``.
WHOLE_NODE = re.compile(r"\s*(- )?(([\w./\"-]+|X): )?X:?\s*")


def test_every_expression_is_a_whole_yaml_node() -> None:
    """``{{ x }}`` must be a whole key or value: glued to text it would break the JSON rule."""
    env = environment()
    assert env.loader is not None
    checked = 0
    for name in env.list_templates():
        source = env.loader.get_source(env, name)[0]
        for number, line in enumerate(source.splitlines(), 1):
            if "{{" in line:
                checked += 1
                shape = EXPRESSION.sub("X", line)
                assert WHOLE_NODE.fullmatch(shape), f"{name}:{number}: {line.strip()}"
    assert checked > 50


@pytest.mark.parametrize(
    "line",
    [
        "  name: nvidia-{{ x }}",
        '  value: "{{ x }}"',
        "  - {{ a }}{{ b }}",
        "  k: {{ a }} # {{ b }}",
    ],
)
def test_the_expression_lint_rejects_glued_text(line: str) -> None:
    assert not WHOLE_NODE.fullmatch(EXPRESSION.sub("X", line))


@pytest.mark.parametrize(
    ("spec", "checks", "driver_root"),
    [
        ({}, "driver,toolkit,cuda,plugin", "/run/nvidia/driver"),
        ({"devicePlugin": {"enabled": False}}, "driver,toolkit,cuda", "/run/nvidia/driver"),
        ({"driver": {"enabled": False}}, "driver,toolkit,cuda,plugin", "/"),
    ],
)
def test_validator_checks_what_is_deployed(
    spec: dict[str, Any], checks: str, driver_root: str
) -> None:
    env = env_of(main_container(daemonsets(parse_spec(spec))["nvidia-operator-validator"]))
    assert env["COMPONENTS"] == checks
    assert env["NVIDIA_DRIVER_ROOT"] == driver_root
    probe = main_container(daemonsets()["nvidia-operator-validator"])["readinessProbe"]
    assert probe["exec"]["command"] == ["test", "-f", "/run/nvidia/validations/.ready"]
