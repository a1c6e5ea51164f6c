"""Feature-discovery labels, written out from gpu-facts.md section 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agent import discovery
from gpu_operator.agent.deviceplugin.config_file import (
    DevicePluginConfigError,
    MigStrategy,
    Replicated,
    Sharing,
    parse_device_plugin_config,
)
from gpu_operator.agent.discovery import label_patch, labels_for
from gpu_operator.agent.inventory import Inventory
from tests.fakes.kube import FakeKube

from .conftest import Simulate, inventory_with

TS = 1_760_000_000
MACHINE = "DGXA100-920-23687-2530-000"

COMMON_580_128 = {
    "nvidia.com/gpu.machine": MACHINE,
    "nvidia.com/cuda.driver.major": "580",
    "nvidia.com/cuda.driver.minor": "95",
    "nvidia.com/cuda.driver.rev": "05",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/cuda.driver-version.minor": "95",
    "nvidia.com/cuda.driver-version.revision": "05",
    "nvidia.com/cuda.driver-version.full": "580.95.05",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "8",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "8",
    "nvidia.com/cuda.runtime-version.full": "12.8",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/gfd.timestamp": str(TS),
}

A100_FULL = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
}


def _labels(
    inventory: Inventory, strategy: MigStrategy = "none", sharing: Sharing | None = None
) -> dict[str, str]:
    return labels_for(inventory, strategy, sharing, MACHINE, timestamp=TS)


def test_a100_x8_no_mig(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:8", cuda_version=12080)
    assert _labels(inv) == {**COMMON_580_128, "nvidia.com/mig.capable": "true", **A100_FULL}


def test_a100_x8_single_all_1g_5gb(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:8", "all-1g.5gb", cuda_version=12080)
    assert _labels(inv, "single") == {
        **COMMON_580_128,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.count": "56",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "0",
        "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "0",
        "nvidia.com/gpu.engines.ofa": "0",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
    }


def _mig(
    profile: str, product: str, count: int, memory: int, sms: int, slices: int, copy: int, dec: int
) -> dict[str, str]:
    key = f"nvidia.com/mig-{profile}"
    return {
        f"{key}.product": product,
        f"{key}.count": str(count),
        f"{key}.replicas": "1",
        f"{key}.sharing-strategy": "none",
        f"{key}.memory": str(memory),
        f"{key}.multiprocessors": str(sms),
        f"{key}.slices.gi": str(slices),
        f"{key}.slices.ci": str(slices),
        f"{key}.engines.copy": str(copy),
        f"{key}.engines.decoder": str(dec),
        f"{key}.engines.encoder": "0",
        f"{key}.engines.jpeg": "0",
        f"{key}.engines.ofa": "0",
    }


def test_a100_x8_mixed_all_balanced(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:8", "all-balanced", cuda_version=12080)
    assert _labels(inv, "mixed") == {
        **COMMON_580_128,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        # the MIG-enabled GPUs themselves: not shareable, so replicas 0
        **A100_FULL,
        "nvidia.com/gpu.replicas": "0",
        **_mig("1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 16, 4864, 14, 1, 1, 0),
        **_mig("2g.10gb", "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", 8, 9856, 28, 2, 2, 1),
        **_mig("3g.20gb", "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", 8, 19968, 42, 3, 3, 2),
    }


def test_mixed_profile_with_plus_is_written_with_a_dot(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "h100-80gb:1", "all-1g.10gb.me", cuda_version=12080)
    labels = _labels(inv, "mixed")
    assert labels["nvidia.com/mig-1g.10gb.me.count"] == "1"
    assert labels["nvidia.com/mig-1g.10gb.me.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb.me"
    assert labels["nvidia.com/mig-1g.10gb.me.engines.decoder"] == "1"
    assert not any("+" in k or "+" in v for k, v in labels.items())


def test_single_with_a_mixed_layout_is_invalid(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:8", "all-balanced", cuda_version=12080)
    assert _labels(inv, "single") == {
        **COMMON_580_128,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **A100_FULL,
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
        "nvidia.com/gpu.count": "0",
        "nvidia.com/gpu.replicas": "0",
        "nvidia.com/gpu.memory": "0",
    }


def test_single_with_mig_enabled_but_empty_is_invalid(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:2", "all-enabled")
    labels = _labels(inv, "single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert labels["nvidia.com/gpu.count"] == "0"


def test_single_without_mig_enabled_is_like_none(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "a100-40gb:8", cuda_version=12080)
    assert _labels(inv, "single") == {
        **COMMON_580_128,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        **A100_FULL,
    }


def test_h100_x8(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "h100-80gb:8", cuda_version=12080)
    assert _labels(inv) == {
        **COMMON_580_128,
        "nvidia.com/mig.capable": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
    }


T4 = {
    **COMMON_580_128,
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/gpu.count": "1",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
}


def test_t4_x1(simulate: Simulate) -> None:
    assert _labels(inventory_with(simulate, "t4:1", cuda_version=12080)) == T4


TIME_SLICED = """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: {rename}
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_time_sliced_replicas_4_not_renamed(simulate: Simulate) -> None:
    sharing = parse_device_plugin_config(TIME_SLICED.format(rename="false")).sharing_settings()
    assert _labels(inventory_with(simulate, "t4:1", cuda_version=12080), sharing=sharing) == {
        **T4,
        "nvidia.com/gpu.product": "Tesla-T4-SHARED",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_time_sliced_replicas_4_renamed(simulate: Simulate) -> None:
    sharing = parse_device_plugin_config(TIME_SLICED.format(rename="true")).sharing_settings()
    assert sharing.lookup("nvidia.com/gpu") is not None
    assert sharing.resources[0].rename == "nvidia.com/gpu.shared"
    assert _labels(inventory_with(simulate, "t4:1", cuda_version=12080), sharing=sharing) == {
        **T4,
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_mps_sharing_makes_the_node_mps_capable(simulate: Simulate) -> None:
    config = parse_device_plugin_config(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    labels = _labels(inventory_with(simulate, "l4:2"), sharing=config.sharing_settings())
    assert labels["nvidia.com/mps.capable"] == "true"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"


def test_mixed_mig_profiles_can_be_time_sliced(simulate: Simulate) -> None:
    sharing = Sharing("time-slicing", (Replicated("nvidia.com/mig-1g.5gb", 3),))
    labels = _labels(inventory_with(simulate, "a100-40gb:1", "all-1g.5gb"), "mixed", sharing)
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "3"
    assert labels["nvidia.com/gpu.replicas"] == "0"


def test_no_gpus_no_labels(simulate: Simulate) -> None:
    assert _labels(inventory_with(simulate, [])) == {}


def test_timestamp_is_optional(simulate: Simulate) -> None:
    inv = inventory_with(simulate, "t4:1")
    assert discovery.TIMESTAMP not in labels_for(inv, "none", None, MACHINE)


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA GeForce RTX 4090 (rev. a1)", "NVIDIA-GeForce-RTX-4090-rev.-a1"),
        ("  odd   spacing  ", "odd-spacing"),
    ],
)
def test_sanitise(name: str, product: str) -> None:
    assert discovery.sanitise(name) == product


@pytest.mark.parametrize(
    ("major", "minor", "family"),
    [
        (3, 7, "kepler"),
        (5, 2, "maxwell"),
        (6, 0, "pascal"),
        (7, 0, "volta"),
        (7, 5, "turing"),
        (8, 0, "ampere"),
        (8, 6, "ampere"),
        (8, 9, "ada-lovelace"),
        (9, 0, "hopper"),
        (10, 0, "blackwell"),
        (12, 0, "blackwell"),
        (4, 0, "undefined"),
    ],
)
def test_family(major: int, minor: int, family: str) -> None:
    assert discovery.family(major, minor) == family


def test_label_patch_sets_ours_and_removes_only_our_stale_keys() -> None:
    current = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/mig-1g.5gb.count": "7",  # stale GFD key
        "nvidia.com/cuda.driver.rev": "01",  # stale GFD key
        "nvidia.com/gpu.present": "true",  # the operator's
        "nvidia.com/gpu.deploy.device-plugin": "true",  # the operator's
        "nvidia.com/mig.config": "all-disabled",  # the MIG manager's
        "nvidia.com/mig.config.state": "success",
        "team.example.com/owner": "ml",  # a user's
        "kubernetes.io/hostname": "n1",
    }
    desired = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"}
    assert label_patch(current, desired) == {
        "nvidia.com/gpu.product": "NVIDIA-L4",
        "nvidia.com/mig-1g.5gb.count": None,
        "nvidia.com/cuda.driver.rev": None,
    }


def test_label_patch_ignores_a_timestamp_only_change() -> None:
    current = {"nvidia.com/gpu.count": "1", discovery.TIMESTAMP: "1"}
    assert label_patch(current, {"nvidia.com/gpu.count": "1", discovery.TIMESTAMP: "2"}) == {}
    assert label_patch(current, {"nvidia.com/gpu.count": "2", discovery.TIMESTAMP: "2"}) == {
        "nvidia.com/gpu.count": "2",
        discovery.TIMESTAMP: "2",
    }


def test_machine_type(tmp_path: Path) -> None:
    product = tmp_path / "product_name"
    product.write_text("DGXA100 920-23687-2530-000\n")
    assert discovery.machine_type(product) == MACHINE
    assert discovery.machine_type(tmp_path / "missing") == "unknown"


def test_device_plugin_config_rejects_nonsense() -> None:
    with pytest.raises(DevicePluginConfigError):
        parse_device_plugin_config("version: v1\nflags:\n  migStrategy: sometimes\n")
    with pytest.raises(DevicePluginConfigError):
        parse_device_plugin_config(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
            "    - {name: nvidia.com/gpu, replicas: 0}\n"
        )


def test_device_plugin_config_allows_one_sharing_strategy() -> None:
    both = (
        "version: v1\nsharing:\n"
        "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
        "  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
    )
    with pytest.raises(DevicePluginConfigError, match="cannot both"):
        parse_device_plugin_config(both)
    with pytest.raises(DevicePluginConfigError, match="version"):
        parse_device_plugin_config("version: v2\n")


def test_device_plugin_config_flags() -> None:
    config = parse_device_plugin_config(
        "version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: true\n"
        "  plugin: {passDeviceSpecs: true, deviceListStrategy: envvar, deviceIDStrategy: uuid}\n"
        "  gfd: {oneshot: false, sleepInterval: 30s}\n"
    )
    assert config.flags.mig_strategy == "mixed"
    assert config.flags.plugin is not None and config.flags.plugin.device_id_strategy == "uuid"
    assert config.flags.gfd is not None and config.flags.gfd.sleep_interval == "30s"
    assert config.sharing_settings() == Sharing()


def node_n1(labels: dict[str, str]) -> FakeKube:
    """The fake holding discovery's Node, ``n1``, labelled ``labels``."""
    node = {"metadata": {"name": "n1", "labels": dict(labels)}, "status": {}}
    return FakeKube().add({"apiVersion": "v1", "kind": "Node", **node})


def labels_of(api: FakeKube) -> dict[str, str]:
    """Node ``n1``'s labels as stored: the dict itself, so a test may change them as a person
    would."""
    node = api.obj("Node", "n1")
    assert node is not None
    labels: dict[str, str] = node["metadata"]["labels"]
    return labels


def test_run_discover_patches_the_node_once_then_only_on_change(
    simulate: Simulate, tmp_path: Path
) -> None:
    from gpu_operator.agent.nvml import Nvml

    simulate("t4:1")
    api = node_n1({"nvidia.com/mig-1g.5gb.count": "7", "team": "ml"})
    with Nvml() as nvml:
        for _ in range(2):
            discovery.run_discover(
                nvml.inventory,
                settings=lambda _: discovery.Settings(),
                node_name="n1",
                api=api,
                oneshot=True,
                machine_file=tmp_path / "missing",
            )
    assert api.writes == [("patch", "Node", "n1")]  # the second changed nothing but the timestamp
    labels = labels_of(api)
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.machine"] == "unknown"
    assert labels["team"] == "ml"
    assert "nvidia.com/mig-1g.5gb.count" not in labels


def test_the_node_label_picks_the_config_each_pass_so_mps_capable_follows_it(
    simulate: Simulate, tmp_path: Path
) -> None:
    """Feature discovery follows nvidia.com/device-plugin.config as the device plugin does: the
    MPS control daemon's nodeSelector (mps.capable=true) matches once the node's config is MPS."""
    from gpu_operator.agent.deviceplugin.config_file import DevicePluginConfig
    from gpu_operator.agent.deviceplugin.configs import ConfigDir
    from gpu_operator.agent.nvml import Nvml

    simulate("a100-40gb:2")
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "default").write_text("version: v1\n")
    (configs / "mps").write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 4}\n"
    )
    settings = discovery.Settings.chooser(
        None, DevicePluginConfig(), ConfigDir(configs, default="default")
    )
    api = node_n1({})

    def one_pass() -> dict[str, str]:
        with Nvml() as nvml:
            discovery.run_discover(
                nvml.inventory,
                settings=settings,
                node_name="n1",
                api=api,
                oneshot=True,
                machine_file=tmp_path / "missing",
            )
        return labels_of(api)

    assert one_pass()["nvidia.com/mps.capable"] == "false"
    labels_of(api)["nvidia.com/device-plugin.config"] = "mps"
    got = one_pass()
    assert got["nvidia.com/mps.capable"] == "true"
    assert got["nvidia.com/gpu.replicas"] == "4"
    assert got["nvidia.com/gpu.sharing-strategy"] == "mps"
    labels_of(api)["nvidia.com/device-plugin.config"] = "no-such-config"
    assert one_pass()["nvidia.com/mps.capable"] == "true"  # a bad label keeps the last config
    labels_of(api)["nvidia.com/device-plugin.config"] = "default"
    assert one_pass()["nvidia.com/gpu.replicas"] == "1"


def test_without_a_config_directory_the_settings_are_the_files() -> None:
    from gpu_operator.agent.deviceplugin.config_file import parse_device_plugin_config

    config = parse_device_plugin_config("version: v1\nflags: {migStrategy: mixed}\n")
    choose = discovery.Settings.chooser(None, config, None)
    assert choose({"nvidia.com/device-plugin.config": "x"}).mig_strategy == "mixed"
    assert discovery.Settings.chooser("single", config, None)({}).mig_strategy == "single"


CLUSTER = "6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10"


def test_a_gb200_node_in_a_completed_clique_is_labelled_with_it(simulate: Simulate) -> None:
    from gpu_operator.agent.nvml import Nvml

    simulate(f"gb200:4,fabric={CLUSTER}.3")
    with Nvml() as nvml:
        clique = discovery.clique_label(nvml.gpu_fabrics())
        labels = labels_for(nvml.inventory(), "none", None, MACHINE, clique=clique)
    assert labels["nvidia.com/gpu.clique"] == f"{CLUSTER}.3"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert labels["nvidia.com/gpu.family"] == "blackwell"


def test_gpus_without_a_fabric_get_no_clique_label(simulate: Simulate) -> None:
    from gpu_operator.agent.nvml import Nvml

    simulate("h100-80gb:8")
    with Nvml() as nvml:
        assert discovery.clique_label(nvml.gpu_fabrics()) is None
        assert "nvidia.com/gpu.clique" not in labels_for(nvml.inventory(), "none", None, MACHINE)


def test_the_clique_label_follows_the_fabric_and_goes_when_it_fails(
    simulate: Simulate, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from gpu_operator.agent.nvml import Nvml

    sim = simulate(f"gb200:4,fabric={CLUSTER}.3")
    api = node_n1({"team": "ml"})

    def one_pass() -> dict[str, str]:
        discovery.run_discover(
            nvml.inventory,
            settings=lambda _: discovery.Settings(),
            node_name="n1",
            api=api,
            oneshot=True,
            machine_file=tmp_path / "missing",
            read_fabrics=nvml.gpu_fabrics,
        )
        return labels_of(api)

    with Nvml() as nvml:
        assert one_pass()["nvidia.com/gpu.clique"] == f"{CLUSTER}.3"
        sim.set_fabric(1, state="not-started")
        labels = one_pass()
        assert "nvidia.com/gpu.clique" not in labels and labels["team"] == "ml"
        assert "GPU fabric state not-started on GPU 1" in caplog.text
        sim.set_fabric(1, state="completed")
        assert one_pass()["nvidia.com/gpu.clique"] == f"{CLUSTER}.3"


def test_a_failing_fabric_read_gives_no_clique_rather_than_failing_discovery() -> None:
    from gpu_operator.agent.nvml import GpuLost

    def lost() -> tuple[None, ...]:
        raise GpuLost(15, "nvmlDeviceGetGpuFabricInfoV")

    assert discovery.read_clique(lost) is None


def test_the_clique_label_is_discoverys_and_the_stacks() -> None:
    from gpu_operator.node_labels import is_stack_label

    assert discovery.is_discovery_label("nvidia.com/gpu.clique")
    assert is_stack_label("nvidia.com/gpu.clique")
    patch = label_patch({"nvidia.com/gpu.clique": f"{CLUSTER}.3", "team": "ml"}, {})
    assert patch == {"nvidia.com/gpu.clique": None}
