"""``/healthz`` served by every replica from the moment it starts, leader or standby.

kopf's own liveness endpoint only exists once kopf runs, i.e. after the Lease is taken, so a
standby replica would look dead and be restarted by its liveness probe. This endpoint lives on
the operator's event loop: it answers while the loop is responsive, whatever the role, and says
which role that is. A leader whose watches or reconcile loop fail does not linger unhealthy: the
answer turns 503 with the reason (``liveness.py``), the operator returns and the
process exits non-zero; while it only retries (API server away) it answers 200 and says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web

from gpu_operator.controller.runtime.liveness import OK, Verdict


def parse_endpoint(endpoint: str) -> tuple[str, int, str]:
    """``http://HOST:PORT/PATH`` → (host, port, path); a clear error for anything else."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"health endpoint must look like http://HOST:PORT/PATH, got {endpoint!r}")
    return parts.hostname, parts.port, parts.path or "/healthz"


class HealthServer:
    """A tiny aiohttp server; ``role`` is asked on each request (``leader`` or ``standby``)."""

    def __init__(
        self,
        endpoint: str,
        role: Callable[[], str],
        verdict: Callable[[], Verdict] = lambda: OK,
    ) -> None:
        self.host, self.port, self.path = parse_endpoint(endpoint)
        self._role = role
        self._verdict = verdict
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _: web.Request) -> web.Response:
        verdict = self._verdict()
        body: dict[str, str] = {"status": verdict.state, "role": self._role()}
        if verdict.reason:
            body["reason"] = verdict.reason
        return web.Response(
            status=200 if verdict.alive else 503,
            text=json.dumps(body),
            content_type="application/json",
        )

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(self.path, self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
