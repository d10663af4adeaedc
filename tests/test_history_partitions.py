"""The history tables in monthly partitions (migration 0033, sql/functions/history.sql):
the upgrade keeps every row, grant and view; runners make the coming months; two makers
at once make each month once; an ended month is archived through the CLI and its
receipts are still found."""

from __future__ import annotations

import datetime as dt
import json
import threading

import psycopg
import pytest

from orch8_py import migrate
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import make_sequence, running, start, wait_for, wait_until
from tests.test_migrate import before_version, dispatched_receipts

HISTORY = ("effect_receipts", "effect_receipt_events", "block_outputs", "instance_transitions")


def this_month() -> dt.date:
    return dt.datetime.now(dt.UTC).date().replace(day=1)


def month_after(month: dt.date, n: int = 1) -> dt.date:
    y, m = divmod(month.month - 1 + n, 12)
    return dt.date(month.year + y, m + 1, 1)


def drop_month(c: psycopg.Connection, month: dt.date) -> None:
    """Take an empty month's partitions away, as if no one had made them yet."""
    for table in HISTORY:
        part = f"{table}_p{month:%Y%m}"
        assert c.execute(f"SELECT count(*) FROM orch8.{part}").fetchone()[0] == 0
        c.execute(f"ALTER TABLE orch8.{table} DETACH PARTITION orch8.{part}")
        c.execute(f"DROP TABLE orch8.{part}")


def months_of(c: psycopg.Connection) -> set[tuple[str, dt.date]]:
    return set(
        c.execute(
            "SELECT table_name, month FROM orch8.history_partitions()"
            " WHERE NOT archived AND month IS NOT NULL"
        ).fetchall()
    )


def test_the_upgrade_keeps_every_row_grant_and_view(empty_db_url):
    """0033 on a database with history: every row of the four tables is there after it,
    the same, in the default partition or moved into this month's; the parents carry the
    old grants, the views come back, and today's functions (made again by the migrator)
    run on the partitioned tables."""
    history_rows = {t: f"SELECT to_jsonb(x) FROM orch8.{t} AS x ORDER BY 1::text" for t in HISTORY}
    grants = (
        "SELECT c.relname::text, c.relacl::text FROM pg_class AS c"
        " WHERE c.relnamespace = 'orch8'::regnamespace AND c.relname = ANY(%s) ORDER BY 1"
    )
    views = (
        "SELECT c.relname::text, c.relacl::text, obj_description(c.oid, 'pg_class')"
        " FROM pg_class AS c WHERE c.relkind = 'v' AND c.relnamespace = 'orch8'::regnamespace"
        " ORDER BY 1"
    )
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=before_version(33))
        ids = dispatched_receipts(c, ("a", "b"))
        c.execute("SELECT orch8.commit_effect('t1', %s, '{\"receipt_id\": \"ch_1\"}')", (ids[0],))
        c.execute(
            "INSERT INTO orch8.block_outputs (tenant_id, instance_id, block_id, attempt, output)"
            " SELECT tenant_id, instance_id, 'a', 0, '{\"ok\": true}' FROM orch8.effect_receipts"
            " WHERE id = %s",
            (ids[0],),
        )
        before = {t: c.execute(q).fetchall() for t, q in history_rows.items()}
        assert all(before.values()), before
        grants_before = c.execute(grants, (list(HISTORY),)).fetchall()
        views_before = c.execute(views).fetchall()

        applied = [m.name for m in migrate.migrate(c)]
        assert applied[0] == "0033_history_partitions.sql"
        assert migrate.status(c).current
        assert {t: c.execute(q).fetchall() for t, q in history_rows.items()} == before
        assert c.execute(grants, (list(HISTORY),)).fetchall() == grants_before
        assert c.execute(views).fetchall() == views_before
        part = f"orch8.effect_receipts_p{this_month():%Y%m}"
        assert c.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM orch8.effect_receipts"
        ).fetchall() == [(part,)]
        assert c.execute("SELECT count(*) FROM orch8.effect_receipts_default").fetchone() == (0,)
        # the functions bound to the old row types were made again, and work
        assert c.execute("SELECT id FROM orch8.find_receipts('t1', 'ch_1')").fetchall() == [
            (ids[0],)
        ]
        c.execute("SELECT orch8.commit_effect('t1', %s, '{}')", (ids[1],))
        assert c.execute(
            "SELECT state::text FROM orch8.effect_receipt_overview WHERE id = %s", (ids[1],)
        ).fetchone() == ("committed",)
        (new,) = dispatched_receipts(c, ("c",))
        assert c.execute(
            "SELECT tableoid::regclass::text FROM orch8.effect_receipts WHERE id = %s", (new,)
        ).fetchone() == (part,)


def test_a_runner_makes_the_coming_months(db_url):
    """A runner that finds next month without partitions makes them when it starts, and
    the instances it runs meanwhile are unaffected."""
    nxt = month_after(this_month())
    with psycopg.connect(db_url, autocommit=True) as c:
        drop_month(c, nxt)
        assert (HISTORY[0], nxt) not in months_of(c)
        seq = make_sequence(c, [{"type": "step", "id": "a", "handler": "noop"}])
        ids = [start(c, seq) for _ in range(5)]
        with running(db_url):
            wait_for(c, ids, states=("completed",))
            wait_until(
                lambda: {(t, nxt) for t in HISTORY} <= months_of(c), what="next month's partitions"
            )


@pytest.mark.parametrize("round_", range(5))
def test_two_makers_at_once_make_each_month_once(db_url, round_):
    """Two sessions calling ensure_history_partitions together: each missing partition is
    made by exactly one of them, and neither fails."""
    months = [month_after(this_month(), 1), month_after(this_month(), 2)]
    with psycopg.connect(db_url, autocommit=True) as c:
        for m in months:
            drop_month(c, m)
    barrier = threading.Barrier(2)
    made: list[list[str]] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as c:
                barrier.wait(timeout=10)
                made.append(
                    [
                        r[0]
                        for r in c.execute(
                            "SELECT partition_name FROM orch8.ensure_history_partitions()"
                        ).fetchall()
                    ]
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    names = sorted(made[0] + made[1])
    assert names == sorted(f"{t}_p{m:%Y%m}" for t in HISTORY for m in months)


def a_month_of_history(c: psycopg.Connection, month: dt.date) -> list:
    """Receipts of an instance created in ``month`` (the session's clock set there): the
    month's partitions made first, as a runner would have then."""
    c.execute("SELECT set_config('orch8.fake_now', %s, false)", (f"{month:%Y-%m}-15 12:00+00",))
    c.execute("SELECT * FROM orch8.ensure_history_partitions(0)")
    ids = dispatched_receipts(c, ("charge",))
    c.execute("SELECT set_config('orch8.fake_now', '', false)")
    return ids


def test_an_ended_month_is_archived_and_its_receipts_still_found(db_url):
    """`orch8 db history archive` refuses a month with work in flight (one line, exit 1),
    then moves the ended month's rows to schema orch8_archive; `orch8 effects find` still
    finds the receipt by the provider's id, and `orch8 db history list` shows where the
    month went."""
    month = dt.date(2026, 10, 1)
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    with psycopg.connect(db_url, autocommit=True) as c:
        (receipt,) = a_month_of_history(c, month)
        (instance,) = c.execute(
            "SELECT instance_id FROM orch8.effect_receipts WHERE id = %s", (receipt,)
        ).fetchone()

        busy = run_orch8("db", "history", "archive", "2026-10", env=env)
        assert_one_line_error(
            busy, "2026-10 is still in use", "1 instance(s) not ended", "1 receipt(s) not settled"
        )
        assert busy.returncode == 1

        c.execute(
            "SELECT orch8.commit_effect('t1', %s, '{\"receipt_id\": \"ch_oct\"}')", (receipt,)
        )
        c.execute("SELECT orch8.cancel_instance('t1', %s, 'test', 'done')", (instance,))
        rows_before = {
            t: c.execute(
                f"SELECT to_jsonb(x) FROM orch8.{t} AS x"
                " WHERE x.tableoid = %s::regclass ORDER BY 1::text",
                (f"orch8.{t}_p202610",),
            ).fetchall()
            for t in HISTORY
        }

    done = run_orch8("db", "history", "archive", "2026-10", "--json", env=env)
    assert done.returncode == 0, done.stderr
    archived = {p["table_name"]: p["row_count"] for p in json.loads(done.stdout)}
    assert archived == {t: len(rows) for t, rows in rows_before.items()}

    with psycopg.connect(db_url, autocommit=True) as c:
        for t, rows in rows_before.items():
            assert (
                c.execute(
                    f"SELECT to_jsonb(x) FROM orch8_archive.{t} AS x ORDER BY 1::text"
                ).fetchall()
                == rows
            )
        assert c.execute(
            "SELECT count(*) FROM orch8.effect_receipts WHERE id = %s", (receipt,)
        ).fetchone() == (0,)

    found = run_orch8("effects", "find", "ch_oct", "--tenant", "t1", "--json", env=env)
    assert found.returncode == 0, found.stderr
    assert [r["id"] for r in json.loads(found.stdout)] == [str(receipt)]

    listed = run_orch8("db", "history", "list", "--json", env=env)
    where = {
        (p["partition_name"], p["archived"])
        for p in json.loads(listed.stdout)
        if p["month"] == "2026-10-01"
    }
    assert where == {(f"{t}_p202610", True) for t in HISTORY}

    again = run_orch8("db", "history", "archive", "2026-10", env=env)
    assert_one_line_error(again, "archived already")
    bad = run_orch8("db", "history", "archive", "October", env=env)
    assert_one_line_error(bad, "is not YYYY-MM")
    assert bad.returncode == 2


def test_the_api_reads_an_archived_receipt_in_its_tenant_only(db_url):
    """GET /effects/{id} and /effects/find answer an archived receipt with its history to
    its tenant (the web role reads the archive through row-level security), and 404 / an
    empty list to another tenant."""
    from orch8_py import apikeys
    from tests.test_api import Api
    from web import create_app

    with psycopg.connect(db_url, autocommit=True) as c:
        (receipt,) = a_month_of_history(c, dt.date(2026, 9, 1))
        c.execute(
            "SELECT orch8.commit_effect('t1', %s, '{\"receipt_id\": \"ch_sep\"}')", (receipt,)
        )
        c.execute(
            "SELECT orch8.cancel_instance('t1', r.instance_id, 'test', 'done')"
            " FROM orch8.effect_receipts AS r WHERE r.id = %s",
            (receipt,),
        )
        c.execute("SELECT * FROM orch8.archive_history_month('2026-09-01')")
        mine = apikeys.create(c, "t1", "operator", "alice")[1]
        theirs = apikeys.create(c, "t2", "operator", "bob")[1]
    app = create_app(db_url, secret_key="history-test-secret")
    app.testing = True
    try:
        api = Api(app.test_client(), mine)
        shown = api.get(f"/effects/{receipt}")
        assert shown.status_code == 200, shown.get_json()
        body = shown.get_json()
        assert body["state"] == "committed" and body["provider_receipt_id"] == "ch_sep"
        assert [e["to_state"] for e in body["events"]] == [
            "planned",
            "prepared",
            "dispatched",
            "committed",
        ]
        found = api.get("/effects/find", query_string={"key": "ch_sep"})
        assert [r["id"] for r in found.get_json()["items"]] == [str(receipt)]
        other = Api(app.test_client(), theirs)
        assert other.get(f"/effects/{receipt}").status_code == 404
        assert other.get("/effects/find", query_string={"key": "ch_sep"}).get_json()["items"] == []
    finally:
        app.extensions["orch8.pool"].close()
