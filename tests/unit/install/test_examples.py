"""examples/: every document is valid, every ClusterPolicy loads and renders, and each example
does what its comments promise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_operator.agent import migparted
from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config
from gpu_operator.agent.inventory import Inventory
from gpu_operator.agent.nvml import Nvml
from gpu_operator.api import ClusterPolicySpec, parse_document
from gpu_operator.api.crd import clusterpolicy_crd, nvidiadriver_crd
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.install.manifests import NAMESPACE
from gpu_operator.render import render
from gpu_operator.render.facts import Facts, NodeOS
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from tests.paths import REPO
from tests.schema import prune_nulls, strict, validate_kubernetes

EXAMPLES = REPO / "examples"
DRA_EXAMPLES = [
    "computedomain-job.yaml",
    "dra-mps.yaml",
    "dra-pod.yaml",
    "dra-time-slicing.yaml",
    "dra-vfio.yaml",
    "gpucluster.yaml",
]  # tests/unit/install/test_dra_examples.py
NAMES = sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name not in DRA_EXAMPLES)
FACTS = Facts(node_oses=(NodeOS("ubuntu", "22.04"), NodeOS("rhel", "9.4")))


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d is not None]


def one(name: str, kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents(name) if d["kind"] == kind]
    return found


def policy(name: str) -> ClusterPolicySpec:
    return parse_document(one(name, "ClusterPolicy"))


def rendered(name: str) -> list[dict[str, Any]]:
    return render(policy(name), FACTS)


def daemonset(objects: list[dict[str, Any]], app: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == app]
    return found


def test_the_expected_examples_exist() -> None:
    assert NAMES == [
        "clusterpolicy.yaml",
        "mig-mixed.yaml",
        "nvidiadriver-pools.yaml",
        "private-registry.yaml",
        "time-slicing.yaml",
        "upgrade-policy.yaml",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_every_document_validates(name: str) -> None:
    schema = strict(clusterpolicy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    kinds = []
    for doc in documents(name):
        kinds.append(doc["kind"])
        if doc["kind"] == "ClusterPolicy":
            jsonschema.validate(prune_nulls(doc), schema)
        elif doc["kind"] == "NVIDIADriver":
            nvd = strict(nvidiadriver_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
            nvd["properties"]["spec"].pop("required")  # all defaulted by the API server
            jsonschema.validate(prune_nulls(doc), nvd)
            parse_driver_spec(doc["spec"])
        else:
            assert validate_kubernetes(doc), doc["kind"]
            assert doc["metadata"].get("namespace") == NAMESPACE, "configs live with the operator"
    assert kinds.count("ClusterPolicy") == 1


@pytest.mark.parametrize("name", NAMES)
def test_every_policy_loads_and_renders_valid_objects(name: str) -> None:
    objects = rendered(name)
    assert any(o["kind"] == "DaemonSet" for o in objects)
    for obj in objects:
        validate_kubernetes(obj)


@pytest.mark.parametrize("name", NAMES)
def test_every_example_updates_the_one_policy(name: str) -> None:
    """Only the oldest ClusterPolicy acts: examples share its name so they replace it."""
    assert one(name, "ClusterPolicy")["metadata"]["name"] == "cluster-policy"


@pytest.mark.parametrize("name", NAMES)
def test_every_example_explains_itself(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert text.startswith("# "), "each example opens with a comment saying what it is for"


# -- time-slicing ---------------------------------------------------------------------------------


def test_time_slicing_shares_each_gpu_four_ways() -> None:
    configmap = one("time-slicing.yaml", "ConfigMap")
    ref = policy("time-slicing.yaml").device_plugin.config
    assert ref is not None
    assert ref.name == configmap["metadata"]["name"]
    assert ref.default in configmap["data"]
    configs = {k: parse_device_plugin_config(v) for k, v in configmap["data"].items()}
    default = configs[ref.default].sharing_settings()
    assert default.strategy == "time-slicing"
    replicated = default.lookup("nvidia.com/gpu")
    assert replicated is not None and replicated.replicas == 4
    raw = yaml.safe_load(configmap["data"][ref.default])
    assert raw["version"] == "v1"
    assert raw["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]


def test_time_slicing_plugin_mounts_the_configmap() -> None:
    plugin = daemonset(rendered("time-slicing.yaml"), "nvidia-device-plugin-daemonset")
    volumes = plugin["spec"]["template"]["spec"]["volumes"]
    names = {v["configMap"]["name"] for v in volumes if "configMap" in v}
    assert "time-slicing-config" in names


# -- MIG mixed ------------------------------------------------------------------------------------


@pytest.fixture
def inventory() -> Iterator[Any]:
    def make(spec: str) -> Inventory:
        install_simulated_nvml(spec, seed="examples")
        with Nvml() as nvml:
            return nvml.inventory()

    yield make
    uninstall_simulated_nvml()


def test_mig_mixed_policy_uses_the_custom_configmap() -> None:
    spec = policy("mig-mixed.yaml")
    configmap = one("mig-mixed.yaml", "ConfigMap")
    assert spec.mig is not None and spec.mig.strategy == "mixed"
    assert spec.mig_manager.config is not None
    assert spec.mig_manager.config.name == configmap["metadata"]["name"]
    manager = daemonset(rendered("mig-mixed.yaml"), "nvidia-mig-manager")
    volumes = manager["spec"]["template"]["spec"]["volumes"]
    assert {"name": "mig-parted-config", "configMap": {"name": "custom-mig-parted-config"}} in [
        {k: v for k, v in vol.items() if k in ("name", "configMap")} for vol in volumes
    ]
    # No generated default ConfigMap when the user brings one.
    assert not [
        o
        for o in rendered("mig-mixed.yaml")
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "default-mig-parted-config"
    ]


@pytest.mark.parametrize("gpus", ["a100-40gb:8", "h100-80gb:8"])
@pytest.mark.parametrize("layout", ["all-disabled", "inference-mix", "split-node"])
def test_mig_mixed_layouts_fit_real_gpus(inventory: Any, gpus: str, layout: str) -> None:
    configmap = one("mig-mixed.yaml", "ConfigMap")
    assert yaml.safe_load(configmap["data"]["config.yaml"])["version"] == "v1"
    config = migparted.parse_mig_config(yaml.safe_dump(configmap))
    default = policy("mig-mixed.yaml").mig_manager.config
    assert default is not None and default.default in config.mig_configs
    plan = migparted.plan(inventory(gpus), config, layout)
    assert len(plan.gpus) == 8


# -- private registry -----------------------------------------------------------------------------


def test_private_registry_pulls_everything_from_the_mirror() -> None:
    spec = one("private-registry.yaml", "ClusterPolicy")["spec"]
    for section in spec.values():
        if section.get("enabled", True):
            assert section["repository"].startswith("registry.example.com/")
            assert "mirror-pull" in section["imagePullSecrets"]
    daemonsets = [o for o in rendered("private-registry.yaml") if o["kind"] == "DaemonSet"]
    assert daemonsets
    for ds in daemonsets:
        pod = ds["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert c["image"].startswith("registry.example.com/"), (ds["metadata"]["name"], c)
        assert {"name": "mirror-pull"} in pod["imagePullSecrets"], ds["metadata"]["name"]


def test_private_registry_pins_one_component_by_digest() -> None:
    plugin = daemonset(rendered("private-registry.yaml"), "nvidia-device-plugin-daemonset")
    image = plugin["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith("registry.example.com/nvidia/k8s-device-plugin@sha256:")
    assert len(image.rsplit(":", 1)[1]) == 64
    drivers = [
        o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in rendered("private-registry.yaml")
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith("nvidia-driver-daemonset")
    ]
    assert sorted(drivers) == [
        "registry.example.com/nvidia/driver:580.95.05-rhel9",
        "registry.example.com/nvidia/driver:580.95.05-ubuntu22.04",
    ]


# -- upgrade policy -------------------------------------------------------------------------------


def _unset(model: Any, path: str = "upgradePolicy") -> Iterator[str]:
    for field, info in type(model).model_fields.items():
        value = getattr(model, field)
        where = f"{path}.{info.alias or field}"
        if value is None:
            yield where
        elif hasattr(type(value), "model_fields"):
            yield from _unset(value, where)


def test_upgrade_policy_spells_out_every_field() -> None:
    upgrade = policy("upgrade-policy.yaml").driver.upgrade_policy
    assert upgrade is not None
    assert list(_unset(upgrade)) == []
    assert upgrade.auto_upgrade is True


def test_upgrade_policy_fields_are_nvidia_s_spelling() -> None:
    raw = one("upgrade-policy.yaml", "ClusterPolicy")["spec"]["driver"]["upgradePolicy"]
    assert set(raw) == {
        "autoUpgrade",
        "maxParallelUpgrades",
        "maxUnavailable",
        "waitForCompletion",
        "podDeletion",
        "drain",
        "canary",  # gpu-operator's own
    }


def test_examples_folder_has_no_stray_files() -> None:
    assert sorted(p.name for p in EXAMPLES.iterdir()) == sorted(NAMES + DRA_EXAMPLES)
