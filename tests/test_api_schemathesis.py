"""Schemathesis against the REST API with every check (`schemathesis run --checks all`):
the app is served by a real HTTP server on 127.0.0.1 (a random port, in a thread) and
schemathesis' engine sends what it generates from the OpenAPI document the app serves:
valid and invalid requests (examples, coverage, fuzzing), stateful sequences along the
document's links, requests without the key (ignored_auth), undeclared methods (405 with
Allow). The collected failures must be none.

The database is seeded (a sequence, a scheduled instance, a failed instance whose
receipt is unknown, a webhook subscription and a delivery) so success paths are reached.
ORCH8_SCHEMATHESIS_EXAMPLES sets the examples per operation (default: small, for
`make test`; 200 for a deeper search).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
import schemathesis
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from schemathesis.engine import Status, events, from_schema
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from orch8_py import apikeys, rules
from tests import pgserver
from tests.test_api import claim, fail_with_unknown_receipt
from web import create_app
from web.api.cursors import INT64_MAX, encode_cursor

TENANT = "acme"
MAX_EXAMPLES = int(os.environ.get("ORCH8_SCHEMATHESIS_EXAMPLES", "12"))
MAX_RESPONSE_TIME = 5.0  # seconds, for any answer

# The document's cursor formats: a valid cursor is one the API handed out, so the
# generator makes them the way the API does (encode_cursor) from positions of its kind.
_identifier = st.from_regex(rules.PATTERNS["identifier"]["pattern"], fullmatch=True)
_name = st.from_regex(rules.PATTERNS["sequence_name"]["pattern"], fullmatch=True)
CURSOR_FORMATS = {
    "orch8-instance-cursor": st.builds(
        encode_cursor, st.datetimes(timezones=st.just(dt.UTC)), st.uuids()
    ),
    "orch8-sequence-cursor": st.builds(encode_cursor, _identifier, _name),
    "orch8-delivery-cursor": st.builds(encode_cursor, st.integers(0, INT64_MAX)),
    "orch8-schedule-cursor": st.builds(encode_cursor, _identifier, st.uuids()),
    "orch8-task-cursor": st.builds(
        encode_cursor, st.datetimes(timezones=st.just(dt.UTC)), st.uuids()
    ),
}

# Every check schemathesis has ("all"); the test fails unless each of them ran.
ALL_CHECKS = {
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
    "object_level_authorization",
    "max_response_time",
}


def seed(conn: psycopg.Connection) -> None:
    blocks = [
        {"type": "step", "id": "charge", "handler": "test.api.charge"},
        {"type": "step", "id": "ship", "handler": "noop"},
    ]
    seq = conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', 'seeded', %s)",
        (TENANT, Jsonb({"blocks": blocks})),
    ).fetchone()[0]
    conn.execute(
        "SELECT orch8.create_webhook_subscription(%s, 'http://127.0.0.1:9/hook', 's3cret')",
        (TENANT,),
    )
    fail_with_unknown_receipt(conn, seq, TENANT)  # and its instance.failed delivery
    conn.execute("SELECT orch8.create_instance(%s, %s, %s)", (TENANT, seq, Jsonb({"n": 1})))
    # a handler workers serve, and a task of it queued (a poll has something to claim)
    conn.execute("SELECT orch8.register_worker_handler(%s, 'test.api.pay')", (TENANT,))
    pay = conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', 'paid', %s)",
        (TENANT, Jsonb({"blocks": [{"type": "step", "id": "pay", "handler": "test.api.pay"}]})),
    ).fetchone()[0]
    paid = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s, '{}')", (TENANT, pay)
    ).fetchone()[0]
    conn.execute(
        "SELECT orch8.begin_step(%s, %s, %s, 'pay', 'test.api.pay', '{}', 0)",
        (TENANT, paid, claim(conn, paid)),
    )


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:
        pass


@pytest.fixture(scope="module")
def served(admin_url, template_db) -> Iterator[tuple[str, str, dict]]:
    """(base URL, operator key, the served document) of the app on a seeded database."""
    name = pgserver.clone(admin_url, template_db, prefix="orch8_st")
    url = pgserver.with_dbname(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        seed(conn)
        _, key = apikeys.create(conn, TENANT, "operator", "schemathesis")
    app = create_app(url, secret_key="schemathesis-test")
    app.config["ORCH8_LONG_POLLS"] = 0  # a poll answers at once (wait_ms goes up to 60 s)
    server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        document = app.test_client().get("/api/v1/openapi.json").get_json()
        yield base, key, document
    finally:
        server.shutdown()
        thread.join()
        app.extensions["orch8.pool"].close()
        pgserver.drop(admin_url, name)


def run_all_checks(base: str, key: str, document: dict) -> tuple[list[str], set[str]]:
    """What `schemathesis run --checks all` reports: (failures, names of the checks run)."""
    for fmt, strategy in CURSOR_FORMATS.items():
        schemathesis.openapi.format(fmt, strategy)
    config = schemathesis.Config.from_dict(
        {
            "seed": 42,
            "operations": [
                {
                    # The document cannot say which definitions orch8.validate_sequence
                    # accepts (unique block ids, handlers, templates...): a generated one
                    # is almost always refused with 422 `invalid definition`, as declared.
                    "include-operation-id": "createSequence",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
                {
                    # Nor which cron expressions (an impossible date, a range out of order)
                    # and time zones (pg_timezone_names) orch8.create_schedule accepts.
                    "include-operation-id": "createSchedule",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
                {
                    # Nor which duration strings are at least 1 s and at most 366 days
                    # (orch8.duration_ms): "0s" and "999999999999d" match its pattern.
                    "include-operation-id": "registerWorkerHandler",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
                {
                    # Nor which duration strings are more than 0 and at most 366 days
                    # (orch8.duration_ms): "0s" and "999999999999d" match its pattern.
                    "include-operation-id": "setRateLimit",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                },
            ],
        }
    )
    schema = schemathesis.openapi.from_dict(document, config=config)
    schema.config.update(base_url=base, headers={"Authorization": f"Bearer {key}"}, workers=1)
    schema.config.checks.update(included_check_names=["all"], max_response_time=MAX_RESPONSE_TIME)
    schema.config.generation.update(
        max_examples=MAX_EXAMPLES,
        deterministic=True,
        allow_x00=False,  # the document says strings hold no NUL
        codec="utf-8",
        database="none",
    )
    failures: list[str] = []
    ran: set[str] = set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for nodes in event.recorder.checks.values():
                for node in nodes:
                    ran.add(node.name)
                    if node.status == Status.FAILURE and node.failure_info is not None:
                        failure = node.failure_info.failure
                        failures.append(
                            f"[{event.phase.value}] {event.label} {node.name}: "
                            f"{failure.title}\n{failure.message}\n"
                            f"{node.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError):
            failures.append(f"ERROR {event.label}: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            failures.append(f"FATAL: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            failures += [f"after the run: {f.title}: {f.message}" for f in event.failures]
    return sorted(set(failures)), ran


def test_every_check_passes_against_the_served_document(served):
    base, key, document = served
    started = time.monotonic()
    failures, ran = run_all_checks(base, key, document)
    elapsed = time.monotonic() - started
    assert failures == [], f"{len(failures)} failure(s):\n\n" + "\n\n".join(failures[:20])
    assert ran == ALL_CHECKS, ALL_CHECKS - ran
    print(f"schemathesis: {len(ran)} checks, {MAX_EXAMPLES} examples, {elapsed:.1f} s")
