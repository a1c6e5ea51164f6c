"""An in-process DRA kubelet plugin served to a real node's kubelet: the plugin's sockets in a
short directory (Unix socket paths are limited to 107 bytes) linked from the kubelet's names in
the node's directory (its plugin watcher and dialer follow links), and the pods that use it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client

from gpu_operator.agent.dra import devices as dra_devices
from gpu_operator.agent.dra.server import DraPlugin, PluginPaths
from gpu_operator.kube import Kube

from .support import NotYet, wait_for

DRIVER = dra_devices.DRIVER


@contextmanager
def namespace(api: Kube, prefix: str) -> Iterator[str]:
    """A namespace of its own, with its default ServiceAccount (pods need it), deleted after."""
    ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_for("the default ServiceAccount", lambda: api.get("ServiceAccount", "default", ns))
    try:
        yield ns
    finally:
        api.delete("Namespace", ns)


def plugin_paths(node_dir: Path, short: Path) -> PluginPaths:
    """Where a plugin for ``node_dir``'s kubelet serves: sockets under ``short``, CDI specs in
    the node's CDI directory, the kubelet's own name for the plugin's directory."""
    (node_dir / "kubelet" / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
    (short / "plugin").mkdir(exist_ok=True)
    (short / "reg").mkdir(exist_ok=True)
    return PluginPaths(
        plugin_dir=short / "plugin",
        registry_dir=short / "reg",
        cdi_dir=node_dir / "cdi",
        kubelet_plugin_dir=Path("/var/lib/kubelet/plugins") / DRIVER,
    )


@contextmanager
def registered(plugin: DraPlugin, node_dir: Path) -> Iterator[DraPlugin]:
    """``plugin`` started and registered with the node's kubelet; stopped and unlinked after
    (the kubelet then sees the driver go)."""
    kubelet_sock = node_dir / "kubelet" / "plugins" / DRIVER / "dra.sock"
    registration = node_dir / "kubelet" / "plugins_registry" / f"{DRIVER}-reg.sock"
    plugin.start()
    try:
        kubelet_sock.unlink(missing_ok=True)
        os.symlink(plugin.paths.plugin_socket, kubelet_sock)
        registration.unlink(missing_ok=True)
        os.symlink(plugin.paths.registration_socket, registration)
        wait_for(
            "the kubelet to register the DRA plugin",
            lambda: (
                (True, "") in (got := plugin.registrations.statuses)
                or NotYet({"registration statuses": list(got)})
            ),
            timeout=60,
        )
        yield plugin
    finally:
        registration.unlink(missing_ok=True)
        kubelet_sock.unlink(missing_ok=True)
        plugin.stop()


@contextmanager
def slices_of(api: Kube, node: str) -> Iterator[None]:
    """The node's ResourceSlices, whatever a test publishes, deleted after it."""
    try:
        yield
    finally:
        for s in api.list_objects("ResourceSlice", field_selector=f"spec.nodeName={node}"):
            api.delete("ResourceSlice", s["metadata"]["name"])


def phase(api: Kube, ns: str, name: str) -> Callable[[], str | NotYet]:
    """A probe for the pod's phase once it runs or has failed."""

    def probe() -> str | NotYet:
        status = (api.get("Pod", name, ns) or {}).get("status") or {}
        if status.get("phase") in ("Running", "Failed"):
            return str(status["phase"])
        states = [s.get("state") for s in status.get("containerStatuses") or []]
        return NotYet({"phase": status.get("phase"), "container states": states})

    return probe


def log_with(api: Kube, ns: str, name: str, marker: str) -> Callable[[], str | NotYet]:
    """A probe for the pod's log once it holds ``marker``."""
    core = client.CoreV1Api(api.api)

    def probe() -> str | NotYet:
        text = str(core.read_namespaced_pod_log(name, ns))
        return text if marker in text else NotYet({"log": text[-500:]})

    return probe
