"""The typed values templates read, and the contract between templates and the shared partial."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import pytest
import yaml

from gpu_operator.api import parse_spec
from gpu_operator.labels import CONFIG_HASH
from gpu_operator.render import (
    Facts,
    config_hash,
    default_policy,
    render,
)
from gpu_operator.render.components import REGISTRY, component
from gpu_operator.render.engine import environment
from gpu_operator.render.facts import DEFAULT_OPERATOR_IMAGE
from gpu_operator.render.settings import DaemonSetSettings, daemonset_settings
from gpu_operator.render.values import VALUES, host_paths, template_context
from gpu_operator.render.wire import merge_env, merge_maps
from tests.unit.render.render_cases import CASES, case

# -- values ---------------------------------------------------------------------------------------


def test_every_component_has_a_values_builder() -> None:
    assert set(VALUES) == {c.name for c in REGISTRY}


@pytest.mark.parametrize("name", sorted(CASES))
def test_template_values_are_frozen_dataclasses(name: str) -> None:
    policy, facts = case(name)
    for comp in REGISTRY:
        context = template_context(policy, facts, comp)
        for value in (context, context.host, context.c, context.d, context.v):
            assert dataclasses.is_dataclass(value), (comp.name, value)
            with pytest.raises(dataclasses.FrozenInstanceError):
                value.__setattr__(dataclasses.fields(value)[0].name, None)


@pytest.mark.parametrize(
    ("spec", "driver_root", "kubelet_root"),
    [
        ({}, "/run/nvidia/driver", "/var/lib/kubelet"),
        ({"driver": {"enabled": False}}, "/", "/var/lib/kubelet"),
        (
            {"driver": {"enabled": False}, "hostPaths": {"rootFS": "/host"}},
            "/host",
            "/var/lib/kubelet",
        ),
        (
            {"hostPaths": {"driverInstallDir": "/d", "kubeletRootDir": "/k/"}},
            "/d",
            "/k",
        ),
    ],
)
def test_host_paths(spec: dict[str, Any], driver_root: str, kubelet_root: str) -> None:
    paths = host_paths(parse_spec(spec))
    assert paths.driver_root == driver_root
    assert paths.kubelet_root == kubelet_root


# -- shared DaemonSet settings --------------------------------------------------------------------


def settings(spec: dict[str, Any], name: str, facts: Facts | None = None) -> DaemonSetSettings:
    return daemonset_settings(parse_spec(spec), facts or Facts(), component(name))


@pytest.mark.parametrize(
    ("spec", "name", "expected"),
    [
        ({}, "gpu-feature-discovery", {"type": "RollingUpdate"}),
        ({}, "driver", {"type": "OnDelete"}),
        ({"daemonsets": {"updateStrategy": "OnDelete"}}, "device-plugin", {"type": "OnDelete"}),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "2"}}},
            "dcgm",
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}},
        ),
        (
            {"daemonsets": {"rollingUpdate": {"maxUnavailable": "10%"}}},
            "driver",
            {"type": "OnDelete"},
        ),
    ],
)
def test_update_strategy(spec: dict[str, Any], name: str, expected: dict[str, Any]) -> None:
    assert settings(spec, name).update_strategy == expected


@pytest.mark.parametrize(
    ("runtime", "toolkit", "name", "expected"),
    [
        ("containerd", True, "device-plugin", "nvidia"),
        ("containerd", True, "driver", None),  # the driver does not run on the NVIDIA runtime
        ("containerd", True, "container-toolkit", None),
        ("containerd", False, "device-plugin", None),  # a preinstalled toolkit is the default
        ("crio", True, "device-plugin", None),
        ("docker", True, "gpu-feature-discovery", None),
    ],
)
def test_runtime_class_name(runtime: Any, toolkit: bool, name: str, expected: str | None) -> None:
    spec = {"toolkit": {"enabled": toolkit}}
    assert settings(spec, name, Facts(runtime=runtime)).runtime_class_name == expected


@pytest.mark.parametrize(
    ("spec", "name", "expected"),
    [
        ({}, "gpu-feature-discovery", ("gpu-operator", "agent", "discover")),
        ({}, "device-plugin", None),  # not the project's image: the template's own command
        (
            {"gfd": {"repository": "nvcr.io/nvidia", "image": "gpu-feature-discovery"}},
            "gpu-feature-discovery",
            ("gpu-feature-discovery",),
        ),
        ({"dcgmExporter": {"repository": "nvcr.io/nvidia/k8s"}}, "dcgm-exporter", None),
    ],
)
def test_command(spec: dict[str, Any], name: str, expected: tuple[str, ...] | None) -> None:
    assert settings(spec, name).command == expected


def test_section_settings_and_their_absence() -> None:
    plain = settings({}, "device-plugin")
    assert (plain.args, plain.env, plain.resources, plain.host_network) == ((), (), None, None)
    assert plain.image_pull_secrets == ()
    assert plain.image_pull_policy == "IfNotPresent"
    assert plain.priority_class_name == "system-node-critical"
    assert plain.security_context is None
    given = settings(
        {
            "devicePlugin": {
                "args": ["-v"],
                "resources": {"limits": {"cpu": "1"}},
                "hostNetwork": False,
                "imagePullSecrets": ["s"],
                "imagePullPolicy": "Always",
            },
            "daemonsets": {"podSecurityContext": {}},
        },
        "device-plugin",
    )
    assert given.args == ("-v",)
    assert given.resources == {"limits": {"cpu": "1"}}
    assert given.host_network is False
    assert given.image_pull_secrets == ({"name": "s"},)
    assert given.image_pull_policy == "Always"
    assert given.security_context == {}  # set, though empty
    assert settings({"devicePlugin": {"resources": {}}}, "device-plugin").resources is None


def test_validator_env_merges_sub_sections_then_its_own() -> None:
    spec = {
        "validator": {
            "env": [{"name": "A", "value": "own"}],
            "driver": {"env": [{"name": "A", "value": "driver"}, {"name": "B", "value": "1"}]},
            "cuda": {"env": [{"name": "B", "value": "2"}]},
        }
    }
    assert settings(spec, "operator-validator").env == (
        {"name": "A", "value": "own"},
        {"name": "B", "value": "2"},
    )


def test_pod_annotations_digest_only_what_is_known() -> None:
    base = settings({"daemonsets": {"annotations": {"x": "1"}}}, "mig-manager")
    assert base.pod_annotations(None, ["cm"]) == {"x": "1"}  # unknown content: no digest
    known = dataclasses.replace(base, config_hashes={"a": "1111", "b": "2222"})
    one = known.pod_annotations({"own": "y"}, ["b", None, "a", "unknown"])
    expected = hashlib.sha256(b"a=1111\nb=2222").hexdigest()[:16]
    assert one == {"x": "1", "own": "y", CONFIG_HASH: expected}
    assert known.pod_annotations({"own": "y"}, ["a", "b"]) == one  # order of mounts is moot
    assert known.pod_annotations(None, ["a"])[CONFIG_HASH] != expected


def test_merges() -> None:
    assert list(merge_maps({"b": 1, "a": 1}, None, {"a": 2, "c": 3})) == ["b", "a", "c"]
    assert merge_maps({"a": 1}, {"a": 2}) == {"a": 2}
    env = merge_env(
        [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}],
        [{"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
    )
    assert env == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "2"},
        {"name": "C", "value": "3"},
    ]
    assert merge_env(None, []) == []


# -- templates and the shared partial -------------------------------------------------------------

SHARED_CALLS = [
    re.compile(r"^\{% import \"_shared/_daemonset\.j2\" as ds %\}$", re.M),
    re.compile(r"^\{% call ds\.pod_metadata\(c, d, .*\) %\}\{% endcall %\}$", re.M),
    re.compile(r"^\{% call ds\.env\(d\) %\}", re.M),
    re.compile(r"^\{% call ds\.container_settings\(d.*\) %\}\{% endcall %\}$", re.M),
    re.compile(r"^\{% call ds\.pod_settings\(d\) %\}\{% endcall %\}$", re.M),
    re.compile(r"^  updateStrategy: \{\{ d\.update_strategy \}\}$", re.M),
]
CONTAINER_CALLS = SHARED_CALLS[2:4]


@pytest.mark.parametrize("comp", REGISTRY, ids=lambda c: c.name)
def test_every_daemonset_template_places_the_shared_settings(comp: Any) -> None:
    env = environment()
    assert env.loader is not None
    source = env.loader.get_source(env, f"{comp.name}/0500_daemonset.yaml.j2")[0]
    for pattern in SHARED_CALLS:
        if comp.name == "driver" and pattern in CONTAINER_CALLS:
            continue  # the NVIDIADriver rendering builds the driver's containers whole
        assert pattern.search(source), f"{comp.name}: missing {pattern.pattern}"


class _StrictLoader(yaml.SafeLoader):
    """Rejects a key given twice: PyYAML would keep the last one silently."""


def _no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    duplicates = {k for k in keys if keys.count(k) > 1}
    assert not duplicates, f"{node.start_mark}: {sorted(duplicates)} given twice"
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _no_duplicates,  # type: ignore[arg-type]
)


def _every_section_set() -> dict[str, Any]:
    """Every setting the shared partial places, on every component."""
    section = {
        "args": ["--x"],
        "env": [{"name": "X", "value": "1"}],
        "resources": {"limits": {"cpu": "1"}},
        "hostNetwork": True,
        "imagePullSecrets": ["pull"],
        "imagePullPolicy": "Always",
    }
    spec: dict[str, Any] = {c.spec_field: dict(section) for c in REGISTRY}
    spec["dcgm"]["enabled"] = True
    spec["devicePlugin"]["config"] = {"name": "plugin-configs"}
    spec["daemonsets"] = {"podSecurityContext": {"runAsUser": 0}, "annotations": {"a": "b"}}
    return spec


STRICT_CASES = {
    **{name: lambda name=name: case(name) for name in CASES},
    "every-section-set": lambda: (parse_spec(_every_section_set()), Facts(openshift=True)),
}


@pytest.mark.parametrize("name", sorted(STRICT_CASES))
def test_no_template_writes_a_key_twice(name: str) -> None:
    """A shared macro and a template setting the same field would otherwise hide one."""
    policy, facts = STRICT_CASES[name]()
    checked = 0
    for comp in REGISTRY:
        variables = template_context(policy, facts, comp).variables(facts.config_hashes)
        for template in environment().list_templates():
            if not template.startswith((comp.name + "/", "_shared/0")):
                continue
            if not re.search(r"/[0-9]{4}_", template):
                continue
            text = environment().get_template(template).render(variables)
            checked += len([d for d in yaml.load_all(text, Loader=_StrictLoader) if d])
    assert checked > 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_hash_covers_every_mounted_configmap(name: str) -> None:
    """The digest a template asks for equals one over the ConfigMap volumes it really mounts."""
    policy, facts = case(name)
    objects = render(policy, facts)
    hashes = dict(facts.config_hashes)
    hashes.update(
        {o["metadata"]["name"]: config_hash(o) for o in objects if o["kind"] == "ConfigMap"}
    )
    for ds in (o for o in objects if o["kind"] == "DaemonSet"):
        pod = ds["spec"]["template"]
        volumes = pod["spec"].get("volumes") or []
        mounted = sorted(v["configMap"]["name"] for v in volumes if "configMap" in v)
        known = [f"{n}={hashes[n]}" for n in mounted if n in hashes]
        expected = hashlib.sha256("\n".join(known).encode()).hexdigest()[:16] if known else None
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get(CONFIG_HASH) == expected, ds["metadata"]["name"]


def test_a_component_image_pointing_at_the_project_runs_its_agent() -> None:
    policy = parse_spec({"gfd": {"image": DEFAULT_OPERATOR_IMAGE}})
    ds = next(
        o for o in render(policy, Facts()) if o["metadata"]["name"] == "gpu-feature-discovery"
    )
    assert ds["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "gpu-operator",
        "agent",
        "discover",
    ]
    default = render(default_policy(), Facts())
    plugin = next(o for o in default if o["metadata"]["name"] == "nvidia-device-plugin-daemonset")
    assert plugin["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "nvidia-device-plugin"
    ]


def test_the_strict_loader_rejects_a_repeated_key() -> None:
    """Guards the duplicate-key test: PyYAML's own loader accepts this silently."""
    assert yaml.safe_load("a: 1\na: 2\n") == {"a": 2}
    with pytest.raises(AssertionError, match="given twice"):
        yaml.load("a: 1\nb: {c: 1}\na: 2\n", Loader=_StrictLoader)
