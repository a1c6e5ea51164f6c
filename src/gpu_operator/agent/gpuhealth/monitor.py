"""The health monitor: the shell around :mod:`state`, :mod:`condition` and :mod:`reset`.

Two halves, so a slow API server never delays NVML: :meth:`HealthMonitor.poll` (the health
loop: NVML readings and the XIDs the caller read, the new state, a requested reset) and
:meth:`HealthMonitor.publish` (its own loop: the condition, the reset answer and Events on the
Node; nothing is sent while nothing changed, and a failed write is tried again on a later pass,
no sooner than ``retry_s``). :meth:`HealthMonitor.on_node` takes what the agent's Node watch
read: the reset request, and the condition as the Node has it now (so one removed by someone
else is written again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpu_operator.agent import nodeapi
from gpu_operator.agent.gpuhealth import reset
from gpu_operator.agent.gpuhealth.condition import (
    Condition,
    condition_entry,
    node_condition,
    seed,
    transition_event,
)
from gpu_operator.agent.gpuhealth.settings import HealthSettings
from gpu_operator.agent.gpuhealth.state import GpuHealth, observe, unhealthy
from gpu_operator.agent.inventory import Inventory, XidEvent
from gpu_operator.agent.nvml.health import HealthReading
from gpu_operator.events import iso_time
from gpu_operator.labels import GPU_HEALTHY_CONDITION, HEALTH_RESET_DONE
from gpu_operator.views import NodeView

if TYPE_CHECKING:
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)


class Gpus(Protocol):
    """What the monitor asks of NVML (:class:`~gpu_operator.agent.nvml.Nvml`)."""

    def health_readings(self, inventory: Inventory) -> tuple[HealthReading, ...]: ...
    def gpu_processes(self, index: int) -> tuple[int, ...] | None: ...
    def reset_gpu(self, index: int) -> None: ...


class NodeWriter(Protocol):
    """What the monitor asks of its Node: :class:`KubeNode`, or a test's recorder."""

    def read_condition(self) -> Mapping[str, Any] | None: ...
    def write_condition(self, entry: Mapping[str, Any]) -> None: ...
    def annotate(self, annotations: Mapping[str, str]) -> None: ...
    def event(self, etype: str, reason: str, message: str) -> None: ...


class KubeNode:
    """The monitor's Node through the API server."""

    def __init__(self, api: Kube, node: str, component: str) -> None:
        self.api, self.node, self.component = api, node, component

    def read_condition(self) -> Mapping[str, Any] | None:
        return nodeapi.read_node_conditions(self.api, self.node)[1].get(GPU_HEALTHY_CONDITION)

    def write_condition(self, entry: Mapping[str, Any]) -> None:
        nodeapi.patch_node_condition(self.api, self.node, entry)

    def annotate(self, annotations: Mapping[str, str]) -> None:
        nodeapi.patch_node_metadata(self.api, self.node, annotations=annotations)

    def event(self, etype: str, reason: str, message: str) -> None:
        nodeapi.record_node_event(
            self.api, self.node, etype, reason, message, component=self.component
        )


class HealthMonitor:
    def __init__(
        self,
        gpus: Gpus,
        node: NodeWriter,
        settings: HealthSettings,
        *,
        clock: Callable[[], float] = time.time,
        retry_s: float = 5.0,
    ) -> None:
        self.gpus = gpus
        self.node = node
        self.settings = settings
        self.clock = clock
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._state: dict[str, GpuHealth] = {}
        self._desired: Condition | None = None
        self._current: Mapping[str, Any] | None = None  # the condition as the Node has it
        self._current_known = False
        self._retry_at = 0.0
        self._request: str | None = None  # a reset request not answered yet
        self._handled: str | None = None  # the request carried out by this process
        self._answer: str | None = None  # the reset-done value still to write
        self._events: list[tuple[str, str, str]] = []

    # -- the health loop -------------------------------------------------------------------------
    def prime(self, inventory: Inventory) -> None:
        """Start from the condition the Node has: GPUs it calls unhealthy stay so for a fresh
        quiet period (this process has not looked at them yet). Best effort. Nothing is
        published before the first poll has read the GPUs."""
        try:
            current = self.node.read_condition()
        except Exception as exc:
            log.warning("reading the %s condition failed: %s", GPU_HEALTHY_CONDITION, exc)
            return
        fresh = {g.uuid: GpuHealth(g.uuid, g.index) for g in inventory.gpus}
        with self._lock:
            self._current, self._current_known = current, True
            self._state = seed(fresh, Condition.of(current), self.clock())

    def poll(self, inventory: Inventory, xids: Sequence[XidEvent]) -> frozenset[str]:
        """One poll; returns the UUIDs of the GPUs now unhealthy."""
        readings = self.gpus.health_readings(inventory)
        now = self.clock()
        gpus = {g.uuid: g.index for g in inventory.gpus}
        with self._lock:
            before = unhealthy(self._state)
            self._state = observe(self._state, gpus, readings, xids, now, self.settings)
            self._desired = node_condition(self._state)
            after = unhealthy(self._state)
            request = self._request if self._request != self._handled else None
            sick = sorted((self._state[u].index, u) for u in after)
        if after != before:
            log.warning("%s: %s", self._desired.reason, self._desired.message)
        if request is not None:
            self._reset(request, sick)
        return after

    def unhealthy(self) -> frozenset[str]:
        with self._lock:
            return unhealthy(self._state)

    def health(self) -> dict[str, GpuHealth]:
        """Each GPU's health (by UUID) as the last poll left it."""
        with self._lock:
            return dict(self._state)

    def _reset(self, request: str, sick: Sequence[tuple[int, str]]) -> None:
        processes = {uuid: self.gpus.gpu_processes(index) for index, uuid in sick}
        plan = reset.plan_reset(sick, processes)
        failed: dict[str, str] = {}
        for index, uuid in plan.reset:
            log.warning("resetting GPU %d (%s), as the operator asked", index, uuid)
            try:
                self.gpus.reset_gpu(index)
            except Exception as exc:  # nvidia-smi's failure, or NVML's
                failed[uuid] = str(exc)
        ok, text = reset.outcome(plan, failed)
        log.info("GPU reset request %s: %s", request, text)
        with self._lock:
            self._handled = request
            self._answer = f"{request}:{text}"
            reason = "GPUReset" if ok else "GPUResetIncomplete"
            self._events.append(("Normal" if ok else "Warning", reason, text))

    # -- the Node --------------------------------------------------------------------------------
    def on_node(self, view: NodeView, conditions: Mapping[str, Mapping[str, Any]]) -> None:
        """What the agent's Node watch just read."""
        with self._lock:
            self._request = reset.pending_request(view.annotations)
            self._current = conditions.get(GPU_HEALTHY_CONDITION)
            self._current_known = True

    def publish(self) -> None:
        """Bring the Node up to date; quiet while nothing changed, retried after a failure."""
        now = self.clock()
        if now < self._retry_at:
            return
        try:
            self._publish(now)
        except Exception as exc:  # API hiccups: try again later
            log.warning("updating the node's %s condition failed: %s", GPU_HEALTHY_CONDITION, exc)
            self._retry_at = now + self.retry_s

    def _publish(self, now: float) -> None:
        if not self._current_known:
            current = self.node.read_condition()
            with self._lock:
                if not self._current_known:
                    self._current, self._current_known = current, True
        with self._lock:
            desired, current, answer = self._desired, self._current, self._answer
        if desired is not None:
            entry = condition_entry(desired, current, iso_time(now))
            if entry is not None:
                self.node.write_condition(entry)
                with self._lock:
                    self._current = entry
                event = transition_event(Condition.of(current), desired)
                if event is not None:
                    self.node.event(*event)
        if answer is not None:
            self.node.annotate({HEALTH_RESET_DONE: answer})
            with self._lock:
                if self._answer == answer:
                    self._answer = None
        with self._lock:
            events, self._events = self._events, []
        for event in events:
            self.node.event(*event)


def follow_health(
    monitor: HealthMonitor,
    inventory: Callable[[], Inventory],
    xids: Callable[[Inventory], Sequence[XidEvent]],
    on_change: Callable[[frozenset[str]], None],
    stop: threading.Event,
    poll_s: float,
) -> None:
    """Where no device-plugin health loop runs (``--kwok-capacity``): poll, publish, and call
    ``on_change`` with the unhealthy GPUs whenever they change (again after it failed)."""
    told: frozenset[str] = frozenset()
    while not stop.is_set():
        try:
            found = inventory()
            sick = monitor.poll(found, xids(found))
            if sick != told:
                on_change(sick)
                told = sick
            monitor.publish()
        except Exception:
            log.exception("health check failed")
        stop.wait(poll_s)
