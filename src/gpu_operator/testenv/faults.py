"""Faults between a client and the API server, for the chaos suite: nothing in the operator
knows about them.

Two layers, both on loopback, each fault bounded in count and time and ended by itself:

- :class:`Toxiproxy` drives a real Toxiproxy (built from ``github.com/Shopify/toxiproxy/v2``
  into the testenv cache): TCP faults such as latency, connection resets and a black hole.
- :class:`FaultProxy` answers at the HTTP level what TCP cannot express: 429 with Retry-After,
  503, 409 on a write, 410 Gone ending a watch. It is a plain-HTTP front that forwards to the
  API server over TLS, passing the client's bearer token through, so the API server (and its
  audit log) sees the client's own identity.

The chain a client under test uses: client -> Toxiproxy -> FaultProxy -> kube-apiserver.
Which requests a fault hits is :func:`decide`, a pure function of the request and the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from .processes import free_ports

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop and framing headers the proxy sets itself.
_HOP = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}
)
MAX_FAULT_SECONDS = 600.0  # no fault outlives this, whatever a test asks


@dataclass(frozen=True)
class Fault:
    """Answer ``status`` instead of forwarding, to a ``fraction`` of the matching requests.

    ``status`` 410 ends watch requests with a ``410 Gone`` watch event (what the API server
    sends once etcd compacted the version a watch asked for); other statuses answer a request
    with a ``Status`` body, and 429/503 carry ``Retry-After``.
    """

    status: int
    fraction: float = 1.0
    writes_only: bool = False
    watches_only: bool = False
    retry_after_s: int = 1
    duration_s: float = 30.0
    max_count: int = 100_000
    seed: int = 16


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    watch: bool


def decide(fault: Fault | None, request: Request, draw: float, injected: int) -> bool:
    """Whether this request gets the fault (``draw`` uniform in [0, 1))."""
    if fault is None or injected >= fault.max_count:
        return False
    if fault.writes_only and request.method not in WRITE_METHODS:
        return False
    if fault.watches_only and not request.watch:
        return False
    if fault.status == 410 and not request.watch:
        return False
    if request.path.startswith(("/readyz", "/livez", "/healthz", "/version")):
        return False
    return draw < fault.fraction


def status_body(code: int) -> dict[str, Any]:
    reasons = {409: "Conflict", 410: "Expired", 429: "TooManyRequests", 503: "ServiceUnavailable"}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"injected by the chaos suite: {code}",
        "reason": reasons.get(code, "InternalError"),
        "code": code,
    }


@dataclass
class _Active:
    fault: Fault
    until: float
    injected: int = 0
    rng: random.Random = field(default_factory=random.Random)


class FaultProxy:
    """A plain-HTTP front for the API server on loopback, injecting at most one fault at a
    time; runs its own event loop in a thread (``start``/``stop``, or ``with``)."""

    def __init__(self, upstream: str, ca_file: Path, port: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.ca_file = ca_file
        self.port = port or free_ports(1)[0]
        self.requests = 0
        self.injected: dict[int, int] = {}
        self._active: _Active | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._session: ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- faults -------------------------------------------------------------------------------
    def inject(self, fault: Fault) -> None:
        """Start ``fault`` now; it ends after its duration or count, or at :meth:`clear`."""
        duration = min(fault.duration_s, MAX_FAULT_SECONDS)
        with self._lock:
            self._active = _Active(
                fault, time.monotonic() + duration, rng=random.Random(fault.seed)
            )

    def clear(self) -> None:
        with self._lock:
            self._active = None

    @property
    def active(self) -> bool:
        with self._lock:
            return self._current() is not None

    def _current(self) -> _Active | None:
        active = self._active
        if active is not None and (
            time.monotonic() >= active.until or active.injected >= active.fault.max_count
        ):
            self._active = active = None
        return active

    def _hit(self, request: Request) -> Fault | None:
        with self._lock:
            self.requests += 1
            active = self._current()
            if active is None:
                return None
            if not decide(active.fault, request, active.rng.random(), active.injected):
                return None
            active.injected += 1
            code = active.fault.status
            self.injected[code] = self.injected.get(code, 0) + 1
            return active.fault

    # -- serving ------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        fault = self._hit(Request(request.method, request.path, watch))
        if fault is not None:
            return await self._answer(request, fault)
        return await self._forward(request)

    async def _answer(self, request: web.Request, fault: Fault) -> web.StreamResponse:
        if fault.status == 410:
            event = {"type": "ERROR", "object": status_body(410)}
            return web.Response(
                status=200, text=json.dumps(event) + "\n", content_type="application/json"
            )
        headers = {}
        if fault.status in (429, 503):
            headers["Retry-After"] = str(fault.retry_after_s)
        return web.Response(
            status=fault.status,
            text=json.dumps(status_body(fault.status)),
            content_type="application/json",
            headers=headers,
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.rel_url.raw_path_qs,
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
        except (TimeoutError, OSError) as exc:
            return web.Response(status=502, text=f"upstream unreachable: {exc}")
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:  # the body goes through as is, compressed or not
                    response.headers[key] = value
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ClientError, OSError, TimeoutError):
                # The API server went away mid-answer (a watch when it is killed): cut the
                # client's connection too, as it would see without a proxy in between. (Or the
                # client went away: nothing to tell it.)
                if request.transport is not None:
                    request.transport.close()
            return response

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        context = ssl.create_default_context(cafile=str(self.ca_file))
        session = self._session = ClientSession(
            connector=TCPConnector(ssl=context, limit=0),
            timeout=ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, shutdown_timeout=1).start()
        self._stopping = asyncio.Event()
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()
            await session.close()

    def start(self) -> FaultProxy:
        def main() -> None:
            # asyncio.run, not run_until_complete: the handlers still pending at stop (a watch
            # being forwarded) are cancelled and finished, not destroyed with the loop.
            asyncio.run(self._serve())

        self._thread = threading.Thread(target=main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class Toxiproxy:
    """A toxiproxy-server process and its HTTP API: proxies on loopback, toxics for a while."""

    def __init__(self, binary: Path, log: Path) -> None:
        self.binary = binary
        self.api_port = free_ports(1)[0]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> Toxiproxy:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), "-host", "127.0.0.1", "-port", str(self.api_port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call("GET", "/version")
                return self
            except (OSError, urllib.error.URLError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"toxiproxy did not start (log: {self.log})") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}", data=data, method=method
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def proxy(self, name: str, upstream: str) -> str:
        """A proxy from a fresh loopback port to ``upstream`` (host:port); its URL."""
        port = free_ports(1)[0]
        with contextlib.suppress(urllib.error.HTTPError):  # a proxy of that name from before
            self._call("DELETE", f"/proxies/{name}")
        self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream, "enabled": True},
        )
        return f"http://127.0.0.1:{port}"

    def add_toxic(
        self, proxy: str, name: str, kind: str, stream: str = "downstream", **attributes: int
    ) -> None:
        self._call(
            "POST",
            f"/proxies/{proxy}/toxics",
            {"name": name, "type": kind, "stream": stream, "attributes": attributes},
        )

    def remove_toxic(self, proxy: str, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    @contextlib.contextmanager
    def toxic(self, proxy: str, kind: str, both: bool = False, **attributes: int) -> Iterator[None]:
        """``kind`` on ``proxy`` (responses; ``both``: requests too) for the ``with`` block,
        removed on the way out, always."""
        names = []
        try:
            for stream in ("upstream", "downstream") if both else ("downstream",):
                name = f"{kind}-{stream}-{time.monotonic_ns()}"
                self.add_toxic(proxy, name, kind, stream, **attributes)
                names.append(name)
            yield
        finally:
            for name in names:
                self.remove_toxic(proxy, name)

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        """A disabled proxy refuses connections and closes the open ones."""
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})


def toxiproxy_binary(bin_dir: Path) -> Path | None:
    path = bin_dir / "toxiproxy-server"
    return (
        path if path.is_file() else (Path(p) if (p := shutil.which("toxiproxy-server")) else None)
    )
