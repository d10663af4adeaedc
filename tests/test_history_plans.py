"""Flat as history grows: the statements of the claim, the hand-over and the bulk start
find a batch's nodes by key even when the statistics say no node is ready, which is what
ANALYZE reports beside a large history (docs/ARCHITECTURE.md, "Flat as history grows").
Before, each of them walked the whole ready queue (the partial index
execution_nodes_ready_idx) once per instance. auto_explain shows the plan every nested
statement ran with; these tests read it."""

from __future__ import annotations

import re
import uuid

from psycopg.types.json import Jsonb

from tests.runner_helpers import TENANT, make_sequence

READY = 400  # nodes in the queue while the statistics say there are none


def stale_queue(conn) -> uuid.UUID:
    """READY ready nodes whose table statistics were taken while none was ready: the
    picture a database with a long history shows the planner. A sequence of two pure
    steps, so a finished first step hands over to a second."""
    seq = make_sequence(
        conn, [{"type": "step", "id": f"s{i}", "handler": "noop"} for i in range(2)]
    )
    conn.execute(
        "SELECT orch8.create_instances(%s, %s, %s)",
        (TENANT, seq, Jsonb([{} for _ in range(READY)])),
    )
    with conn.transaction():
        # past the guards on purpose: only the statistics are meant to lie, not the rows
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("UPDATE orch8.execution_nodes SET state = 'completed' WHERE state = 'ready'")
    conn.execute("ANALYZE orch8.execution_nodes")
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "UPDATE orch8.execution_nodes SET state = 'ready' WHERE state = 'completed'"
            " AND kind = 'step'"
        )
    return seq


def plans_of(conn, statement: str, params: tuple = ()) -> list[str]:
    """The plans auto_explain logged for every statement ``statement`` ran, nested ones
    included, as the client received them."""
    got: list[str] = []
    conn.add_notice_handler(lambda d: got.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_analyze = on")
    conn.execute("SET client_min_messages = log")
    try:
        conn.execute(statement, params)
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("SET auto_explain.log_min_duration = -1")
    return got


def walks_of_ready_queue(plans: list[str], pattern: str) -> list[str]:
    """The plans of statements matching ``pattern`` that scanned the ready queue's index."""
    return [p for p in plans if re.search(pattern, p, re.S) and "execution_nodes_ready_idx" in p]


def test_stale_statistics_really_say_the_queue_is_empty(conn):
    stale_queue(conn)
    # the premise of the other tests: the planner believes almost nothing is ready
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            "EXPLAIN SELECT * FROM orch8.execution_nodes WHERE state = 'ready'"
        ).fetchall()
    )
    rows = int(re.search(r"rows=(\d+)", plan).group(1))
    assert rows < READY / 10, plan


def test_the_claim_moves_its_batch_by_row(conn):
    stale_queue(conn)
    plans = plans_of(
        conn,
        "SELECT count(*) FROM orch8.claim_due_nodes(p_worker_id => 'w', p_batch => 64)",
    )
    # the rows the claim locked, reached by ctid: neither the ready queue nor a key probe
    for table, rows in (("execution_nodes", "v_node_rows"), ("task_instances", "v_inst_rows")):
        moved = [p for p in plans if f"UPDATE orch8.{table}" in p and rows in p]
        assert moved, f"auto_explain logged no plan for the claim's UPDATE of {table}"
        assert walks_of_ready_queue(moved, rows) == []
        assert "Tid Scan" in moved[0] and "(actual time" in moved[0], moved[0]
        assert re.search(r"Update on \S+ \S+ .*rows=(64|0) loops=1", moved[0]), moved[0]


def test_the_hand_over_looks_at_its_own_instance_only(conn):
    stale_queue(conn)
    inst, token = conn.execute(
        "SELECT instance_id, lease_token FROM orch8.claim_due_nodes('w', 1)"
    ).fetchone()
    # the instance's other step is ready too (the stale queue made every step ready)
    plans = plans_of(
        conn,
        "SELECT (orch8.hand_over(t, %s, 'w', orch8.now() + interval '30 s', '', "
        "(SELECT path FROM orch8.execution_nodes WHERE lease_token = %s))).path"
        " FROM orch8.task_instances AS t WHERE t.tenant_id = %s AND t.id = %s",
        (token, token, TENANT, inst),
    )
    hand = [p for p in plans if "p_prefer_parent" in p or "c.parent_path" in p]
    assert hand, "auto_explain logged no plan for hand_over's lookup"
    assert walks_of_ready_queue(hand, "parent_path") == []


def test_a_bulk_start_probes_each_new_instance_by_key(conn):
    seq = stale_queue(conn)
    plans = plans_of(
        conn,
        "SELECT count(*) FROM orch8.create_instances(%s, %s, %s)",
        (TENANT, seq, Jsonb([{} for _ in range(50)])),
    )
    lateral = [p for p in plans if "min(n.next_fire_at)" in p]
    assert lateral, "auto_explain logged no plan for the first-delay update"
    assert walks_of_ready_queue(lateral, "min\\(n.next_fire_at\\)") == []
