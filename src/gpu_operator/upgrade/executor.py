"""The imperative side of driver upgrades: observe the fleet, ask the planner, apply its actions.

Everything the planner needs is read from the operator's indexes except the workload pods of
nodes that are being emptied, which are listed per node only while a node is in such a state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.api.spec import UpgradePolicy
from gpu_operator.controller.nodes import NodeView
from gpu_operator.controller.readiness import newest_revision_hash
from gpu_operator.kube import Kube
from gpu_operator.render import COMPONENT_LABEL
from gpu_operator.upgrade.model import (
    STATE_LABEL,
    VALIDATOR_APP,
    Action,
    Cordon,
    DeletePod,
    Event,
    Evict,
    Fail,
    Fleet,
    Node,
    Plan,
    Pod,
    Policy,
    SetState,
    State,
    Uncordon,
)
from gpu_operator.upgrade.planner import plan

log = logging.getLogger(__name__)

# States in which the planner looks at the pods running on a node.
EMPTYING = frozenset({State.WAIT_FOR_JOBS.value, State.POD_DELETION.value, State.DRAIN.value})

EventSink = Callable[[Mapping[str, Any], str, str, str], Any]


def driver_fleet_inputs(
    daemonsets: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    revisions: Iterable[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], dict[str, str]]:
    """Driver pods, validator pods and each driver DaemonSet's newest revision hash."""
    drivers = {
        d["metadata"]["uid"]: d["metadata"]["name"]
        for d in daemonsets
        if (d["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "driver"
    }
    pods = list(pods)

    def owner_uid(obj: Mapping[str, Any]) -> str | None:
        refs = obj["metadata"].get("ownerReferences") or ()
        return next((r.get("uid") for r in refs if r.get("kind") == "DaemonSet"), None)

    driver_pods = [p for p in pods if owner_uid(p) in drivers]
    validators = [
        p for p in pods if (p["metadata"].get("labels") or {}).get("app") == VALIDATOR_APP
    ]
    by_owner: dict[str, list[Mapping[str, Any]]] = {}
    for rev in revisions:
        uid = owner_uid(rev)
        if uid is not None and uid in drivers:
            by_owner.setdefault(uid, []).append(rev)
    newest = {}
    for uid, name in drivers.items():
        hash_ = newest_revision_hash(by_owner.get(uid, []))
        if hash_:
            newest[name] = hash_
    return driver_pods, validators, newest


class UpgradeExecutor:
    def __init__(self, kube: Kube, call: Callable[..., Any], event: EventSink) -> None:
        self.kube = kube
        self._call = call  # the operator's bounded thread-pool runner
        self._event = event

    async def workload_pods(self, nodes: Sequence[NodeView]) -> list[Mapping[str, Any]]:
        emptying = [n.name for n in nodes if n.labels.get(STATE_LABEL) in EMPTYING]
        lists = await asyncio.gather(
            *(
                self._call(self.kube.list_objects, "Pod", field_selector=f"spec.nodeName={name}")
                for name in emptying
            )
        )
        return [p for items in lists for p in items]

    async def reconcile(
        self,
        spec: UpgradePolicy | None,
        nodes: Sequence[NodeView],
        daemonsets: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        revisions: Iterable[Mapping[str, Any]],
        now: float | None = None,
    ) -> Plan:
        policy = Policy.from_spec(spec)
        driver_pods, validators, newest = driver_fleet_inputs(daemonsets, pods, revisions)
        workloads = await self.workload_pods(nodes) if policy.auto_upgrade else []
        fleet = Fleet(
            nodes=tuple(
                Node(n.name, n.labels, n.annotations, n.unschedulable, n.ready) for n in nodes
            ),
            driver_pods=tuple(Pod.from_k8s(p) for p in driver_pods),
            workload_pods=tuple(Pod.from_k8s(p) for p in workloads),
            validator_pods=tuple(Pod.from_k8s(p) for p in validators),
            newest_hash=newest,
        )
        result = plan(fleet, policy, time.time() if now is None else now)
        await self.execute(result.actions)
        return result

    async def execute(self, actions: Sequence[Action]) -> None:
        """Apply in order; a failed node patch skips the rest of that node's actions."""
        failed_nodes: set[str] = set()
        for action in actions:
            if action.node in failed_nodes:
                continue
            try:
                await self._apply(action)
            except ApiException as exc:
                if isinstance(action, (Evict, DeletePod)):
                    if exc.status not in (404, 429):  # gone already / a PDB says not now
                        log.warning("upgrade: %s failed: %s", action, exc.reason)
                    continue
                log.warning("upgrade: %s failed (%s); retrying next pass", action, exc.status)
                failed_nodes.add(action.node)

    async def _apply(self, action: Action) -> None:
        if isinstance(action, (SetState, Cordon, Uncordon, Fail)):
            await self._call(self.kube.merge_patch, "Node", action.node, action.patch())
            if isinstance(action, Fail):
                await self._event(_node_ref(action.node), "Warning", "UpgradeFailed", action.reason)
            elif isinstance(action, SetState):
                log.info("upgrade: node %s -> %s", action.node, action.state.value or "(none)")
        elif isinstance(action, Evict):
            await self._call(self.kube.evict, action.pod, action.namespace)
        elif isinstance(action, DeletePod):
            await self._call(
                self.kube.delete, "Pod", action.pod, action.namespace,
                grace_period_seconds=0 if action.force else None,
            )  # fmt: skip
        elif isinstance(action, Event):
            await self._event(_node_ref(action.node), action.type, action.reason, action.message)


def _node_ref(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
