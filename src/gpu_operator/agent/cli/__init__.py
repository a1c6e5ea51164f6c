"""``gpu-operator agent ...``: the node agents' command line.

Every agent that reads the GPUs takes ``--driver-root`` (where this container has the driver
root, NVML's source) or ``--simulate PROFILE:COUNT`` (or ``GPU_OPERATOR_SIMULATE``) to run
against a simulated NVML instead, and reads the same environment variables as NVIDIA's images,
so manifests carry over.

One module per group of commands, each with its parsers (``register``) and its command
functions; :mod:`.common` holds what they share. The commands that exist only for simulation
(``simulate-driver``, ``simulate-toolkit``, ``simulate-fault``) are the simulation's own
(:mod:`gpu_operator.sim.commands`): the command line adds them (``more``), as the simulation
sits above the agents. Modules import at top level only what is light:
each command imports what it alone needs (pydantic, prometheus_client) inside its function, so a
feature-discovery pod does not carry the exporter's or the MIG manager's memory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, cast

from gpu_operator.agent.cli import cdi, computedomain, discover, mig, monitor, plugins
from gpu_operator.argtree import leaves
from gpu_operator.logsetup import add_log_format_option

MODULES = (discover, mig, monitor, plugins, cdi, computedomain)


def add_agent_commands(
    subparsers: Any, more: Iterable[Callable[[Any], None]] = ()
) -> argparse.ArgumentParser:
    """Add ``agent`` and its sub-commands to the main parser's sub-parsers, then those that
    each of ``more`` adds to the ``agent`` sub-parsers it is given; each takes ``--log-format``
    (env LOG_FORMAT), as ``run`` does."""
    agent = subparsers.add_parser(
        "agent",
        help="node agents (run in the operand pods)",
        description="The node agents the operand pods run, on the node's driver or on "
        "simulated GPUs (--simulate).",
    )
    sub = agent.add_subparsers(dest="agent_command", required=True, metavar="COMMAND")
    for register in (*(module.register for module in MODULES), *more):
        register(sub)
    for leaf in leaves(agent):
        add_log_format_option(leaf)
    return cast(argparse.ArgumentParser, agent)


__all__ = ["add_agent_commands"]
