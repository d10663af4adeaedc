"""What bench/ reads beyond the engine's own functions: the commit and WAL counters and
the run's own WAL around a run, the settings that explain its numbers, the claim-rate
loop, and the status of a DBOS Transact system database run side by side with ours."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from .base import Conn, all_rows, one, value

# The settings a reader needs to compare two bench results (durability and WAL volume).
SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "wal_level",
    "max_wal_size",
    "fsync",
    "full_page_writes",
    "checkpoint_timeout",
    "wal_compression",
    "max_connections",
)


@dataclass(frozen=True)
class Counters:
    """A snapshot to subtract from a later one."""

    commits: int  # this database's xact_commit
    rollbacks: int  # this database's xact_rollback
    server_commits: int  # xact_commit summed over every database of the server
    wal_bytes: int  # pg_current_wal_lsn() as a byte offset: the whole server's WAL


def counters(conn: Conn) -> Counters:
    """The counters now. ``conn`` must be in autocommit: a transaction would keep serving
    the statistics snapshot it took first."""
    if conn.info.server_version >= 150000:
        # Our own backend's commits are otherwise flushed to the shared statistics up to a
        # second late (PostgreSQL 15 batches them), and would land on the wrong side.
        value(conn, "SELECT pg_stat_force_next_flush()")
    row = one(
        conn,
        "SELECT d.xact_commit AS commits, d.xact_rollback AS rollbacks,"
        " (SELECT sum(xact_commit) FROM pg_stat_database)::bigint AS server_commits,"
        " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal_bytes"
        " FROM pg_stat_database AS d WHERE d.datname = current_database()",
    )
    return Counters(
        commits=int(row["commits"]),
        rollbacks=int(row["rollbacks"]),
        server_commits=int(row["server_commits"]),
        wal_bytes=int(row["wal_bytes"]),
    )


def wal_position(conn: Conn) -> int:
    """pg_current_wal_lsn() as a byte offset (read the moment a run ends, before the engine
    shuts down and writes its own)."""
    n: int = value(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
    return n


def watch_wal(conn: Conn) -> bool:
    """Make this database's own WAL countable (database_wal_bytes) for as long as ``conn``
    stays open: pg_walinspect here, and a temporary physical replication slot, which keeps
    the server from recycling the run's WAL before it is read and goes with the session.
    False when the server will not (no superuser, no contrib, no free slot): only the
    whole server's WAL is known then."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        value(
            conn,
            "SELECT pg_create_physical_replication_slot('orch8_bench_' || pg_backend_pid(),"
            " immediately_reserve => true, temporary => true)",
        )
    except psycopg.Error:
        return False
    return True


@dataclass(frozen=True)
class Wal:
    bytes: int
    fpi_bytes: int  # full-page images among them: the first change to a page after a
    # checkpoint logs the whole page, so a short run on a fresh database is heavy in them


def database_wal(conn: Conn, *, start: int, end: int) -> Wal:
    """The WAL records between byte offsets ``start`` and ``end`` that belong to this
    database: those touching its relations, and the commit (and any other record) of a
    transaction that did. The server's own records (checkpoints, running-xacts) and every
    other database's are left out. Needs watch_wal first."""
    # pg_walinspect reads only flushed WAL, and refuses a window that starts beyond it
    flushed: int = value(conn, "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint")
    end = min(end, flushed)
    if end <= start:
        return Wal(bytes=0, fpi_bytes=0)
    row = one(
        conn,
        "WITH r AS MATERIALIZED ("
        "  SELECT xid, record_length, fpi_length, block_ref FROM pg_get_wal_records_info("
        "    '0/0'::pg_lsn + %(start)s::numeric,"
        "    '0/0'::pg_lsn + %(end)s::numeric)),"
        " here AS (SELECT '%%/' || oid || '/%%' AS rel FROM pg_database"
        "  WHERE datname = current_database()),"
        " x AS (SELECT DISTINCT xid FROM r, here WHERE xid <> '0' AND block_ref LIKE here.rel)"
        " SELECT coalesce(sum(record_length), 0)::bigint AS bytes,"
        " coalesce(sum(fpi_length), 0)::bigint AS fpi_bytes FROM r, here"
        " WHERE block_ref LIKE here.rel OR xid IN (SELECT xid FROM x)",
        {"start": start, "end": end},
    )
    return Wal(bytes=int(row["bytes"]), fpi_bytes=int(row["fpi_bytes"]))


def other_sessions_here(conn: Conn) -> int:
    """Sessions of this database besides this one: a backend flushes its statistics as it
    exits, so a run's commits are all counted once this reaches zero."""
    n: int = value(
        conn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return n


def settings(conn: Conn, names: tuple[str, ...] = SETTINGS) -> dict[str, str]:
    """Each setting as SHOW prints it (with its unit)."""
    return {
        r["name"]: r["setting"]
        for r in all_rows(
            conn,
            "SELECT s.name, current_setting(s.name) AS setting FROM unnest(%(names)s::text[])"
            " AS s(name)",
            {"names": list(names)},
        )
    }


def claim_due(conn: Conn, *, worker_id: str, batch: int, lease_seconds: float) -> int:
    """Claim up to ``batch`` due nodes with orch8.claim_due_nodes (its sweeps included) and
    say how many it handed out; the rows themselves stay on the server."""
    n: int = value(
        conn,
        "SELECT count(*) FROM orch8.claim_due_nodes(p_worker_id => %(worker)s,"
        " p_batch => %(batch)s, p_lease => make_interval(secs => %(lease)s))",
        {"worker": worker_id, "batch": batch, "lease": lease_seconds},
    )
    return n


def dbos_status_counts(conn: Conn, *, schema: str = "dbos") -> dict[str, int]:
    """Workflows of a DBOS system database by status (SUCCESS, ERROR, ENQUEUED, ...)."""
    return {
        r["status"]: int(r["n"])
        for r in all_rows(
            conn,
            sql.SQL("SELECT status, count(*) AS n FROM {}.workflow_status GROUP BY status")
            .format(sql.Identifier(schema))
            .as_string(conn),
        )
    }


def dbos_run_latencies(conn: Conn, *, schema: str = "dbos") -> list[float]:
    """Seconds from dequeue to completion per successful DBOS workflow: the counterpart of
    observe.run_latencies (first claim to completion). updated_at stands in for a missing
    completed_at."""
    return [
        float(r["seconds"])
        for r in all_rows(
            conn,
            sql.SQL(
                "SELECT (coalesce(completed_at, updated_at) - started_at_epoch_ms) / 1000.0"
                " AS seconds FROM {}.workflow_status"
                " WHERE status = 'SUCCESS' AND started_at_epoch_ms IS NOT NULL"
            )
            .format(sql.Identifier(schema))
            .as_string(conn),
        )
    ]
