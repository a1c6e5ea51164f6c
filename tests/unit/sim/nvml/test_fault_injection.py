"""Injecting faults from outside a node's processes: the state-file API, CLI, testenv helper."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.cli import main
from gpu_operator.sim.nvml import (
    ENV_STATE,
    SIM_STATE,
    SimulationError,
    build_simulated_nvml,
    clear_faults,
    inject_fault,
    read_faults,
)
from gpu_operator.testenv import gpufaults


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The state file of a node with two A100s, written by its first agent."""
    path = tmp_path / "node.nvml.json"
    build_simulated_nvml("a100-40gb:2", state_file=path, seed="node-1")
    return path


def uuids(path: Path) -> list[str]:
    return [gpu["uuid"] for gpu in json.loads(path.read_text())["gpus"]]


# -- the state-file API --------------------------------------------------------------------------
def test_a_gpu_is_named_by_index_or_uuid(state: Path) -> None:
    second = uuids(state)[1]
    assert second == build_simulated_nvml("a100-40gb:2", seed="node-1").gpus[1].uuid
    assert inject_fault(state, second, "xid", 79) == 1
    assert inject_fault(state, "1", "thermal") == 1
    assert clear_faults(state, 1, "thermal") == 1
    index, uuid, faults = read_faults(state, second)
    assert (index, uuid, faults.xids, faults.thermal) == (1, second, ((1, 79),), False)
    with pytest.raises(SimulationError, match=r"no GPU 2 in .*node.nvml.json: the node has 2"):
        inject_fault(state, 2, "lost")
    with pytest.raises(SimulationError, match="no GPU GPU-nope"):
        inject_fault(state, "GPU-nope", "lost")


def test_a_file_without_uuids_takes_indexes_only(state: Path) -> None:
    doc = json.loads(state.read_text())
    for gpu in doc["gpus"]:
        del gpu["uuid"], gpu["faults"]  # as written before faults
    state.write_text(json.dumps(doc))
    with pytest.raises(SimulationError, match=r"does not record GPU UUIDs.*give an index"):
        inject_fault(state, "GPU-0000", "lost")
    assert inject_fault(state, 0, "lost") == 0
    assert read_faults(state, 0)[2].lost


def test_a_missing_state_file_is_an_error_naming_it_and_nothing_is_made(tmp_path: Path) -> None:
    missing = tmp_path / "not-started.nvml.json"
    with pytest.raises(SimulationError, match=re.escape(f"no simulated NVML state at {missing}")):
        inject_fault(missing, 0, "lost")
    assert list(tmp_path.iterdir()) == []


def test_bad_faults_are_refused_and_leave_the_file_alone(state: Path) -> None:
    before = state.read_text()
    for kind, value, message in [
        ("melted", None, "unknown fault 'melted'"),
        ("xid", None, "needs its XID number"),
        ("ecc", 0, "positive number"),
        ("lost", 1, "lost takes no value"),
    ]:
        with pytest.raises(SimulationError, match=message):
            inject_fault(state, 0, kind, value)
    with pytest.raises(SimulationError, match="unknown fault"):
        clear_faults(state, 0, "melted")
    assert state.read_text() == before


def test_injecting_waits_for_a_process_changing_the_file_and_loses_nothing(state: Path) -> None:
    agent = build_simulated_nvml("a100-40gb:2", state_file=state, seed="node-1")
    injected = threading.Event()

    def inject() -> None:
        inject_fault(state, 0, "ecc", 2)
        injected.set()

    with agent.node.mutate():  # the agent holds the file's lock, mid-change (a MIG mode)
        injector = threading.Thread(target=inject)
        injector.start()
        assert not injected.wait(0.3)
        agent.gpus[0].mig_pending = True
    injector.join(10)
    assert injected.is_set()
    doc = json.loads(state.read_text())
    assert doc["gpus"][0]["mig_pending"] is True
    assert doc["gpus"][0]["faults"]["ecc_volatile"] == 2
    agent.inject_fault(0, "thermal")  # and the agent's next change keeps the injected one
    assert (read_faults(state, 0)[2].ecc_volatile, read_faults(state, 0)[2].thermal) == (2, True)


# -- the CLI -------------------------------------------------------------------------------------
def cli(*words: str) -> int:
    return main(["agent", "simulate-fault", *words])


def test_the_cli_injects_and_clears(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--simulate-state", str(state), "--gpu", "1", "xid", "79") == 0
    assert capsys.readouterr().out == f"SIMULATED GPU 1 of {state}: injected xid 79\n"
    assert cli("--simulate-state", str(state), "--gpu", uuids(state)[0], "ecc", "5") == 0
    assert cli("--simulate-state", str(state), "--gpu", "0", "lost") == 0
    assert read_faults(state, 0)[2].ecc_volatile == 5 and read_faults(state, 0)[2].lost
    assert cli("--simulate-state", str(state), "--gpu", "0", "clear", "lost") == 0
    assert not read_faults(state, 0)[2].lost and read_faults(state, 0)[2].ecc_volatile == 5
    capsys.readouterr()
    assert cli("--simulate-state", str(state), "--gpu", "0", "clear") == 0
    assert capsys.readouterr().out == f"SIMULATED GPU 0 of {state}: cleared every fault\n"
    assert read_faults(state, 0)[2].ecc_volatile == 0


def test_the_cli_refuses_without_a_state_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_STATE, raising=False)
    assert cli("--gpu", "0", "lost") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "simulated GPUs only" in err and "--simulate-state" in err


def test_the_cli_reads_the_state_file_from_the_environment(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_STATE, str(state))
    assert cli("--gpu", "1", "power") == 0
    assert read_faults(state, 1)[2].power


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["xid", "x79"], "expected a number, not 'x79'"),
        (["xid"], "needs its XID number"),
        (["clear", "melted"], "clear takes one of"),
        (["thermal", "2"], "thermal takes no value"),
    ],
)
def test_the_cli_says_what_is_wrong_in_one_line(
    state: Path, capsys: pytest.CaptureFixture[str], words: list[str], message: str
) -> None:
    assert cli("--simulate-state", str(state), "--gpu", "0", *words) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_the_cli_names_a_missing_state_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "n.json"
    assert cli("--simulate-state", str(missing), "--gpu", "0", "lost") == 1
    assert str(missing) in capsys.readouterr().err


# -- testenv's helper ----------------------------------------------------------------------------
@dataclass
class FakeCluster:
    """What gpufaults reads of a testenv cluster."""

    state_dir: Path
    real: dict[str, Path] = field(default_factory=dict)

    @property
    def real_nodes(self) -> list[str]:
        return list(self.real)

    def real_node_dir(self, name: str) -> Path:
        return self.real[name]


def test_testenv_finds_kwok_and_real_nodes_state_files(tmp_path: Path) -> None:
    node_dir = tmp_path / "real-node-0"
    cluster: Any = FakeCluster(tmp_path, {"real-node-0": node_dir})
    assert gpufaults.state_file(cluster, "kwok-a100") == tmp_path / "kwok-a100.nvml.json"
    assert gpufaults.SIM_STATE_IN_DEV == SIM_STATE  # the agents' own path, kept in step
    container = node_dir / "nvidia" / "driver" / "dev" / SIM_STATE
    host = node_dir / "host-driver" / "dev" / SIM_STATE
    assert gpufaults.state_file(cluster, "real-node-0") == container  # none yet
    host.parent.mkdir(parents=True)
    host.write_text("{}")
    assert gpufaults.state_file(cluster, "real-node-0") == host  # the preinstalled driver's
    container.parent.mkdir(parents=True)
    container.write_text("{}")
    assert gpufaults.state_file(cluster, "real-node-0") == container  # the driver container's


def test_testenv_injects_through_the_agents_cli(tmp_path: Path) -> None:
    cluster: Any = FakeCluster(tmp_path)
    path = gpufaults.kwok_state_file(cluster, "kwok-h100")
    build_simulated_nvml("h100-80gb:2", state_file=path, seed="kwok-h100")
    said = gpufaults.inject(cluster, "kwok-h100", 1, "xid", 79)
    assert said == f"SIMULATED GPU 1 of {path}: injected xid 79"
    gpufaults.clear(cluster, "kwok-h100", uuids(path)[1], "xid")
    assert read_faults(path, 1)[2].xids == ()
    with pytest.raises(gpufaults.GpuFaultError, match="no simulated NVML state"):
        gpufaults.inject(cluster, "kwok-missing", 0, "lost")
