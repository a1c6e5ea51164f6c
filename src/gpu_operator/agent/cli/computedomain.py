"""``agent compute-domain-daemon run|check``: the IMEX daemon stand-in a ComputeDomain's daemon
pods run (:mod:`gpu_operator.agent.imexdaemon`), under the names its DaemonSet renders."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_operator.agent.cli.common import add_common, setup

log = logging.getLogger(__name__)


def _domain_dir(args: argparse.Namespace) -> Path:
    return Path(args.domain_dir)


def cmd_run(args: argparse.Namespace) -> int:
    from gpu_operator.agent import imexdaemon
    from gpu_operator.agent.nvml import Nvml, NvmlError
    from gpu_operator.durations import parse_duration
    from gpu_operator.stopping import stop_on_signals

    setup(args)
    identity = imexdaemon.Identity.from_env(os.environ)
    try:
        nvml = Nvml().open()
    except NvmlError as exc:
        reason = f"no NVML: {exc}: {imexdaemon.CANNOT_START}"
        imexdaemon.write_termination_message(Path(args.termination_log), reason)
        sys.stderr.write(reason + "\n")
        return 1
    try:
        return imexdaemon.run_daemon(
            nvml.gpu_fabrics,
            identity,
            domain_dir=_domain_dir(args),
            peers_file=Path(args.peers_file) if args.peers_file else None,
            read_peers=_domain_peers(identity),
            termination_log=Path(args.termination_log),
            interval_s=parse_duration(args.interval),
            stop=stop_on_signals(),
        )
    finally:
        nvml.close()


def _domain_peers(identity: Any) -> Callable[[str], list[str] | None] | None:
    """Peers from the domain's status, in a pod that can reach the API server (its
    ServiceAccount may read ComputeDomains); None elsewhere: the peers file is used then."""
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and identity.domain_name):
        return None
    from kubernetes.client.exceptions import ApiException

    from gpu_operator.agent import imexdaemon, nodeapi

    api = nodeapi.connect()

    def read(clique: str) -> list[str] | None:
        try:
            doc = api.get("ComputeDomain", identity.domain_name, identity.domain_namespace)
        except (ApiException, OSError) as exc:  # the file, this pass; again the next
            log.warning("reading ComputeDomain %s: %s", identity.domain_name, exc)
            return None
        return imexdaemon.peers_from_domain(doc, clique)

    return read


def cmd_check(args: argparse.Namespace) -> int:
    from gpu_operator.agent import imexdaemon

    code, text = imexdaemon.check_daemon(_domain_dir(args))
    sys.stdout.write(text)
    return code


def _add_domain_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--domain-dir",
        default="/imexd",
        help="the ComputeDomain's directory in this container, where the kubelet plugin "
        "mounts it: nodes.cfg, the status file and the peers file (default /imexd)",
    )


def register(sub: Any) -> None:
    daemon = sub.add_parser(
        "compute-domain-daemon",
        help="the IMEX daemon stand-in of a ComputeDomain's daemon pods",
        description="Stands in for NVIDIA's compute-domain-daemon and nvidia-imex: checks the "
        "node's NVLink fabric through NVML, writes the IMEX nodes config of its peers and "
        "answers the pod's probes. It starts no nvidia-imex and connects to no peer.",
    )
    commands = daemon.add_subparsers(dest="daemon_command", required=True, metavar="COMMAND")
    p = commands.add_parser(
        "run",
        help="check the fabric, write the nodes config, run until SIGTERM",
        description="Refuse to start (exit 1, the reason in the termination message) unless "
        "every GPU's NVLink fabric is registered and agrees with CLIQUE_ID; then keep "
        "nodes.cfg (this pod's IP and the peers file's) and the status file current.",
    )
    add_common(p)
    _add_domain_dir(p)
    p.add_argument(
        "--peers-file",
        default=None,
        help="the peers' IPs, one a line, re-read every pass (default: <domain dir>/peers)",
    )
    p.add_argument(
        "--termination-log",
        default="/dev/termination-log",
        help="where the reason of a refusal goes: the container's terminationMessagePath "
        "(default /dev/termination-log)",
    )
    p.add_argument("--interval", default="5s", help="time between passes, e.g. 5s, 1m (default 5s)")
    p.set_defaults(func=cmd_run)
    p = commands.add_parser(
        "check",
        help="exit 0 only while run is up and ready (the pod's probe)",
        description="Print the IMEX domain's nodes as nvidia-imex-ctl -N lists them, from "
        "the status run keeps; exit 0 only while run is up and ready.",
    )
    _add_domain_dir(p)
    p.set_defaults(func=cmd_check)
