"""Reads for watching the engine: the /metrics snapshot, the bench's latencies, and how
many instances are due or running."""

from __future__ import annotations

from typing import Any

from .base import Conn, all_rows, one, value

# One statement, small aggregates: (metric, tenant, kind, state, blocking, n, seconds).
# A receipt whose instance row is gone blocks nothing (blocking NULL in the view).
_METRICS = """
SELECT 'unresolved'::text AS metric, u.tenant_id AS tenant, u.kind, u.state::text AS state,
       coalesce(u.blocking, false) AS blocking,
       count(*) AS n, extract(epoch FROM max(u.age))::float8 AS seconds
FROM orch8.unresolved_effects AS u
GROUP BY u.tenant_id, u.kind, u.state, coalesce(u.blocking, false)
UNION ALL
SELECT 'instances', t.tenant_id, NULL, t.state::text, NULL, count(*), NULL
FROM orch8.task_instances AS t
GROUP BY t.tenant_id, t.state
UNION ALL
SELECT 'webhooks', w.tenant_id, NULL, w.state, NULL, count(*), NULL
FROM orch8.webhook_outbox AS w
GROUP BY w.tenant_id, w.state
UNION ALL
SELECT 'verifications', v.tenant_id, NULL, v.state, NULL, count(*), NULL
FROM orch8.effect_verifications AS v
WHERE v.state <> 'settled'
GROUP BY v.tenant_id, v.state
UNION ALL
SELECT 'lease_reclaims', NULL, NULL, NULL, NULL, count(*), NULL
FROM orch8.instance_transitions AS x
WHERE x.actor = 'lease-sweep'
"""


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


def completion_counts(conn: Conn) -> dict[str, int]:
    """How many instances of every tenant completed and failed."""
    row = one(
        conn,
        "SELECT count(*) FILTER (WHERE state = 'completed') AS completed,"
        " count(*) FILTER (WHERE state = 'failed') AS failed FROM orch8.task_instances",
    )
    return {"completed": row["completed"], "failed": row["failed"]}


def run_latencies(conn: Conn) -> list[float]:
    """Seconds from first claim to completion, per completed instance."""
    return [
        r["seconds"]
        for r in all_rows(
            conn,
            "SELECT extract(epoch FROM max(at) FILTER (WHERE to_state = 'completed')"
            " - min(at) FILTER (WHERE to_state = 'running'))::float8 AS seconds"
            " FROM orch8.instance_transitions GROUP BY instance_id",
        )
        if r["seconds"] is not None
    ]
