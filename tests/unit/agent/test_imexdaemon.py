"""The IMEX daemon stand-in: when it may start, the nodes config it writes, what its probe
answers, and the process against a simulated GB200 node (one of whose GPUs is made to fail)."""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path

import pytest

from gpu_operator.agent import imexdaemon as imexd
from gpu_operator.agent.cli import add_agent_commands, computedomain
from gpu_operator.agent.nvml import Nvml
from gpu_operator.agent.nvml.fabric import NO_FABRIC, GpuFabric
from gpu_operator.render.computedomain import STANDIN_CHECK_COMMAND, STANDIN_DAEMON_COMMAND
from tests.unit.conftest import Simulate

CLUSTER = "6f2e2f0a-5d4c-4b7e-9a51-0c2d4e6f8a10"
CLIQUE = f"{CLUSTER}.3"
DONE = GpuFabric(CLUSTER, 3, "completed", "success")
ME = imexd.Identity(domain_uuid="cd-uid", node_name="n1", pod_ip="10.0.0.12")


def test_a_completed_fabric_gives_its_clique() -> None:
    assert imexd.start_decision([DONE] * 4, ME) == (CLIQUE, None)


def test_a_fabric_not_started_is_the_reason_it_cannot_start() -> None:
    fabrics = [GpuFabric(CLUSTER, 3, "not-started", "success"), DONE]
    assert imexd.start_decision(fabrics, ME) == (
        None,
        "GPU fabric state not-started on GPU 0: the IMEX daemon cannot start",
    )


def test_no_fabric_is_no_clique_and_no_failure() -> None:
    assert imexd.start_decision([NO_FABRIC, None], ME) == (None, None)


@pytest.mark.parametrize(
    ("clique_id", "fabrics", "ok"),
    [
        (CLIQUE, [DONE], True),
        (f"{CLUSTER}.4", [DONE], False),
        ("", [DONE], False),
        ("", [NO_FABRIC], True),
        (CLIQUE, [NO_FABRIC], False),
    ],
)
def test_the_clique_must_be_the_one_the_kubelet_plugin_prepared(
    clique_id: str, fabrics: list[GpuFabric], ok: bool
) -> None:
    identity = imexd.Identity(domain_uuid="cd-uid", clique_id=clique_id)
    _, reason = imexd.start_decision(fabrics, identity)
    assert (reason is None) is ok
    if not ok:
        assert reason is not None and "CLIQUE_ID" in reason and imexd.CANNOT_START in reason


def test_outside_a_compute_domain_it_cannot_start() -> None:
    _, reason = imexd.start_decision([DONE], imexd.Identity(domain_uuid=""))
    assert reason is not None and reason.startswith("COMPUTE_DOMAIN_UUID is not set")


def test_the_identity_is_the_daemonsets_environment() -> None:
    env = {
        "COMPUTE_DOMAIN_UUID": "cd-uid",
        "COMPUTE_DOMAIN_NAME": "cd",
        "COMPUTE_DOMAIN_NAMESPACE": "ml",
        "NODE_NAME": "n1",
        "POD_IP": "10.0.0.12",
        "POD_NAME": "computedomain-daemon-x",
        "POD_NAMESPACE": "gpu-operator",
        "MAX_NODES_PER_IMEX_DOMAIN": "4",
    }
    identity = imexd.Identity.from_env(env)
    assert (identity.domain_name, identity.max_nodes, identity.clique_id) == ("cd", 4, None)
    assert imexd.Identity.from_env({**env, "CLIQUE_ID": CLIQUE}).clique_id == CLIQUE


def test_peers_file_lines() -> None:
    assert imexd.parse_peers("# peers\n10.0.0.13\n\n 10.0.0.11  # tray 1\n") == [
        "10.0.0.13",
        "10.0.0.11",
    ]
    with pytest.raises(ValueError, match="line 2: 'node-b' is not an IP address"):
        imexd.parse_peers("10.0.0.1\nnode-b\n")


def test_every_daemon_writes_the_same_node_map() -> None:
    peers = ["10.0.0.13", "10.0.0.9", "10.0.0.12", "10.0.0.13"]
    here = imexd.nodes_config("10.0.0.12", peers, 18)
    there = imexd.nodes_config("10.0.0.9", ["10.0.0.12", "10.0.0.13"], 18)
    assert here == there == ("10.0.0.9", "10.0.0.12", "10.0.0.13")
    assert imexd.nodes_config_text(here) == "10.0.0.9\n10.0.0.12\n10.0.0.13\n"
    assert imexd.nodes_config("10.0.0.12", [], 18) == ("10.0.0.12",)
    assert imexd.nodes_config("10.0.0.12", peers, 2) == ("10.0.0.9", "10.0.0.12")


def status(state: str = imexd.READY, **kw: object) -> imexd.Status:
    values: dict[str, object] = {
        "pid": 7,
        "state": state,
        "clique": CLIQUE,
        "domain_uuid": "cd-uid",
        "node_name": "n1",
        "nodes": ("10.0.0.9", "10.0.0.12"),
        "own_ip": "10.0.0.12",
    }
    return imexd.Status(**{**values, **kw})  # type: ignore[arg-type]


def test_check_passes_only_while_run_is_up_and_ready() -> None:
    code, text = imexd.check_report(status(), running=True)
    assert code == 0
    assert text.splitlines() == [
        "READY",
        f"Clique: {CLIQUE}",
        "Nodes:",
        "Node #0   - 10.0.0.9        - CONFIGURED",
        "Node #1   - 10.0.0.12       - READY",
    ]
    assert imexd.check_report(status(), running=False)[0] == 1
    assert imexd.check_report(None, running=False) == (
        1,
        "NOT_READY: the compute-domain daemon has not started (no status file)\n",
    )
    failed = status(imexd.NOT_READY, reason="GPU fabric state in-progress on GPU 2: ...")
    assert imexd.check_report(failed, running=False) == (
        1,
        "NOT_READY: GPU fabric state in-progress on GPU 2: ...\n",
    )
    assert imexd.check_report(status(clique=None, nodes=()), running=True)[0] == 0


def test_status_round_trips() -> None:
    assert imexd.Status.load(status().dump()) == status()


def test_a_pass_on_a_gb200_node_writes_nodes_config_and_status(
    simulate: Simulate, tmp_path: Path
) -> None:
    simulate(f"gb200:4,fabric={CLIQUE}")
    (tmp_path / imexd.PEERS_FILE).write_text("10.0.0.13\n10.0.0.9\n")
    with Nvml() as nvml:
        done = imexd.run_pass(nvml.gpu_fabrics, ME, tmp_path, tmp_path / imexd.PEERS_FILE)
    assert (done.state, done.clique) == (imexd.READY, CLIQUE)
    assert (tmp_path / imexd.NODES_CONFIG).read_text() == "10.0.0.9\n10.0.0.12\n10.0.0.13\n"
    code, text = imexd.check_daemon(tmp_path)
    assert code == 0 and "Node #1   - 10.0.0.12       - READY" in text
    assert imexd.read_status(tmp_path) == done and done.pid == os.getpid()


def test_peers_are_the_domains_daemons_of_its_own_clique() -> None:
    domain = {"status": {"nodes": [
        {"name": "n1", "ipAddress": "10.0.0.12", "cliqueID": CLIQUE},
        {"name": "n2", "ipAddress": "10.0.0.13", "cliqueID": CLIQUE},
        {"name": "n3", "ipAddress": "", "cliqueID": CLIQUE},  # no address yet
        {"name": "n4", "ipAddress": "10.0.1.4", "cliqueID": f"{CLUSTER}.4"},  # another clique
    ]}}  # fmt: skip
    assert imexd.peers_from_domain(domain, CLIQUE) == ["10.0.0.12", "10.0.0.13"]
    assert imexd.peers_from_domain({"status": {}}, CLIQUE) == []
    assert imexd.peers_from_domain(None, CLIQUE) == []


def test_peers_read_from_the_domain_win_over_the_file_unless_unknown(
    simulate: Simulate, tmp_path: Path
) -> None:
    simulate(f"gb200:4,fabric={CLIQUE}")
    (tmp_path / imexd.PEERS_FILE).write_text("10.0.0.99\n")
    asked: list[str] = []

    def from_domain(clique: str) -> list[str]:
        asked.append(clique)
        return ["10.0.0.13"]

    with Nvml() as nvml:
        imexd.run_pass(nvml.gpu_fabrics, ME, tmp_path, tmp_path / imexd.PEERS_FILE, from_domain)
        assert asked == [CLIQUE]
        assert (tmp_path / imexd.NODES_CONFIG).read_text() == "10.0.0.12\n10.0.0.13\n"
        imexd.run_pass(nvml.gpu_fabrics, ME, tmp_path, tmp_path / imexd.PEERS_FILE, lambda _: None)
    assert (tmp_path / imexd.NODES_CONFIG).read_text() == "10.0.0.12\n10.0.0.99\n"


def test_run_refuses_a_failed_fabric_and_says_why(simulate: Simulate, tmp_path: Path) -> None:
    sim = simulate(f"gb200:4,fabric={CLIQUE}")
    sim.set_fabric(1, state="not-started")
    log = tmp_path / "termination-log"
    with Nvml() as nvml:
        code = imexd.run_daemon(nvml.gpu_fabrics, ME, domain_dir=tmp_path, termination_log=log)
    assert code == 1
    reason = "GPU fabric state not-started on GPU 1: the IMEX daemon cannot start"
    assert log.read_text() == reason
    assert imexd.check_daemon(tmp_path) == (1, f"NOT_READY: {reason}\n")
    assert not (tmp_path / imexd.NODES_CONFIG).exists()


def test_run_stops_on_its_signal_and_check_then_fails(simulate: Simulate, tmp_path: Path) -> None:
    simulate(f"gb200:4,fabric={CLIQUE}")
    stop = threading.Event()
    stop.set()  # SIGTERM before the first wait: one pass, then out
    with Nvml() as nvml:
        code = imexd.run_daemon(nvml.gpu_fabrics, ME, domain_dir=tmp_path, stop=stop)
    assert code == 0
    assert (tmp_path / imexd.NODES_CONFIG).read_text() == "10.0.0.12\n"
    assert imexd.check_daemon(tmp_path)[0] == 1


def parse(argv: tuple[str, ...]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-operator")
    add_agent_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def test_the_daemonset_commands_are_these(tmp_path: Path) -> None:
    run = parse((*STANDIN_DAEMON_COMMAND[1:], "--simulate", "gb200:4"))
    check = parse((*STANDIN_CHECK_COMMAND[1:], "--domain-dir", str(tmp_path)))
    assert (run.func, run.domain_dir) == (computedomain.cmd_run, "/imexd")
    assert check.func is computedomain.cmd_check


def test_the_run_command_exits_with_the_reason_on_a_node_whose_fabric_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_operator.sim.nvml import uninstall_simulated_nvml

    monkeypatch.setenv("COMPUTE_DOMAIN_UUID", "cd-uid")
    monkeypatch.setenv("POD_IP", "10.0.0.12")
    log = tmp_path / "termination-log"
    argv = (
        *STANDIN_DAEMON_COMMAND[1:],
        "--simulate",
        f"gb200:4,fabric={CLIQUE}/in-progress",
        "--domain-dir",
        str(tmp_path / "imexd"),
        "--termination-log",
        str(log),
    )
    try:
        args = parse(argv)
        assert args.func(args) == 1
    finally:
        uninstall_simulated_nvml()
    assert log.read_text() == "GPU fabric state in-progress on GPU 0: the IMEX daemon cannot start"
    check = parse((*STANDIN_CHECK_COMMAND[1:], "--domain-dir", str(tmp_path / "imexd")))
    assert check.func(check) == 1
    assert capsys.readouterr().out.startswith("NOT_READY: GPU fabric state in-progress")
