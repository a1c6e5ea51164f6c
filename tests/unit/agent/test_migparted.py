"""mig-parted configs: NVIDIA's defaults parse, fit, apply through NVML and read back."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.agent import migparted
from gpu_operator.agent.inventory import Placement
from gpu_operator.agent.migparted import MigConfigError, MigPlanError, parse_mig_config
from gpu_operator.agent.nvml import Nvml
from gpu_operator.sim.nvml import install_simulated_nvml, uninstall_simulated_nvml
from tests.paths import REPO

from .conftest import Simulate, mig_configmap

GI_CHANGES = (
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceDestroy",
    "nvmlDeviceSetMigMode",
)

FITS = {
    "a100-40gb": [
        "all-disabled",
        "all-enabled",
        "all-1g.5gb",
        "all-1g.5gb.me",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-4g.20gb",
        "all-7g.40gb",
        "all-1g.10gb",
        "all-balanced",
    ],
    "h100-80gb": [
        "all-disabled",
        "all-enabled",
        "all-1g.10gb",
        "all-1g.10gb.me",
        "all-1g.20gb",
        "all-2g.20gb",
        "all-3g.40gb",
        "all-4g.40gb",
        "all-7g.80gb",
        "all-balanced",
    ],
}


def test_nvidia_default_configmap_parses(nvidia_mig_config: migparted.MigPartedConfig) -> None:
    configs = nvidia_mig_config.mig_configs
    assert len(configs) > 50
    assert configs["all-disabled"][0].mig_enabled is False
    balanced = configs["all-balanced"]
    a100 = next(e for e in balanced if e.device_filter and "0x20B010DE" in e.device_filter)
    assert a100.mig_devices == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    a30 = next(e for e in balanced if e.device_filter == ("0x20B710DE",))  # a bare string filter
    assert a30.mig_devices == {"1g.6gb": 2, "2g.12gb": 1}


@pytest.mark.parametrize("model", sorted(FITS))
def test_every_default_config_that_fits_applies_and_reads_back(
    simulate: Simulate, nvidia_mig_config: migparted.MigPartedConfig, model: str
) -> None:
    sim = simulate(f"{model}:8")
    applied, refused = [], {}
    with Nvml() as nvml:
        for name in nvidia_mig_config.mig_configs:
            try:
                migparted.plan(nvml.inventory(), nvidia_mig_config, name)
            except MigPlanError as exc:
                refused[name] = str(exc)
                continue
            result = migparted.apply_config(nvml, nvidia_mig_config, name)
            assert result.already_applied
            inv = nvml.inventory()
            entry = migparted.select(inv, nvidia_mig_config.mig_configs[name])[0]
            for gpu in inv.gpus:
                assert gpu.mig_current is entry.mig_enabled
                wanted = {p: n for p, n in entry.mig_devices.items() if n}
                assert dict(gpu.instance_counts()) == wanted
                assert len(gpu.mig_devices) == sum(wanted.values())
            applied.append(name)
            # the same config again: not a single NVML change
            sim.calls.clear()
            migparted.apply_config(nvml, nvidia_mig_config, name)
            assert not any(sim.calls[c] for c in GI_CHANGES)
    assert applied == FITS[model]
    for name, message in refused.items():
        assert "not supported by GPU 0" in message or "selects none" in message, (name, message)


def test_impossible_layouts_name_the_profile(simulate: Simulate) -> None:
    simulate("a100-40gb:1")
    config = parse_mig_config(
        """
version: v1
mig-configs:
  too-many:
    - {devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 8}}
  too-big:
    - {devices: all, mig-enabled: true, mig-devices: {"4g.20gb": 1, "3g.20gb": 1, "1g.5gb": 1}}
  no-room:
    - {devices: all, mig-enabled: true, mig-devices: {"3g.20gb": 1, "2g.10gb": 1, "1g.10gb": 2}}
  unknown:
    - {devices: all, mig-enabled: true, mig-devices: {"1g.6gb": 1}}
  on-a-t4:
    - {devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 1}}
"""
    )
    with Nvml() as nvml:
        inv = nvml.inventory()
    with pytest.raises(MigPlanError, match=r"8 x MIG profile '1g.5gb'.*at most 7"):
        migparted.plan(inv, config, "too-many")
    with pytest.raises(MigPlanError, match=r"'1g.5gb' does not fit.*8 compute slices.*has 7"):
        migparted.plan(inv, config, "too-big")
    with pytest.raises(
        MigPlanError, match=r"MIG profile '1g.10gb' does not fit GPU 0.*no free placement"
    ):
        migparted.plan(inv, config, "no-room")
    with pytest.raises(
        MigPlanError, match=r"'1g.6gb' is not supported by GPU 0 \(NVIDIA A100-SXM4-40GB\)"
    ):
        migparted.plan(inv, config, "unknown")
    with pytest.raises(MigPlanError, match="unknown MIG config 'nope'"):
        migparted.plan(inv, config, "nope")
    uninstall_simulated_nvml()
    install_simulated_nvml("t4:1", seed="x")
    with Nvml() as nvml:
        t4 = nvml.inventory()
    with pytest.raises(MigPlanError, match=r"GPU 0 \(Tesla T4\) is not MIG capable"):
        migparted.plan(t4, config, "on-a-t4")


def test_device_filter_and_indices_select_gpus(simulate: Simulate) -> None:
    simulate("a100-40gb:2,h100-80gb:2")
    config = parse_mig_config(
        """
version: v1
mig-configs:
  split:
    - {devices: all, mig-enabled: false}
    - {device-filter: "0x233010DE", devices: [3], mig-enabled: true, mig-devices: {"7g.80gb": 1}}
  none-here:
    - {device-filter: ["0x20B710DE"], devices: all, mig-enabled: true, mig-devices: {}}
"""
    )
    with Nvml() as nvml:
        plan = migparted.plan(nvml.inventory(), config, "split")
        assert [(g.index, g.mig_enabled) for g in plan.gpus] == [
            (0, False),
            (1, False),
            (2, False),
            (3, True),
        ]
        migparted.apply_config(nvml, config, "split")
        assert [g.mig_current for g in nvml.inventory().gpus] == [False, False, False, True]
        with pytest.raises(MigPlanError, match="selects none of this node's GPUs"):
            migparted.plan(nvml.inventory(), config, "none-here")


def test_configmap_or_bare_document_and_bad_input() -> None:
    bare = "version: v1\nmig-configs:\n  x:\n    - {devices: [0, 1], mig-enabled: true}\n"
    assert parse_mig_config(bare).mig_configs["x"][0].devices == (0, 1)
    with pytest.raises(MigConfigError):
        parse_mig_config("version: v2\nmig-configs: {}\n")
    with pytest.raises(MigConfigError):
        parse_mig_config(
            "version: v1\nmig-configs:\n  x:\n    - {devices: all}\n"
        )  # mig-enabled missing
    with pytest.raises(MigConfigError):
        parse_mig_config(
            "version: v1\nmig-configs:\n  x:\n"
            "    - {devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}\n"
        )
    with pytest.raises(MigConfigError):
        parse_mig_config("kind: ConfigMap\ndata: {}\n")


def test_balanced_layout_places_the_3g_on_the_upper_half(simulate: Simulate) -> None:
    simulate("a100-40gb:1")
    with Nvml() as nvml:
        profiles = nvml.inventory().gpus[0].mig_profiles
    layout = migparted.place(profiles, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})
    where = {(i.profile, i.placement.start) for i in layout}
    assert where == {("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3)}


def test_standard_configs_from_the_hardware(simulate: Simulate) -> None:
    simulate("a100-40gb:2")
    with Nvml() as nvml:
        generated = migparted.standard_configs(nvml.inventory())
        assert set(generated.mig_configs) == {
            "all-disabled",
            "all-enabled",
            "all-1g.5gb",
            "all-1g.5gb.me",
            "all-1g.10gb",
            "all-2g.10gb",
            "all-3g.20gb",
            "all-4g.20gb",
            "all-7g.40gb",
            "all-balanced",
        }
        assert generated.mig_configs["all-balanced"][0].mig_devices == {
            "1g.5gb": 2,
            "2g.10gb": 1,
            "3g.20gb": 1,
        }
        for name in generated.mig_configs:  # every generated config fits and applies
            migparted.apply_config(nvml, generated, name)
        assert parse_mig_config(generated.to_yaml()) == generated


def test_standard_configs_filter_by_model_on_mixed_nodes(simulate: Simulate) -> None:
    simulate("a100-40gb:1,h100-80gb:1,t4:1")
    with Nvml() as nvml:
        inv = nvml.inventory()
    generated = migparted.standard_configs(inv)
    assert [e.device_filter for e in generated.mig_configs["all-1g.10gb"]] == [
        ("0x20B010DE",),
        ("0x233010DE",),
    ]
    assert generated.mig_configs["all-1g.10gb"][0].mig_devices == {"1g.10gb": 4}
    assert generated.mig_configs["all-1g.10gb"][1].mig_devices == {"1g.10gb": 7}
    assert migparted.config_name("1g.5gb+me") == "all-1g.5gb.me"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    counts=st.fixed_dictionaries(
        {
            "1g.5gb": st.integers(0, 7),
            "1g.10gb": st.integers(0, 2),
            "2g.10gb": st.integers(0, 3),
            "3g.20gb": st.integers(0, 2),
            "4g.20gb": st.integers(0, 1),
        }
    )
)
def test_any_planned_layout_is_valid_and_the_simulator_accepts_it(counts: dict[str, int]) -> None:
    install_simulated_nvml("a100-40gb:1", seed="prop")
    try:
        with Nvml() as nvml:
            gpu = nvml.inventory().gpus[0]
            try:
                layout = migparted.place(gpu.mig_profiles, counts)
            except MigPlanError as exc:
                assert any(f"'{p}'" in str(exc) for p in counts)
                return
            used: set[int] = set()
            for inst in layout:
                profile = gpu.profile(inst.profile)
                assert profile is not None and inst.placement in profile.placements
                assert not used & inst.placement.slices
                used |= inst.placement.slices
            assert sum(i.slices for i in layout) <= 7
            nvml.set_mig_mode(0, True)
            nvml.reset_gpu(0)
            for inst in layout:
                gi = nvml.create_gpu_instance(0, inst.profile_index, inst.placement)
                nvml.create_compute_instance(0, gi, inst.slices)
            assert dict(nvml.gpu(0).instance_counts()) == {p: n for p, n in counts.items() if n}
    finally:
        uninstall_simulated_nvml()


def test_placement_slices() -> None:
    assert Placement(4, 4).slices == frozenset({4, 5, 6, 7})


def test_reference_configmap_path_is_outside_the_repo() -> None:
    assert REPO.resolve() not in mig_configmap().resolve().parents


def test_only_gpus_that_differ_are_touched(
    simulate: Simulate, nvidia_mig_config: migparted.MigPartedConfig
) -> None:
    sim = simulate("h100-80gb:2")
    first_only = parse_mig_config(
        "version: v1\nmig-configs:\n  one:\n"
        '    - {devices: [0], mig-enabled: true, mig-devices: {"1g.10gb": 7}}\n'
    )
    with Nvml() as nvml:
        migparted.apply_config(nvml, first_only, "one")
        sim.calls.clear()
        plan = migparted.plan(nvml.inventory(), nvidia_mig_config, "all-1g.10gb")
        assert [g.already_applied for g in plan.gpus] == [True, False]
        assert migparted.apply_plan(nvml, plan) == 1
    assert sim.calls["nvmlDeviceCreateGpuInstanceWithPlacement"] == 7  # GPU 1 only
    assert sim.calls["nvmlGpuInstanceDestroy"] == 0
