"""A real HTTP server for tests: records every request and replies from a script.

As a pytest fixture named ``provider`` (started on 127.0.0.1, a free port, stopped after
the test). Import it into the test module; ``provider_fixture`` is the lint-friendly
spelling (importing ``provider`` itself also works but ruff flags F811 on each use)::

    from tests.http_provider import provider_fixture  # noqa: F401  (fixture "provider")

    def test_x(provider):
        provider.reply("/charge", status=503)             # next reply on /charge
        provider.reply("/charge", json={"ok": True}, delay=0.5)
        ... provider.url + "/charge" ...
        assert provider.requests[0].headers["idempotency-key"] == "..."

As a plain object (a subprocess test, a benchmark)::

    p = Provider().start()
    try:
        ...
    finally:
        p.stop()

Replies on a path come from its queue, first in first out; when the queue is empty, from
the first ``always(prefix, ...)`` whose prefix the path starts with; else the default is
200 ``{"ok": true, "receipt_id": "r-<n>"}`` where n counts requests from 1.
A reply may also ``drop`` the connection without answering (a broken connection).
Only ever binds loopback.
"""

from __future__ import annotations

import collections
import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest


@dataclass
class Reply:
    status: int = 200
    json: Any = None
    body: str | bytes | None = None  # used when json is None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering
    drop: bool = False  # close the connection without an answer


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # names lowercased
    body: bytes
    n: int  # 1-based arrival number

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Provider:
    def __init__(self, host: str = "127.0.0.1"):
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the test provider only binds loopback")
        self.host = host
        self.requests: list[Recorded] = []
        self._queues: dict[str, collections.deque[Reply]] = collections.defaultdict(
            collections.deque
        )
        self._always: list[tuple[str, Reply]] = []  # (path prefix, reply) when no queue has one
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- scripting ----------------------------------------------------------------------

    def reply(
        self,
        path: str,
        status: int = 200,
        json: Any = None,
        *,
        body: str | bytes | None = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        drop: bool = False,
    ) -> Provider:
        """Queue one reply for the next request on ``path`` (the query string is ignored)."""
        return self.script(path, Reply(status, json, body, dict(headers or {}), delay, drop))

    def script(self, path: str, *replies: Reply) -> Provider:
        with self._lock:
            self._queues[path].extend(replies)
        return self

    def always(
        self,
        prefix: str,
        status: int = 200,
        json: Any = None,
        *,
        body: str | bytes | None = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        drop: bool = False,
    ) -> Provider:
        """Answer every request whose path starts with ``prefix`` (and has nothing queued)
        this way, until ``clear``: for paths not known in advance (a key in the path)."""
        with self._lock:
            self._always.append(
                (prefix, Reply(status, json, body, dict(headers or {}), delay, drop))
            )
        return self

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()
            self._always.clear()
            self.requests.clear()

    def requests_to(self, path: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the provider is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Provider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # quiet
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                with provider._lock:
                    n = len(provider.requests) + 1
                    provider.requests.append(
                        Recorded(
                            self.command,
                            parts.path,
                            parts.query,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            n,
                        )
                    )
                    queue = provider._queues.get(parts.path)
                    reply = queue.popleft() if queue else None
                    if reply is None:
                        reply = next(
                            (r for p, r in provider._always if parts.path.startswith(p)), None
                        )
                if reply is None:
                    reply = Reply(json={"ok": True, "receipt_id": f"r-{n}"})
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.drop:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(2)
                    return
                if reply.json is not None:
                    payload = json.dumps(reply.json).encode()
                    ctype = "application/json"
                else:
                    raw = reply.body or b""
                    payload = raw.encode() if isinstance(raw, str) else raw
                    ctype = "text/plain; charset=utf-8"
                try:
                    self.send_response(reply.status)
                    headers = {"Content-Type": ctype, **reply.headers}
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                except OSError:  # the client gave up (a timeout test)
                    pass
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = family
            # socketserver's default backlog is 5: with 16 runner threads posting at once the
            # kernel overflows it and resets connections, which the engine rightly records as
            # "may have been received". Real providers listen with a deep backlog.
            request_queue_size = 1024

            def handle_error(self, request, client_address):  # quiet on client hang-ups
                pass

        self._server = Server((self.host, 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="test-http-provider",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Provider:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(name="provider")
def provider_fixture():
    """A started Provider on 127.0.0.1, as the fixture ``provider``."""
    p = Provider().start()
    try:
        yield p
    finally:
        p.stop()


# The same fixture under its own name. ``from tests.http_provider import provider`` works,
# but ruff then reports F811 on every test parameter named provider; importing
# provider_fixture (fixture name still ``provider``) keeps the test module lint-clean.
provider = provider_fixture
