"""The command line's conventions: every option says what it does, ``--version``, ``-o`` is a
format everywhere, the cluster options are spelled alike, and ``--watch`` leaves a pipe clean."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest
import yaml

from gpu_operator import cli
from gpu_operator.argtree import leaves, subcommands
from gpu_operator.cli import build_parser, main, package_version
from tests.fakes.kube import FakeKube

UPGRADING = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-a",
        "labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"},
        "annotations": {"nvidia.com/gpu-driver-upgrade-state.since": "1000"},
    },
    "spec": {"unschedulable": True},
}
POLICY = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "status": {"upgrade": {"done": 0, "total": 1, "failed": 0, "message": "0/1 done"}},
}


def parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree, with its command line (``gpu-operator agent cdi generate``)."""
    yield parser.prog, parser
    for action in subcommands(parser):
        for child in dict.fromkeys(action.choices.values()):
            yield from parsers(child)


def test_every_option_and_command_says_what_it_does() -> None:
    silent = []
    for prog, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                silent += [f"{prog} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help:  # SUPPRESS (a hidden compatibility word) is a choice
                silent.append(f"{prog} {'/'.join(action.option_strings) or action.dest}")
        if prog != "gpu-operator" and not parser.description and not subcommands(parser):
            silent.append(f"{prog}: no description")
    assert not silent, silent


def test_output_is_a_format_wherever_it_is() -> None:
    for prog, parser in parsers(build_parser()):
        for action in parser._actions:
            if "-o" in action.option_strings or "--output" in action.option_strings:
                assert action.option_strings == ["-o", "--output"], prog
                assert action.choices and set(action.choices) <= {"yaml", "json", "table", "wide"}


CLUSTER_COMMANDS = ("crd", "run", "upgrade status", "health status", "uninstall")


@pytest.mark.parametrize("command", CLUSTER_COMMANDS)
def test_cluster_commands_take_kubeconfig_and_context_alike(command: str) -> None:
    found = {prog: parser for prog, parser in parsers(build_parser())}
    options = {o for a in found[f"gpu-operator {command}"]._actions for o in a.option_strings}
    assert {"--kubeconfig", "--context"} <= options
    if "--namespace" in options:
        assert "-n" in options


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"gpu-operator {package_version()}\n"


def test_the_help_says_what_it_is_and_ends_with_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "Command line:" not in text  # no module docstring
    assert "ClusterPolicy" in text
    assert text.split("exit codes:")[1].split()[:2] == ["0", "done"]
    assert "130  interrupted" in text


def test_debug_is_taken_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["--debug", "crd"]).debug
    assert parser.parse_args(["crd", "--debug"]).debug
    assert not parser.parse_args(["crd"]).debug
    assert all(
        "--debug" in {o for a in leaf._actions for o in a.option_strings} for leaf in leaves(parser)
    )


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    """The cluster the status commands read: a policy and a node it is upgrading."""
    kube = FakeKube().add(POLICY, UPGRADING)
    monkeypatch.setattr(cli, "cluster", lambda *_: kube)
    return kube


def test_upgrade_status_as_json_and_yaml(
    fleet: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upgrade", "status", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["upgrade"]["message"] == "0/1 done"
    (node,) = doc["nodes"]
    assert (node["name"], node["state"], node["schedulable"]) == (
        "gpu-a",
        "upgrade-required",
        False,
    )
    assert main(["upgrade", "status", "-o", "yaml"]) == 0
    again = yaml.safe_load(capsys.readouterr().out)
    # Time in state is read from the clock at each call: a second may pass between the two.
    assert again["nodes"][0].pop("secondsInState") >= node.pop("secondsInState") >= 0
    assert again == doc


def test_upgrade_status_without_a_policy_says_so_in_one_line(
    fleet: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.remove("ClusterPolicy", "cluster-policy")
    assert main(["upgrade", "status", "--policy", "mine"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no ClusterPolicy named mine found") and err.count("\n") == 1


def test_health_status_as_yaml(fleet: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["health", "status", "--all", "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == {"nodes": [], "healthRemediation": {}}


@pytest.mark.parametrize(("tty", "cleared"), [(False, False), (True, True)])
def test_watch_clears_only_a_terminal(
    tty: bool, cleared: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt  # ^C ends a watch: exit 0

    monkeypatch.setattr("time.sleep", interrupt)
    monkeypatch.setattr("sys.stdout.isatty", lambda: tty)
    assert cli._show(lambda: "table\n", watch=True, output="table") == 0
    assert ("\x1b[2J" in capsys.readouterr().out) is cleared
