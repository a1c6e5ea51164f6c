"""One immutable observation of everything a ClusterPolicy pass decides from (and what an
NVIDIADriver pass's snapshot is built on).

Built by the loop from the watches' stores (what is watched) plus the few reads a pass needs
(workload pods on nodes being emptied);
:func:`~gpu_operator.controller.clusterpolicy.decide.decide` never sees anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.controller.runtime.plan import Observed
from gpu_operator.views import NodeView


@dataclass(frozen=True)
class Snapshot:
    now: float  # unix seconds
    stamp: str  # the same instant, RFC 3339, for status and Events
    policies: tuple[Mapping[str, Any], ...]
    nodes: tuple[NodeView, ...]
    # Nodes that changed since the last pass; None: look at every node (first pass, resync).
    changed_nodes: frozenset[str] | None = None
    configmap_hashes: Mapping[str, str] = field(default_factory=dict)  # operator's namespace
    mps_configmaps: frozenset[str] = frozenset()  # of those, the ones configuring MPS sharing
    configmap_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # the same
    managed: tuple[Observed, ...] = ()  # the operator's children on the server
    daemonsets: tuple[Mapping[str, Any], ...] = ()
    pods: tuple[Mapping[str, Any], ...] = ()  # operand pods (the operator's namespace)
    revisions: tuple[Mapping[str, Any], ...] = ()
    workload_pods: tuple[Mapping[str, Any], ...] = ()  # on nodes being emptied for an upgrade
    # GPU nodes a GPUCluster's DRA stack also targets (the GPUCluster loop finds them).
    dra_conflicts: frozenset[str] = frozenset()
    # Of the kinds applied only where their CRD is served (clusterpolicy.decide.OPTIONAL_KINDS),
    # those served.
    served_optional: frozenset[str] = frozenset()
