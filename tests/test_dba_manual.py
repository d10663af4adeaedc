"""The DBA's manual runs top to bottom (tests/dba_manual.py): every SQL example of the
README, docs/SQL_API.md and docs/CONTINUITY_OPERATIONS.md, pasted into the real psql in
order on a database fresh from `orch8 db migrate`, runs, and prints what the manual
shows. The walk-through ends with the blocked payment resolved and its instance
completed."""

from __future__ import annotations

import shutil

import psycopg
import pytest

from tests import dba_manual

pytestmark = pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")


@pytest.mark.parametrize("name", sorted(dba_manual.SESSIONS))
def test_every_example_runs_and_prints_what_the_manual_shows(admin_url, name):
    session, outputs, url = dba_manual.run_session(admin_url, dba_manual.SESSIONS[name])
    try:
        assert len(session) > 0
        found = dba_manual.problems(session, outputs)
        assert not found, "\n\n".join(found)
        if name == "manual":
            with psycopg.connect(url) as c:
                # the payment the walk-through blocked, resolved and retried
                rows = c.execute(
                    "SELECT i.state, r.state, r.provider_receipt_id"
                    " FROM orch8.task_instances AS i JOIN orch8.effect_receipts AS r"
                    "   ON r.tenant_id = i.tenant_id AND r.instance_id = i.id"
                    " WHERE i.tenant_id = 'acme' AND i.idempotency_key = 'order-7'"
                ).fetchall()
            assert rows == [("completed", "committed", "ch_3LkP")], rows
    finally:
        dba_manual.drop_database(admin_url, url)


def test_a_changed_output_is_caught():
    """The comparison is not vacuous: ids and times are masked, nothing else."""
    shown = " state | id\n-------+----\n committed | 5b013af5-7c6b-889b-b272-a21c93c53cd8"
    same = " state     | id\n-----------+---\n committed | 0c0b8a1e-0000-4000-8000-000000000001"
    assert dba_manual.normalise(shown) == dba_manual.normalise(same)
    assert dba_manual.normalise(shown) != dba_manual.normalise(same.replace("committed", "unknown"))
    assert dba_manual.normalise("(1 row)") != dba_manual.normalise("(2 rows)")
