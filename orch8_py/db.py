"""Connections: URL validation, connecting with errors people can act on."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg_pool import PoolTimeout

from .errors import ConfigError, DatabaseUnavailable

CONNECT_TIMEOUT = 5


def validate_url(url: str, source: str = "ORCH8_DATABASE_URL") -> dict[str, Any]:
    """Parse a libpq URL or key=value string; raise ConfigError in one line if malformed."""
    if "://" in url and not url.startswith(("postgresql://", "postgres://")):
        scheme = url.split("://", 1)[0]
        raise ConfigError(f"{source} has scheme {scheme!r}; use postgresql://user@host:port/dbname")
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(
            f"{source} is not a valid PostgreSQL URL ({reason}); "
            "use postgresql://user@host:port/dbname"
        ) from None
    port = str(params.get("port") or "")
    if port and not all(p.isdigit() for p in port.split(",")):
        raise ConfigError(
            f"{source} is not a valid PostgreSQL URL (port {port!r} is not a number); "
            "use postgresql://user@host:port/dbname"
        )
    return params


# What a loop treats as "the database went away": reconnect and resume. A server that
# answers read-only (25006: a standby, or a primary demoted by a failover) is as gone as
# one that does not answer; its connection must be dropped, not reused.
CONNECTION_LOST: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
    PoolTimeout,
)


def drop_if_read_only(conn: psycopg.Connection[Any], exc: BaseException) -> None:
    """Close a connection that reached a read-only server, so a pool discards it instead
    of handing it out again."""
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) and not conn.closed:
        conn.close()


class OncePerWindow(logging.Filter):
    """Lets one record of each message shape through per ``window`` seconds; the next one
    let through says how many were held back. psycopg's pool warns on every failed
    reconnection attempt, which during a failover is dozens of lines a second."""

    def __init__(self, window: float = 10.0):
        super().__init__()
        self.window = window
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            last, held = self._seen.get(key, (None, 0))
            if last is not None and now - last < self.window:
                self._seen[key] = (last, held + 1)
                return False
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {self.window:g}s]"
        return True


def limit_pool_warnings(window: float = 10.0) -> None:
    """Install OncePerWindow on psycopg's pool logger (once per process)."""
    logger = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, OncePerWindow) for f in logger.filters):
        logger.addFilter(OncePerWindow(window))


# psycopg_pool waits 1, 2, 4, 8... seconds between attempts to reach a lost server, so a
# primary promoted 10 s after a failure is found at the 15 s attempt (measured with
# `make chaos-ha`). Between attempts orch8 waits at most this long instead.
RECONNECT_BACKOFF_CAP = 1.0


def cap_pool_reconnect_backoff(cap: float = RECONNECT_BACKOFF_CAP) -> None:
    """Make every psycopg pool of this process retry a lost server at least every ``cap``
    seconds (once per process). psycopg_pool has no setting for it: this replaces the
    attempt class its pool module uses with one whose delay is capped; with a
    psycopg_pool that has no such class it does nothing."""
    from psycopg_pool import pool

    attempt: Any = getattr(pool, "AttemptWithBackoff", None)
    if attempt is None or getattr(attempt, "orch8_cap", None) is not None:
        return

    class CappedAttempt(attempt):  # type: ignore[misc]
        orch8_cap = cap

        def update_delay(self, now: float) -> None:
            super().update_delay(now)
            self.delay: float = min(self.delay, self.orch8_cap)

    setattr(pool, "AttemptWithBackoff", CappedAttempt)  # noqa: B010 (not a public name)


# The least-privilege roles of migration 0010 (docs/SECURITY.md): what the runner and the
# operator service act as, whatever login their URL names.
RUNNER_ROLE = "orch8_runner"
WEB_ROLE = "orch8_web"


def as_role(url: str, role: str) -> str:
    """``url`` with the session switched to ``role`` from the first statement (libpq
    ``options=-c role=...``). The login must be ``role`` or a member of it: the login of
    ORCH8_RUNNER_DATABASE_URL is orch8_runner itself; the one URL of the quick start is the
    schema owner, a member of both (then a connection could RESET ROLE: not a boundary)."""
    params = conninfo.conninfo_to_dict(url)
    options = str(params.get("options") or "")
    return conninfo.make_conninfo(url, options=f"{options} -c role={role}".strip())


def describe(url: str) -> str:
    """Where a URL points, without its password, for messages. A multi-host URL (an HA
    cluster) shows each host:port: ``10.0.0.1:5432,10.0.0.2:5433/orch8``."""
    try:
        parts = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<invalid url>"
    hosts = str(parts.get("host") or "localhost").split(",")
    ports = str(parts.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    places = [
        h if h.startswith("/") else f"{h or 'localhost'}:{p or '5432'}"
        for h, p in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=False)
    ]
    return f"{','.join(places)}/{parts.get('dbname') or parts.get('user') or ''}"


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a connection, turning 'cannot reach the server' into one actionable line."""
    validate_url(url)
    kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0].removeprefix("connection failed: ") if text else "no answer"
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {describe(url)} ({reason}); "
            "check that the server is running and ORCH8_DATABASE_URL is right"
        ) from None
