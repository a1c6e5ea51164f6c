"""Install or upgrade the operator's CRDs (ClusterPolicy, GPUCluster, NVIDIADriver) at
start-up, so the operator never runs against a stale schema (a frequent failure with NVIDIA's
operator, whose Helm chart does not upgrade CRDs).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from gpu_operator import __version__
from gpu_operator.api.crd import all_crds, clusterpolicy_crd
from gpu_operator.controller.runtime.plan import content_hash
from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

VERSION_ANNOTATION = "nvidia.com/gpu-operator.version"
SCHEMA_ANNOTATION = "nvidia.com/gpu-operator.schema-hash"


_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)([^+]*)")

VersionKey = tuple[tuple[int, ...], int, tuple[tuple[int, int, str], ...]]


def _version_key(text: str) -> VersionKey:
    """Orders versions as SemVer does: release numbers (trailing zeros ignored), then a release
    above its pre-releases (``0.3.0-rc1`` < ``0.3.0``, also PEP 440's ``0.3.0rc1``), then the
    pre-release's parts, numbers numerically (``rc2`` < ``rc10``); build metadata is ignored."""
    match = _VERSION.match(text.strip())
    if match is None:
        return (), 0, ()
    release = tuple(int(n) for n in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = re.findall(r"\d+|[A-Za-z]+", match.group(2))
    if not pre:
        return release, 1, ()
    return release, 0, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre)


def needs_update(current: dict[str, Any] | None, desired: dict[str, Any]) -> bool:
    """Missing, older, or the same version with another schema: apply. Newer: leave it."""
    if current is None:
        return True
    have = (current.get("metadata") or {}).get("annotations") or {}
    want = desired["metadata"]["annotations"]
    have_version = _version_key(have.get(VERSION_ANNOTATION, "0"))
    want_version = _version_key(want[VERSION_ANNOTATION])
    if have_version != want_version:
        return have_version < want_version
    return bool(have.get(SCHEMA_ANNOTATION) != want[SCHEMA_ANNOTATION])


def desired_crd(crd: dict[str, Any] | None = None) -> dict[str, Any]:
    """``crd`` (the ClusterPolicy's by default) with the version and schema annotations."""
    crd = crd if crd is not None else clusterpolicy_crd()
    crd["metadata"]["annotations"] = {
        VERSION_ANNOTATION: __version__,
        SCHEMA_ANNOTATION: content_hash(crd["spec"]),
    }
    return crd


def ensure_crds(kube: Kube, timeout: float = 60.0) -> dict[str, bool]:
    """Apply every CRD that needs it and wait until Established: kind -> whether applied."""
    return {
        crd["spec"]["names"]["kind"]: _ensure_one(kube, desired_crd(crd), timeout)
        for crd in all_crds()
    }


def ensure_crd(kube: Kube, timeout: float = 60.0) -> bool:
    """``ensure_crds``; True when one was applied."""
    return any(ensure_crds(kube, timeout).values())


def _ensure_one(kube: Kube, crd: dict[str, Any], timeout: float) -> bool:
    name = crd["metadata"]["name"]
    current = kube.get("CustomResourceDefinition", name)
    if not needs_update(current, crd):
        return False
    log.info("installing CustomResourceDefinition %s (version %s)", name, __version__)
    kube.apply(crd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = kube.get("CustomResourceDefinition", name) or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return True
        time.sleep(0.2)
    raise TimeoutError(f"CustomResourceDefinition {name} not Established after {timeout:.0f}s")
