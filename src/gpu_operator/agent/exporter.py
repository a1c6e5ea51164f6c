"""GPU metrics exporter: dcgm-exporter's metric names and labels, from NVML alone.

Which metrics to export comes from a counters CSV in dcgm-exporter's format
(``FIELD, type, help`` with ``#`` comments), so users keep their ConfigMaps. Fields NVML cannot
read (the DCGM_FI_PROF_* profiling metrics, NVLink bandwidth, vGPU licence) are skipped with one
log line naming them.

A background thread reads NVML every interval into an immutable snapshot; scrapes render the
latest snapshot and never touch NVML, so a slow or hung GPU cannot stall Prometheus. Samples
carry pod/namespace/container when the kubelet PodResources socket says who holds the GPU.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpu_operator.agent.inventory import Gpu, GpuMetrics, Inventory, MigDevice, MigMetrics
from gpu_operator.agent.podresources import KUBELET_SOCKET, Attribution, attributions_from_kubelet
from gpu_operator.textfiles import parse_file

log = logging.getLogger(__name__)

PORT = 9400
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"


class CountersError(ValueError):
    """A malformed counters CSV line."""


@dataclass(frozen=True)
class CounterSpec:
    field: str
    type: str  # gauge | counter | label
    help: str


@dataclass(frozen=True)
class FieldSource:
    gpu: Callable[[GpuMetrics], float | None]
    mig: Callable[[MigMetrics], float | None] | None = None


# What NVML can provide, by dcgm-exporter field name.
FIELDS: dict[str, FieldSource] = {
    "DCGM_FI_DEV_SM_CLOCK": FieldSource(lambda m: m.sm_clock_mhz),
    "DCGM_FI_DEV_MEM_CLOCK": FieldSource(lambda m: m.mem_clock_mhz),
    "DCGM_FI_DEV_GPU_TEMP": FieldSource(lambda m: m.gpu_temp_c),
    "DCGM_FI_DEV_MEMORY_TEMP": FieldSource(lambda m: m.memory_temp_c),
    "DCGM_FI_DEV_POWER_USAGE": FieldSource(lambda m: m.power_w),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": FieldSource(lambda m: m.energy_mj),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FieldSource(lambda m: m.pcie_replay_count),
    "DCGM_FI_DEV_GPU_UTIL": FieldSource(lambda m: m.gpu_util_pct),
    "DCGM_FI_DEV_MEM_COPY_UTIL": FieldSource(lambda m: m.mem_copy_util_pct),
    "DCGM_FI_DEV_ENC_UTIL": FieldSource(lambda m: m.encoder_util_pct),
    "DCGM_FI_DEV_DEC_UTIL": FieldSource(lambda m: m.decoder_util_pct),
    "DCGM_FI_DEV_XID_ERRORS": FieldSource(lambda m: m.last_xid),
    "DCGM_FI_DEV_FB_FREE": FieldSource(lambda m: m.fb_free_mib, lambda m: m.fb_free_mib),
    "DCGM_FI_DEV_FB_USED": FieldSource(lambda m: m.fb_used_mib, lambda m: m.fb_used_mib),
    "DCGM_FI_DEV_FB_RESERVED": FieldSource(
        lambda m: m.fb_reserved_mib, lambda m: m.fb_reserved_mib
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FieldSource(lambda m: m.remapped_rows_correctable),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FieldSource(lambda m: m.remapped_rows_uncorrectable),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FieldSource(lambda m: m.row_remap_failure),
}
LABEL_FIELDS = frozenset({DRIVER_LABEL})

# Used when no counters file is given: every field above.
DEFAULT_COUNTERS: tuple[CounterSpec, ...] = (
    CounterSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock (MHz)."),
    CounterSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock (MHz)."),
    CounterSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (C)."),
    CounterSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "HBM temperature (C)."),
    CounterSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Board power draw (W)."),
    CounterSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy since boot (mJ)."),
    CounterSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe replays (retries)."),
    CounterSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "Time the GPU was busy (%)."),
    CounterSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Time memory was being read or written (%)."),
    CounterSpec("DCGM_FI_DEV_ENC_UTIL", "gauge", "Video encoder busy (%)."),
    CounterSpec("DCGM_FI_DEV_DEC_UTIL", "gauge", "Video decoder busy (%)."),
    CounterSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Last XID error seen (0: none)."),
    CounterSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer free (MiB)."),
    CounterSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer used (MiB)."),
    CounterSpec("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer reserved by the driver (MiB)."),
    CounterSpec(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors."
    ),
    CounterSpec(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Rows remapped for uncorrectable errors.",
    ),
    CounterSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 if a row remapping failed."),
    CounterSpec(DRIVER_LABEL, "label", "Driver version."),
)


def parse_counters(text: str) -> list[CounterSpec]:
    """dcgm-exporter's counters CSV: ``FIELD, type, help``; ``#`` lines are comments."""
    specs: list[CounterSpec] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise CountersError(f"line {number}: expected 'FIELD, type, help', got {raw!r}")
        kind = parts[1].lower()
        if kind not in ("gauge", "counter", "label"):
            raise CountersError(f"line {number}: unknown metric type {parts[1]!r} for {parts[0]}")
        specs.append(CounterSpec(parts[0], kind, parts[2] if len(parts) > 2 else ""))
    return specs


def load_counters(path: str | Path | None) -> list[CounterSpec]:
    """The counters CSV in ``path`` (FileProblem names it when it cannot be used); no path:
    every field NVML has."""
    return (
        list(DEFAULT_COUNTERS) if not path else parse_file(path, parse_counters, (CountersError,))
    )


def split_supported(specs: Iterable[CounterSpec]) -> tuple[list[CounterSpec], list[str]]:
    """(fields this exporter can serve, names it cannot)."""
    usable, skipped = [], []
    for spec in specs:
        supported = spec.field in LABEL_FIELDS if spec.type == "label" else spec.field in FIELDS
        (usable.append(spec) if supported else skipped.append(spec.field))
    return usable, skipped


# -- building the families (pure) ---------------------------------------------------------------
def gpu_labels(gpu: Gpu, hostname: str, driver: str | None) -> dict[str, str]:
    labels = {
        "gpu": str(gpu.index),
        "UUID": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "device": f"nvidia{gpu.minor_number}",
        "modelName": gpu.name,
        "Hostname": hostname,
    }
    if driver is not None:
        labels[DRIVER_LABEL] = driver
    return labels


def _holders(
    who: Mapping[str, list[Attribution]] | None, keys: Sequence[str]
) -> list[Attribution | None]:
    if who:
        for key in keys:
            if key in who:
                return list(who[key])
    return [None]


def _with_pod(labels: dict[str, str], holder: Attribution | None) -> dict[str, str]:
    if holder is None:
        return labels
    return {
        **labels,
        "container": holder.container,
        "namespace": holder.namespace,
        "pod": holder.pod,
    }


def build_families(
    inventory: Inventory,
    gpu_metrics: Sequence[GpuMetrics],
    mig_metrics: Sequence[MigMetrics],
    counters: Sequence[CounterSpec],
    hostname: str,
    who: Mapping[str, list[Attribution]] | None = None,
) -> list[Metric]:
    """One Prometheus family per supported counter, samples per GPU and per MIG device."""
    with_driver = any(c.type == "label" and c.field == DRIVER_LABEL for c in counters)
    driver = inventory.driver_version if with_driver else None
    gpus = {g.index: g for g in inventory.gpus}
    migs: dict[tuple[int, int, int], MigDevice] = {
        (d.gpu_index, d.gi_id, d.ci_id): d for g in inventory.gpus for d in g.mig_devices
    }
    families: list[Metric] = []
    for spec in counters:
        source = FIELDS.get(spec.field)
        if spec.type == "label" or source is None:
            continue
        family = Metric(spec.field, spec.help, spec.type)
        for reading in gpu_metrics:
            gpu = gpus.get(reading.index)
            value = source.gpu(reading)
            if gpu is None or value is None:
                continue
            base = gpu_labels(gpu, hostname, driver)
            for holder in _holders(who, [gpu.uuid, str(gpu.index)]):
                family.add_sample(spec.field, _with_pod(base, holder), value)
        if source.mig is not None:
            for mig_reading in mig_metrics:
                device = migs.get((mig_reading.gpu_index, mig_reading.gi_id, mig_reading.ci_id))
                gpu = gpus.get(mig_reading.gpu_index)
                value = source.mig(mig_reading)
                if device is None or gpu is None or value is None:
                    continue
                base = gpu_labels(gpu, hostname, driver)
                base["GPU_I_PROFILE"] = device.profile
                base["GPU_I_ID"] = str(device.gi_id)
                position = gpu.mig_devices.index(device)
                keys = [device.uuid, f"{gpu.index}:{position}"]
                for holder in _holders(who, keys):
                    family.add_sample(spec.field, _with_pod(base, holder), value)
        families.append(family)
    return families


# -- exposition ----------------------------------------------------------------------------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Metric]) -> str:
    """Prometheus text format 0.0.4 with dcgm-exporter's names: counters keep their bare name
    (prometheus_client would append ``_total``, breaking dashboards written for DCGM)."""
    lines: list[str] = []
    for family in families:
        if not family.samples:
            continue
        doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family.name} {doc}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n" if lines else ""


class SnapshotCollector(Collector):
    """A prometheus_client collector that yields the families of the last collection."""

    def __init__(self) -> None:
        self._families: list[Metric] = []

    def update(self, families: list[Metric]) -> None:
        self._families = families  # one reference swap: scrapes see old or new, never half

    def collect(self) -> Iterator[Metric]:
        yield from self._families


# -- the running exporter ------------------------------------------------------------------------
class MetricsSource(Protocol):
    """What the exporter needs from NVML; :class:`gpu_operator.agent.nvml.Nvml` provides it."""

    def inventory(self) -> Inventory: ...

    def metrics(
        self, inventory: Inventory
    ) -> tuple[tuple[GpuMetrics, ...], tuple[MigMetrics, ...]]: ...


class Exporter:
    """Collects on an interval in a background thread; renders the last snapshot on demand."""

    def __init__(
        self,
        nvml: MetricsSource,
        counters: Sequence[CounterSpec] = DEFAULT_COUNTERS,
        *,
        hostname: str | None = None,
        interval_s: float = 30.0,
        pod_resources_socket: str | None = KUBELET_SOCKET,
        inventory_refresh_s: float = 300.0,
    ) -> None:
        self._nvml = nvml
        self.counters, skipped = split_supported(counters)
        if skipped:
            log.info("NVML cannot provide these fields, skipping them: %s", ", ".join(skipped))
        self.skipped = skipped
        self.hostname = hostname or socket.gethostname()
        self.interval_s = interval_s
        self.pod_resources_socket = pod_resources_socket
        self.inventory_refresh_s = inventory_refresh_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = SnapshotCollector()
        self.registry.register(self.collector)
        self._inventory: Inventory | None = None
        self._inventory_at = 0.0
        self.last_success = 0.0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def collect_once(self) -> None:
        """Read NVML (and the kubelet) once and publish the result."""
        now = time.monotonic()
        try:
            if self._inventory is None or now - self._inventory_at > self.inventory_refresh_s:
                self._inventory = self._nvml.inventory()
                self._inventory_at = now
            inventory = self._inventory
            assert inventory is not None
            gpu_metrics, mig_metrics = self._nvml.metrics(inventory)
        except Exception as exc:
            self._inventory = None  # re-read the layout next time (MIG may have changed)
            self.last_error = str(exc)
            log.warning("metrics collection failed: %s", exc)
            return
        who = None
        if self.pod_resources_socket:
            who = attributions_from_kubelet(self.pod_resources_socket)
        self.collector.update(
            build_families(inventory, gpu_metrics, mig_metrics, self.counters, self.hostname, who)
        )
        self.last_success = time.monotonic()
        self.last_error = ""

    def render(self) -> str:
        return render(self.registry.collect())

    def healthy(self) -> bool:
        """Collected successfully within the last three intervals."""
        return bool(self.last_success) and time.monotonic() - self.last_success < 3 * max(
            self.interval_s, 1.0
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            self._stop.wait(self.interval_s)

    def start(self) -> Exporter:
        self.collect_once()
        self._thread = threading.Thread(target=self._loop, name="gpu-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def make_server(exporter: Exporter, host: str = "", port: int = PORT) -> ThreadingHTTPServer:
    """``/metrics`` (text format) and ``/health`` (200 while collections succeed)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, exporter.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/health":
                ok = exporter.healthy()
                body = (
                    "OK\n" if ok else f"unhealthy: {exporter.last_error or 'no collection yet'}\n"
                )
                self._send(200 if ok else 503, body, "text/plain; charset=utf-8")
            else:
                self._send(404, "not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: str, content_type: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s - %s", self.address_string(), format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
