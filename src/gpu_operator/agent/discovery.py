"""GPU feature discovery: node labels from the GPU inventory (the ``nvidia.com/`` GFD set).

:func:`labels_for` and :func:`label_patch` are pure; :func:`run_discover` is the loop that reads
NVML, computes the labels and writes them to the Node with one merge patch (or prints them).
Label names and values follow NVIDIA's gpu-feature-discovery so workloads and selectors written
for it keep working.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_operator.agent import nodeapi
from gpu_operator.agent.deviceplugin.config_file import DevicePluginConfig, MigStrategy, Sharing
from gpu_operator.agent.inventory import Gpu, Inventory, MigDevice
from gpu_operator.agent.nvml import FabricError, GpuFabric, NvmlError, node_clique
from gpu_operator.labels import GPU_CLIQUE

if TYPE_CHECKING:
    from gpu_operator.agent.deviceplugin.configs import ConfigDir
    from gpu_operator.kube import Kube

log = logging.getLogger(__name__)

PREFIX = "nvidia.com/"
FULL_GPU = "nvidia.com/gpu"
TIMESTAMP = "nvidia.com/gfd.timestamp"
MACHINE_TYPE_FILE = Path("/sys/class/dmi/id/product_name")

_ATTRS = (
    r"(product|count|memory|replicas|sharing-strategy|multiprocessors"
    r"|slices\.gi|slices\.ci|engines\.[a-z]+)"
)
_OWNED = re.compile(
    r"^nvidia\.com/("
    r"gfd\.timestamp|mig\.strategy|mig\.capable|mps\.capable|cuda\.[a-z.-]+"
    rf"|gpu\.({_ATTRS[1:-1]}|family|compute\.major|compute\.minor|machine|mode|clique)"
    rf"|mig-[A-Za-z0-9._-]+\.{_ATTRS}"
    r")$"
)


def is_discovery_label(key: str) -> bool:
    """Keys feature discovery owns; the operator's own (gpu.present, gpu.deploy.*,
    mig.config...) and users' keys are never matched, so never removed."""
    return bool(_OWNED.match(key))


def sanitise(text: str) -> str:
    """Drop characters outside ``[A-Za-z0-9-_. ]``, then join words with ``-``."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def family(major: int, minor: int) -> str:
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
    }.get(major, "undefined")


def mig_name(device: MigDevice) -> str:
    """The MIG device's profile as resource names spell it: ``+`` -> ``.``; a compute
    instance smaller than its GPU instance is ``<c>c.<profile>``."""
    name = device.profile.replace("+", ".")
    if device.slices_ci != device.slices_gi:
        name = f"{device.slices_ci}c.{name}"
    return name


def _resource(
    resource: str,
    sharing: Sharing | None,
    count: int,
    product_parts: Iterable[str],
) -> dict[str, str]:
    """product/count/replicas/sharing-strategy of one resource; ``sharing=None``: unshareable."""
    replicated = sharing.lookup(resource) if sharing is not None else None
    if sharing is None:
        replicas = 0
    elif replicated is not None:
        replicas = replicated.replicas
    else:
        replicas = 1
    shared = replicated is not None and replicated.replicas > 1
    parts = [sanitise(p) for p in product_parts if p]
    if shared and replicated is not None and not replicated.rename:
        parts.append("SHARED")
    strategy = sharing.strategy if (sharing is not None and shared) else "none"
    return {
        f"{resource}.product": "-".join(parts),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }


def _full_gpu_labels(gpu: Gpu, count: int, sharing: Sharing | None) -> dict[str, str]:
    labels = _resource(FULL_GPU, sharing, count, [gpu.name])
    if gpu.memory_mib:
        labels[f"{FULL_GPU}.memory"] = str(gpu.memory_mib)
    if gpu.compute_major:
        labels[f"{FULL_GPU}.family"] = family(gpu.compute_major, gpu.compute_minor)
        labels[f"{FULL_GPU}.compute.major"] = str(gpu.compute_major)
        labels[f"{FULL_GPU}.compute.minor"] = str(gpu.compute_minor)
    return labels


def _mig_labels(
    resource: str, gpu: Gpu, device: MigDevice, count: int, sharing: Sharing | None
) -> dict[str, str]:
    labels = _resource(resource, sharing, count, [gpu.name, "MIG", mig_name(device)])
    attributes = {
        "memory": device.memory_mib,
        "multiprocessors": device.sm_count,
        "slices.gi": device.slices_gi,
        "slices.ci": device.slices_ci,
        "engines.copy": device.engines.copy,
        "engines.decoder": device.engines.decoder,
        "engines.encoder": device.engines.encoder,
        "engines.jpeg": device.engines.jpeg,
        "engines.ofa": device.engines.ofa,
    }
    labels.update({f"{resource}.{k}": str(v) for k, v in attributes.items()})
    return labels


def _groups(gpus: Iterable[Gpu]) -> list[tuple[Gpu, int]]:
    """(first GPU, count) per model name, in order of first appearance."""
    seen: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        seen.setdefault(gpu.name, []).append(gpu)
    return [(members[0], len(members)) for members in seen.values()]


def _resource_labels(
    inventory: Inventory, strategy: MigStrategy, sharing: Sharing
) -> dict[str, str]:
    gpus = inventory.gpus
    labels: dict[str, str] = {}
    enabled = [g for g in gpus if g.mig_current]
    disabled = [g for g in gpus if not g.mig_current]
    # MIG-enabled GPUs are not themselves shareable (replicas 0); full GPUs override them, and
    # with several models the lowest-indexed model's labels win.
    for gpu, count in reversed(_groups(enabled)):
        labels.update(_full_gpu_labels(gpu, count, None))
    for gpu, count in reversed(_groups(disabled)):
        labels.update(_full_gpu_labels(gpu, count, sharing))
    if strategy == "none":
        return labels
    labels["nvidia.com/mig.strategy"] = strategy
    devices = [(g, d) for g in enabled for d in g.mig_devices]
    if strategy == "single":
        if not enabled:
            return labels
        profiles = {mig_name(d) for _, d in devices}
        empty = any(not g.mig_devices for g in enabled)
        if empty or disabled or len(profiles) != 1:
            product = "-".join([sanitise(enabled[0].name), "MIG", "INVALID"])
            labels.update(
                {
                    f"{FULL_GPU}.product": product,
                    f"{FULL_GPU}.count": "0",
                    f"{FULL_GPU}.replicas": "0",
                    f"{FULL_GPU}.memory": "0",
                }
            )
            return labels
        gpu, device = devices[0]
        labels.update(_mig_labels(FULL_GPU, gpu, device, len(devices), sharing))
        return labels
    by_profile: dict[str, list[tuple[Gpu, MigDevice]]] = {}
    for gpu, device in devices:
        by_profile.setdefault(mig_name(device), []).append((gpu, device))
    for profile, members in sorted(by_profile.items()):
        gpu, device = members[0]
        labels.update(_mig_labels(f"nvidia.com/mig-{profile}", gpu, device, len(members), sharing))
    return labels


def clique_label(fabrics: Sequence[GpuFabric | None]) -> str | None:
    """The ``nvidia.com/gpu.clique`` value from the GPUs' fabrics; None (no label) without a
    fabric, and, logged, when the fabric is not ready: a node whose NVLink registration has
    not completed must not be placed in a clique."""
    try:
        return node_clique(fabrics)
    except FabricError as exc:
        log.warning("no %s label: %s", GPU_CLIQUE, exc)
        return None


def read_clique(fabrics: Callable[[], Sequence[GpuFabric | None]]) -> str | None:
    """:func:`clique_label` of what ``fabrics`` reads; None, logged, when NVML fails."""
    try:
        return clique_label(fabrics())
    except NvmlError as exc:
        log.warning("no %s label: reading the GPU fabric failed: %s", GPU_CLIQUE, exc)
        return None


def labels_for(
    inventory: Inventory,
    mig_strategy: MigStrategy,
    sharing: Sharing | None,
    machine: str,
    *,
    timestamp: int | None = None,
    clique: str | None = None,
) -> dict[str, str]:
    """All feature-discovery labels for a node with this inventory (empty without GPUs);
    ``clique``: the node's NVLink clique (:func:`clique_label`), labelled when there is one."""
    if not inventory.gpus:
        return {}
    sharing = sharing or Sharing()
    labels: dict[str, str] = {"nvidia.com/gpu.machine": machine}
    driver = inventory.driver_version.split(".")
    major, minor = driver[0], driver[1] if len(driver) > 1 else ""
    revision = driver[2] if len(driver) > 2 else ""
    cuda_major, cuda_minor = str(inventory.cuda_major), str(inventory.cuda_minor)
    labels.update(
        {
            "nvidia.com/cuda.driver.major": major,
            "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": revision,
            "nvidia.com/cuda.runtime.major": cuda_major,
            "nvidia.com/cuda.runtime.minor": cuda_minor,
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor,
            "nvidia.com/cuda.driver-version.revision": revision,
            "nvidia.com/cuda.driver-version.full": inventory.driver_version,
            "nvidia.com/cuda.runtime-version.major": cuda_major,
            "nvidia.com/cuda.runtime-version.minor": cuda_minor,
            "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
        }
    )
    labels["nvidia.com/mig.capable"] = str(any(g.mig_capable for g in inventory.gpus)).lower()
    mps = sharing.strategy == "mps" and not any(g.mig_current for g in inventory.gpus)
    labels["nvidia.com/mps.capable"] = str(mps).lower()
    labels.update(_resource_labels(inventory, mig_strategy, sharing))
    if clique is not None:
        labels[GPU_CLIQUE] = clique
    if timestamp is not None:
        labels[TIMESTAMP] = str(timestamp)
    return labels


def label_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """The label changes (``None`` removes) that take ``current`` to ``desired``.

    Only discovery's own keys are removed; a change of nothing but ``gfd.timestamp`` is no
    change, so an idle node is not rewritten every interval (the timestamp records the last
    time the labels changed).
    """
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in current:
        if key not in desired and is_discovery_label(key):
            patch[key] = None
    if set(patch) == {TIMESTAMP}:
        return {}
    return patch


def machine_type(path: Path = MACHINE_TYPE_FILE) -> str:
    try:
        value = sanitise(path.read_text().strip())
    except OSError:
        return "unknown"
    return value or "unknown"


def format_labels(labels: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


@dataclass(frozen=True)
class Settings:
    """What one pass labels with: the MIG strategy and the sharing of the config that applies."""

    mig_strategy: MigStrategy = "none"
    sharing: Sharing | None = None

    @staticmethod
    def of(flag: MigStrategy | None, config: DevicePluginConfig) -> Settings:
        return Settings(flag or config.flags.mig_strategy or "none", config.sharing_settings())

    @staticmethod
    def chooser(
        flag: MigStrategy | None, config: DevicePluginConfig, configs: ConfigDir | None
    ) -> Callable[[Mapping[str, str]], Settings]:
        """Settings from the node's labels. With a config directory the node label picks the
        config each pass, as it does for the device plugin, so ``mps.capable``, replicas and
        sharing-strategy follow a label change; a label naming no config keeps the last."""
        last = [Settings.of(flag, config)]

        def choose(node_labels: Mapping[str, str]) -> Settings:
            if configs is None:
                return last[0]
            try:
                _, chosen = configs.choose(node_labels.get(configs.label_key))
            except (OSError, ValueError) as exc:
                log.error("device-plugin config not applied to the labels: %s", exc)
                return last[0]
            last[0] = Settings.of(flag, chosen)
            return last[0]

        return choose


def run_discover(
    read_inventory: Callable[[], Inventory],
    *,
    settings: Callable[[Mapping[str, str]], Settings],
    node_name: str | None,
    api: Kube | None = None,
    output: str | None = None,
    interval_s: float = 60.0,
    oneshot: bool = False,
    machine_file: Path = MACHINE_TYPE_FILE,
    with_timestamp: bool = True,
    stop: threading.Event | None = None,
    read_fabrics: Callable[[], Sequence[GpuFabric | None]] | None = None,
) -> int:
    """Label the node (or print/write ``key=value`` lines) once or every ``interval_s``;
    ``read_fabrics``: the GPUs' NVLink fabrics, for the clique label (None: no such label)."""
    stop = stop or threading.Event()
    while True:
        node = None
        if not output:
            if api is None or not node_name:
                raise ValueError("labelling the node needs NODE_NAME and a Kubernetes client")
            node = nodeapi.read_node(api, node_name)
        chosen = settings(node.labels if node else {})
        labels = labels_for(
            read_inventory(),
            chosen.mig_strategy,
            chosen.sharing,
            machine_type(machine_file),
            timestamp=int(time.time()) if with_timestamp else None,
            clique=read_clique(read_fabrics) if read_fabrics is not None else None,
        )
        if output == "-":
            sys.stdout.write(format_labels(labels))
            sys.stdout.flush()
        elif output:
            target = Path(output)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(format_labels(labels))
            tmp.replace(target)
        elif node is not None and api is not None and node_name:
            patch = label_patch(node.labels, labels)
            if patch:
                nodeapi.patch_node_metadata(api, node_name, labels=patch)
                log.info("updated %d labels on node %s", len(patch), node_name)
        if oneshot or stop.wait(interval_s):
            return 0
