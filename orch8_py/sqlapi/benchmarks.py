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
    run_latencies (first claim to completion). updated_at stands in for a missing
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


# History for the "flat as history grows" measurement (bench/history.py): what a finished
# instance leaves behind, copied. Each table's column that names an instance, a continuity
# or a receipt takes the copy's new id; every timestamp moves back by the copy's offset,
# so the history spreads over the past as a real one would. An instance's and a receipt's
# new id keeps the time-ordered shape of the original (its first 48 bits, Unix
# milliseconds, move back by the same offset), so a copy's rows land in the history
# tables' partition of the month they are dated in, as real ones would.
HISTORY_TABLES = {
    "task_instances": {"id": "i.new_id"},
    "execution_nodes": {"instance_id": "i.new_id"},
    "instance_transitions": {"instance_id": "i.new_id"},
    "block_outputs": {"instance_id": "i.new_id", "effect_id": "r.new_id"},
    "continuity_executions": {"continuity_id": "c.new_id", "current_instance_id": "i.new_id"},
    "effect_receipts": {
        "id": "r.new_id",
        "continuity_id": "c.new_id",
        "instance_id": "i.new_id",
        "idempotency_key": "r.new_id::text",
        "provider_receipt_id": "r.new_id::text",
    },
    "effect_receipt_events": {"receipt_id": "r.new_id"},
}

# how each table's rows find their copy's instance (i), continuity (c) and receipt (r)
_HISTORY_JOINS = {
    "task_instances": "JOIN hist_i AS i ON i.old_id = t.id",
    "execution_nodes": "JOIN hist_i AS i ON i.old_id = t.instance_id",
    "instance_transitions": "JOIN hist_i AS i ON i.old_id = t.instance_id",
    "block_outputs": "JOIN hist_i AS i ON i.old_id = t.instance_id"
    " LEFT JOIN hist_r AS r ON r.old_id = t.effect_id AND r.k = i.k",
    "continuity_executions": "JOIN hist_i AS i ON i.old_id = t.current_instance_id"
    " JOIN hist_c AS c ON c.old_id = t.continuity_id AND c.k = i.k",
    "effect_receipts": "JOIN hist_r AS r ON r.old_id = t.id"
    " JOIN hist_i AS i ON i.old_id = t.instance_id AND i.k = r.k"
    " JOIN hist_c AS c ON c.old_id = t.continuity_id AND c.k = r.k",
    "effect_receipt_events": "JOIN hist_r AS r ON r.old_id = t.receipt_id",
}


# each table's sample: its rows whose column names a row of an earlier table's sample
_HISTORY_SOURCES = {
    "execution_nodes": ("instance_id", "task_instances", "id"),
    "instance_transitions": ("instance_id", "task_instances", "id"),
    "block_outputs": ("instance_id", "task_instances", "id"),
    "continuity_executions": ("current_instance_id", "task_instances", "id"),
    "effect_receipts": ("instance_id", "task_instances", "id"),
    "effect_receipt_events": ("receipt_id", "effect_receipts", "id"),
}


def history_sample(conn: Conn, *, tenant_id: str) -> int:
    """Copy the tenant's finished instances and every row they left into this session's
    temporary tables (hist_src_<table>), the sample fill_history copies; their count."""
    conn.execute(
        "CREATE TEMP TABLE hist_src_task_instances AS SELECT * FROM orch8.task_instances"
        " WHERE tenant_id = %(t)s AND state IN ('completed', 'failed', 'cancelled')",
        {"t": tenant_id},
    )
    for table, (column, source, key) in _HISTORY_SOURCES.items():
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE {} AS SELECT * FROM orch8.{} WHERE tenant_id = %(t)s"
                " AND {} IN (SELECT {} FROM {})"
            ).format(
                sql.Identifier(f"hist_src_{table}"),
                sql.Identifier(table),
                sql.Identifier(column),
                sql.Identifier(key),
                sql.Identifier(f"hist_src_{source}"),
            ),
            {"t": tenant_id},
        )
    n: int = value(conn, "SELECT count(*) FROM hist_src_task_instances")
    return n


# a time-ordered id moved back by k offsets: its first 48 bits (Unix milliseconds) less
# k * spacing, the rest random
_SHIFTED_ID = (
    "encode(overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send("
    "('x' || lpad(left(replace(s.{key}::text, '-', ''), 12), 16, '0'))::bit(64)::bigint"
    " - (k * %(spacing)s * 1000)::bigint) FROM 3 FOR 6) FROM 1 FOR 6), 'hex')::uuid"
)


def make_history_months(conn: Conn, *, span_days: float) -> int:
    """The history tables' partitions (orch8.attach_history_month) for every month of the
    ``span_days`` (and an hour) before now up to the month before the current one, where
    missing (the current month and those ahead are ensure_history_partitions'); how many
    were made."""
    made: int = value(
        conn,
        "SELECT count(orch8.attach_history_month(h.table_name, h.key_column, m::date))"
        " FROM orch8.history_tables AS h,"
        " generate_series(date_trunc('month', (orch8.now() - interval '1 hour'"
        "   - make_interval(secs => %(span)s * 86400)) AT TIME ZONE 'UTC'),"
        "  date_trunc('month', orch8.now() AT TIME ZONE 'UTC') - interval '1 month',"
        "  interval '1 month') AS m"
        " WHERE to_regclass('orch8.' || orch8.history_partition_name(h.table_name, m::date))"
        " IS NULL",
        {"span": span_days},
    )
    return made


def fill_history(conn: Conn, *, first: int, last: int, spacing: float) -> None:
    """Copies first..last (inclusive) of the sample history_sample took, copy k dated
    k * ``spacing`` seconds before the original, in one transaction, written straight into
    the tables: a bench database only (it needs a superuser and turns off the ledger's
    triggers for the session, foreign keys included, which is what lets history be made at
    the speed of COPY rather than of a workflow)."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for name, source, key, new_id in (
            ("hist_i", "task_instances", "id", _SHIFTED_ID.format(key="id")),
            ("hist_c", "continuity_executions", "continuity_id", "gen_random_uuid()"),
            ("hist_r", "effect_receipts", "id", _SHIFTED_ID.format(key="id")),
        ):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL(
                    "CREATE TEMP TABLE {} AS SELECT s.{} AS old_id, k, " + new_id + " AS new_id"
                    " FROM {} AS s CROSS JOIN generate_series(%(first)s::int, %(last)s::int) AS k"
                ).format(
                    sql.Identifier(name),
                    sql.Identifier(key),
                    sql.Identifier(f"hist_src_{source}"),
                ),
                {"first": first, "last": last, "spacing": spacing},
            )
            conn.execute(sql.SQL("CREATE INDEX ON {} (old_id, k)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))
        for table, replaced in HISTORY_TABLES.items():
            cols = all_rows(
                conn,
                "SELECT attname, format_type(atttypid, atttypmod) AS type"
                " FROM pg_attribute WHERE attrelid = ('orch8.' || %(t)s)::regclass"
                " AND attnum > 0 AND NOT attisdropped AND attidentity <> 'a' ORDER BY attnum",
                {"t": table},
            )
            # the copy number: the receipt's for the events, which name nothing else
            k = "r.k" if table == "effect_receipt_events" else "i.k"
            exprs: list[sql.Composable] = []
            for c in cols:
                if c["attname"] in replaced:
                    exprs.append(sql.SQL(replaced[c["attname"]]))
                elif c["type"] == "timestamp with time zone":
                    exprs.append(
                        sql.SQL("t.{} - make_interval(secs => %(spacing)s * " + k + ")").format(
                            sql.Identifier(c["attname"])
                        )
                    )
                else:
                    exprs.append(sql.SQL("t.{}").format(sql.Identifier(c["attname"])))
            join = _HISTORY_JOINS[table]
            conn.execute(
                sql.SQL("INSERT INTO orch8.{} ({}) SELECT {} FROM {} AS t " + join).format(
                    sql.Identifier(table),
                    sql.SQL(", ").join(sql.Identifier(c["attname"]) for c in cols),
                    sql.SQL(", ").join(exprs),
                    sql.Identifier(f"hist_src_{table}"),
                ),
                {"spacing": spacing},
            )


def server_now(conn: Conn) -> object:
    """orch8.now(): the clock a run's instances are stamped with."""
    return value(conn, "SELECT orch8.now()")


def run_counts(conn: Conn, *, tenant_id: str, since: object) -> dict[str, int]:
    """How many of the tenant's instances created at or after ``since`` completed and
    failed (by the listing index, so a large history beside the run costs nothing)."""
    row = one(
        conn,
        "SELECT count(*) FILTER (WHERE state = 'completed') AS completed,"
        " count(*) FILTER (WHERE state = 'failed') AS failed FROM orch8.task_instances"
        " WHERE tenant_id = %(t)s AND created_at >= %(since)s",
        {"t": tenant_id, "since": since},
    )
    return {"completed": row["completed"], "failed": row["failed"]}


def run_latencies(conn: Conn, *, tenant_id: str, since: object) -> list[float]:
    """Seconds from first claim to completion, per completed instance run_counts counts."""
    return [
        float(r["seconds"])
        for r in all_rows(
            conn,
            "SELECT extract(epoch FROM max(t.at) FILTER (WHERE t.to_state = 'completed')"
            " - min(t.at) FILTER (WHERE t.to_state = 'running'))::float8 AS seconds"
            " FROM orch8.task_instances AS i JOIN orch8.instance_transitions AS t"
            " ON t.tenant_id = i.tenant_id AND t.instance_id = i.id"
            " WHERE i.tenant_id = %(t)s AND i.created_at >= %(since)s GROUP BY t.instance_id",
            {"t": tenant_id, "since": since},
        )
        if r["seconds"] is not None
    ]


def settle_history(conn: Conn) -> None:
    """What a database that grew over months would have had time for: its tables
    vacuumed and analyzed, and a checkpoint (``conn`` in autocommit)."""
    conn.execute(
        "VACUUM (ANALYZE) orch8.task_instances, orch8.execution_nodes,"
        " orch8.instance_transitions, orch8.block_outputs,"
        " orch8.continuity_executions, orch8.effect_receipts,"
        " orch8.effect_receipt_events"
    )
    conn.execute("CHECKPOINT")


def history_size(conn: Conn) -> dict[str, int]:
    """The instances a database holds and its size on disk."""
    row = one(
        conn,
        "SELECT (SELECT count(*) FROM orch8.task_instances) AS instances,"
        " pg_database_size(current_database()) AS bytes",
    )
    return {"instances": int(row["instances"]), "bytes": int(row["bytes"])}


def bench_sequence(conn: Conn, *, tenant_id: str) -> str:
    """The id of the tenant's sequence named bench (bench/run_bench.py creates it)."""
    return str(
        value(
            conn,
            "SELECT id FROM orch8.sequences WHERE tenant_id = %(t)s AND name = 'bench'"
            " ORDER BY version DESC LIMIT 1",
            {"t": tenant_id},
        )
    )


def track_functions(conn: Conn, *, dbname: str) -> None:
    """Count calls and time of every function in sessions that connect to ``dbname`` from
    now on (a superuser setting; bench/profile.py)."""
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(sql.Identifier(dbname))
    )


def function_profile(conn: Conn) -> list[dict[str, object]]:
    """This database's orch8 functions by self time: calls, self and total milliseconds
    (pg_stat_user_functions, as the backends flushed them)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return all_rows(
        conn,
        "SELECT funcname AS name, calls, self_time AS self_ms, total_time AS total_ms"
        " FROM pg_stat_user_functions WHERE schemaname = 'orch8'"
        " ORDER BY self_time DESC",
    )
