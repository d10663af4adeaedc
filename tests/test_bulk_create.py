"""Starting instances in bulk (orch8.create_instances, POST /bulk/instances/start, `orch8
instances start-many`), against a real PostgreSQL: a batch is one transaction, its trees
are exactly what create_instance builds, a bad item writes nothing, and the cost per
instance stays flat as the table grows."""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import apikeys, rules, sqlapi
from orch8_py.errors import InvalidInput
from orch8_py.sqlapi.base import engine_errors
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import running, wait_for
from tests.test_api import Api, ok, problem
from web import create_app

TENANT = "acme"
NODE_COLUMNS = (
    "path, parent_path, block_id, kind, state::text, selector, vars, priority, items, position,"
    " next_fire_at, deadline_at, concurrency_key, max_concurrency, rate_limit_key"
)
INSTANCE_COLUMNS = (
    "state::text, sequence_version, context, priority, next_fire_at, current_block,"
    " concurrency_key, max_concurrency, sla_at, depth"
)


def make_seq(conn, blocks, **extra):
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (TENANT, f"s{uuid.uuid4().hex[:8]}", Jsonb({"blocks": blocks, **extra})),
    ).fetchone()[0]


def batch(conn, seq, items, at=None):
    with engine_errors():
        return conn.execute(
            "SELECT ord, id, state::text, deduplicated FROM orch8.create_instances(%s, %s, %s, %s)",
            (TENANT, seq, Jsonb(items), at),
        ).fetchall()


def one(conn, seq, data, at=None):
    with engine_errors():
        return conn.execute(
            "SELECT id FROM orch8.create_instance(%s, %s, %s, p_next_fire_at => %s)",
            (TENANT, seq, Jsonb(data), at),
        ).fetchone()[0]


def shape(conn, instance):
    """An instance and its tree, without ids and with times relative to its creation."""
    inst = conn.execute(
        f"SELECT {INSTANCE_COLUMNS}, created_at FROM orch8.task_instances WHERE id = %s",
        (instance,),
    ).fetchone()
    created = inst[-1]

    def rel(v):
        return (v - created).total_seconds() if hasattr(v, "tzinfo") else v

    nodes = conn.execute(
        f"SELECT {NODE_COLUMNS} FROM orch8.execution_nodes WHERE instance_id = %s ORDER BY path",
        (instance,),
    ).fetchall()
    transitions = conn.execute(
        "SELECT from_state::text, to_state::text, actor FROM orch8.instance_transitions"
        " WHERE instance_id = %s ORDER BY seq",
        (instance,),
    ).fetchall()
    return (
        tuple(rel(v) for v in inst[:-1]),
        [tuple(rel(v) for v in n) for n in nodes],
        transitions,
    )


def assert_same(a, b):
    """Equal, times relative to creation within a second (the calls run apart)."""
    if isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) < 1, (a, b)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), (a, b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b, (a, b)


FIRST_BLOCKS = {
    "a step with delay, window, deadline and a templated key": [
        {
            "type": "step",
            "id": "a",
            "handler": "noop",
            "delay": "30s",
            "deadline": "5m",
            "concurrency_key": "acct-{{ data.acct }}",
            "max_concurrency": 2,
            "rate_limit_key": "provider",
        },
        {"type": "step", "id": "b", "handler": "noop"},
    ],
    "a for_each": [
        {
            "type": "for_each",
            "id": "each",
            "collection": "{{ data.items }}",
            "body": [{"type": "step", "id": "x", "handler": "noop"}],
        }
    ],
    "a parallel (started one instance at a time)": [
        {
            "type": "parallel",
            "id": "p",
            "branches": [
                [{"type": "step", "id": "l", "handler": "noop"}],
                [{"type": "sleep", "id": "z", "duration": "5s"}],
            ],
        }
    ],
}


@pytest.mark.parametrize("name", sorted(FIRST_BLOCKS))
def test_a_batch_builds_what_create_instance_builds(conn, name):
    seq = make_seq(
        conn, FIRST_BLOCKS[name], concurrency_key="t-{{ data.acct }}", max_concurrency=3, sla="1h"
    )
    data = {"acct": 7, "items": [1, 2]}
    for at in (None, "2030-01-01T00:00:00Z"):
        single = one(conn, seq, data, at)
        rows = batch(conn, seq, [{"data": data}, {"data": data, "priority": 3}], at)
        assert [(r[0], r[2], r[3]) for r in rows] == [(0, "scheduled", False)] * 1 + [
            (1, "scheduled", False)
        ]
        assert_same(shape(conn, rows[0][1]), shape(conn, single))
        prio = shape(conn, rows[1][1])
        assert prio[0][3] == 3 and all(n[7] == 3 for n in prio[1])


def test_idempotency_keys_within_a_batch_and_across_batches(conn):
    seq = make_seq(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    first = batch(conn, seq, [{"idempotency_key": "k1"}, {"idempotency_key": "k1"}, {}])
    assert first[0][3] is False and first[1][3] is True and first[2][3] is False
    assert first[1][1] == first[0][1]
    again = batch(conn, seq, [{"idempotency_key": "k2"}, {"idempotency_key": "k1"}])
    assert again[1][1:] == (first[0][1], "scheduled", True)
    assert again[0][3] is False
    n = conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0]
    assert n == 3
    # one transition per started instance, none for the repeats
    assert conn.execute("SELECT count(*) FROM orch8.instance_transitions").fetchone()[0] == 3


@pytest.mark.parametrize(
    ("items", "fragment", "facts"),
    [
        ([{}, 5], "instance 1: an instance must be a JSON object", {"index": 1}),
        ([{}, {}, {"dta": {}}], "instance 2: unknown field(s): dta", {"index": 2}),
        ([{"data": [1]}, {}], "instance 0: instance data and config must", {"field": "data"}),
        ([{}, {"priority": 1.5}], "priority must be a 32-bit integer", {"field": "priority"}),
        (
            [{}, {"idempotency_key": "x" * 257}],
            "idempotency key must be 1 to 256 bytes",
            {"field": "idempotency_key", "limit": 256, "index": 1},
        ),
        (
            [{}, {"data": {"blob": "x" * 300_000}}],
            "instance 1: instance context is",
            {"field": "context", "limit": rules.LIMITS["context_bytes"]},
        ),
    ],
)
def test_a_bad_item_refuses_the_whole_batch(conn, items, fragment, facts):
    seq = make_seq(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    with pytest.raises(InvalidInput) as err:
        batch(conn, seq, items)
    assert fragment in str(err.value)
    for key, expected in facts.items():
        assert err.value.facts[key] == expected, err.value.facts
    for table in ("task_instances", "execution_nodes", "instance_transitions"):
        assert conn.execute(f"SELECT count(*) FROM orch8.{table}").fetchone()[0] == 0


def test_the_batch_size_is_bounded_in_sql(conn):
    seq = make_seq(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    limit = rules.LIMITS["create_batch"]
    with pytest.raises(InvalidInput, match="over the limit create_batch"):
        batch(conn, seq, [{}] * (limit + 1))
    assert batch(conn, seq, []) == []


def test_cost_per_instance_stays_flat_as_the_table_grows(conn):
    """Each batch of 5,000 takes about as long as the first, however many instances exist
    already (a plan that scanned the growing tables per instance would not)."""
    seq = make_seq(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    took = []
    for _ in range(4):
        t0 = time.perf_counter()
        made = sqlapi.instances.create_instances(
            conn, tenant_id=TENANT, sequence_id=seq, count=5000
        )
        took.append(time.perf_counter() - t0)
        assert made == 5000
    assert max(took[1:]) < 3 * took[0] + 0.5, took
    ready = conn.execute(
        "SELECT count(*) FROM orch8.execution_nodes WHERE state = 'ready'"
    ).fetchone()[0]
    assert ready == 20_000


def test_bulk_started_instances_run_to_completion(conn, db_url):
    seq = make_seq(
        conn,
        [
            {"type": "step", "id": "a", "handler": "transform", "params": {"expression": "1"}},
            {"type": "step", "id": "b", "handler": "noop"},
        ],
    )
    made = sqlapi.instances.start_instances(
        conn, tenant_id=TENANT, sequence_id=seq, items=[{"data": {"n": i}} for i in range(40)]
    )
    with running(db_url):
        done = wait_for(conn, [m.id for m in made])
    assert {s for s, _ in done.values()} == {"completed"}


def test_input_schema_is_checked_for_every_item(conn):
    seq = make_seq(
        conn,
        [{"type": "step", "id": "a", "handler": "noop"}],
        input_schema={"type": "object", "required": ["order"]},
    )
    with pytest.raises(InvalidInput, match="instance 1: data does not match") as err:
        sqlapi.instances.start_instances(
            conn, tenant_id=TENANT, sequence_id=seq, items=[{"data": {"order": 1}}, {}]
        )
    assert err.value.facts["index"] == 1
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0


# --- REST ------------------------------------------------------------------------------------


@pytest.fixture
def api(db_url, conn):
    app = create_app(db_url, secret_key="bulk-create-test")
    app.testing = True
    key = apikeys.create(conn, TENANT, "operator", "op-alice")[1]
    yield Api(app.test_client(), key)
    app.extensions["orch8.pool"].close()


def test_rest_batch_start(conn, api):
    conn.execute(
        "SELECT orch8.create_sequence(%s, 'default', 'orders', %s)",
        (TENANT, Jsonb({"blocks": [{"type": "step", "id": "a", "handler": "noop"}]})),
    )
    body = {
        "sequence": "orders",
        "instances": [
            {"data": {"n": 1}, "idempotency_key": "o-1"},
            {"data": {"n": 2}, "priority": 5},
        ],
    }
    made = ok(api.post("/bulk/instances/start", body), 201)
    assert made["created"] == 2 and made["deduplicated"] == 0 and made["sequence_version"] == 1
    assert [i["state"] for i in made["items"]] == ["scheduled", "scheduled"]
    shown = ok(api.get(f"/instances/{made['items'][1]['id']}"))
    assert shown["priority"] == 5 and shown["context"]["data"] == {"n": 2}

    again = ok(api.post("/bulk/instances/start", {**body, "instances": body["instances"][:1]}), 200)
    assert again["items"] == [{**made["items"][0], "deduplicated": True}]

    bad = problem(
        api.post(
            "/bulk/instances/start",
            {"sequence": "orders", "instances": [{}, {"data": {"x": "y" * 300_000}}]},
        ),
        422,
    )
    assert "instance 1" in bad["detail"]
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 2

    problem(api.post("/bulk/instances/start", {"sequence": "orders", "instances": []}), 422)
    problem(api.post("/bulk/instances/start", {"sequence": "orders", "instances": [{"x": 1}]}), 422)
    problem(api.post("/bulk/instances/start", {"sequence": "nope", "instances": [{}]}), 404)


# --- CLI -------------------------------------------------------------------------------------


def test_cli_start_many(conn, db_url, tmp_path):
    conn.execute(
        "SELECT orch8.create_sequence('default', 'default', 'orders', %s)",
        (Jsonb({"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}),),
    )
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    lines = [json.dumps({"data": {"n": i}, "idempotency_key": f"o-{i}"}) for i in range(25)]
    path = tmp_path / "orders.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    proc = run_orch8(
        "instances",
        "start-many",
        "orders",
        "--file",
        str(path),
        "--batch",
        "10",
        "--json",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["started"] == 25
    assert proc.stderr.splitlines()[-1] == "25/25 started"  # progress, a line a batch
    again = run_orch8("instances", "start-many", "orders", "--file", str(path), env=env)
    assert again.returncode == 0, again.stderr
    assert "0 instance(s) started, 25 already existed" in again.stdout

    path.write_text(lines[0] + "\n{not json\n")
    assert_one_line_error(
        run_orch8("instances", "start-many", "orders", "--file", str(path), env=env),
        "line 2: not JSON",
    )
    path.write_text(json.dumps({"data": [1]}) + "\n")
    assert_one_line_error(
        run_orch8("instances", "start-many", "orders", "--file", str(path), env=env),
        "instance 0 refused after 0 were started",
    )
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 25


def test_the_web_role_starts_batches_only_in_its_own_tenant(db_url, conn):
    """create_instances is callable by the web role, and only for its sealed tenant."""
    seq = make_seq(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    with psycopg.connect(db_url, autocommit=True) as web:
        web.execute("SET ROLE orch8_web")
        with pytest.raises(psycopg.Error, match="not sealed to tenant"):
            web.execute(
                "SELECT * FROM orch8.create_instances(%s, %s, '[{}]')", (TENANT, seq)
            ).fetchall()
