"""Outbound webhooks: signing, verification and the delivery loop.

The database writes ``instance.completed`` and ``instance.failed`` to ``orch8.webhook_outbox``
in the transaction that moved the instance (a trigger, see sql/migrations/0004_webhooks.sql).
A :class:`WebhookDeliverer` claims due rows in one round trip, POSTs each one signed with
the subscription's secret, and records every attempt; failures go back to pending with
exponential backoff, or are parked after ``max_attempts``. Delivery is at-least-once:
receivers dedupe on ``X-Orch8-Delivery``.

Signature: ``X-Orch8-Signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}." + body)>``
with ``X-Orch8-Timestamp`` in unix seconds. Receivers check it with :func:`verify`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from . import __version__, db, sqlapi
from .errors import DatabaseUnavailable
from .sqlapi.base import Conn

log = logging.getLogger("orch8.webhooks")
T = TypeVar("T")

SIGNATURE_PREFIX = "sha256="
DEFAULT_TOLERANCE = 300.0  # seconds a receiver accepts between X-Orch8-Timestamp and now
USER_AGENT = f"orch8-py/{__version__} (webhooks)"
MAX_RECONNECT_BACKOFF = 10.0
STOP_CHECK = 0.25  # seconds between looks at the stop event while waiting
ERROR_SNIPPET = 300  # bytes of a failed response body kept in last_error
DRAIN_LIMIT = 64 * 1024  # bytes of a response read before closing it

LOG_EVENTS = {
    "delivered": "webhook.delivered",
    "pending": "webhook.retry_scheduled",
    "parked": "webhook.parked",
    "stale": "webhook.stale_claim",
}


# --- signing ---------------------------------------------------------------------------


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def sign(secret: str | bytes, timestamp: int | str, body: bytes | str) -> str:
    """Hex HMAC-SHA256 of ``f"{timestamp}."`` + body under secret (without the prefix)."""
    message = f"{timestamp}.".encode() + _bytes(body)
    return hmac.new(_bytes(secret), message, hashlib.sha256).hexdigest()


def verify(
    secret: str | bytes,
    timestamp: int | str,
    body: bytes | str,
    signature_header: str | None,
    *,
    tolerance: float | None = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> bool:
    """For receivers: is ``signature_header`` (``sha256=<hex>``) valid for this body?

    Pass the raw request body (bytes, before any JSON parsing) and the X-Orch8-Timestamp
    header as received. The comparison is constant-time. With ``tolerance`` (seconds,
    default 300) a timestamp further than that from ``now`` is refused, which limits
    replays; ``tolerance=None`` skips the check.
    """
    if not isinstance(signature_header, str) or not signature_header.startswith(SIGNATURE_PREFIX):
        return False
    ts = str(timestamp).strip()
    if not ts.isascii() or not ts.isdigit():
        return False
    if tolerance is not None:
        current = time.time() if now is None else now
        if abs(current - int(ts)) > tolerance:
            return False
    expected = sign(secret, ts, body).encode("ascii")
    given = signature_header[len(SIGNATURE_PREFIX) :].strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected, given)


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The request body: compact JSON with sorted keys (what the signature covers)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")


def build_headers(
    secret: str | bytes, event: str, delivery_id: int | str, body: bytes, timestamp: int
) -> dict[str, str]:
    """The headers of one delivery attempt."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Orch8-Event": event,
        "X-Orch8-Delivery": str(delivery_id),
        "X-Orch8-Timestamp": str(timestamp),
        "X-Orch8-Signature": SIGNATURE_PREFIX + sign(secret, timestamp, body),
    }


# --- HTTP ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What one POST gave: ok (a 2xx), the HTTP status if any, an error text on failure."""

    ok: bool
    status: int | None
    error: str | None
    elapsed: float


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is not followed: the 3xx itself is the (failed) answer."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> None:
        return None


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(_NoRedirect)


def _classify(exc: BaseException) -> str:
    """An error class for last_error: dns, connect, tls, timeout or other."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return "dns"
    if isinstance(reason, ssl.SSLError | ssl.CertificateError):
        return "tls"
    if isinstance(reason, TimeoutError):
        return "timeout"
    if isinstance(reason, ConnectionError | OSError):
        return "connect"
    return "other"


def _snippet(data: bytes) -> str:
    text = data[:ERROR_SNIPPET].decode("utf-8", "replace")
    return " ".join(text.split())


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    opener: urllib.request.OpenerDirector | None = None,
) -> Attempt:
    """POST once. Never raises: any failure (network, status, bad URL) is an Attempt."""
    opener = opener or _opener()
    started = time.monotonic()
    try:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with opener.open(request, timeout=timeout) as response:
            status = response.status
            response.read(DRAIN_LIMIT)
        ok = 200 <= status < 300
        return Attempt(ok, status, None if ok else f"http_status: {status}", _since(started))
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            detail = _snippet(exc.read(ERROR_SNIPPET))
        except Exception:
            detail = ""
        finally:
            exc.close()
        if 300 <= status < 400:
            where = exc.headers.get("Location", "") if exc.headers else ""
            error = f"redirect_rejected: {status} to {where}".rstrip()
        else:
            error = f"http_status: {status}" + (f" {detail}" if detail else "")
        return Attempt(False, status, error, _since(started))
    except Exception as exc:  # a bad endpoint must never stop the loop
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        error = f"{_classify(exc)}: {type(reason).__name__}: {reason}"
        return Attempt(False, None, error, _since(started))


def _since(started: float) -> float:
    return time.monotonic() - started


# --- logging ---------------------------------------------------------------------------


def _kv(**fields: Any) -> str:
    """key=value pairs; values with spaces, quotes or '=' are JSON-quoted."""
    parts = []
    for key, value in fields.items():
        if value is None:
            continue
        text = str(value)
        if not text or any(c in text for c in ' "=\n\t'):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _host(url: str) -> str:
    """Where a URL points, for logs: never the path, query or credentials (they hold tokens)."""
    try:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "<invalid url>"


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


# --- the delivery loop -----------------------------------------------------------------


class WebhookDeliverer:
    """Claims due outbox rows, POSTs them, records each result.

    ``url_or_pool`` is a libpq URL (the deliverer keeps one autocommit connection of its
    own, :attr:`conn`) or a ``psycopg_pool.ConnectionPool`` (a connection is borrowed per
    call). ``worker_id`` must be unique among running deliverers: a result is recorded only
    while the row is still claimed by this id. ``backoff`` and ``timeout`` are seconds or
    timedeltas. POSTs of a batch run ``concurrency`` at a time; the claim's lease covers the
    slowest possible batch unless ``lease`` is given.
    """

    def __init__(
        self,
        url_or_pool: Any,
        worker_id: str,
        batch: int = 20,
        max_attempts: int = 8,
        backoff: float | timedelta = 5.0,
        timeout: float | timedelta = 10.0,
        *,
        concurrency: int = 8,
        lease: float | timedelta | None = None,
        poll_interval: float = 1.0,
    ):
        if not worker_id:
            raise ValueError("a webhook deliverer needs a worker id")
        if batch < 1 or max_attempts < 1 or concurrency < 1:
            raise ValueError("batch, max_attempts and concurrency must be >= 1")
        self.worker_id = worker_id
        self.batch = batch
        self.max_attempts = max_attempts
        self.backoff = timedelta(seconds=_seconds(backoff))
        self.timeout = _seconds(timeout)
        self.concurrency = concurrency
        if lease is None:
            # urllib's timeout bounds each blocking step (connect, send, each read), so
            # allow three per POST, for every wave of `concurrency` POSTs, plus a margin.
            lease = math.ceil(batch / concurrency) * 3 * self.timeout + 30
        self.lease = timedelta(seconds=_seconds(lease))
        self.poll_interval = poll_interval
        self.delivered = 0
        self.failed = 0
        self._opener = _opener()
        if isinstance(url_or_pool, str):
            db.validate_url(url_or_pool)
            self._url: str | None = url_or_pool
            self._pool = None
        else:
            self._url = None
            self._pool = url_or_pool
        self._conn: psycopg.Connection | None = None
        self._listen_conn: psycopg.Connection | None = None

    # connections

    @property
    def conn(self) -> psycopg.Connection:
        """The deliverer's own autocommit connection (URL mode), opened on first use."""
        if self._url is None:
            raise TypeError("a deliverer built on a pool has no connection of its own")
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self._url, autocommit=True)
        return self._conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        if self._pool is None:
            yield self.conn
        else:
            with self._pool.connection() as conn:
                yield conn

    def _call(self, fn: Callable[[Conn], T]) -> T:
        """One door call in its own transaction (committed unless autocommit)."""
        with self._connection() as conn:
            result = fn(conn)
            if not conn.autocommit:
                conn.commit()
            return result

    def close(self) -> None:
        for c in (self._conn, self._listen_conn):
            if c is not None and not c.closed:
                c.close()
        self._conn = None
        self._listen_conn = None

    def __enter__(self) -> WebhookDeliverer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # one pass

    def deliver_once(self) -> int:
        """Claim up to ``batch`` due deliveries, POST them, record each result.

        Returns how many were attempted. Database errors propagate (the rows stay claimed
        until the lease expires, then are delivered again); endpoint errors never do.
        """
        rows = self._call(
            lambda c: sqlapi.webhooks.claim_deliveries(
                c, worker=self.worker_id, batch=self.batch, lease=self.lease
            )
        )
        if not rows:
            return 0
        workers = min(self.concurrency, len(rows))
        with ThreadPoolExecutor(workers, thread_name_prefix="orch8-webhook") as pool:
            futures = {pool.submit(self._attempt, row): row for row in rows}
            for future in as_completed(futures):
                self._record(futures[future], future.result())
        return len(rows)

    def _attempt(self, row: dict[str, Any]) -> Attempt:
        try:
            body = encode_payload(row["payload"])
            headers = build_headers(row["secret"], row["event"], row["id"], body, int(time.time()))
            return post(row["url"], body, headers, self.timeout, self._opener)
        except Exception as exc:  # never let one row break the batch
            return Attempt(False, None, f"other: {type(exc).__name__}: {exc}", 0.0)

    def _record(self, row: dict[str, Any], attempt: Attempt) -> str:
        state = self._call(
            lambda c: sqlapi.webhooks.record_delivery(
                c,
                tenant_id=row["tenant_id"],
                delivery_id=row["id"],
                worker=self.worker_id,
                ok=attempt.ok,
                status=attempt.status,
                error=attempt.error,
                max_attempts=self.max_attempts,
                backoff=self.backoff,
            )
        )
        if attempt.ok:
            self.delivered += 1
        else:
            self.failed += 1
        fields = _kv(
            event=LOG_EVENTS.get(state, "webhook.recorded"),
            state=state,
            tenant=row["tenant_id"],
            delivery=row["id"],
            webhook_event=row["event"],
            instance=row["instance_id"],
            endpoint=_host(row["url"]),
            attempt=row["attempts"] + 1,
            status=attempt.status,
            elapsed_ms=round(attempt.elapsed * 1000),
            error=attempt.error,
        )
        if state == "parked":
            log.error("%s", fields)
        elif state in ("pending", "stale"):
            log.warning("%s", fields)
        else:
            log.info("%s", fields)
        return state

    # the loop

    def _listener(self) -> psycopg.Connection:
        """The connection that LISTENs: our own one, or (pool mode) a dedicated one."""
        if self._pool is None:
            conn = self.conn
        else:
            if self._listen_conn is None or self._listen_conn.closed:
                kwargs = {**(getattr(self._pool, "kwargs", None) or {}), "autocommit": True}
                self._listen_conn = psycopg.connect(self._pool.conninfo, **kwargs)
            conn = self._listen_conn
        return conn

    def _wait(self, conn: psycopg.Connection, stop: threading.Event) -> None:
        """Until a NOTIFY on orch8_webhooks, poll_interval or stop, whichever comes first."""
        deadline = time.monotonic() + self.poll_interval
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for _ in conn.notifies(timeout=min(remaining, STOP_CHECK), stop_after=1):
                return

    def run(self, stop: threading.Event) -> None:
        """Deliver until ``stop`` is set. Survives lost connections and bad endpoints."""
        log.info(
            "%s",
            _kv(
                event="webhook.start",
                worker=self.worker_id,
                batch=self.batch,
                max_attempts=self.max_attempts,
                backoff_s=self.backoff.total_seconds(),
                timeout_s=self.timeout,
            ),
        )
        backoff = 0.1
        listener: psycopg.Connection | None = None
        try:
            while not stop.is_set():
                try:
                    if listener is None or listener.closed:
                        listener = self._listener()
                        sqlapi.webhooks.listen_for_deliveries(listener)
                    attempted = self.deliver_once()
                    backoff = 0.1
                    if attempted >= self.batch:
                        continue  # maybe more are due: no waiting
                    self._wait(listener, stop)
                except (psycopg.Error, DatabaseUnavailable) as exc:
                    log.warning(
                        "%s",
                        _kv(
                            event="webhook.db_error",
                            worker=self.worker_id,
                            error=str(exc).strip()[:200],
                            retry_in_s=round(backoff, 2),
                        ),
                    )
                    self.close()
                    listener = None
                    stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF)
                except Exception:
                    log.exception("%s", _kv(event="webhook.loop_error", worker=self.worker_id))
                    stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF)
        finally:
            self.close()
            log.info(
                "%s",
                _kv(
                    event="webhook.stop",
                    worker=self.worker_id,
                    delivered=self.delivered,
                    failed=self.failed,
                ),
            )
