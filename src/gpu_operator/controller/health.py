"""``/healthz`` served by every replica from the moment it starts, leader or standby.

An endpoint that only existed once the watches run, i.e. after the Lease is taken, would make a
standby replica look dead and be restarted by its liveness probe. This endpoint lives on
the operator's event loop: it answers while the loop is responsive, whatever the role, and says
which role that is. A leader whose watches or reconcile loop fail does not linger unhealthy: the
operator returns and the process exits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web


def parse_endpoint(endpoint: str) -> tuple[str, int, str]:
    """``http://HOST:PORT/PATH`` → (host, port, path); a clear error for anything else."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"health endpoint must look like http://HOST:PORT/PATH, got {endpoint!r}")
    return parts.hostname, parts.port, parts.path or "/healthz"


class HealthServer:
    """A tiny aiohttp server; ``role`` is asked on each request (``leader`` or ``standby``)."""

    def __init__(self, endpoint: str, role: Callable[[], str]) -> None:
        self.host, self.port, self.path = parse_endpoint(endpoint)
        self._role = role
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps({"status": "ok", "role": self._role()}),
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
