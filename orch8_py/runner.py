"""The engine runner: a tick loop against PostgreSQL.

The loop keeps one connection, reconnects with capped exponential backoff when
PostgreSQL goes away, and stops when its stop event is set.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from . import db

log = logging.getLogger("orch8.runner")

MAX_BACKOFF = 5.0


class Runner:
    def __init__(self, url: str, tick_interval: float = 0.1):
        self.url = url
        self.tick_interval = tick_interval
        self.ticks = 0

    def tick(self, conn: psycopg.Connection) -> None:
        """One pass of the loop. Claiming and running steps arrive with durable execution."""
        conn.execute("SELECT orch8.now()").fetchone()
        self.ticks += 1

    def run(self, stop: threading.Event) -> None:
        log.info("event=runner.start tick_interval=%s", self.tick_interval)
        backoff = 0.1
        conn: psycopg.Connection | None = None
        while not stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = db.connect(self.url, autocommit=True)
                    backoff = 0.1
                self.tick(conn)
                stop.wait(self.tick_interval)
            except (psycopg.OperationalError, db.DatabaseUnavailable) as exc:
                log.warning("event=runner.db_lost error=%r retry_in=%.1fs", str(exc)[:200], backoff)
                if conn is not None:
                    conn.close()
                conn = None
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
        if conn is not None:
            conn.close()
        log.info("event=runner.stop ticks=%d", self.ticks)
