"""The options of every command that talks to the API server, spelled and explained alike
(``--kubeconfig``, ``--context``, and ``-n/--namespace`` where the command has a namespace),
and the client they make."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the client is imported on first use: agents printing labels stay small
    from gpu_operator.kube import Kube, Retry

KUBECONFIG_HELP = (
    "kubeconfig file (default: in a pod its service account, else KUBECONFIG, else ~/.kube/config)"
)
CONTEXT_HELP = "the kubeconfig context to use (default: its current context)"


def add_cluster_options(
    parser: argparse.ArgumentParser,
    *,
    namespace: str | None = None,
    namespace_help: str | None = None,
) -> None:
    """``--kubeconfig`` and ``--context``; with ``namespace_help``, ``-n/--namespace`` too,
    defaulting to ``namespace``."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)
    parser.add_argument("--context", metavar="NAME", help=CONTEXT_HELP)
    if namespace_help is not None:
        parser.add_argument(
            "-n", "--namespace", metavar="NAME", default=namespace, help=namespace_help
        )


def credentials(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The command's ``--kubeconfig`` and ``--context`` (None for those it lacks)."""
    return getattr(args, "kubeconfig", None) or None, getattr(args, "context", None) or None


def cluster(args: argparse.Namespace, retry: Retry | None = None) -> Kube:
    """The client the command's ``--kubeconfig`` and ``--context`` name."""
    from gpu_operator.kube import connect

    return connect(*credentials(args), retry=retry)
