"""``gpu-operator agent ...``: the node agents' command line.

Every agent that reads the GPUs takes ``--driver-root`` (where this container has the driver
root, NVML's source) or ``--simulate PROFILE:COUNT`` (or ``GPU_OPERATOR_SIMULATE``) to run
against a simulated NVML instead, and reads the same environment variables as NVIDIA's images,
so manifests carry over.

One module per group of commands, each with its parsers (``register``) and its command
functions; :mod:`.common` holds what they share. Modules import at top level only what is light:
each command imports what it alone needs (pydantic, prometheus_client) inside its function, so a
feature-discovery pod does not carry the exporter's or the MIG manager's memory.
"""

from __future__ import annotations

import argparse
from typing import Any, cast

from gpu_operator.agent.cli import cdi, discover, faults, mig, monitor, plugins, standins
from gpu_operator.argtree import leaves
from gpu_operator.logsetup import add_log_format_option

MODULES = (discover, mig, monitor, plugins, standins, cdi, faults)


def add_agent_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``agent`` and its sub-commands to the main parser's sub-parsers; each takes
    ``--log-format`` (env LOG_FORMAT), as ``run`` does."""
    agent = subparsers.add_parser(
        "agent",
        help="node agents (run in the operand pods)",
        description="The node agents the operand pods run, on the node's driver or on "
        "simulated GPUs (--simulate).",
    )
    sub = agent.add_subparsers(dest="agent_command", required=True, metavar="COMMAND")
    for module in MODULES:
        module.register(sub)
    for leaf in leaves(agent):
        add_log_format_option(leaf)
    return cast(argparse.ArgumentParser, agent)


__all__ = ["add_agent_commands"]
