"""What receiving one Node status report costs the operator's node watch thread.

A converged fleet's only traffic to the operator is its nodes' periodic status reports (a
kubelet's, or kwok's, every 5 minutes: 1,000 a minute at 5,000 nodes), and every report reaches
every Node watcher. This serves a chunked watch response of N reports of one node over local
TLS, one chunk each, ``--gap-ms`` apart (a server subprocess), and reads it with the thread CPU
clock in four ways:

- ``recv``: a bare TLS socket's ``recv_into`` counting bytes: the floor for any reader in Python;
- ``recvpaced``: ``recv``, paced as the informer paces nodes: the floor for a paced reader;
- ``chunks``: the operator's request (``Kube.watch``), its chunks read and nothing parsed;
- ``repeats``: the operator's node watch as it runs (managedFields cut, repeats unparsed);
- ``parsed``: every event parsed and made a ``NodeView`` (what a changed report costs);
- ``paced``: ``repeats`` read as the informer reads nodes, paced (``REPORTED_PACE_S``).

    python benchmarks/bench_watch.py [--events 300] [--gap-ms 4,60] [--modes recv,paced]

The spacing matters: at 5,000 nodes reports come about 60 ms apart, so every one wakes a thread
whose code and data are out of the cache. Figures: ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client as k8s

from gpu_operator.controller.runtime.informer import REPORTED_PACE_S
from gpu_operator.kube import Kube, Repeats
from gpu_operator.views import NodeView

MODES = ("recv", "recvpaced", "chunks", "repeats", "parsed", "paced")


def report(version: int, beat: str) -> bytes:
    """A kwok GPU node's status report as the API server writes it (Go field order, map keys
    sorted, no spaces), about 4 KB without managedFields."""
    labels = {f"feature.node.kubernetes.io/cpu-cpuid.F{i}": "true" for i in range(50)}
    labels |= {
        "kubernetes.io/hostname": "gpu-node-1",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    conditions = [
        {
            "type": kind,
            "status": "True" if kind == "Ready" else "False",
            "lastHeartbeatTime": beat,
            "lastTransitionTime": "2026-11-27T10:00:00Z",
            "reason": "KubeletReady" if kind == "Ready" else f"KubeletHas{kind}",
            "message": "kubelet is posting ready status",
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    resources = {"cpu": "64", "memory": "1056Gi", "nvidia.com/gpu": "8", "pods": "110"}
    node = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "gpu-node-1",
            "uid": "6b1c2f0e-5d7a-4c1e-9f3b-0a8e2d4c6b10",
            "resourceVersion": str(version),
            "creationTimestamp": "2026-11-27T10:00:00Z",
            "labels": dict(sorted(labels.items())),
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [
                {
                    "manager": "kwok",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": beat,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {}}}},
                    "subresource": "status",
                }
            ],
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "fake"},
        },
    }
    event = {"type": "MODIFIED", "object": node}
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def serve(port_file: Path, cert: Path, key: Path, events: int, gap_s: float) -> None:
    """One connection: a chunked watch response, an event a chunk, ``gap_s`` apart."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port_file.write_text(str(listener.getsockname()[1]))
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            tls.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for i in range(events):
                beat = f"2026-11-27T1{i // 3600 % 10}:{i // 60 % 60:02d}:{i % 60:02d}Z"
                line = report(100 + i, beat)
                tls.sendall(b"%x\r\n%s\r\n" % (len(line), line))
                time.sleep(gap_s)
            tls.sendall(b"0\r\n\r\n")
            with contextlib.suppress(OSError):
                tls.recv(1)  # until the reader hangs up


def read(mode: str, port: int, ca: Path) -> tuple[int, float]:
    """(events read, thread CPU-seconds spent reading them)."""
    if mode in ("recv", "recvpaced"):
        ctx = ssl.create_default_context(cafile=ca)
        with ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1"
        ) as tls:
            tls.sendall(b"GET /api/v1/nodes?watch=true HTTP/1.1\r\nHost: bench\r\n\r\n")
            buf = bytearray(1 << 18)
            start, received = time.thread_time(), b""
            while not received.endswith(b"0\r\n\r\n"):
                n = tls.recv_into(buf)
                if not n:
                    break
                received = bytes(buf[max(0, n - 5) : n])
                if (
                    mode == "recvpaced"
                    and not tls.pending()
                    and not select.select([tls], [], [], 0)[0]
                ):
                    time.sleep(REPORTED_PACE_S)  # as WatchStream.batches waits
            # each event's chunk holds exactly one line: counted by the server's arithmetic
            return -1, time.thread_time() - start
    config = k8s.Configuration()
    config.host, config.ssl_ca_cert = f"https://127.0.0.1:{port}", str(ca)
    with k8s.ApiClient(config) as api:
        stream = Kube(api).watch(
            "Node",
            None,
            "1",
            300,
            compact=True,
            repeats=Repeats() if mode in ("repeats", "paced") else None,
            pace_s=REPORTED_PACE_S if mode == "paced" else 0.0,
        )
        count, start = 0, time.thread_time()
        if mode == "chunks":
            for chunk in stream.chunks():
                count += chunk.count(b"\n")
            stream.close()
            return count, time.thread_time() - start
        for events in stream.batches():
            for event in events:
                count += 1
                if mode == "parsed":
                    NodeView.from_k8s(event["object"])
        return count, time.thread_time() - start


def measure(mode: str, events: int, gap_ms: float, certs: Path) -> float:
    """Microseconds of reader thread CPU per event."""
    port_file = certs / f"port-{mode}-{gap_ms}"
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port_file), str(certs), str(events), str(gap_ms)]
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the benchmark's server did not start")
            time.sleep(0.05)
        count, cpu = read(mode, int(port_file.read_text()), certs / "cert.pem")
    except BaseException:
        server.kill()
        raise
    finally:
        server.wait(timeout=60)
    if count not in (-1, events):
        raise RuntimeError(f"{mode}: read {count} events of {events}")
    return cpu / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--gap-ms", default="4,60", help="spacings between reports to try")
    parser.add_argument("--modes", default=",".join(MODES), help="readers to measure")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        port_file, certs, events, gap_ms = args.serve
        serve(Path(port_file), Path(certs) / "cert.pem", Path(certs) / "key.pem", int(events),
              float(gap_ms) / 1000)  # fmt: skip
        return
    gaps = [float(g) for g in args.gap_ms.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", "key.pem", "-out", "cert.pem"],
            cwd=certs, check=True, capture_output=True,
        )  # fmt: skip
        size = len(report(100, "2026-11-27T10:00:00Z"))
        load = os.getloadavg()[0]
        print(f"{args.events} reports of {size} bytes a gap apart; load average {load:.2f}")
        modes = args.modes.split(",")
        print("gap ms | " + " | ".join(f"{m} us/event" for m in modes))
        for gap in gaps:
            row = [measure(mode, args.events, gap, certs) for mode in modes]
            print(f"{gap:g} | " + " | ".join(f"{us:.0f}" for us in row))
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
