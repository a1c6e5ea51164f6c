"""The library object under pynvml: dispatch, init, marshalling, and how one is built."""

from __future__ import annotations

import ctypes
import inspect
from pathlib import Path

import pynvml
import pytest

from gpu_operator.sim.nvml import cabi
from gpu_operator.sim.nvml.devices import NvmlFault
from gpu_operator.sim.nvml.install import (
    ENV_SIMULATE,
    ENV_STATE,
    build_simulated_nvml,
    install_from_environment,
    uninstall_simulated_nvml,
)
from gpu_operator.sim.nvml.library import ENTRY_POINTS
from gpu_operator.sim.nvml.profiles import load_model
from tests.unit.conftest import Simulate

NOT_CALLED_BY_PYNVML = {"nvmlInit_v2"}  # in nvml.h; pynvml's nvmlInit calls nvmlInitWithFlags


def test_every_simulated_function_is_one_pynvml_calls() -> None:
    """A misspelt entry point would never be reached: pynvml would report it missing."""
    source = inspect.getsource(pynvml)
    unknown = {name for name in ENTRY_POINTS if f'"{name}"' not in source}
    assert unknown == NOT_CALLED_BY_PYNVML


def test_unknown_functions_are_not_found(simulate: Simulate) -> None:
    sim = simulate("t4:1")
    with pytest.raises(AttributeError):
        sim.nvmlDeviceGetNvLinkState  # noqa: B018 - not simulated
    with pytest.raises(AttributeError):
        sim.not_a_c_function  # noqa: B018
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetNvLinkState(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    finally:
        pynvml.nvmlShutdown()


def test_calls_need_init_and_are_counted(simulate: Simulate) -> None:
    sim = simulate("t4:1")
    assert sim.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())) == (
        pynvml.NVML_ERROR_UNINITIALIZED
    )
    assert sim.nvmlShutdown() == pynvml.NVML_ERROR_UNINITIALIZED
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1  # one init is still open
    pynvml.nvmlShutdown()
    assert sim.calls["nvmlInitWithFlags"] == 2
    assert sim.calls["nvmlDeviceGetCount_v2"] == 3
    assert sim.calls["nvmlShutdown"] == 3


def test_system_queries(simulate: Simulate) -> None:
    sim = simulate("a100-40gb:2", driver_version="570.172.08", cuda_version=12080)
    pynvml.nvmlInit()
    try:
        assert pynvml.nvmlSystemGetDriverVersion() == "570.172.08"
        assert pynvml.nvmlSystemGetNVMLVersion() == "13.570.172.08"
        assert pynvml.nvmlSystemGetCudaDriverVersion() == 12080
        second = pynvml.nvmlDeviceGetHandleByUUID(sim.gpus[1].uuid)
        assert pynvml.nvmlDeviceGetIndex(second) == 1
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(2)
    finally:
        pynvml.nvmlShutdown()


def test_handles_pack_what_they_name() -> None:
    handle = cabi.pack_handle(cabi.Kind.COMPUTE_INSTANCE, 7, 13, 2)
    assert cabi.unpack_handle(handle) == (cabi.Kind.COMPUTE_INSTANCE, 7, 13, 2)
    pointer = ctypes.c_void_p(handle)
    assert cabi.unpack_handle(ctypes.byref(pointer)) == (4, 7, 13, 2)
    for null in (0, ctypes.c_void_p(None)):
        with pytest.raises(NvmlFault):
            cabi.unpack_handle(null)


def test_handles_are_written_into_structs_and_arrays() -> None:
    handles = (ctypes.c_void_p * 3)()
    cabi.store_handle(handles, 11, 0)
    cabi.store_handle(handles, 22, 2)
    assert [handles[0], handles[1], handles[2]] == [11, None, 22]


def test_text_that_does_not_fit_is_insufficient_size() -> None:
    buffer = ctypes.create_string_buffer(8)
    cabi.store_text(buffer, ctypes.c_uint(8), "1234567")
    assert buffer.value == b"1234567"
    with pytest.raises(NvmlFault) as caught:
        cabi.store_text(buffer, ctypes.c_uint(8), "12345678")  # no room for the NUL
    assert caught.value.code == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    with pytest.raises(NvmlFault):
        cabi.dest(None)


def test_building_does_not_install(tmp_path: Path) -> None:
    before = pynvml.nvmlLib
    state = tmp_path / "state.json"
    sim = build_simulated_nvml("a100-40gb:1,t4:1", state_file=state, seed="node-a")
    assert pynvml.nvmlLib is before
    assert [g.model.key for g in sim.gpus] == ["a100-40gb", "t4"]
    assert state.exists()  # the initial state is written at once, for the node's others


def test_specs_and_models_make_the_same_node() -> None:
    by_text = build_simulated_nvml("h100-80gb:2", seed="node-a")
    by_list = build_simulated_nvml(["h100-80gb:1", "h100-80gb"], seed="node-a")
    by_model = build_simulated_nvml([load_model("h100-80gb")] * 2, seed="node-a")
    other_node = build_simulated_nvml("h100-80gb:2", seed="node-b")
    uuids = [g.uuid for g in by_text.gpus]
    assert [g.uuid for g in by_list.gpus] == [g.uuid for g in by_model.gpus] == uuids
    assert not set(uuids) & {g.uuid for g in other_node.gpus}
    assert [g.bus for g in by_text.gpus] == [0x07, 0x0F]


def test_install_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_SIMULATE, raising=False)
    assert install_from_environment() is None
    monkeypatch.setenv(ENV_SIMULATE, "l4:2")
    monkeypatch.setenv(ENV_STATE, str(tmp_path / "state.json"))
    try:
        sim = install_from_environment()
        assert sim is not None and pynvml.nvmlLib is sim
        assert [g.model.key for g in sim.gpus] == ["l4", "l4"]
        assert (tmp_path / "state.json").exists()
        flag = install_from_environment("t4:1")  # --simulate wins over the environment
        assert flag is not None and [g.model.key for g in flag.gpus] == ["t4"]
    finally:
        uninstall_simulated_nvml()
    assert pynvml.nvmlLib is None
