"""A fake payment provider on loopback, for `orch8 demo` and for trying things by hand.

It behaves like a real card API in the one way that matters here: a charge sent twice
with the same ``Idempotency-Key`` is charged once, and the provider can be asked what
it did for a key::

    POST /v1/charges   {"amount": 1250, "currency": "EUR", "order_id": 1001}
                       Idempotency-Key: <key>
        -> 201 {"id": "ch_…", "receipt_id": "ch_…", "amount": 1250, "status": "succeeded", …}
        -> 200 with the same charge when the key was seen before (same request)
        -> 409 when the key was used for a different request, 400 for a bad body
    GET  /v1/charges?idempotency_key=<key>    the charge for that key, or 404
    GET  /v1/charges/by-key/<key>             the same
    GET  /v1/charges/<id>                     one charge, or 404
    GET  /v1/charges                          {"data": [every charge, oldest first]}
    GET  /health                              {"status": "ok"}

Charges live in memory (gone when it stops). Only ever binds loopback.

Faults, for the demo and the tests (``fail_next``, for any order or one): ``slow``
charges and then answers after a delay (a client that gave up earlier never learns it
was charged), ``drop`` closes the connection before charging (nothing charged, the
client cannot tell); ``lookup_down`` (or ``lookup_down_orders``, for some) makes the
lookups answer 503 (a verifier cannot tell either).

    python -m orch8_py.demo.provider --port 8099
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigError, cannot_listen

LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_PORT = 8099
MAX_BODY = 64 * 1024


class FakeProvider:
    """The provider: ``start()``, ``url``, ``stop()``; also a context manager."""

    def __init__(
        self, port: int = 0, host: str = "127.0.0.1", verbose: bool = False, flag: str = "--port"
    ):
        if host not in LOOPBACK:
            raise ConfigError(f"the fake provider only binds loopback, not {host!r}")
        if not 0 <= port < 65536:
            raise ConfigError(f"port {port} is not a TCP port (0 picks a free one)")
        self.host = host
        self.requested_port = port
        self.verbose = verbose
        self.flag = flag  # named in the "port in use" error
        self.requests = 0  # POST /v1/charges received, repeats included
        self._charges: dict[str, dict[str, Any]] = {}  # id -> charge
        self._by_key: dict[str, str] = {}  # idempotency key -> charge id
        self._fingerprints: dict[str, str] = {}  # idempotency key -> request fingerprint
        self._lock = threading.Lock()
        self._faults: list[tuple[str, float, Any]] = []  # (kind, delay, order id or None)
        self.lookup_down = False  # lookups answer 503
        self.lookup_down_orders: set[Any] = set()  # ...for the charges of these orders
        self.lookup_delay = 0.0  # seconds a lookup takes
        self.lookups = 0  # lookup requests received
        self._looking: collections.Counter[str] = collections.Counter()  # key -> in flight
        self.max_parallel_lookups = 0  # of one key, ever: two verifiers at once would show
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- the ledger ---------------------------------------------------------------------

    def charge(self, body: Any, key: str | None) -> tuple[int, dict[str, Any]]:
        """Create (or, for a known key, return) a charge: (HTTP status, JSON reply)."""
        problem = _check_charge(body)
        if problem:
            return 400, {"error": {"type": "invalid_request", "message": problem}}
        fingerprint = json.dumps(
            [body["amount"], body["currency"], body.get("order_id")], sort_keys=True
        )
        with self._lock:
            self.requests += 1
            if key is not None and key in self._by_key:
                if self._fingerprints[key] != fingerprint:
                    return 409, {
                        "error": {
                            "type": "idempotency_error",
                            "message": f"idempotency key {key!r} was used for a different request",
                        }
                    }
                return 200, dict(self._charges[self._by_key[key]])
            charge_id = f"ch_{secrets.token_hex(8)}"
            charge = {
                "id": charge_id,
                "object": "charge",
                "receipt_id": charge_id,
                "amount": body["amount"],
                "currency": body["currency"],
                "order_id": body.get("order_id"),
                "status": "succeeded",
                "idempotency_key": key,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            self._charges[charge_id] = charge
            if key is not None:
                self._by_key[key] = charge_id
                self._fingerprints[key] = fingerprint
            return 201, dict(charge)

    def fail_next(
        self, kind: str, count: int = 1, delay: float = 0.0, order_id: Any = None
    ) -> None:
        """The next ``count`` charge requests (of ``order_id``, when given): ``slow``
        (charge, then answer after ``delay`` seconds) or ``drop`` (close the connection
        without charging)."""
        if kind not in ("slow", "drop"):
            raise ValueError(f"unknown fault {kind!r} (slow or drop)")
        with self._lock:
            self._faults.extend([(kind, delay, order_id)] * count)

    def _next_fault(self, body: Any) -> tuple[str, float] | None:
        order_id = body.get("order_id") if isinstance(body, dict) else None
        with self._lock:
            for i, (kind, delay, for_order) in enumerate(self._faults):
                if for_order is None or for_order == order_id:
                    del self._faults[i]
                    return kind, delay
        return None

    @contextlib.contextmanager
    def _lookup(self, key: str) -> Iterator[None]:
        with self._lock:
            self.lookups += 1
            self._looking[key] += 1
            self.max_parallel_lookups = max(self.max_parallel_lookups, self._looking[key])
        try:
            if self.lookup_delay:
                time.sleep(self.lookup_delay)
            yield
        finally:
            with self._lock:
                self._looking[key] -= 1

    def charges_for_key(self, key: str) -> int:
        """How many charges the key made (the provider keeps one per key: 0 or 1)."""
        with self._lock:
            return sum(1 for c in self._charges.values() if c.get("idempotency_key") == key)

    def charge_for_key(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            charge_id = self._by_key.get(key)
            return dict(self._charges[charge_id]) if charge_id else None

    def get(self, charge_id: str) -> dict[str, Any] | None:
        with self._lock:
            charge = self._charges.get(charge_id)
            return dict(charge) if charge else None

    def charges(self) -> list[dict[str, Any]]:
        """Every charge, oldest first."""
        with self._lock:
            return [dict(c) for c in self._charges.values()]

    def charges_for_order(self, order_id: Any) -> list[dict[str, Any]]:
        return [c for c in self.charges() if c["order_id"] == order_id]

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake provider is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> FakeProvider:
        """Listen and serve on a thread; ConfigError (one line) when the port is taken."""
        if self._server is not None:
            return self
        handler = _handler_for(self)
        host = self.host

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            # socketserver listens with a backlog of 5; a runner posting from many threads
            # overflows it and the kernel resets connections (an ambiguous "unknown").
            request_queue_size = 1024

            def handle_error(  # quiet on client hang-ups
                self,
                request: socket.socket | tuple[bytes, socket.socket],
                client_address: tuple[Any, ...],
            ) -> None:
                pass

        try:
            self._server = Server((self.host, self.requested_port), handler)
        except OSError as exc:
            raise cannot_listen(
                exc,
                self.host,
                self.requested_port,
                server="the fake provider",
                remedy=f"stop the other process or pick another port with {self.flag} "
                "(0 picks a free one)",
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="fake-provider",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_charge(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the body must be a JSON object {amount, currency, order_id}"
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        return "amount must be a positive integer (minor units, e.g. cents)"
    currency = body.get("currency")
    if not isinstance(currency, str) or not (3 <= len(currency) <= 8):
        return "currency must be a currency code such as EUR"
    return None


def _handler_for(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "orch8-fake-provider/1"

        def log_message(self, format: str, *args: Any) -> None:
            if provider.verbose:
                sys.stderr.write(f"fake-provider: {self.address_string()} {format % args}\n")

        def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = (json.dumps(payload, indent=None) + "\n").encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            except OSError:  # the client went away
                self.close_connection = True

        def _not_found(self, what: str) -> None:
            self._reply(404, {"error": {"type": "not_found", "message": what}})

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True
                return self._reply(413, {"error": {"type": "invalid_request"}})
            raw = self.rfile.read(length) if length else b""
            if parts.path.rstrip("/") != "/v1/charges":
                return self._not_found(f"no route POST {parts.path}")
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return self._reply(
                    400, {"error": {"type": "invalid_request", "message": "body is not JSON"}}
                )
            key = self.headers.get("Idempotency-Key") or None
            fault = provider._next_fault(body)
            if fault is not None and fault[0] == "drop":  # gone before anything was charged
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            status, reply = provider.charge(body, key)
            if fault is not None:  # slow: charged, the answer comes late
                time.sleep(fault[1])
            headers = {"Location": f"/v1/charges/{reply['id']}"} if status == 201 else None
            if status == 200:
                headers = {"Idempotent-Replayed": "true"}
            self._reply(status, reply, headers)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/")
            if path == "/health":
                return self._reply(200, {"status": "ok"})
            if path == "/v1/charges":
                keys = parse_qs(parts.query).get("idempotency_key")
                if not keys:
                    return self._reply(200, {"data": provider.charges()})
                return self._by_key(keys[0])
            if path.startswith("/v1/charges/by-key/"):
                return self._by_key(unquote(path.removeprefix("/v1/charges/by-key/")))
            if path.startswith("/v1/charges/"):
                charge_id = unquote(path.removeprefix("/v1/charges/"))
                charge = provider.get(charge_id)
                if charge is None:
                    return self._not_found(f"no charge {charge_id}")
                return self._reply(200, charge)
            self._not_found(f"no route GET {parts.path}")

        def _by_key(self, key: str) -> None:
            with provider._lookup(key):
                charge = provider.charge_for_key(key)
                if provider.lookup_down or (
                    charge is not None and charge["order_id"] in provider.lookup_down_orders
                ):
                    return self._reply(
                        503, {"error": {"type": "unavailable", "message": "lookups are down"}}
                    )
                if charge is None:
                    return self._not_found(f"no charge for idempotency key {key}")
                self._reply(200, charge)

        do_HEAD = do_GET

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m orch8_py.demo.provider",
        description="A fake payment provider on 127.0.0.1 (charges kept in memory).",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"listen port (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    p.add_argument("--quiet", action="store_true", help="do not log each request")
    args = p.parse_args(argv)
    try:
        provider = FakeProvider(args.port, verbose=not args.quiet).start()
    except ConfigError as exc:
        print(f"fake-provider: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"fake-provider: listening on {provider.url} (Ctrl-C to stop)", flush=True)
    print(
        f"  curl -X POST {provider.url}/v1/charges -H 'Idempotency-Key: k1' "
        """-d '{"amount": 1250, "currency": "EUR", "order_id": 1}'""",
        flush=True,
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        provider.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
