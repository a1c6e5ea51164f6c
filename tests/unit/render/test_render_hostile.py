"""User-controlled strings cannot change the shape of what is rendered.

Every value that reaches a template is emitted as one JSON value, including the settings the
shared DaemonSet partial places and the env it merges. So a hostile env value, label,
annotation, argument, ConfigMap name or image tag comes out as the very same string and adds no
field and no object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.api import ClusterPolicySpec, parse_spec
from gpu_operator.render import Facts, render

HOSTILE = (
    "x\n  injected: true\n- evil: 1\n---\napiVersion: v1\nkind: Secret\n"
    "\"quoted\" 'single' {{ 7*7 }} {% if true %}boom{% endif %} {# c #} &a *a !!python/object "
    "# comment : colon, [flow] {map: 1} | > % @ ` \\ \t \u2028 \U0001f600 \x7f end"
)
BENIGN = "benign"


def hostile_spec(value: str) -> dict[str, Any]:
    """Every user string the renderer places, set to ``value``."""
    return {
        "operator": {"runtimeClass": value},
        "daemonsets": {
            "annotations": {"example.com/note": value, value: "key"},
            "priorityClassName": value,
            "tolerations": [{"key": value, "operator": "Equal", "value": value}],
        },
        "driver": {"env": [{"name": "HOSTILE", "value": value}]},
        "toolkit": {"installDir": value, "args": [value, "--x"]},
        "dcgm": {"enabled": True, "args": [value], "env": [{"name": "HOSTILE", "value": value}]},
        "devicePlugin": {
            "config": {"name": value, "default": value},
            "env": [{"name": "HOSTILE", "value": value}],
            "imagePullSecrets": [value],
        },
        "dcgmExporter": {
            "config": {"name": value},
            "annotations": {"example.com/exporter": value},
            "podLabelAllowlistRegex": [value],
            "enablePodLabels": True,
            "serviceMonitor": {
                "enabled": True,
                "interval": value,
                "additionalLabels": {"k": value, value: "key"},
            },
        },
        "migManager": {"config": {"name": value}, "gpuClientsConfig": {"name": value}},
        "validator": {"plugin": {"env": [{"name": "HOSTILE", "value": value}]}},
        "hostPaths": {"rootFS": value, "driverInstallDir": value},
    }


def hostile_policy(value: str) -> ClusterPolicySpec:
    policy = parse_spec(hostile_spec(value))
    # The API rejects such label values and the models such image parts; the renderer must
    # not depend on that.
    policy.daemonsets.labels = {"example.com/team": value, value: "key"}
    policy.gfd.repository = policy.gfd.image = value
    return policy


def paths(value: Any, replace: str, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every leaf path; a map key equal to ``replace`` reads as ``<key>``."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, replace, (*prefix, "<key>" if key == replace else key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, replace, (*prefix, index))
    else:
        yield prefix


def shape(objects: list[dict[str, Any]], replace: str) -> list[set[tuple[Any, ...]]]:
    return [set(paths(obj, replace)) for obj in objects]


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def by_name(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def main_env(objects: list[dict[str, Any]], daemonset: str) -> dict[str, Any]:
    ds = by_name(objects, "DaemonSet", daemonset)
    return {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_hostile_strings_add_no_fields_and_no_objects() -> None:
    facts = Facts()
    benign = render(hostile_policy(BENIGN), facts)
    hostile = render(hostile_policy(HOSTILE), facts)
    assert [(o["kind"], o["apiVersion"]) for o in hostile] == [
        (o["kind"], o["apiVersion"]) for o in benign
    ]
    assert shape(hostile, HOSTILE) == shape(benign, BENIGN)
    assert "Secret" not in {o["kind"] for o in hostile}
    assert "injected" not in {k for obj in hostile for p in paths(obj, HOSTILE) for k in p}


def test_hostile_strings_come_out_unchanged() -> None:
    objects = render(hostile_policy(HOSTILE), Facts())
    for daemonset in ("nvidia-device-plugin-daemonset", "nvidia-driver-daemonset-ubuntu22.04"):
        assert main_env(objects, daemonset)["HOSTILE"] == HOSTILE
    assert main_env(objects, "nvidia-operator-validator")["HOSTILE"] == HOSTILE
    assert main_env(objects, "nvidia-dcgm")["HOSTILE"] == HOSTILE
    dcgm = by_name(objects, "DaemonSet", "nvidia-dcgm")["spec"]["template"]["spec"]
    assert dcgm["containers"][0]["args"] == [HOSTILE]
    assert dcgm["priorityClassName"] == HOSTILE
    assert {"key": HOSTILE, "operator": "Equal", "value": HOSTILE} in dcgm["tolerations"]
    toolkit = by_name(objects, "DaemonSet", "nvidia-container-toolkit-daemonset")
    container = toolkit["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [HOSTILE, "--x"]
    assert {"name": "ROOT", "value": HOSTILE} in container["env"]
    assert by_name(objects, "RuntimeClass", HOSTILE)["handler"] == HOSTILE
    plugin = by_name(objects, "DaemonSet", "nvidia-device-plugin-daemonset")
    template = plugin["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/note"] == HOSTILE
    assert template["metadata"]["annotations"][HOSTILE] == "key"
    assert template["metadata"]["labels"]["example.com/team"] == HOSTILE
    assert template["metadata"]["labels"][HOSTILE] == "key"
    assert plugin["metadata"]["labels"][HOSTILE] == "key"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == HOSTILE
    assert template["spec"]["imagePullSecrets"] == [{"name": HOSTILE}]
    init_env = {e["name"]: e.get("value") for e in template["spec"]["initContainers"][0]["env"]}
    assert init_env["DEFAULT_CONFIG"] == HOSTILE
    exporter = by_name(objects, "DaemonSet", "nvidia-dcgm-exporter")["spec"]["template"]
    assert {"name": "metrics-config", "configMap": {"name": HOSTILE}} in exporter["spec"]["volumes"]
    assert exporter["metadata"]["annotations"]["example.com/exporter"] == HOSTILE
    monitor = by_name(objects, "ServiceMonitor", "nvidia-dcgm-exporter")
    assert monitor["spec"]["endpoints"][0]["interval"] == HOSTILE
    assert monitor["metadata"]["labels"]["k"] == HOSTILE
    assert monitor["metadata"]["labels"][HOSTILE] == "key"
    gfd = by_name(objects, "DaemonSet", "gpu-feature-discovery")
    image = gfd["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith(f"{HOSTILE}/{HOSTILE}:")
    # the hostile text never leaks anywhere but whole values and keys
    leaked = [s for o in objects for s in strings(o) if "injected" in s and HOSTILE not in s]
    assert leaked == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(max_size=80))
def test_any_env_value_round_trips(value: str) -> None:
    spec = {"gfd": {"env": [{"name": "ANY", "value": value}]}}
    objects = render(parse_spec(spec), Facts())
    assert main_env(objects, "gpu-feature-discovery")["ANY"] == value
    benign = render(parse_spec({"gfd": {"env": [{"name": "ANY", "value": "v"}]}}), Facts())
    assert shape(objects, "\0never") == shape(benign, "\0never")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.text(min_size=1, max_size=40))
def test_any_templated_string_round_trips(value: str) -> None:
    """Strings that pass through a template (not set after parsing) are exact too."""
    spec = {"devicePlugin": {"config": {"name": value, "default": value}}}
    objects = render(parse_spec(spec), Facts())
    plugin = by_name(objects, "DaemonSet", "nvidia-device-plugin-daemonset")["spec"]["template"]
    volumes = {v["name"]: v for v in plugin["spec"]["volumes"]}
    assert volumes["available-configs"]["configMap"]["name"] == value
    init_env = {e["name"]: e.get("value") for e in plugin["spec"]["initContainers"][0]["env"]}
    assert init_env["DEFAULT_CONFIG"] == value
