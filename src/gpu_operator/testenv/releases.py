"""Which Kubernetes release a testenv runs, and what each release is started with.

The release is the binaries' own (``kube-apiserver --version``), so a cluster is started for
what it really runs whatever chose the binaries. The feature gates the project's parts need
are read against the binary's own ``--help``: a gate that release has off by default is turned
on; one on by default, GA and locked, or unknown to it (not yet there, or removed) is not
given, so no release gets an alpha gate nothing here needs, and none refuses to start for a
gate it no longer has.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

# The oldest release the README claims, tested in CI by the kwok modules; the default (the
# newest served) is hack/build-components.sh's K8S_VERSION.
OLDEST = "v1.33.13"
# DRA's GA API, resource.k8s.io/v1, which every DRA object of this project is of.
DRA_GA_MINOR = 34
# What the DRA parts need of the control plane where DRA is there at all: device taints (DRA
# device health: taints in ResourceSlices, honoured by the scheduler) and partitionable
# devices (counter sets: MIG made on demand). While off, the API server drops their fields.
DRA_GATES = ("DRADeviceTaints", "DRAPartitionableDevices")
# DeviceTaintRule, which the scheduler watches once DRADeviceTaints is on: while its API is not
# served its informer never syncs and the scheduler places nothing. The API serving it on the
# releases seen with the gate off by default (alpha); where the gate is GA (1.37) it is served
# by default.
_TAINT_RULE_API = {34: "resource.k8s.io/v1alpha3"}

_VERSION = re.compile(r"\bv(\d+)\.(\d+)\.(\d+)\b")
# A gate in ``--help``: ``  kube:DRAPartitionableDevices=true|false (BETA - default=true)``
# (older releases without ``kube:``)
_GATE = re.compile(
    r"^\s*(?:kube:)?(?P<name>[A-Za-z0-9]+)=true\|false \((?P<stage>[A-Z]+) - default=(?P<on>\w+)\)"
)


class ReleaseError(RuntimeError):
    """The binaries do not say which release they are."""


def parse_release(text: str) -> str:
    """``v1.37.2`` from ``Kubernetes v1.37.2`` (a ``--version`` line) or a bare version."""
    match = _VERSION.search(text)
    if match is None:
        raise ReleaseError(f"no Kubernetes version (vX.Y.Z) in {text.strip()!r}")
    return match.group(0)


def minor(release: str) -> int:
    """34 for ``v1.34.4``."""
    match = _VERSION.search(release)
    if match is None:
        raise ReleaseError(f"not a Kubernetes version (vX.Y.Z): {release!r}")
    return int(match.group(2))


def _run(binary: Path, *args: str) -> str:
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


@functools.cache
def release_of(bin_dir: Path) -> str:
    """The release of the control-plane binaries in ``bin_dir``."""
    return parse_release(_run(bin_dir / "kube-apiserver", "--version"))


def gates_off_by_default(help_text: str, wanted: Sequence[str]) -> list[str]:
    """Those of ``wanted`` that ``help_text`` (a component's ``--help``) lists as off by
    default: the ones to turn on."""
    off = set()
    for line in help_text.splitlines():
        match = _GATE.match(line)
        if match and match.group("on") == "false":
            off.add(match.group("name"))
    return [g for g in wanted if g in off]


def serves_dra(release: str) -> bool:
    """Whether ``release`` has DRA's GA API, which the project's DRA parts need."""
    return minor(release) >= DRA_GA_MINOR


def wanted_gates(release: str) -> tuple[str, ...]:
    """The gates the project's parts need on ``release``: DRA's, where its GA API is."""
    return DRA_GATES if serves_dra(release) else ()


@functools.cache
def feature_gates(bin_dir: Path) -> str:
    """``--feature-gates`` for every control-plane component of ``bin_dir``'s release ("" when
    it needs none)."""
    wanted = wanted_gates(release_of(bin_dir))
    if not wanted:
        return ""
    on = gates_off_by_default(_run(bin_dir / "kube-apiserver", "--help"), wanted)
    return ",".join(f"{g}=true" for g in on)


def runtime_config(release: str, gates: str) -> str:
    """``--runtime-config`` for ``release`` started with ``gates`` ("" when none)."""
    if "DRADeviceTaints=true" not in gates:
        return ""
    api = _TAINT_RULE_API.get(minor(release))
    if api is None:
        raise ReleaseError(
            f"{release} has DRADeviceTaints off by default and the API serving its "
            "DeviceTaintRules is not known here: add it to releases._TAINT_RULE_API"
        )
    return f"{api}=true"
