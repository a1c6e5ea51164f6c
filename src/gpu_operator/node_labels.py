"""GPU node labels and taint: a pure computation from one Node and the active policy, shared
by the operator's loops and by ``gpu-operator uninstall`` (which cleans the nodes itself once
the operator is gone).

The operator writes only keys it owns. Ownership is recorded on the Node itself (annotation
``OWNED_ANNOTATION``) so that a restarted operator, or the cleanup after the ClusterPolicy is
deleted, removes exactly what the operator added: a label or taint that was already there
(a user's manual ``nvidia.com/gpu.present=true``, GKE's GPU taint) is never taken away.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpu_operator.jsonpatch import map_ops, taint_ops
from gpu_operator.labels import (
    DEPLOY_OPERANDS,
    DEPLOY_PREFIX,
    GKE_ACCELERATOR,
    GPU_PRESENT,
    GPU_RESOURCE,
    MIG_CAPABLE,
    MIG_CONFIG,
    NFD_GPU_LABELS,
    OWNED_ANNOTATION,
    STACK_ANNOTATIONS,
    WORKLOAD_CONFIG,
    WORKLOAD_MOVE,
    is_true,
)
from gpu_operator.views import NodeView, derived

# Labels other parts of the GPU stack write (feature discovery, MIG manager, upgrades, the
# NVIDIADriver loop's pool label, and for sandbox workloads the vGPU device manager's and CC
# manager's states and feature discovery's vGPU labels). They mean nothing once the stack is
# gone, so uninstall removes them too (NVIDIA leaves them). What a person sets to ask for
# something (nvidia.com/vgpu.config, cc.mode, gpu.workload.config, mig.config) stays.
_STACK_LABEL = re.compile(
    r"^nvidia\.com/("
    r"gpu\.(product|count|memory|family|compute\.(major|minor)|machine|replicas|sharing-strategy"
    r"|multiprocessors|slices\.[a-z]+|engines\.[a-z]+|clique)"
    r"|cuda\..+|mig\.(capable|strategy|config\.state)|mps\.capable|gfd\.timestamp"
    r"|mig-[0-9]+g\.[0-9]+gb(\.[a-z]+)*\..+"
    r"|vgpu\.(config\.state|present|host-driver-(version|branch))|cc\.(mode|ready)\.state"
    r"|gpu-driver-upgrade-state|gpu\.driver-pool)$"
)


def is_stack_label(key: str) -> bool:
    return bool(_STACK_LABEL.match(key))


@dataclass(frozen=True, order=True)
class Taint:
    key: str
    value: str
    effect: str

    def to_k8s(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    @property
    def ident(self) -> str:
        """Taints are identified by key and effect, as the scheduler does."""
        return f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Owned:
    """What the operator added to a node, and the workload config whose stack it deployed
    there (so that a changed ``nvidia.com/gpu.workload.config`` is seen as a move)."""

    labels: frozenset[str] = frozenset()
    taints: frozenset[str] = frozenset()
    workload: str | None = None

    @classmethod
    def parse(cls, annotations: Mapping[str, str]) -> Owned:
        raw = annotations.get(OWNED_ANNOTATION)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            workload = data.get("workload")
            return cls(
                frozenset(data.get("labels", ())),
                frozenset(data.get("taints", ())),
                workload if isinstance(workload, str) else None,
            )
        except (ValueError, AttributeError, TypeError):
            return cls()  # a mangled annotation: own nothing rather than guess

    def dump(self) -> str | None:
        if not self.labels and not self.taints:
            return None
        data: dict[str, Any] = {"labels": sorted(self.labels), "taints": sorted(self.taints)}
        if self.workload is not None:
            data["workload"] = self.workload
        return json.dumps(data, separators=(",", ":"))


# What each GPU workload config deploys, by deploy-label suffix (NVIDIA's operator's table).
# ``container`` is the stack a node runs without sandbox workloads; mig-manager joins it only on
# MIG-capable nodes (``NodePolicy.mig_only``).
CONTAINER = "container"
VM_PASSTHROUGH = "vm-passthrough"
VM_VGPU = "vm-vgpu"
WORKLOAD_STACKS: Mapping[str, frozenset[str]] = {
    CONTAINER: frozenset(
        {
            "driver",
            "gpu-feature-discovery",
            "container-toolkit",
            "device-plugin",
            "dcgm",
            "dcgm-exporter",
            "node-status-exporter",
            "operator-validator",
            "mig-manager",
        }
    ),
    VM_PASSTHROUGH: frozenset(
        {"sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager", "cc-manager"}
    ),
    VM_VGPU: frozenset(
        {
            "sandbox-device-plugin",
            "vgpu-manager",
            "vgpu-device-manager",
            "sandbox-validator",
            "cc-manager",
        }
    ),
}


@dataclass(frozen=True)
class SandboxPolicy:
    """``sandboxWorkloads`` when enabled: each GPU node runs the stack its
    ``nvidia.com/gpu.workload.config`` label names, ``default_workload`` where it has none."""

    default_workload: str = CONTAINER
    # fabricManager.mode shared-nvswitch: passthrough nodes keep the driver (the fabric manager
    # runs on the host and partitions the NVSwitches for the VMs)
    shared_nvswitch: bool = False
    # sandboxWorkloads.mode kata: passthrough GPUs go to Kata's device plugin, not KubeVirt's
    kata: bool = False


@dataclass(frozen=True)
class NodePolicy:
    """What the active ClusterPolicy asks of every GPU node."""

    deploy: tuple[str, ...]  # deploy-label suffixes of enabled components
    mig_only: frozenset[str] = frozenset({"mig-manager"})
    taint: Taint | None = None
    default_mig_config: str | None = "all-disabled"
    sandbox: SandboxPolicy | None = None  # None: every GPU node runs the container stack


def workload_config(node: NodeView, policy: NodePolicy) -> str | None:
    """The workload config ``node`` runs under ``policy``; None when its label names none of
    NVIDIA's three (the node then keeps the deploy labels it has, see :func:`plan_node`)."""
    if policy.sandbox is None:
        return CONTAINER
    value = node.labels.get(WORKLOAD_CONFIG)
    if value is None or value == "":
        return policy.sandbox.default_workload
    return value if value in WORKLOAD_STACKS else None


def workload_problem(node: NodeView, policy: NodePolicy | None) -> str | None:
    """Why ``node``'s workload config label cannot be used, for its Event and the policy's
    status; None when it can (or when sandbox workloads are off, or it is not a GPU node)."""
    if policy is None or policy.sandbox is None or not is_gpu_node(node):
        return None
    if workload_config(node, policy) is not None:
        return None
    value = node.labels.get(WORKLOAD_CONFIG)
    return (
        f"{WORKLOAD_CONFIG}={value!r} is none of {', '.join(WORKLOAD_STACKS)}; "
        "the node keeps the deploy labels it has"
    )


class MovePhase(StrEnum):
    DRAINING = "draining"  # the old stack deployed, the node cordoned, its GPU pods leaving
    SWITCHING = "switching"  # no stack deployed, until the old stack's pods are gone
    VALIDATING = "validating"  # the new stack deployed, cordoned until its validator is Ready


@dataclass(frozen=True)
class Move:
    """A GPU node moving from one workload stack to another, recorded on the node (annotation
    ``WORKLOAD_MOVE``) so that a restarted operator carries on where it was. The old stack's
    pods are gone before the new stack's land: a VFIO manager must not take GPUs a driver
    container or a CUDA pod still holds, nor a driver load under a running VM."""

    source: str
    target: str
    phase: MovePhase
    since: float  # when the phase began, unix seconds
    was_cordoned: bool  # before the move: it leaves the node as it found it
    blocked: str = ""  # why the phase is past its time, once told

    @classmethod
    def parse(cls, annotations: Mapping[str, str]) -> Move | None:
        raw = annotations.get(WORKLOAD_MOVE)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            move = cls(
                str(data["from"]),
                str(data["to"]),
                MovePhase(data["phase"]),
                float(data["since"]),
                bool(data.get("wasCordoned", False)),
                str(data.get("blocked", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a mangled record: the move starts again from what the node runs
        valid = move.source in WORKLOAD_STACKS and move.target in WORKLOAD_STACKS
        return move if valid else None

    def dump(self) -> str:
        data: dict[str, Any] = {
            "from": self.source,
            "to": self.target,
            "phase": self.phase.value,
            "since": self.since,
            "wasCordoned": self.was_cordoned,
        }
        if self.blocked:
            data["blocked"] = self.blocked
        return json.dumps(data, separators=(",", ":"))

    @property
    def deployed(self) -> str | None:
        """The workload config whose stack the node runs in this phase; None while switching."""
        if self.phase is MovePhase.DRAINING:
            return self.source
        if self.phase is MovePhase.VALIDATING:
            return self.target
        return None


# Deploy-label suffixes that only one workload config's stack has: how a node labelled before
# the operator recorded its workload config tells which stack it runs.
_ONLY_IN = {
    VM_VGPU: frozenset({"vgpu-manager", "vgpu-device-manager"}),
    VM_PASSTHROUGH: frozenset({"vfio-manager", "kata-manager", "kata-sandbox-device-plugin"}),
    CONTAINER: WORKLOAD_STACKS[CONTAINER] - {"driver"},
}


def running_config(node: NodeView) -> str | None:
    """The workload config whose stack the operator last deployed on ``node`` (None: none
    yet, or no telling): recorded with what it owns, else told by its deploy labels."""
    owned = Owned.parse(node.annotations)
    if owned.workload in WORKLOAD_STACKS:
        return owned.workload
    deployed = {k.removeprefix(DEPLOY_PREFIX) for k in owned.labels if k.startswith(DEPLOY_PREFIX)}
    return next((config for config, only in _ONLY_IN.items() if deployed & only), None)


def deployed_config(node: NodeView, policy: NodePolicy) -> str | None:
    """The workload config whose stack ``node``'s deploy labels follow now: a move's phase
    decides while one is under way, and the running stack stays until one starts; None while
    a move switches (no stack) or when the label names no workload config."""
    move = Move.parse(node.annotations)
    if move is not None:
        return move.deployed
    wanted = workload_config(node, policy)
    running = running_config(node)
    if wanted is not None and running is not None and running != wanted:
        return running  # the move starts first (see gpu_operator.workload_move)
    return wanted


def stack(node: NodeView, policy: NodePolicy) -> frozenset[str] | None:
    """The deploy-label suffixes of the stack ``node`` runs now (before the policy's enabled
    components and the node's MIG capability filter them); empty while a move switches
    stacks, None when the node's label names no workload config (it keeps what it has)."""
    move = Move.parse(node.annotations)
    if move is not None and move.phase is MovePhase.SWITCHING:
        return frozenset()
    config = deployed_config(node, policy)
    if config is None:
        return None
    return config_stack(config, policy)


def config_stack(config: str, policy: NodePolicy) -> frozenset[str]:
    """The deploy-label suffixes of ``config``'s stack under ``policy``'s sandbox settings."""
    names = WORKLOAD_STACKS[config]
    sandbox = policy.sandbox
    if config == VM_PASSTHROUGH and sandbox is not None:
        if sandbox.shared_nvswitch:
            names = names | {"driver"}
        if sandbox.kata:
            names = (names - {"sandbox-device-plugin"}) | {"kata-sandbox-device-plugin"}
    return names


@dataclass(frozen=True)
class NodePatch:
    """One write that brings a node to what the operator wants of it: a JSON patch (RFC 6902).

    It carries no resourceVersion: a kubelet heartbeat or another controller's write to other
    keys between the read and the write must not turn it into a 409 and a retry. Each label
    changes only if it still holds what the plan read (a ``test`` before it): the operator sets
    ``nvidia.com/mig.config`` and the deploy labels only where they are absent, and a person's
    value written after the operator's read must win, not be overwritten from a stale view (a
    test's ``all-1g.5gb`` became ``all-disabled`` that way, 320 ms after it was set). The
    operator's taint is appended to the list as it is on the server, and removed at its index
    only if a ``test`` finds it still there (the list is the API's, shared with the node
    lifecycle controller and people). Asked again after a lost answer, an append that had
    landed is refused (the API server keeps taints unique by key and effect). A refused patch
    is a 422, and the next pass plans from what the watch shows.
    """

    labels: dict[str, str | None] = field(default_factory=dict)
    annotations: dict[str, str | None] = field(default_factory=dict)
    taints: list[dict[str, Any]] | None = None  # the whole new list, when it changes
    read: NodeView | None = None  # what the plan saw (guards labels and the taint list)

    def to_json_patch(self) -> list[dict[str, Any]]:
        read = self.read or NodeView("")
        return [
            *map_ops("/metadata/labels", self.labels, read.labels, guard=True),
            *map_ops("/metadata/annotations", self.annotations, read.annotations),
            *(taint_ops(read.taints, self.taints) if self.taints is not None else ()),
        ]


def is_gpu_node(node: NodeView) -> bool:
    """A node has NVIDIA GPUs when NFD, GKE, a person or the kubelet says so.

    ``nvidia.com/gpu.present`` counts only when someone other than this operator set it,
    otherwise a node could never stop being a GPU node. Asked of every node by several stages
    of every pass, so answered once per view (:func:`derived`).
    """
    return derived(node, _has_gpus)


def _has_gpus(node: NodeView) -> bool:
    labels = node.labels
    if any(is_true(labels.get(key)) for key in NFD_GPU_LABELS):
        return True
    if labels.get(GKE_ACCELERATOR):
        return True
    if is_true(labels.get(GPU_PRESENT)) and GPU_PRESENT not in Owned.parse(node.annotations).labels:
        return True
    try:
        return int(node.capacity.get(GPU_RESOURCE, "0")) > 0
    except ValueError:
        return False


def desired_labels(node: NodeView, policy: NodePolicy) -> dict[str, str]:
    """Labels the operator wants on a GPU node (keys it may then own): the deploy labels of the
    enabled components in the node's workload stack. A node whose workload config is invalid
    gets only ``gpu.present`` here; :func:`plan_node` keeps what it had."""
    labels = node.labels
    want = {GPU_PRESENT: "true"}
    names = stack(node, policy)
    if names is not None and labels.get(DEPLOY_OPERANDS, "").lower() != "false":
        mig_capable = is_true(labels.get(MIG_CAPABLE))
        deploy = [name for name in policy.deploy if name in names]
        for name in deploy:
            if name in policy.mig_only and not mig_capable:
                continue
            want[DEPLOY_PREFIX + name] = "true"
        if mig_capable and "mig-manager" in deploy and policy.default_mig_config:
            want[MIG_CONFIG] = policy.default_mig_config
    return want


def plan_node(
    node: NodeView, policy: NodePolicy | None, *, uninstall: bool = False
) -> NodePatch | None:
    """The one patch that brings a node to what ``policy`` asks, or None when it already is.

    ``policy`` None means no active ClusterPolicy: the node gets back what it had before the
    operator. ``uninstall`` also removes the labels and annotations the rest of the GPU stack
    wrote.
    """
    owned = _disown_user_choices(node, Owned.parse(node.annotations))
    labels: dict[str, str | None] = {}
    new_owned_labels = set(owned.labels)
    gpu_node = policy is not None and is_gpu_node(node)
    want = desired_labels(node, policy) if policy and gpu_node else {}
    # An invalid workload config changes nothing the operator set: the node's operands stay
    # until someone fixes the label (the problem is reported, see ``workload_problem``).
    invalid = policy is not None and gpu_node and stack(node, policy) is None
    held = (
        {k for k in owned.labels if k.startswith(DEPLOY_PREFIX) or k == MIG_CONFIG}
        if invalid
        else set()
    )
    if invalid:
        workload = owned.workload
    else:
        workload = deployed_config(node, policy) if policy is not None and gpu_node else None

    for key, value in want.items():
        current = node.labels.get(key)
        if current is None:
            labels[key] = value
            new_owned_labels.add(key)
        elif key.startswith(DEPLOY_PREFIX) and current != "true":
            continue  # "false" is a person's choice; "paused-for-..." is another component's
        elif key == MIG_CONFIG:
            continue  # any layout someone chose wins over our default
        elif current != value and key in owned.labels:
            labels[key] = value

    for key in owned.labels:
        if key not in want and key not in held:
            if key in node.labels:
                labels[key] = None
            new_owned_labels.discard(key)
    if uninstall:
        for key in node.labels:
            if is_stack_label(key):
                labels[key] = None

    taints, new_owned_taints = _plan_taints(node, policy if want else None, owned)
    new_owned = Owned(frozenset(new_owned_labels), frozenset(new_owned_taints), workload)
    annotations: dict[str, str | None] = {}
    if new_owned != owned:
        annotations[OWNED_ANNOTATION] = new_owned.dump()
    if uninstall:
        annotations.update({k: None for k in node.annotations if k in STACK_ANNOTATIONS})
    if not labels and not annotations and taints is None:
        return None
    return NodePatch(labels, annotations, taints, node)


def _disown_user_choices(node: NodeView, owned: Owned) -> Owned:
    """A deploy label the operator set to ``true`` and a person then set to ``false`` is the
    person's from then on (NVIDIA issue 2288): it is never removed or turned back to ``true``,
    whatever the policy does later (component disabled and re-enabled, operands=false, uninstall).
    """
    chosen = {
        key
        for key in owned.labels
        if key.startswith(DEPLOY_PREFIX) and node.labels.get(key, "").lower() == "false"
    }
    if not chosen:
        return owned
    return replace(owned, labels=owned.labels - chosen)


def _plan_taints(
    node: NodeView, policy: NodePolicy | None, owned: Owned
) -> tuple[list[dict[str, Any]] | None, set[str]]:
    present = {f"{t.get('key')}:{t.get('effect')}" for t in node.taints}
    want = policy.taint if policy else None
    new_owned = {ident for ident in owned.taints if ident in present}
    keep = list(node.taints)
    changed = False
    # Drop owned taints that are no longer wanted.
    for taint in node.taints:
        ident = f"{taint.get('key')}:{taint.get('effect')}"
        if ident in owned.taints and (want is None or want.ident != ident):
            keep.remove(taint)
            new_owned.discard(ident)
            changed = True
    if want is not None and want.ident not in present:
        keep.append(want.to_k8s())
        new_owned.add(want.ident)
        changed = True
    return (keep if changed else None), new_owned
