"""`orch8 sequences|instances|effects|api-key ...` as real processes on a fresh database:
each command's happy path and its refusals, the exit codes (0 ok, 1 error, 2 bad input,
3 blocked by an unresolved effect, 4 stale), and the reconciliation flow end to end."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

from psycopg.types.json import Jsonb

from orch8_py.handlers.http import output_from_response
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.queue_helpers import (
    VERIFIED_HANDLER,
    escalate,
    supersede,
    unknown_receipt,
    verified_sequence,
)
from tests.runner_helpers import TENANT, make_sequence, start

PARAMS = {"url": "https://pay.example/charge"}


def orch8(db_url: str, *args: str):
    return run_orch8(*args, env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"))


def ok(db_url: str, *args: str) -> str:
    proc = orch8(db_url, *args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert proc.stderr == "", proc.stderr
    return proc.stdout


def ok_json(db_url: str, *args: str):
    return json.loads(ok(db_url, *args, "--json"))


def refused(db_url: str, code: int, *args: str, fragments=()):
    proc = orch8(db_url, *args)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    assert_one_line_error(proc, *fragments)
    assert proc.stdout == "", proc.stdout
    return proc.stderr


def many(db_url: str, calls: list[tuple]) -> None:
    """Independent refusals in parallel: (exit code, args, fragments)."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda c: refused(db_url, c[0], *c[1], fragments=c[2]), calls))


def fail_with_unknown_receipt(conn, seq) -> tuple[uuid.UUID, uuid.UUID]:
    """A failed instance whose charge receipt is unknown: the attempt began, its run was
    lost, and another claim began the same attempt (as in tests/test_operations.py)."""
    a = start(conn, seq)

    def claim():
        return conn.execute(
            "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
        ).fetchone()[0]

    def begin(token):
        return conn.execute(
            "SELECT outcome, effect_id FROM orch8.begin_step("
            "%s, %s, %s, 'charge', 'test.cli.charge', %s, 0)",
            (TENANT, a, token, Jsonb(PARAMS)),
        ).fetchone()

    token = claim()
    begin(token)
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, a, token))
    outcome, effect_id = begin(claim())
    assert outcome == "blocked"
    state = conn.execute("SELECT state::text FROM orch8.task_instances WHERE id = %s", (a,))
    assert state.fetchone()[0] == "failed"
    return a, effect_id


def test_sequences_create_list_show(db_url, tmp_path):
    f = tmp_path / "checkout.json"
    f.write_text(json.dumps({"blocks": [{"id": "charge", "type": "step", "handler": "noop"}]}))
    assert "created default/checkout version 1" in ok(
        db_url, "sequences", "create", str(f), "--name", "checkout"
    )
    assert ok_json(db_url, "sequences", "create", str(f), "--name", "checkout")["version"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"blocks": [{"id": "a", "type": "step"}]}))
    proc = orch8(db_url, "sequences", "create", str(bad), "--name", "bad")
    assert proc.returncode == 2 and "$.blocks[0].handler" in proc.stderr, proc.stderr

    text = ok(db_url, "sequences", "list")
    assert re.search(r"default\s+checkout\s+2\s+2\s+1", text), text
    assert text.splitlines()[0].split()[:4] == ["NAMESPACE", "NAME", "LATEST", "VERSIONS"]
    [row] = ok_json(db_url, "sequences", "list")
    assert (row["name"], row["latest_version"], row["versions"]) == ("checkout", 2, 2)
    assert "no sequences" in ok(db_url, "sequences", "list", "--namespace", "other")
    assert ok_json(db_url, "sequences", "list", "--tenant", "other") == []

    shown = ok_json(db_url, "sequences", "show", "checkout")
    assert shown["version"] == 2 and shown["versions"] == [1, 2]
    assert shown["definition"]["blocks"][0]["id"] == "charge"
    text = ok(db_url, "sequences", "show", "checkout", "--version", "1")
    assert "sequence default/checkout version 1 (versions: 1, 2)" in text
    assert re.search(r"charge\s+step\s+noop", text), text
    many(
        db_url,
        [
            (1, ("sequences", "show", "nope"), ("sequence default/nope not found",)),
            (1, ("sequences", "show", "checkout", "--version", "9"), ("version 9 not found",)),
            (2, ("sequences", "show", "checkout", "--version", "0"), ("--version",)),
            (
                2,
                ("sequences", "create", str(tmp_path / "none.json"), "--name", "x"),
                ("not found",),
            ),
        ],
    )


def test_instances_list_and_operations(db_url, conn):
    make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}], name="orders")
    t = ("--tenant", TENANT)
    a = ok_json(db_url, "instances", "start", "orders", "--data", '{"order": 1}', *t)["id"]
    b = ok_json(db_url, "instances", "start", "orders", *t)["id"]

    text = ok(db_url, "instances", "list", *t)
    assert a in text and b in text and "orders v1" in text and "scheduled" in text
    rows = ok_json(
        db_url,
        "instances",
        "list",
        "--state",
        "scheduled",
        "--sequence",
        "orders",
        "--limit",
        "1",
        *t,
    )
    assert [r["id"] for r in rows] == [b]  # newest first
    assert ok_json(db_url, "instances", "list", "--sequence", "other", *t) == []
    assert "no instances in tenant 'default'" in ok(db_url, "instances", "list")

    assert ok(db_url, "instances", "pause", a, *t).strip() == f"instance {a} is now paused"
    assert "already paused" in ok(db_url, "instances", "pause", a, *t)
    assert (
        ok_json(db_url, "instances", "resume", a, "--reason", "checked", *t)["outcome"]
        == "scheduled"
    )
    sig = ok_json(db_url, "instances", "signal", a, "approved", "--payload", '{"by": "bob"}', *t)
    assert sig["outcome"] == "pending" and sig["signal_type"] == "approved"
    assert conn.execute(
        "SELECT payload, actor FROM orch8.instance_signals WHERE instance_id = %s", (a,)
    ).fetchone() == ({"by": "bob"}, "cli:tester")
    text = ok(
        db_url, "instances", "cancel", a, "--reason", "customer asked", "--actor", "alice", *t
    )
    assert f"instance {a} is now cancelled" in text
    assert conn.execute(
        "SELECT actor, reason FROM orch8.instance_transitions WHERE instance_id = %s"
        " ORDER BY seq DESC LIMIT 1",
        (a,),
    ).fetchone() == ("alice", "customer asked")
    assert ok_json(db_url, "instances", "cancel", a, *t)["outcome"] == "unchanged"
    shown = ok_json(db_url, "instances", "show", a, *t)
    assert shown["state"] == "cancelled"
    # every request is on record with who asked, why, and what it answered
    assert [(r["action"], r["actor"], r["reason"], r["outcome"]) for r in shown["requests"]] == [
        ("pause", "cli:tester", None, "paused"),
        ("pause", "cli:tester", None, "unchanged"),
        ("resume", "cli:tester", "checked", "scheduled"),
        ("cancel", "alice", "customer asked", "cancelled"),
        ("cancel", "cli:tester", None, "unchanged"),
    ]
    text = ok(db_url, "instances", "show", a, *t)
    assert re.search(r"requests:\n.*pause +by cli:tester: paused", text), text
    assert re.search(r"resume +by cli:tester: scheduled  \(checked\)", text), text
    assert [r["id"] for r in ok_json(db_url, "instances", "list", "--state", "cancelled", *t)] == [
        a
    ]

    many(
        db_url,
        [
            (1, ("instances", "pause", a, *t), ("cannot be paused", "current state: cancelled")),
            (1, ("instances", "resume", b, *t), ("not paused", "current state: scheduled")),
            (1, ("instances", "retry", b, *t), ("only a failed instance can be retried",)),
            (1, ("instances", "cancel", a), ("not found",)),  # another tenant
            (2, ("instances", "signal", b, "bad type!", *t), ("signal type",)),
            (2, ("instances", "signal", b, "x", "--payload", "[1]", *t), ("--payload", "object")),
            (
                2,
                ("instances", "start", "orders", "--data", "{bad", *t),
                ("--data", "not valid JSON"),
            ),
            (1, ("instances", "start", "nope", *t), ("sequence default/nope not found",)),
        ],
    )


def test_bad_input_is_one_line_with_exit_2(db_url, tmp_path):
    u = str(uuid.uuid4())
    resolve = ("effects", "resolve", u, "--state", "committed", "--expected-state", "unknown")
    many(
        db_url,
        [
            (2, ("instances", "show", "nope"), ("'nope' is not an instance id",)),
            (2, ("instances", "retry", "42"), ("not an instance id",)),
            (2, ("instances", "retry", u, "--output", "{bad"), ("--output is not valid JSON",)),
            (
                2,
                ("instances", "retry", u, "--output", f"@{tmp_path / 'none.json'}"),
                ("--output @", "cannot read"),
            ),
            (2, ("instances", "cancel", "x"), ("not an instance id",)),
            (2, ("instances", "pause", "x"), ("not an instance id",)),
            (2, ("instances", "resume", "x"), ("not an instance id",)),
            (2, ("instances", "signal", "x", "t"), ("not an instance id",)),
            (2, ("instances", "list", "--limit", "0"), ("--limit",)),
            (2, ("effects", "show", "x"), ("not an effect id",)),
            (2, ("effects", "find", " "), ("the key must be 1 to 256 bytes, without NUL",)),
            (2, ("effects", "find", "k" * 257), ("the key must be 1 to 256 bytes, without NUL",)),
            (
                2,
                ("effects", "resolve", "x", "--state", "committed", "--expected-state", "unknown"),
                ("not an effect id",),
            ),
            (2, (*resolve, "--evidence", "{bad"), ("--evidence is not valid JSON",)),
            (2, (*resolve, "--evidence", "[]"), ("--evidence must be a JSON object",)),
            (2, (*resolve, "--evidence", "NaN"), ("--evidence is not valid JSON",)),
            (2, (*resolve, "--output", "{bad"), ("--output is not valid JSON",)),
            (2, (*resolve, "--response", "[]"), ("--response must be a JSON object",)),
            (2, (*resolve, "--response", '{"json": {}}'), ("--response needs", "status")),
            (2, (*resolve, "--response", '{"status": "200"}'), ("--response needs",)),
            (
                2,
                (*resolve, "--response", '{"status": 200}', "--evidence", '{"response": {}}'),
                ("give the provider's response once",),
            ),
            (2, (*resolve, "--actor", " "), ("--actor",)),
            (2, ("effects", "unresolved", "--older-than", "10x"), ("--older-than '10x'",)),
            (2, ("effects", "unresolved", "--older-than", "m"), ("is not a duration",)),
            (2, ("effects", "unresolved", "--limit", "-1"), ("--limit",)),
            (2, ("effects", "verify"), ("name the receipts to verify", "--superseded")),
            (2, ("effects", "verify", u, "--superseded"), ("not both",)),
            (2, ("effects", "verify", u, "x"), ("'x' is not an effect id",)),
            (2, ("api-key", "revoke", "x"), ("not an API key id",)),
            (1, ("effects", "show", u), (f"effect receipt {u} not found",)),
            (1, resolve, (f"{u} not found",)),
            (1, ("instances", "retry", u), (f"instance {u} not found",)),
        ],
    )
    # usage errors are argparse's: exit 2 with the usage
    for args in (
        ("effects", "resolve", u, "--expected-state", "unknown"),  # --state is required
        ("effects", "resolve", u, "--state", "committed"),  # --expected-state is required
        ("effects", "resolve", u, "--state", "dispatched", "--expected-state", "unknown"),
        ("effects", "resolve", u, "--state", "planned", "--expected-state", "unknown"),
        ("effects", "resolve", u, "--state", "committed", "--expected-state", "settled"),
        ("effects", "unresolved", "--kind", "fax"),
        ("effects", "unresolved", "--blocking", "--superseded"),
        ("api-key", "create", "--role", "root"),
        ("instances", "list", "--state", "done"),
    ):
        proc = orch8(db_url, *args)
        assert proc.returncode == 2 and "usage:" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_reconciliation_flow(db_url, conn):
    seq = make_sequence(
        conn,
        [
            {"type": "step", "id": "charge", "handler": "test.cli.charge"},
            {"type": "step", "id": "ship", "handler": "noop"},
        ],
    )
    a, ea = fail_with_unknown_receipt(conn, seq)
    b, eb = fail_with_unknown_receipt(conn, seq)
    t = ("--tenant", TENANT)

    # 1. the queue lists both, oldest first
    text = ok(db_url, "effects", "unresolved", *t)
    header, first, second = text.splitlines()[:3]
    assert header.split()[:4] == ["EFFECT", "ID", "KIND", "STATE"] and "IDEMPOTENCY KEY" in header
    assert "BLOCKING" in header and "VERIFICATION" in header
    assert first.split()[:3] == [str(ea), "worker", "unknown"] and str(a) in first
    # its failed instance waits on it; no verifier: "yes" and "-"
    assert re.search(r"charge\s+0\s+yes\s+-\s", first), first
    assert "charge" in first and second.startswith(str(eb))
    rows = ok_json(db_url, "effects", "unresolved", *t)
    assert [r["effect_id"] for r in rows] == [str(ea), str(eb)]
    assert rows[0]["kind"] == "worker" and rows[0]["attempt"] == 0 and rows[0]["age_seconds"] >= 0
    assert (rows[0]["blocking"], rows[0]["verification"], rows[0]["verification_tries"]) == (
        True,
        None,
        None,
    )
    assert [
        r["effect_id"] for r in ok_json(db_url, "effects", "unresolved", "--limit", "1", *t)
    ] == [str(ea)]
    assert (
        ok_json(db_url, "effects", "unresolved", "--kind", "worker", "--older-than", "0s", *t) != []
    )
    assert ok_json(db_url, "effects", "unresolved", "--kind", "http", *t) == []
    assert "no unresolved effects" in ok(db_url, "effects", "unresolved", "--older-than", "1h", *t)
    assert ok_json(db_url, "effects", "unresolved") == []  # the default tenant has none

    # 2. one receipt, every field and its history
    receipt = conn.execute(
        "SELECT continuity_id, request_sha256, destination_fingerprint FROM orch8.effect_receipts"
        " WHERE id = %s",
        (ea,),
    ).fetchone()
    text = ok(db_url, "effects", "show", str(ea), *t)
    for field in (
        "instance",
        "block",
        "attempt",
        "epoch",
        "continuity id",
        "handler",
        "kind",
        "request sha256",
        "destination fingerprint",
        "idempotency key",
        "provider receipt id",
        "error",
        "evidence:",
        "history:",
    ):
        assert re.search(rf"^ *{field}", text, re.M), field
    for value in (str(a), *map(str, receipt), "test.cli.charge", "worker", "(failed)"):
        assert value in text, value
    assert re.search(r"dispatched\s+unknown", text), text
    assert f"orch8 effects resolve {ea} --tenant {TENANT} --expected-state unknown" in text
    shown = ok_json(db_url, "effects", "show", str(ea), *t)
    # found again by the key a provider would show (here the default key: its id)
    found = ok(db_url, "effects", "find", str(ea), *t)
    assert str(ea) in found and "orch8 effects show EFFECT_ID" in found
    assert [r["id"] for r in ok_json(db_url, "effects", "find", str(ea), *t)] == [str(ea)]
    assert "no receipt in tenant" in ok(db_url, "effects", "find", "nothing-sent", *t)
    assert shown["state"] == "unknown" and shown["request_sha256"] == receipt[1]
    assert [e["to_state"] for e in shown["events"]] == [
        "planned",
        "prepared",
        "dispatched",
        "unknown",
    ]

    # 3. the retry refuses while the receipt is unknown, naming it and the command
    err = refused(db_url, 3, "instances", "retry", str(a), *t, fragments=(str(ea), "is unknown"))
    assert f"orch8 effects resolve {ea} --tenant {TENANT} --expected-state unknown" in err

    # 4. resolve: stale expectation (4), missing evidence (2), then committed
    refused(
        db_url,
        4,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "committed",
        "--expected-state",
        "dispatched",
        *t,
        fragments=("reload before resolving",),
    )
    refused(
        db_url,
        2,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "abandoned",
        "--expected-state",
        "unknown",
        *t,
        fragments=("needs evidence",),
    )
    text = ok(
        db_url,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "committed",
        "--provider-receipt-id",
        "ch_1",
        "--evidence",
        '{"checked": "dashboard"}',
        "--note",
        "provider shows it",
        "--expected-state",
        "unknown",
        *t,
    )
    assert f"effect {ea} is now committed (provider receipt ch_1)" in text
    assert f"orch8 instances retry {a} --tenant {TENANT}" in text
    # a second resolution still expecting unknown: stale (4), the first one stays
    refused(
        db_url,
        4,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "abandoned",
        "--evidence",
        '{"by": "bob"}',
        "--expected-state",
        "unknown",
        *t,
        fragments=("reload before resolving",),
    )
    refused(
        db_url,
        1,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "committed",
        "--expected-state",
        "committed",
        *t,
        fragments=("cannot be resolved from committed", "current state: committed"),
    )
    out = ok_json(
        db_url,
        "effects",
        "resolve",
        str(eb),
        "--state",
        "abandoned",
        "--evidence",
        '{"found": "nothing"}',
        "--expected-state",
        "unknown",
        "--actor",
        "alice@ops",
        *t,
    )
    assert out["state"] == "abandoned" and out["instance_state"] == "failed"
    actors = dict(
        conn.execute(
            "SELECT DISTINCT ON (receipt_id) receipt_id, actor FROM orch8.effect_receipt_events"
            " WHERE receipt_id = ANY(%s) ORDER BY receipt_id, event_id DESC",
            ([ea, eb],),
        ).fetchall()
    )
    assert actors == {ea: "cli:tester", eb: "alice@ops"}
    resolution = ok_json(db_url, "effects", "show", str(ea), *t)["evidence"]["resolution"]
    assert resolution["evidence"] == {"checked": "dashboard"}
    assert resolution["note"] == "provider shows it"
    assert "no unresolved effects" in ok(db_url, "effects", "unresolved", *t)

    # 5. the retry completes the step from the evidence; the abandoned one runs again
    text = ok(db_url, "instances", "retry", str(a), *t)
    assert text.startswith("completed_from_evidence (block charge)") and "ch_1" in text
    assert f"instance {a} is now scheduled" in text
    again = ok_json(db_url, "instances", "retry", str(b), *t)
    assert again["outcome"] == "rerun" and again["effect_id"] == str(eb)
    assert again["state"] == "scheduled"
    settled = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'charge'"
        " AND sentinel IS NULL",
        (a,),
    ).fetchone()[0]
    assert settled["settled"] and settled["provider_receipt_id"] == "ch_1"
    assert settled["settled_by"] == "cli:tester"
    refused(db_url, 1, "instances", "retry", str(a), *t, fragments=("only a failed instance",))


def test_resolve_with_an_output_and_retry_with_one(db_url, conn, tmp_path):
    seq = make_sequence(
        conn,
        [
            {"type": "step", "id": "charge", "handler": "test.cli.charge"},
            {
                "type": "step",
                "id": "ship",
                "handler": "noop",
                "params": {"receipt": "{{ outputs.charge.receipt_id }}"},
            },
        ],
    )
    a, ea = fail_with_unknown_receipt(conn, seq)
    b, eb = fail_with_unknown_receipt(conn, seq)
    t = ("--tenant", TENANT)
    output_file = tmp_path / "output.json"
    output_file.write_text(json.dumps({"receipt_id": "ch_a"}))

    # a: the output comes with the resolution (from a file)
    text = ok(
        db_url,
        "effects",
        "resolve",
        str(ea),
        "--state",
        "verified",
        "--expected-state",
        "unknown",
        "--evidence",
        '{"dashboard": "paid"}',
        "--output",
        f"@{output_file}",
        *t,
    )
    assert 'the step\'s output: {"receipt_id": "ch_a"}' in text
    assert f"next: `orch8 instances retry {a} --tenant {TENANT}`" in text
    done = ok_json(db_url, "instances", "retry", str(a), *t)
    assert (done["outcome"], done["state"]) == ("completed_from_evidence", "scheduled")
    assert _charge_output(conn, a) == {"receipt_id": "ch_a"}

    # b: none with the resolution; the retry refuses, naming the block that reads it
    ok(
        db_url,
        "effects",
        "resolve",
        str(eb),
        "--state",
        "committed",
        "--expected-state",
        "unknown",
        *t,
    )
    err = refused(
        db_url,
        2,
        "instances",
        "retry",
        str(b),
        *t,
        fragments=(
            "read by: ship",
            "--output JSON",
            f"orch8 instances retry {b} --tenant {TENANT}",
        ),
    )
    assert "block charge" in err
    assert conn.execute(
        "SELECT state::text FROM orch8.task_instances WHERE id = %s", (b,)
    ).fetchone() == ("failed",)
    refused(
        db_url, 2, "instances", "retry", str(b), "--output", "{oops", *t, fragments=("--output",)
    )
    # the output on standard input: @-
    proc = subprocess.run(
        [sys.executable, "-m", "orch8_py", "instances", "retry", str(b), *t, "--output", "@-"],
        input='{"receipt_id": "ch_b"}',
        env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("completed_from_evidence (block charge)")
    assert _charge_output(conn, b) == {"receipt_id": "ch_b"}


def _charge_output(conn, instance):
    return conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'charge'"
        " AND sentinel IS NULL",
        (instance,),
    ).fetchone()[0]


def test_resolve_an_http_request_with_the_providers_response(db_url, conn):
    params = {"method": "POST", "url": "https://pay.example/charges", "receipt_path": "json.id"}
    seq = make_sequence(
        conn,
        [
            {"type": "step", "id": "charge", "handler": "http_request", "params": params},
            {
                "type": "step",
                "id": "ship",
                "handler": "noop",
                "params": {"r": "{{ outputs.charge }}"},
            },
        ],
    )
    a = start(conn, seq)
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    begin = (
        "SELECT outcome, effect_id FROM orch8.begin_step(%s, %s, %s, 'charge', 'http_request',"
        " %s, 0)"
    )
    conn.execute(begin, (TENANT, a, token, Jsonb(params)))
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, a, token))
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    outcome, effect_id = conn.execute(begin, (TENANT, a, token, Jsonb(params))).fetchone()
    assert outcome == "blocked"
    response = {"status": 200, "json": {"id": "ch_42", "paid": True}}
    resolve = (
        "effects",
        "resolve",
        str(effect_id),
        "--expected-state",
        "unknown",
        "--tenant",
        TENANT,
    )
    refused(
        db_url,
        2,
        *resolve,
        "--state",
        "committed",
        "--response",
        '{"status": 200, "colour": "red"}',
        fragments=("cannot derive the http_request output from the evidence", "colour"),
    )
    refused(
        db_url,
        2,
        *resolve,
        "--state",
        "abandoned",
        "--evidence",
        '{"found": "nothing"}',
        "--output",
        "1",
        fragments=("an output belongs to a committed or verified resolution",),
    )
    out = ok_json(
        db_url,
        "effects",
        "resolve",
        str(effect_id),
        "--state",
        "committed",
        "--expected-state",
        "unknown",
        "--response",
        json.dumps(response),
        "--evidence",
        '{"checked": "provider API"}',
        "--tenant",
        TENANT,
    )
    resolution = out["evidence"]["resolution"]
    assert resolution["evidence"] == {"checked": "provider API", "response": response}
    assert resolution["output"] == output_from_response(response, "json.id")
    assert out["instance_state"] == "failed"
    ok(db_url, "instances", "retry", str(a), "--tenant", TENANT)
    assert _charge_output(conn, a) == output_from_response(response, "json.id")


def test_verify_and_the_queue_shows_blocking_superseded_and_verification(db_url, conn):
    t = ("--tenant", TENANT)
    plain = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.cli.charge"}])
    _, no_verifier = fail_with_unknown_receipt(conn, plain)
    verified = verified_sequence(conn, TENANT)
    _, escalated = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    escalate(conn, TENANT, escalated)
    gone, superseded = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    supersede(conn, TENANT, gone)

    text = ok(db_url, "effects", "unresolved", *t)
    lines = {line.split()[0]: line for line in text.splitlines()[1:4]}
    assert re.search(r"\syes\s+-\s", lines[str(no_verifier)]), text
    assert re.search(r"\syes\s+escalated 1/1\s", lines[str(escalated)]), text
    assert re.search(r"\ssuperseded\s+verifying 0/1\s", lines[str(superseded)]), text
    assert f"orch8 effects verify --superseded --tenant {TENANT}" in text
    blocking = ok_json(db_url, "effects", "unresolved", "--blocking", *t)
    assert [r["effect_id"] for r in blocking] == [str(no_verifier), str(escalated)]
    assert blocking[1]["verification"] == "escalated"
    assert (blocking[1]["verification_tries"], blocking[1]["verification_max_tries"]) == (1, 1)
    assert [
        r["effect_id"] for r in ok_json(db_url, "effects", "unresolved", "--superseded", *t)
    ] == [str(superseded)]
    only = ok(db_url, "effects", "unresolved", "--superseded", "--kind", "http", *t)
    assert "no unresolved effects in tenant 't1' (kind http, superseded)" in only

    missing = str(uuid.uuid4())
    text = ok(db_url, "effects", "verify", str(no_verifier), str(escalated), missing, *t)
    said = dict(line.split("  ", 1) for line in text.splitlines())
    assert said[str(no_verifier)].startswith("no_verifier: its step declares no verify")
    assert said[str(escalated)].startswith("rescheduled: its escalated verification starts over")
    assert said[missing] == "not_found: no such receipt in this tenant"
    assert "verifying 0/1" in ok(db_url, "effects", "unresolved", "--blocking", *t)
    again = ok_json(db_url, "effects", "verify", "--superseded", "--actor", "alice", *t)
    assert again == [{"effect_id": str(superseded), "outcome": "already_scheduled"}]
    assert ok(db_url, "effects", "verify", "--superseded").strip() == (
        "no superseded unknown receipts in tenant 'default'"
    )
    # who asked is on the receipt
    actors = conn.execute(
        "SELECT actor FROM orch8.effect_receipt_events WHERE receipt_id = %s"
        " AND note = 'verification scheduled again'",
        (escalated,),
    ).fetchall()
    assert actors == [("cli:tester",)]
    # over 1000 receipts in one request: refused by the engine, in one line
    ids = [str(uuid.uuid4()) for _ in range(1001)]
    refused(db_url, 2, "effects", "verify", *ids, *t, fragments=("at most 1000",))


def test_api_keys(db_url, conn):
    text = ok(db_url, "api-key", "create", "--role", "operator", "--name", "ci")
    [secret] = re.findall(r"o8_[0-9a-f]{8}_[A-Za-z0-9_-]{43}", text)
    assert "shown once" in text and "not stored" in text and "role operator" in text
    key_hash = hashlib.sha256(secret.encode()).hexdigest()
    auth = "SELECT tenant_id, role, name FROM orch8.authenticate_api_key(%s)"
    assert conn.execute(auth, (key_hash,)).fetchall() == [("default", "operator", "ci")]
    created = ok_json(db_url, "api-key", "create", "--role", "auditor", "--tenant", TENANT)
    assert created["role"] == "auditor" and created["name"] == "auditor"
    assert (
        created["secret"].startswith(created["key_prefix"] + "_")
        and "not stored" in created["warning"]
    )

    listing = ok(db_url, "api-key", "list")
    assert secret not in listing and created["key_prefix"] not in listing
    # columns: prefix, role, name, created, last used (the check above used it), expires,
    # revoked
    line = re.escape(secret[:11]) + r"\s+operator\s+ci\s+\S+ \S+Z\s+\S+ \S+Z\s+never\s+no$"
    assert re.search(line, listing, re.M), listing
    other = ok(db_url, "api-key", "list", "--tenant", TENANT)
    assert re.search(r"auditor\s+auditor\s+\S+ \S+Z\s+never\s+never\s+no$", other, re.M), other
    temp = ok_json(
        db_url, "api-key", "create", "--role", "operator", "--expires-in", "2h", "--tenant", TENANT
    )
    assert temp["expires_at"] is not None
    shown = ok(db_url, "api-key", "list", "--tenant", TENANT)
    assert re.search(re.escape(temp["key_prefix"]) + r".*\d\d:\d\d:\d\dZ\s+no$", shown, re.M)
    [key] = ok_json(db_url, "api-key", "list")
    assert key["key_prefix"] == secret[:11] and key["revoked_at"] is None

    assert "revoked API key" in ok(db_url, "api-key", "revoke", str(key["id"]))
    assert conn.execute(auth, (key_hash,)).fetchall() == []
    assert ok_json(db_url, "api-key", "revoke", str(key["id"]))["already_revoked"] is True
    assert ok_json(db_url, "api-key", "list")[0]["revoked_at"] is not None
    many(
        db_url,
        [
            (1, ("api-key", "revoke", str(key["id"]), "--tenant", TENANT), ("not found",)),
            (1, ("api-key", "revoke", str(uuid.uuid4())), ("not found",)),
            (2, ("api-key", "create", "--role", "admin", "--tenant", "bad tenant"), ("tenant",)),
            (2, ("api-key", "create", "--role", "admin", "--expires-in", "soon"), ("duration",)),
        ],
    )


def test_webhook_subscriptions_from_the_cli(db_url):
    import json as _json

    from tests.cli_helpers import orch8_env, run_orch8

    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    made = run_orch8(
        "webhooks",
        "subscribe",
        "https://hooks.example/orch8",
        "--event",
        "instance.failed",
        "--json",
        env=env,
    )
    assert made.returncode == 0, made.stderr
    created = _json.loads(made.stdout)
    assert created["events"] == ["instance.failed"] and len(created["secret"]) > 20
    listed = _json.loads(run_orch8("webhooks", "list", "--json", env=env).stdout)
    assert [s["url"] for s in listed] == ["https://hooks.example/orch8"]
    bad = run_orch8("webhooks", "subscribe", "ftp://x.example/", env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert run_orch8("webhooks", "outbox", env=env).stdout.strip() == "the outbox is empty"


def test_webhooks_disable_and_enable(db_url, conn):
    t = ("--tenant", TENANT)
    sub = ok_json(db_url, "webhooks", "subscribe", "https://hooks.example/orch8", *t)
    sid = str(sub["id"])

    text = ok(db_url, "webhooks", "disable", sid, *t)
    assert f"disabled webhook subscription {sid} (https://hooks.example/orch8)" in text
    assert "no new events" in text
    enabled = "SELECT enabled FROM orch8.webhook_subscriptions WHERE id = %s"
    assert conn.execute(enabled, (sid,)).fetchone()[0] is False
    listing = ok(db_url, "webhooks", "list", *t)
    assert listing.splitlines()[0].split() == ["ID", "URL", "EVENTS", "ENABLED", "CREATED"]
    assert re.search(rf"^{sid}\s+https://hooks.example/orch8\s+\S+\s+no\s", listing, re.M), listing
    assert "already disabled: nothing to do" in ok(db_url, "webhooks", "disable", sid, *t)
    again = ok_json(db_url, "webhooks", "disable", sid, *t)
    assert (again["id"], again["enabled"], again["changed"]) == (sid, False, False)
    assert set(again) == {"id", "url", "events", "enabled", "created_at", "changed"}

    on = ok_json(db_url, "webhooks", "enable", sid, *t)
    assert (on["enabled"], on["changed"], on["url"]) == (True, True, "https://hooks.example/orch8")
    assert sub["secret"] not in json.dumps(on)
    assert conn.execute(enabled, (sid,)).fetchone()[0] is True
    assert "already enabled" in ok(db_url, "webhooks", "enable", sid, *t)
    assert re.search(rf"^{sid}\s.*\syes\s", ok(db_url, "webhooks", "list", *t), re.M)

    many(
        db_url,
        [
            (2, ("webhooks", "disable", "not-a-uuid", *t), ("'not-a-uuid' is not",)),
            (2, ("webhooks", "enable", "42", "--json", *t), ("is not a webhook subscription id",)),
            (1, ("webhooks", "disable", str(uuid.uuid4()), *t), ("not found in tenant 't1'",)),
            # another tenant's subscription is not found, and stays as it is
            (1, ("webhooks", "disable", sid), ("not found", "orch8 webhooks list")),
            (1, ("webhooks", "enable", sid, "--tenant", "other", "--json"), ("not found",)),
        ],
    )
    assert conn.execute(enabled, (sid,)).fetchone()[0] is True


def test_output_cut_short_by_the_reader_is_no_traceback(db_url):
    """`orch8 ... | head`: the reader closes the pipe; the command ends quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orch8_py", "effects", "unresolved"],
        env=orch8_env(ORCH8_DATABASE_URL=db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -0`
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
