"""Reads for watching the engine: the /metrics snapshot, the bench's latencies, and how
many instances are due or running."""

from __future__ import annotations

from typing import Any

from .base import Conn, Row, all_rows, value

# One statement, small aggregates: (metric, tenant, kind, state, blocking, n, seconds), by a
# function that reads every tenant's counts whoever calls (the web role included).
_METRICS = "SELECT * FROM orch8.metrics_snapshot()"


def metrics_snapshot(conn: Conn, *, timeout: str) -> list[tuple[Any, ...]]:
    """(metric, tenant, kind, state, blocking, n, seconds) rows for every tenant, in one
    round trip (pipelined with its statement timeout, e.g. '5s')."""
    with conn.pipeline(), conn.transaction():
        conn.execute("SELECT set_config('statement_timeout', %(t)s, true)", {"t": timeout})
        cur = conn.execute(_METRICS)
    return cur.fetchall()


def instances_in_flight(conn: Conn) -> int:
    """Instances of any tenant that are scheduled or running (work a new runner would take)."""
    n: int = value(
        conn,
        "SELECT count(*) FROM orch8.task_instances WHERE state IN ('scheduled', 'running')",
    )
    return n


def worker_task_lags(conn: Conn) -> list[Row]:
    """Per completed worker task, seconds from queued to claimed and to completed (from
    its events; bench/workers.py)."""
    return all_rows(
        conn,
        "SELECT extract(epoch FROM c.recorded_at - q.recorded_at)::float8 AS claimed_s,"
        " extract(epoch FROM d.recorded_at - q.recorded_at)::float8 AS completed_s"
        " FROM orch8.worker_task_events AS q"
        " JOIN orch8.worker_task_events AS c ON c.task_id = q.task_id AND c.event = 'claimed'"
        " JOIN orch8.worker_task_events AS d ON d.task_id = q.task_id AND d.event = 'completed'"
        " WHERE q.event = 'queued'",
    )
