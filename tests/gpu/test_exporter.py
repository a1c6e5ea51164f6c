"""``agent exporter`` on the real GPU: its /metrics against nvidia-smi, idle and under load (the
CUDA probe, allocating and filling device memory in a loop).

A scrape and an nvidia-smi read are not simultaneous, and the exporter serves a snapshot up to
one interval (200 ms) old: each scrape is paired with the nearer of two nvidia-smi reads, one just
before and one just after it, and the figures are compared on the median of several pairs:
framebuffer used within 10% (at least 512 MiB: one probe's allocation comes and goes), power
within 50 W.
"""

from __future__ import annotations

import re
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_operator.agent.inventory import Inventory
from tests.gpu.conftest import Driver
from tests.gpu.host import Probe, agent_argv, agent_env

INTERVAL_MS = 200  # the exporter's snapshot is at most this old
LOAD_BYTES = 2 << 30  # held while the probe checks it on the host: a second or so per run
FB_TOLERANCE = 0.10
FB_FLOOR_MIB = 512.0
POWER_TOLERANCE_W = 50.0
PAIRS_IDLE, PAIRS_LOADED = 3, 6
REQUIRED = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
)
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = dict(LABEL.findall(match.group(2)))
            samples.append(Sample(match.group(1), labels, float(match.group(3))))
    return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Exporter:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def gpu0(self) -> dict[str, Sample]:
        """GPU 0's sample of each metric."""
        code, text = self.get("/metrics")
        assert code == 200, text
        return {s.name: s for s in parse(text) if s.labels.get("gpu") == "0"}


@pytest.fixture
def exporter(driver: Driver, workdir: Path) -> Iterator[Exporter]:
    port = free_port()
    log = workdir / "exporter.log"
    args = ["exporter", "--driver-root", driver.root, "--address", f"127.0.0.1:{port}"]
    args += ["--interval-ms", str(INTERVAL_MS), "--no-kubernetes"]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            agent_argv(*args),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=agent_env({"LOG_LEVEL": "INFO"}),
        )
    running = Exporter(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"the exporter exited {process.returncode}:\n{log.read_text()}")
            try:
                if running.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the exporter was not healthy within 60 s:\n{log.read_text()}")
            time.sleep(0.2)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Load:
    """The CUDA probe run again and again until stopped (each run allocates, fills, copies back
    and checks LOAD_BYTES of device memory)."""

    def __init__(self, probe: Probe, library_dir: str) -> None:
        self.probe, self.library_dir = probe, library_dir
        self.runs = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cuda load", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = self.probe.run(LOAD_BYTES, library_dir=self.library_dir)
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                self.errors.append(str(exc))
                return
            if "check: ok" not in out:
                self.errors.append(out)
                return
            self.runs += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def closest(value: float, *reads: float | None) -> float | None:
    """Of nvidia-smi's reads around a scrape, the one nearest the exporter's figure."""
    known = [r for r in reads if r is not None]
    return min(known, key=lambda r: abs(r - value)) if known else None


@dataclass(frozen=True)
class Pair:
    """One scrape and nvidia-smi's read nearest it (of one just before and one just after)."""

    phase: str
    util: tuple[float, float | None]  # (exporter, nvidia-smi)
    fb_used: tuple[float, float | None]
    power: tuple[float, float | None]


def pairs(exporter: Exporter, driver: Driver, phase: str, count: int) -> list[Pair]:
    found = []
    for _ in range(count):
        before = driver.smi.load()
        metrics = exporter.gpu0()
        after = driver.smi.load()
        figures = [
            metrics[name].value
            for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE")
        ]
        util, fb, power = (
            (figure, closest(figure, before[i], after[i])) for i, figure in enumerate(figures)
        )
        found.append(Pair(phase, util, fb, power))
        time.sleep(0.3)
    return found


def _figure(value: float | None, width: int, decimals: int) -> str:
    return "N/A".rjust(width) if value is None else f"{value:{width}.{decimals}f}"


def test_exporter_metrics_match_nvidia_smi_under_load(
    exporter: Exporter, driver: Driver, inventory: Inventory, probe: Probe
) -> None:
    metrics = exporter.gpu0()
    missing = [name for name in REQUIRED if name not in metrics]
    assert not missing, f"/metrics lacks {missing}; it has {sorted(metrics)}"
    gpu = inventory.gpus[0]
    labels = metrics["DCGM_FI_DEV_FB_USED"].labels
    assert labels["UUID"] == gpu.uuid and labels["modelName"] == gpu.name
    assert labels["DCGM_FI_DRIVER_VERSION"] == inventory.driver_version
    assert labels["device"] == f"nvidia{gpu.minor_number}"
    found = pairs(exporter, driver, "idle", PAIRS_IDLE)
    with Load(probe, driver.library_dir) as load:
        time.sleep(1.5)
        found += pairs(exporter, driver, "load", PAIRS_LOADED)
    assert not load.errors, f"the CUDA probe failed under the exporter: {load.errors[0]}"
    assert load.runs > 0, "the CUDA probe never completed a run during the load phase"

    print(f"\nexporter vs nvidia-smi, GPU 0 ({gpu.name}); {load.runs} probe runs of {LOAD_BYTES} B")
    print(f"  {'phase':5} {'util %':>13} {'FB used MiB':>19} {'power W':>15}")
    for p in found:
        print(
            f"  {p.phase:5} {p.util[0]:5.0f} / {_figure(p.util[1], 5, 0)} "
            f"{p.fb_used[0]:8.0f} / {_figure(p.fb_used[1], 8, 0)} "
            f"{p.power[0]:6.1f} / {_figure(p.power[1], 6, 1)}"
        )
    for p in found:
        assert 0 <= p.util[0] <= 100
    fb = [(e, s) for e, s in (p.fb_used for p in found) if s is not None]
    assert fb, "nvidia-smi reported no memory.used"
    fb_diff = statistics.median(abs(e - s) for e, s in fb)
    fb_allowed = max(FB_TOLERANCE * statistics.median(s for _, s in fb), FB_FLOOR_MIB)
    print(f"  FB used: median |difference| {fb_diff:.0f} MiB (allowed {fb_allowed:.0f})")
    assert fb_diff <= fb_allowed
    power = [(e, s) for e, s in (p.power for p in found) if s is not None]
    if power:
        power_diff = statistics.median(abs(e - s) for e, s in power)
        print(f"  power: median |difference| {power_diff:.1f} W (allowed {POWER_TOLERANCE_W})")
        assert power_diff <= POWER_TOLERANCE_W
    else:
        print("  power: nvidia-smi reports no power.draw on this GPU (not compared)")
    loaded_fb = max(e for e, _ in (p.fb_used for p in found if p.phase == "load"))
    idle_fb = min(e for e, _ in (p.fb_used for p in found if p.phase == "idle"))
    print(f"  FB used by the exporter: idle min {idle_fb:.0f} MiB, loaded max {loaded_fb:.0f} MiB")
