"""Migrations: idempotent, concurrent-safe, immutable once applied, version-checked."""

from __future__ import annotations

import shutil
import subprocess
import sys

import psycopg
import pytest

from orch8_py import migrate
from orch8_py.errors import MigrationError, SchemaMismatch
from tests import effect_rules
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8


def rows(url: str) -> list[tuple]:
    with psycopg.connect(url) as c:
        return c.execute(
            "SELECT kind, name, checksum, applied_at FROM orch8.schema_migrations ORDER BY 1, 2"
        ).fetchall()


# Today's function files read continuity_executions.effect_id_version (0032), so a schema
# "before version N" on which they make receipts needs that column as well.
NEEDED_BY_TODAYS_FUNCTIONS = ("0032_time_ordered_receipt_ids.sql",)


def before_version(version: int, *, leave_out: tuple[str, ...] = ()) -> list[migrate.Migration]:
    """The migrations of a database before ``version``, with today's function files."""
    return [
        m
        for m in migrate.discover()
        if m.name not in leave_out
        and (m.version is None or m.version < version or m.name in NEEDED_BY_TODAYS_FUNCTIONS)
    ]


def dispatched_receipts(c: psycopg.Connection, blocks: tuple[str, ...]) -> list:
    """One instance of tenant t1 with a dispatched http_request receipt per block; their ids."""
    seq = c.execute(
        "SELECT id FROM orch8.create_sequence('t1', 'default', 'pay',"
        ' \'{"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}\')'
    ).fetchone()[0]
    inst = c.execute("SELECT id FROM orch8.create_instance('t1', %s, '{}')", (seq,)).fetchone()[0]
    return [
        c.execute(
            "SELECT (orch8.begin_effect('t1', %s, %s, 'http_request',"
            ' \'{"url": "https://x.example"}\', 0)).effect_id',
            (inst, block),
        ).fetchone()[0]
        for block in blocks
    ]


def test_migrate_twice_is_a_noop(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        first = migrate.migrate(c)
        assert [m.name for m in first] == [m.name for m in migrate.discover()]
        before = rows(empty_db_url)
        assert migrate.migrate(c) == []
    assert rows(empty_db_url) == before
    with psycopg.connect(empty_db_url) as c:
        assert migrate.check_schema(c).current


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_migrators_apply_once(empty_db_url, round_):
    env = orch8_env(ORCH8_DATABASE_URL=empty_db_url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "orch8_py", "db", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    applied = [out for out, _err in outs if "applying" in out]
    assert len(applied) == 1, outs  # exactly one process did the work
    names = [name for _k, name, _c, _a in rows(empty_db_url)]
    assert len(names) == len(set(names)) == len(migrate.discover())


def test_edited_applied_migration_is_refused(empty_db_url, tmp_path):
    shutil.copytree(migrate.sql_dir(), tmp_path / "sql")
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        first = sorted((tmp_path / "sql" / "migrations").glob("*.sql"))[0]
        first.write_text(first.read_text() + "\n-- edited\n")
        edited = migrate.discover(tmp_path / "sql")
        with pytest.raises(MigrationError, match=f"{first.name} was edited after it was applied"):
            migrate.migrate(c, migrations=edited)
        assert migrate.status(c, edited).edited == [first.name]


def test_changed_repeatable_file_is_reapplied(empty_db_url, tmp_path):
    shutil.copytree(migrate.sql_dir(), tmp_path / "sql")
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        f = tmp_path / "sql" / "functions" / "schema_info.sql"
        f.write_text(f.read_text().replace("The highest versioned", "The latest versioned"))
        applied = migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        assert [m.name for m in applied] == ["schema_info.sql"]
        comment = c.execute(
            "SELECT obj_description('orch8.schema_version()'::regprocedure)"
        ).fetchone()[0]
        assert comment.startswith("The latest versioned")


def test_a_changed_limit_reaches_sessions_already_open(empty_db_url, tmp_path):
    # A domain's check is prepared once per session, limit_of folded in; migrate makes
    # open sessions prepare it again (migration 0029, orch8.refresh_domain_checks).
    shutil.copytree(migrate.sql_dir(), tmp_path / "sql")
    key_257 = "SELECT repeat('x', 257)::orch8.instance_idempotency_key"
    with (
        psycopg.connect(empty_db_url, autocommit=True) as c,
        psycopg.connect(empty_db_url, autocommit=True) as runner,
    ):
        migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        with pytest.raises(psycopg.errors.CheckViolation):
            runner.execute(key_257)
        f = tmp_path / "sql" / "functions" / "limits.sql"
        before = f.read_text()
        f.write_text(
            before.replace("('idempotency_key_bytes', 256,", "('idempotency_key_bytes', 300,")
        )
        assert f.read_text() != before
        migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        runner.execute(key_257)  # the open session sees the new limit


def test_failed_migration_leaves_nothing_half_written(empty_db_url, tmp_path):
    shutil.copytree(migrate.sql_dir(), tmp_path / "sql")
    bad = tmp_path / "sql" / "migrations" / "9000_broken.sql"
    bad.write_text("CREATE TABLE orch8.half_written (id int);\nSELECT no_such_function();\n")
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        with pytest.raises(MigrationError, match=r"9000_broken\.sql failed"):
            migrate.migrate(c, migrations=migrate.discover(tmp_path / "sql"))
        assert c.execute("SELECT to_regclass('orch8.half_written')").fetchone()[0] is None
        names = {r[1] for r in rows(empty_db_url)}
        assert "9000_broken.sql" not in names


def test_newer_schema_is_refused(db_url):
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "INSERT INTO orch8.schema_migrations (kind, name, version, checksum) "
            "VALUES ('versioned', '9999_from_the_future.sql', 9999, 'x')"
        )
        with pytest.raises(SchemaMismatch, match="upgrade orch8-py"):
            migrate.check_schema(c)
        with pytest.raises(MigrationError, match="newer than this orch8"):
            migrate.migrate(c)
    for command in (["run"], ["serve", "--port", "18093"], ["db", "migrate"]):
        proc = run_orch8(*command, env=orch8_env(ORCH8_DATABASE_URL=db_url))
        assert_one_line_error(proc, "9999")


def test_older_schema_asks_for_migrate(empty_db_url):
    with (
        psycopg.connect(empty_db_url) as c,
        pytest.raises(SchemaMismatch, match="orch8 db migrate"),
    ):
        migrate.check_schema(c)
    for command in (["run"], ["serve", "--port", "18093"]):
        proc = run_orch8(*command, env=orch8_env(ORCH8_DATABASE_URL=empty_db_url))
        assert_one_line_error(proc, "run `orch8 db migrate`")


def test_a_changed_function_file_is_named_not_a_version(db_url):
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE orch8.schema_migrations SET checksum = 'x' WHERE name = 'limits.sql'")
        with pytest.raises(SchemaMismatch) as refused:
            migrate.check_schema(c)
    assert str(refused.value) == (
        f"the database schema is at version {migrate.known_version(migrate.discover())}, but 1"
        " function file(s) changed since it was migrated (limits.sql): run `orch8 db migrate`"
    )


def test_status_command(empty_db_url):
    env = orch8_env(ORCH8_DATABASE_URL=empty_db_url)
    proc = run_orch8("db", "status", env=env)
    assert proc.returncode == 3 and "pending" in proc.stdout
    assert run_orch8("db", "migrate", env=env).returncode == 0
    proc = run_orch8("db", "status", env=env)
    assert proc.returncode == 0, proc.stdout


def test_receipt_lookup_migration_indexes_the_provider_ids_already_there(empty_db_url):
    """0024 on a database that already settled receipts: the provider ids no receipt
    index finds get their receipt_provider_ids rows, so find_receipts finds old receipts
    as well as new ones."""
    # triggers.sql holds today's trigger bodies, which write receipt_provider_ids; before
    # 0024 the triggers were the bodies the versioned migrations left, so leave it out.
    before = before_version(24, leave_out=("triggers.sql",))
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=before)
        ids = dispatched_receipts(c, ("charged", "plain"))
        c.execute("SELECT orch8.commit_effect('t1', %s, '{\"receipt_id\": \"ch_9\"}')", (ids[0],))
        c.execute(
            "SELECT orch8.commit_effect('t1', %s, jsonb_build_object('receipt_id', %s::text))",
            (ids[1], ids[1]),
        )
        applied = [m.name for m in migrate.migrate(c)]
        assert applied[0] == "0024_receipt_lookup.sql"
        assert c.execute(
            "SELECT provider_receipt_id, receipt_id FROM orch8.receipt_provider_ids"
        ).fetchall() == [("ch_9", ids[0])]
        assert c.execute("SELECT id FROM orch8.find_receipts('t1', 'ch_9')").fetchall() == [
            (ids[0],)
        ]


def test_domain_migration_keeps_rows_views_and_grants(empty_db_url):
    """0029 on a database with receipts: no row changes, the views come back with their
    grants and comments, and the moved rules still refuse a bad value."""
    before = before_version(29)
    views = (
        "SELECT c.relname::text, c.relacl::text, c.reloptions::text,"
        " obj_description(c.oid, 'pg_class'),"
        " (SELECT count(*) FROM pg_description AS d WHERE d.objoid = c.oid AND d.objsubid > 0)"
        " FROM pg_class AS c WHERE c.relkind = 'v' AND c.relnamespace = 'orch8'::regnamespace"
        " ORDER BY 1"
    )
    receipts = "SELECT to_jsonb(r) FROM orch8.effect_receipts AS r ORDER BY r.id"
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=before)
        (effect,) = dispatched_receipts(c, ("a",))
        c.execute("SELECT orch8.commit_effect('t1', %s, '{\"receipt_id\": \"ch_9\"}')", (effect,))
        views_before = c.execute(views).fetchall()
        receipts_before = c.execute(receipts).fetchall()
        applied = [m.name for m in migrate.migrate(c)]
        assert applied[0] == "0029_column_rules_as_domains.sql"
        assert c.execute(views).fetchall() == views_before
        assert c.execute(receipts).fetchall() == receipts_before
        assert c.execute(
            "SELECT block_id, kind, provider_receipt_id FROM orch8.effect_receipt_overview"
        ).fetchall() == [("a", "http", "ch_9")]
        with pytest.raises(psycopg.errors.CheckViolation):
            c.execute("UPDATE orch8.effect_receipts SET handler = '' WHERE id = %s", (effect,))


def test_receipt_id_migration_keeps_every_existing_scope_on_its_ids(empty_db_url):
    """0032 on a database with a scope: the scope is of effect id version 1, so a step of
    its instance begun again gets the receipt id (and idempotency key) it was first sent
    under; a scope made afterwards is of version 2, its ids led by the instance's time."""
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        migrate.migrate(c, migrations=[m for m in migrate.discover() if (m.version or 0) < 32])
        seq = c.execute(
            "SELECT id FROM orch8.create_sequence('t1', 'default', 'pay',"
            ' \'{"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}\')'
        ).fetchone()[0]
        old, new = (
            c.execute("SELECT id FROM orch8.create_instance('t1', %s, '{}')", (seq,)).fetchone()[0]
            for _ in range(2)
        )
        # the scope as the engine before 0032 made it (its functions are not today's)
        c.execute(
            "INSERT INTO orch8.continuity_executions (tenant_id, continuity_id, epoch,"
            " owner_runtime_id, current_instance_id) VALUES ('t1',"
            " orch8.effect_scope_id('orch8-effect-scope-v1', %(i)s), 0,"
            " orch8.effect_scope_id('orch8-effect-runtime-v1', %(i)s), %(i)s)",
            {"i": old},
        )
        applied = [m.name for m in migrate.migrate(c)]
        assert applied[0] == "0032_time_ordered_receipt_ids.sql"
        begin = (
            "SELECT (orch8.begin_effect('t1', %s, 'a', 'http_request',"
            ' \'{"url": "https://x.example"}\', 0)).effect_id'
        )
        key = "SELECT idempotency_key FROM orch8.effect_receipts WHERE id = %s"
        old_id, new_id = (c.execute(begin, (i,)).fetchone()[0] for i in (old, new))
        old_key, new_key = (c.execute(key, (r,)).fetchone()[0] for r in (old_id, new_id))
        continuity = effect_rules.continuity_id_for
        assert old_id == effect_rules.deterministic_effect_id(continuity(old), 0, old, "a", 0)
        assert new_id == effect_rules.effect_receipt_id(2, continuity(new), 0, new, "a", 0)
        assert (old_key, new_key) == (str(old_id), str(new_id))
        assert new_id.bytes[:6] == new.bytes[:6] != old_id.bytes[:6]
        assert c.execute(
            "SELECT current_instance_id, effect_id_version FROM orch8.continuity_executions"
            " ORDER BY effect_id_version"
        ).fetchall() == [(old, 1), (new, 2)]
