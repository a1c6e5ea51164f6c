"""Operator at fleet scale on the local control plane: N GPU + N/10 CPU kwok nodes.

For NVIDIA's Helm-default ClusterPolicy, per fleet size: time from creating the policy to every
GPU node labelled and to ``state: ready``; the operator process's CPU-seconds (utime + stime,
all threads) while converging and per minute once converged; its peak RSS; its node writes per
GPU node and all its writes while converging; its requests per minute once converged; and the
machine's load average (a shared machine makes figures noisy: compare runs made side by side).
The operator runs as its own process (``python -m gpu_operator run``) under a ServiceAccount
token, so the apiserver's audit log attributes every request to it. kube-controller-manager
runs with --kube-api-qps 200 / --kube-api-burst 400 (testenv's setting), which bounds how fast
DaemonSet pods appear; kwok's pod stages (1-6 s each) bound how fast they turn Ready.
Figures and profiles: ``benchmarks/README.md``.

    python benchmarks/bench_operator.py [--sizes 500,1000,2000] [--steady 60] [--profile DIR]

``--profile DIR`` samples the operator with py-spy (``pip install py-spy``) and writes, per
size, collapsed stacks of the converging and the converged phase plus their top functions by
own time and with their callees.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_operator import testenv  # noqa: E402
from gpu_operator.kube import Kube, WatchStream  # noqa: E402
from tests.e2e.support import (  # noqa: E402
    OPERATOR_USER,
    audit_requests,
    audit_writes,
    now,
    service_account_config,
    token_kubeconfig,
)

NS = "gpu-operator"
POLICY = REPO.parent / "shared" / "reference" / "nvidia" / "clusterpolicy-helm-default.yaml"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_by_thread(pid: int) -> collections.Counter[str]:
    """CPU-seconds so far per thread name: the operator names its watch threads, its event
    loop, its request threads and the Lease's. From the scheduler's nanoseconds where the
    kernel keeps them (an idle minute's figures are a few ticks of /proc's 10 ms)."""
    counts: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            try:
                counts[name] += int((task / "schedstat").read_text().split()[0]) / 1e9
                continue
            except (OSError, IndexError, ValueError):  # no schedstat: the ticks
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        counts[name] += (int(fields[11]) + int(fields[12])) / TICKS
    return counts


def peak_rss_mib(pid: int, field: str = "VmHWM") -> float:
    """The process's peak resident set (``VmRSS``: the current one), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def requests_by_verb(cluster: testenv.Cluster, since: datetime) -> collections.Counter[str]:
    return collections.Counter(
        f"{e['verb']} {e['objectRef'].get('resource', '')}"
        for e in audit_requests(cluster, OPERATOR_USER, since)
    )


def others_writes_by_minute(
    cluster: testenv.Cluster, since: datetime, resources: tuple[str, ...] = ("nodes", "pods")
) -> dict[int, collections.Counter[str]]:
    """Everyone else's writes to ``resources`` in each minute from ``since``: what the operator's
    watches had to read while it had nothing to do (the audit log omits Lease renewals)."""
    minutes: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for event in audit_writes(cluster, None, since):
        user, ref = event["user"]["username"], event["objectRef"]
        if user == OPERATOR_USER or ref.get("resource") not in resources:
            continue
        what = f"{user.rsplit(':', 1)[-1]} {event['verb']} {ref['resource']}"
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        stamp = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        minutes[int((stamp - since).total_seconds() // 60)][what] += 1
    return minutes


@dataclass
class Result:
    gpu_nodes: int
    labelled_s: float
    ready_s: float
    cpu_converge_s: float
    cpu_per_min: float
    peak_rss_mib: float
    writes: int
    writes_by_resource: dict[str, int]
    steady_reads_per_min: float
    steady_writes_per_min: float
    steady_detail: dict[str, int]
    load: tuple[float, float]  # the machine's 1-minute load average when converged, at the end
    cpu_minutes: tuple[float, ...] = ()  # CPU-seconds in each minute of the steady window

    def row(self) -> str:
        return (
            f"| {self.gpu_nodes} | {self.labelled_s:.1f} | {self.ready_s:.1f} | "
            f"{self.cpu_converge_s:.1f} | {self.cpu_per_min:.2f} | {self.peak_rss_mib:.0f} | "
            f"{self.writes_by_resource.get('nodes', 0) / self.gpu_nodes:.2f} | "
            f"{self.writes} | {self.steady_reads_per_min:.1f} / "
            f"{self.steady_writes_per_min:.1f} | {self.load[0]:.1f} / {self.load[1]:.1f} |"
        )


HEADER = (
    "| GPU nodes | labelled s | ready s | CPU-s converging | CPU-s/min converged | "
    "peak RSS MiB | node writes/GPU node | all writes | steady reads/writes per min | "
    "load avg |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


class LabelledNodes:
    """When every GPU node first carries ``nvidia.com/gpu.present=true``, from a watch with
    that label selector (polling a list of thousands of nodes would load the API server the
    operator is measured against)."""

    def __init__(self, kube: Kube, expected: int) -> None:
        self.kube, self.expected = kube, expected
        self.at: float | None = None
        self._stream: WatchStream | None = None
        self._since = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, since: float) -> None:
        self._since = since
        self._thread.start()

    def _run(self) -> None:
        selector = "nvidia.com/gpu.present=true"
        items, version = self.kube.list_with_version("Node", None, {"labelSelector": selector})
        seen = {n["metadata"]["name"] for n in items}
        while self.at is None:
            self._stream = self.kube.watch("Node", None, version, 300, label_selector=selector)
            for events in self._stream.batches():
                for event in events:
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") == "ADDED":
                        seen.add(obj["metadata"]["name"])
                if len(seen) >= self.expected:
                    self.at = time.monotonic() - self._since
                    return

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._thread.join(10)


class Profiler:
    """py-spy sampling the operator for one phase at a time (collapsed stacks)."""

    def __init__(self, out: Path | None, pid: int) -> None:
        self.out, self.pid = out, pid
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, name: str) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.file = self.out / f"{name}.txt"
        self.proc = subprocess.Popen(
            [_py_spy(), "record", "--pid", str(self.pid), "--format", "raw", "--rate", "50",
             "--nonblocking", "--gil", "-o", str(self.file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self, top: int = 15) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        self.proc = None
        own, inclusive = top_frames(self.file, top)
        print(f"  profile {self.file.name}: top functions by own samples")
        for share, frame in own:
            print(f"    {share:5.1f}%  {frame}")
        print(f"  profile {self.file.name}: top functions with their callees")
        for share, frame in inclusive:
            print(f"    {share:5.1f}%  {frame}")


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else "py-spy"


PLUMBING = re.compile(
    r"\((<frozen runpy>|asyncio/|threading\.py|concurrent/futures/|gpu_operator/__main__\.py|"
    r"gpu_operator/cli\.py|gpu_operator/controller/runner\.py)"
)


def top_frames(
    collapsed: Path, top: int
) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """Shares of samples per frame in py-spy's collapsed output: as the innermost frame (own
    time), and anywhere in the stack (with callees), leaving out the plumbing every stack runs
    through (runpy, asyncio, threading, the command line)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        total += int(count)
    total = max(total, 1)
    for frame in [f for f in inclusive if PLUMBING.search(f)]:
        del inclusive[frame]
    return (
        [(100 * n / total, f) for f, n in own.most_common(top)],
        [(100 * n / total, f) for f, n in inclusive.most_common(top)],
    )


def run_size(gpu_nodes: int, steady: float, profile: Path | None) -> Result:
    cpu_nodes = max(1, gpu_nodes // 10)
    state = testenv.default_state_dir() / f"bench-{uuid.uuid4().hex[:6]}"
    t = time.monotonic()
    cluster = testenv.start(state)
    print(f"[{gpu_nodes}] control plane up: {time.monotonic() - t:.1f}s")
    proc = None
    try:
        t = time.monotonic()
        manifests = [testenv.node_manifest(f"gpu-node-{i}", gpu=True) for i in range(gpu_nodes)]
        manifests += [testenv.node_manifest(f"cpu-node-{i}", gpu=False) for i in range(cpu_nodes)]
        cluster.create_nodes(manifests, timeout=900)
        print(
            f"[{gpu_nodes}] {len(manifests)} nodes created and Ready: {time.monotonic() - t:.1f}s"
        )

        with (
            tempfile.TemporaryDirectory() as tmp,
            cluster.api_client(pool_size=8) as api,
            (Path(tmp) / "operator.log").open("w") as oplog,
        ):
            kube = Kube(api)
            kubeconfig = Path(tmp) / "kubeconfig"
            token_kubeconfig(
                cluster, service_account_config(cluster, NS, "gpu-operator"), kubeconfig
            )
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_operator", "run", "--kubeconfig", str(kubeconfig),
                 "--namespace", NS, "--health-port", "0", "--metrics-port", "0"],
                stdout=subprocess.DEVNULL, stderr=oplog,
            )  # fmt: skip
            profiler = Profiler(profile / str(gpu_nodes) if profile else None, proc.pid)
            while not kube.list_objects("Lease", NS):  # leading (and its caches filling)
                time.sleep(0.2)
            time.sleep(2)
            cpu_idle = cpu_seconds(proc.pid)
            threads_idle = cpu_by_thread(proc.pid)
            profiler.start("converging")
            labelled = LabelledNodes(kube, gpu_nodes)
            start_wall, start = now(), time.monotonic()
            labelled.start(start)
            kube.create(yaml.safe_load(POLICY.read_text()))
            ready_at = None
            while ready_at is None and time.monotonic() - start < 1800:
                status = (kube.get("ClusterPolicy", "cluster-policy") or {}).get("status") or {}
                if status.get("state") == "ready" and labelled.at is not None:
                    ready_at = time.monotonic() - start
                time.sleep(0.5)
            labelled.stop()
            labelled_at = labelled.at
            if ready_at is None or labelled_at is None:
                raise SystemExit(f"[{gpu_nodes}] did not converge within 1800 s")
            cpu_converge = cpu_seconds(proc.pid) - cpu_idle
            by_thread = cpu_by_thread(proc.pid)
            by_thread.subtract(threads_idle)
            print(
                f"[{gpu_nodes}] CPU-s converging by thread: "
                + ", ".join(f"{n} {s:.2f}" for n, s in by_thread.most_common() if s >= 0.01)
            )
            load_converged = os.getloadavg()[0]
            print(
                f"[{gpu_nodes}] RSS at ready {peak_rss_mib(proc.pid, 'VmRSS'):.0f} MiB, "
                f"peak so far {peak_rss_mib(proc.pid):.0f} MiB"
            )
            profiler.stop()
            time.sleep(2)
            writes = audit_writes(cluster, OPERATOR_USER, start_wall)
            by_resource = collections.Counter(w["objectRef"]["resource"] for w in writes)
            node_codes = collections.Counter(
                (w["verb"], (w.get("responseStatus") or {}).get("code"))
                for w in writes
                if w["objectRef"]["resource"] == "nodes"
            )
            print(f"[{gpu_nodes}] node writes by verb and response code: {dict(node_codes)}")

            profiler.start("converged")
            steady_from, cpu_before = now(), cpu_seconds(proc.pid)
            threads_converged = cpu_by_thread(proc.pid)
            marks = [cpu_before]
            for _ in range(int(steady // 60)):
                time.sleep(60)
                marks.append(cpu_seconds(proc.pid))
            time.sleep(steady % 60)
            cpu_steady = cpu_seconds(proc.pid) - cpu_before
            minutes_cpu = tuple(b - a for a, b in itertools.pairwise(marks))
            print(
                f"[{gpu_nodes}] CPU-s in each minute once converged: "
                + ", ".join(f"{m:.2f}" for m in minutes_cpu)
            )
            steady_threads = cpu_by_thread(proc.pid)
            steady_threads.subtract(threads_converged)
            print(
                f"[{gpu_nodes}] CPU-s once converged by thread: "
                + ", ".join(f"{n} {s:.3f}" for n, s in steady_threads.most_common() if s >= 0.001)
            )
            profiler.stop()
            counts = requests_by_verb(cluster, steady_from)
            for minute, writes in sorted(others_writes_by_minute(cluster, steady_from).items()):
                print(f"[{gpu_nodes}] minute {minute + 1} once converged, others' writes: "
                      + ", ".join(f"{w} {n}" for w, n in writes.most_common()))  # fmt: skip
            if profile is not None:  # the operator's log next to its profiles
                shutil.copy(Path(tmp) / "operator.log", profile / str(gpu_nodes) / "operator.log")
            minutes = steady / 60
            write_verbs = {"create", "update", "patch", "delete"}
            steady_writes = sum(v for k, v in counts.items() if k.split()[0] in write_verbs)
            steady_reads = sum(v for k, v in counts.items() if k.split()[0] not in write_verbs)
            return Result(
                gpu_nodes=gpu_nodes,
                labelled_s=labelled_at,
                ready_s=ready_at,
                cpu_converge_s=cpu_converge,
                cpu_per_min=cpu_steady / minutes,
                peak_rss_mib=peak_rss_mib(proc.pid),
                writes=len(writes),
                writes_by_resource=dict(by_resource),
                steady_reads_per_min=steady_reads / minutes,
                steady_writes_per_min=steady_writes / minutes,
                steady_detail=dict(counts),
                load=(load_converged, os.getloadavg()[0]),
                cpu_minutes=minutes_cpu,
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        cluster.stop(remove_state=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="500,1000,2000", help="GPU nodes per run")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of idle measured")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output folder")
    args = parser.parse_args()
    if not POLICY.is_file():
        print(f"skipped: NVIDIA's Helm-default policy not found at {POLICY}")
        return 0
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        result = run_size(size, args.steady, args.profile)
        results.append(result)
        print(f"[{size}] writes while converging: {result.writes} {result.writes_by_resource}")
        print(f"[{size}] steady requests: {result.steady_detail}")
        print(HEADER.splitlines()[0])
        print(result.row())
    print("\n" + HEADER)
    for result in results:
        print(result.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
