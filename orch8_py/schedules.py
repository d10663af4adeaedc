"""The schedule loop: fires due cron schedules from every runner process.

Everything that decides a fire is SQL (orch8.fire_due_schedules, docs/ARCHITECTURE.md
"Schedules (issue 12)"): due schedules are taken FOR UPDATE SKIP LOCKED, so any number of
runners can tick at once without firing a schedule twice, and each fire (the instance,
its history row, the advanced next fire time) commits in one transaction. This loop only
calls it every ``interval`` seconds (ORCH8_TICK_INTERVAL), again at once while whole
batches come back, and rides out lost connections like the runner's other loops.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from psycopg_pool import ConnectionPool

from . import db, sqlapi
from .sqlapi.base import Row

log = logging.getLogger("orch8.schedules")

BATCH = 100  # schedules per transaction
MAX_BATCHES = 50  # per tick: a backlog cannot keep the loop from seeing `stop`


class ScheduleFirer:
    """Calls orch8.fire_due_schedules on every tick, on a connection of ``pool``."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        worker_id: str,
        *,
        interval: float = 0.1,
        batch: int = BATCH,
    ):
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.pool = pool
        self.worker_id = worker_id
        self.interval = interval
        self.batch = batch
        self.fired = 0  # fires recorded by this loop (every outcome)

    def fire_once(self) -> list[Row]:
        """One transaction: up to ``batch`` due schedules fired; the fires recorded."""
        with self.pool.connection() as conn:
            try:
                return sqlapi.schedules.fire_due_schedules(
                    conn, limit=self.batch, actor=self.worker_id
                )
            except db.CONNECTION_LOST as exc:
                db.drop_if_read_only(conn, exc)  # a standby now: the pool must not reuse it
                raise

    def tick(self) -> int:
        """Fire batches until one comes back with fewer schedules than ``batch``; how many
        fires were recorded."""
        total = 0
        for _ in range(MAX_BATCHES):
            fires = self.fire_once()
            total += len(fires)
            for f in fires:
                if f["outcome"] == "failed":
                    log.error(
                        "event=schedule.fire_failed tenant=%s schedule=%s fire_at=%s error=%r",
                        f["tenant_id"],
                        f["schedule_id"],
                        f["fire_at"].isoformat(),
                        f["error"],
                    )
                    continue
                log.info(
                    "event=schedule.fire tenant=%s schedule=%s fire_at=%s outcome=%s instance=%s",
                    f["tenant_id"],
                    f["schedule_id"],
                    f["fire_at"].isoformat(),
                    f["outcome"],
                    f["instance_id"] or "-",
                )
            if len({(f["tenant_id"], f["schedule_id"]) for f in fires}) < self.batch:
                break
        self.fired += total
        return total

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. A lost connection (or a read-only server after a
        failover) is logged and tried again on the next tick; so is any other error, which
        rolls back only that transaction."""
        log.info("event=schedules.start worker=%s interval=%gs", self.worker_id, self.interval)
        while not stop.is_set():
            try:
                self.tick()
            except db.CONNECTION_LOST as exc:
                log.warning("event=schedules.db_lost error=%r", str(exc)[:200])
            except Exception:
                log.exception("event=schedules.error")
            stop.wait(self.interval)
        log.info("event=schedules.stop worker=%s fired=%d", self.worker_id, self.fired)
