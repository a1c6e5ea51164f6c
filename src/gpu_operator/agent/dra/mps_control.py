"""Claims' MPS control daemons on this node, started and stopped (the I/O of
:mod:`gpu_operator.agent.dra.mps`).

Start: the daemon's directories (its shm a tmpfs of its own, as NVIDIA's), its GPUs put in
compute mode EXCLUSIVE_PROCESS, its Deployment created, and Ready awaited, so Prepare returns
only once a client can connect. Stop: the Deployment deleted, compute mode DEFAULT again (a GPU
must not stay exclusive after the claim, NVIDIA's issue 1262), the directories removed. Both
may be repeated: a retried Prepare or Unprepare finds what the first try did.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpu_operator.agent.dra import mps
from gpu_operator.agent.dra.mps import DaemonPod, MpsDaemon
from gpu_operator.agent.dra.prepare import PrepareError
from gpu_operator.agent.dra.sharing import GpuSettings
from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

EXCLUSIVE, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"
POLL_S = 0.5
# A daemon not Ready by then fails Prepare with its pod's reason (what the workload's Events
# show), kept short so the answer reaches the kubelet before it gives up on the call.
READY_TIMEOUT_S = 40.0


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


def mount_shm(path: Path) -> None:
    """A tmpfs of its own on ``path`` (once): the clients' and the daemon's shared memory."""
    if _mounted(path):
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "rw,nosuid,nodev,noexec,size=65536k", "shm", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise PrepareError(f"mounting the MPS shm on {path}: {done.stderr.strip()}")


def unmount_shm(path: Path) -> None:
    if path.exists() and _mounted(path):
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


class MpsControl:
    """Starts and stops this node's claims' daemons; ``pod`` says what their pods run."""

    def __init__(
        self,
        kube: Kube,
        plugin_dir: Path,
        pod: Callable[[], DaemonPod],
        settings: Callable[[], GpuSettings],
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        mount: Callable[[Path], None] = mount_shm,
        unmount: Callable[[Path], None] = unmount_shm,
    ) -> None:
        self.kube, self.plugin_dir, self.pod, self.settings = kube, plugin_dir, pod, settings
        self.ready_timeout_s = ready_timeout_s
        self.mount, self.unmount = mount, unmount

    def start(self, daemon: MpsDaemon) -> None:
        where = mps.dirs(self.plugin_dir, daemon.id)
        for path in (where.pipe, where.shm, where.log):
            path.mkdir(parents=True, exist_ok=True)
        self.mount(where.shm)
        tool = self.settings()
        for gpu in daemon.gpus:
            tool.set_compute_mode(gpu, EXCLUSIVE)
        pod = self.pod()
        try:
            self.kube.create(mps.deployment(daemon, where, pod))
            log.info("MPS control daemon %s started for %s", daemon.name, ",".join(daemon.devices))
        except ApiException as exc:
            if exc.status != 409:  # already there: a retried Prepare
                raise PrepareError(f"creating Deployment {daemon.name}: {exc.reason}") from None
        self._wait_ready(daemon, pod.namespace)

    def _wait_ready(self, daemon: MpsDaemon, namespace: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            found = self.kube.get("Deployment", daemon.name, namespace) or {}
            if int((found.get("status") or {}).get("readyReplicas") or 0) >= 1:
                return
            if time.monotonic() >= deadline:
                raise PrepareError(
                    f"MPS control daemon {daemon.name} not Ready after "
                    f"{self.ready_timeout_s:.0f}s: {self._why(daemon, namespace)}"
                )
            time.sleep(POLL_S)

    def _why(self, daemon: MpsDaemon, namespace: str) -> str:
        """What its pod is waiting on, in the words kubectl shows."""
        pods = self.kube.list_objects("Pod", namespace, label_selector=f"app={daemon.name}")
        if not pods:
            return "no pod yet"
        status: dict[str, Any] = pods[0].get("status") or {}
        for container in status.get("containerStatuses") or []:
            for state in (container.get("state") or {}).values():
                if state.get("reason") or state.get("message"):
                    return f"{state.get('reason', '')} {state.get('message', '')}".strip()
        return str(status.get("phase") or "Pending")

    def stop(self, daemon: MpsDaemon) -> None:
        namespace = self.pod().namespace
        self.kube.delete("Deployment", daemon.name, namespace, propagation="Foreground")
        tool = self.settings()
        for gpu in daemon.gpus:
            tool.set_compute_mode(gpu, DEFAULT)
        self._remove(mps.dirs(self.plugin_dir, daemon.id).root)
        log.info("MPS control daemon %s stopped", daemon.name)

    def _remove(self, root: Path) -> None:
        self.unmount(mps.MpsDirs(root).shm)
        shutil.rmtree(root, ignore_errors=True)

    def stop_unheld(self, held: Iterable[MpsDaemon], gpus: Iterable[str]) -> list[str]:
        """Stop every daemon of this node no prepared claim holds (a plugin killed between
        starting one and checkpointing its claim, or a claim let go while it was down) and put
        DEFAULT back on ``gpus`` that no held daemon has. Returns the daemons stopped."""
        held = list(held)
        keep = {d.name for d in held}
        pod = self.pod()
        stopped = []
        for found in self.kube.list_objects(
            "Deployment",
            pod.namespace,
            label_selector=f"app.kubernetes.io/component={mps.COMPONENT}",
        ):
            name = found["metadata"]["name"]
            template = ((found.get("spec") or {}).get("template") or {}).get("spec") or {}
            if name in keep or template.get("nodeName") != pod.node:
                continue
            self.kube.delete("Deployment", name, pod.namespace, propagation="Foreground")
            stopped.append(name)
        root = self.plugin_dir / "mps"
        ids = {d.id for d in held}
        for path in sorted(root.iterdir()) if root.is_dir() else ():
            if path.name not in ids:
                self._remove(path)
        exclusive = {g for d in held for g in d.gpus}
        free = sorted(set(gpus) - exclusive)
        if free:
            tool = self.settings()
            for gpu in free:
                tool.set_compute_mode(gpu, DEFAULT)
        return stopped
