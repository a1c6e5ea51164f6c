"""``spec.healthRemediation`` in the rendered device plugin: its container gets the
GPU_HEALTH_* env and its ServiceAccount may patch its Node, whichever image runs (the project's
agent publishes the condition; NVIDIA's ignores the env); off or absent, nothing in the
rendering changes."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.api import parse_spec
from gpu_operator.render import Facts, render
from tests.schema import validate_kubernetes
from tests.unit.rbac_grants import verbs
from tests.unit.render.test_render import by_kind, env_of, main_container

OWN_IMAGE = {"repository": "ghcr.io/gpu-operator", "image": "gpu-operator", "version": "v0.1.0"}
DS = "nvidia-device-plugin-daemonset"
ROLE = "nvidia-device-plugin"
SIGNALS = {
    "xids": [13, 48],
    "ignoredXids": [92],
    "thermal": True,
    "power": False,
    "debounce": "45s",
    "quietPeriod": "1h30m",
}


def objects(device_plugin: dict[str, Any], health: dict[str, Any] | None) -> list[Any]:
    spec: dict[str, Any] = {"devicePlugin": device_plugin}
    if health is not None:
        spec["healthRemediation"] = health
    return render(parse_spec(spec), Facts())


def plugin_objects(device_plugin: dict[str, Any], health: dict[str, Any] | None) -> list[Any]:
    """The device plugin's own objects (the quarantine toleration is every operand's)."""
    found = [o for o in objects(device_plugin, health) if o["metadata"]["name"] in (DS, ROLE)]
    for o in found:
        if o["kind"] == "DaemonSet":
            o["spec"]["template"]["spec"].pop("tolerations")
    return found


def health_env(device_plugin: dict[str, Any], health: dict[str, Any] | None) -> dict[str, Any]:
    ds = by_kind(objects(device_plugin, health), "DaemonSet")[DS]
    return {k: v for k, v in env_of(main_container(ds)).items() if k.startswith("GPU_HEALTH")}


@pytest.mark.parametrize(
    "device_plugin", [{}, OWN_IMAGE, {**OWN_IMAGE, "config": {"name": "c"}}], ids=str
)
@pytest.mark.parametrize("health", [{}, {"enabled": False, "signals": SIGNALS}], ids=str)
def test_off_or_absent_changes_nothing(device_plugin: dict[str, Any], health: Any) -> None:
    assert objects(device_plugin, health) == objects(device_plugin, None)


@pytest.mark.parametrize("device_plugin", [{}, OWN_IMAGE], ids=["nvidia", "own"])
def test_the_plugin_gets_the_signals_set_as_strings_durations_as_written(
    device_plugin: dict[str, Any],
) -> None:
    env = health_env(device_plugin, {"enabled": True, "signals": SIGNALS})
    assert env == {
        "GPU_HEALTH_CONDITION": "true",
        "GPU_HEALTH_XIDS": "13,48",
        "GPU_HEALTH_IGNORED_XIDS": "92",
        "GPU_HEALTH_THERMAL": "true",
        "GPU_HEALTH_POWER": "false",
        "GPU_HEALTH_DEBOUNCE": "45s",
        "GPU_HEALTH_QUIET_PERIOD": "1h30m",
    }


def test_only_the_signals_set() -> None:
    assert health_env(OWN_IMAGE, {"enabled": True}) == {"GPU_HEALTH_CONDITION": "true"}
    partial = {"enabled": True, "signals": {"quietPeriod": "5m"}}
    assert health_env(OWN_IMAGE, partial) == {
        "GPU_HEALTH_CONDITION": "true",
        "GPU_HEALTH_QUIET_PERIOD": "5m",
    }


@pytest.mark.parametrize(
    "device_plugin",
    [{}, {"config": {"name": "c"}}, OWN_IMAGE, {**OWN_IMAGE, "config": {"name": "c"}}],
    ids=["nvidia", "nvidia with config", "own", "own with config"],
)
def test_the_plugin_may_patch_its_node_and_status_and_record_events(
    device_plugin: dict[str, Any],
) -> None:
    rendered = objects(device_plugin, {"enabled": True})
    role = by_kind(rendered, "ClusterRole")[ROLE]
    assert verbs(role["rules"]) == {
        ("", "nodes", "get"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "events", "create"),
    }
    binding = by_kind(rendered, "ClusterRoleBinding")[ROLE]
    assert binding["roleRef"]["name"] == ROLE
    assert binding["subjects"][0]["name"] == ROLE
    ds = by_kind(rendered, "DaemonSet")[DS]
    for obj in (role, binding, ds):
        assert validate_kubernetes(obj)


def test_the_agent_knows_its_node() -> None:
    ds = by_kind(objects(OWN_IMAGE, {"enabled": True}), "DaemonSet")[DS]
    assert env_of(main_container(ds))["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("device_plugin", [{}, OWN_IMAGE], ids=["nvidia", "own"])
def test_the_rest_of_the_daemonset_is_untouched(device_plugin: dict[str, Any]) -> None:
    (ds_on,) = [
        o for o in plugin_objects(device_plugin, {"enabled": True}) if o["kind"] == "DaemonSet"
    ]
    (ds_off,) = [o for o in plugin_objects(device_plugin, None) if o["kind"] == "DaemonSet"]
    # The agent names its Node (NVIDIA's image has no NODE_NAME otherwise).
    assert "NODE_NAME" in {e["name"] for e in main_container(ds_on)["env"]}
    for ds in (ds_on, ds_off):
        container = main_container(ds)
        container["env"] = [
            e
            for e in container["env"]
            if not e["name"].startswith("GPU_HEALTH") and e["name"] != "NODE_NAME"
        ]
    assert ds_on == ds_off


def test_a_users_env_still_wins() -> None:
    device_plugin = {**OWN_IMAGE, "env": [{"name": "GPU_HEALTH_QUIET_PERIOD", "value": "10m"}]}
    env = health_env(device_plugin, {"enabled": True, "signals": {"quietPeriod": "5m"}})
    assert env["GPU_HEALTH_QUIET_PERIOD"] == "10m"


def test_the_env_is_placed_as_data(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_operator.render import values

    hostile = '5m"\n            - name: INJECTED\n              value: "x'
    monkeypatch.setattr(
        values,
        "health_env",
        lambda policy: ({"name": "GPU_HEALTH_QUIET_PERIOD", "value": hostile},),
    )
    env = health_env(OWN_IMAGE, {"enabled": True})
    assert env == {"GPU_HEALTH_QUIET_PERIOD": hostile}
    ds = by_kind(objects(OWN_IMAGE, {"enabled": True}), "DaemonSet")[DS]
    assert "INJECTED" not in env_of(main_container(ds))
