"""Network stand-ins for client tests: a port nothing listens on, and a server that gives every
request the same answer (as an API server refusing a user does)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on, for as long as the block runs: it stays bound (and
    never listens), so a connection is refused and no other server can be handed the port. A
    port bound and let go at once was taken by a busy machine's next server now and then."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port: int = holder.getsockname()[1]
        yield port


@contextlib.contextmanager
def answering(status: int, body: bytes) -> Iterator[str]:
    """An HTTP server answering every request with ``status`` and ``body``: its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = do_POST = do_DELETE = _answer

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
