"""Schemathesis against the REST API, in process: every operation of the OpenAPI document
served at /api/v1/openapi.json, with generated valid and invalid requests, must answer
without a server error, with a documented status and a body matching its schema.

The database is seeded (a sequence, a scheduled instance, a failed instance whose receipt
is unknown, a webhook delivery) and each generated case is sent twice: as generated (its
ids rarely exist) and with its path ids replaced by the seeded ones, so the success paths
are exercised too.
"""

from __future__ import annotations

import json
import os

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from psycopg.types.json import Jsonb
from schemathesis.checks import (
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orch8_py import apikeys
from tests import pgserver
from tests.test_api import fail_with_unknown_receipt
from web import create_app
from web.api.openapi import DOCUMENT

TENANT = "acme"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    negative_data_rejection,  # invalid requests (by the document) must be refused
]
# bounded so the file runs in seconds; ORCH8_SCHEMATHESIS_EXAMPLES=500 for a deeper search
MAX_EXAMPLES = int(os.environ.get("ORCH8_SCHEMATHESIS_EXAMPLES", "20"))


def seed(conn) -> dict:
    blocks = [
        {"type": "step", "id": "charge", "handler": "test.api.charge"},
        {"type": "step", "id": "ship", "handler": "noop"},
    ]
    seq = conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', 'seeded', %s)",
        (TENANT, Jsonb({"blocks": blocks})),
    ).fetchone()[0]
    subscription = conn.execute(
        "SELECT orch8.create_webhook_subscription(%s, 'http://127.0.0.1:9/hook', 's3cret')",
        (TENANT,),
    ).fetchone()[0]
    failed, effect_id = fail_with_unknown_receipt(conn, seq, TENANT)
    scheduled = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s, %s)", (TENANT, seq, Jsonb({"n": 1}))
    ).fetchone()[0]
    continuity = conn.execute(
        "SELECT continuity_id FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()[0]
    delivery = conn.execute(
        "SELECT id FROM orch8.webhook_outbox WHERE tenant_id = %s", (TENANT,)
    ).fetchone()[0]
    return {
        "instance_id": str(scheduled),
        "failed_instance_id": str(failed),
        "effect_id": str(effect_id),
        "continuity_id": str(continuity),
        "delivery_id": delivery,
        "subscription_id": str(subscription),
        "namespace": "default",
        "name": "seeded",
        "version": 1,
    }


@pytest.fixture(scope="module")
def api_env(admin_url, template_db):
    name = pgserver.clone(admin_url, template_db, prefix="orch8_st")
    url = pgserver.with_dbname(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        ids = seed(conn)
        _, key = apikeys.create(conn, TENANT, "operator", "schemathesis")
    app = create_app(url, secret_key="schemathesis-test")
    try:
        yield app, key, ids
    finally:
        app.extensions["orch8.pool"].close()
        pgserver.drop(admin_url, name)


# Loaded from the document the app serves (test_served_document_is_the_one_tested checks
# they are the same); the app under test is handed to each call, since its database is a
# fixture. (schemathesis.pytest.from_fixture does not work with pytest 9 yet.)
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_served_document_is_the_one_tested(api_env):
    app, _, _ = api_env
    assert app.test_client().get("/api/v1/openapi.json").get_json() == json.loads(
        json.dumps(DOCUMENT)
    )


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize="ORCH8_SCHEMATHESIS_EXAMPLES" not in os.environ,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_openapi_document(case, api_env):
    app, key, ids = api_env
    headers = {"Authorization": f"Bearer {key}"}
    case.call_and_validate(app=app, headers=headers, checks=CHECKS)
    known = {k: ids[k] for k in case.path_parameters or {} if k in ids}
    if known:
        # the replaced ids may turn a negative case into a valid request: no rejection check
        case.path_parameters = {**case.path_parameters, **known}
        case.call_and_validate(app=app, headers=headers, checks=CHECKS[:3])
