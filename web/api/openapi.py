"""The OpenAPI 3.0 document of /api/v1, served at GET /api/v1/openapi.json (no key needed).

Built here as data next to the routes it describes; tests/test_api.py checks that every
route is in it and tests/test_api_schemathesis.py checks the answers against it.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify

from orch8_py import states

from .validation import INT32_MAX, INT32_MIN, INT64_MAX

bp = Blueprint("openapi", __name__)

PREFIX = "/api/v1"

INSTANCE_STATES = list(states.INSTANCE_STATES)
EFFECT_STATES = list(states.EFFECT_STATES)
KINDS = list(states.EFFECT_KINDS)
WEBHOOK_STATES = list(states.OUTBOX_STATES)
WEBHOOK_EVENTS = list(states.WEBHOOK_EVENTS)

# --- schema helpers ----------------------------------------------------------------------

STR: dict = {"type": "string"}
INT: dict = {"type": "integer"}
INT64: dict = {"type": "integer", "format": "int64"}
BOOL: dict = {"type": "boolean"}
NUM: dict = {"type": "number"}
UUID: dict = {"type": "string", "format": "uuid"}
TIME: dict = {"type": "string", "format": "date-time"}
OBJECT: dict = {"type": "object"}  # any JSON object
ANY: dict = {}  # any JSON value, null included


def null(schema: dict) -> dict:
    return {**schema, "nullable": True}


def enum(values: list[str], nullable: bool = False) -> dict:
    return {"type": "string", "enum": values, **({"nullable": True} if nullable else {})}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def record(props: dict, optional: tuple[str, ...] = ()) -> dict:
    """A response object: exactly these properties, all present unless optional."""
    return {
        "type": "object",
        "properties": props,
        "required": [p for p in props if p not in optional],
        "additionalProperties": False,
    }


def page(item: str, cursor: bool = True) -> dict:
    props: dict = {"items": {"type": "array", "items": ref(item)}}
    if cursor:
        props["next_cursor"] = {
            **null(STR),
            "description": "pass as ?cursor= for the next page; null on the last page",
        }
    return record(props)


def body(props: dict, required: tuple[str, ...] = ()) -> dict:
    """A request body object: unknown fields are refused (422)."""
    out: dict = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


SEQUENCE_SUMMARY = {
    "id": UUID,
    "namespace": STR,
    "name": STR,
    "version": INT,
    "created_at": TIME,
}
INSTANCE_SUMMARY = {
    "id": UUID,
    "sequence_id": UUID,
    "sequence_namespace": STR,
    "sequence_name": STR,
    "sequence_version": INT,
    "state": enum(INSTANCE_STATES),
    "requested_state": {
        **enum(["paused", "cancelled"], nullable=True),
        "description": "a pause or cancel waiting for the running step to end",
    },
    "current_block": null(STR),
    "priority": INT,
    "idempotency_key": null(STR),
    "parent_instance_id": null(UUID),
    "error": null(STR),
    "next_fire_at": TIME,
    "created_at": TIME,
    "updated_at": TIME,
}
INSTANCE = {
    **INSTANCE_SUMMARY,
    "context": {**OBJECT, "description": "{data, config, runtime}"},
    "lease_owner": null(STR),
    "lease_expires_at": null(TIME),
}
RECEIPT = {
    "id": UUID,
    "continuity_id": UUID,
    "epoch": INT64,
    "instance_id": UUID,
    "block_id": STR,
    "attempt": INT,
    "kind": enum(KINDS),
    "state": enum(EFFECT_STATES),
    "handler": STR,
    "destination_fingerprint": STR,
    "request_sha256": STR,
    "idempotency_key": null(STR),
    "provider_receipt_id": null(STR),
    "error": null(STR),
    "evidence": OBJECT,
    "created_at": TIME,
    "updated_at": TIME,
}
SUBSCRIPTION = {
    "id": UUID,
    "url": STR,
    "events": {"type": "array", "items": enum(WEBHOOK_EVENTS)},
    "enabled": {**BOOL, "description": "false: no new events; queued deliveries wait"},
    "created_at": TIME,
}
MOVE = {
    "id": UUID,
    "outcome": {**STR, "description": "what the SQL function answered"},
    "state": enum(INSTANCE_STATES),
    "requested_state": enum(["paused", "cancelled"], nullable=True),
}

SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "description": "Every 4xx and 5xx answer.",
        "properties": {
            "error": {**STR, "description": "short, stable: not found, invalid input, ..."},
            "detail": STR,
            "problems": {"type": "array", "items": ref("FieldProblem")},
            "current_state": {**STR, "description": "the state that made a move illegal"},
            "effect_id": {**UUID, "description": "the receipt to resolve first"},
            "sql_detail": STR,
        },
        "required": ["error"],
    },
    "FieldProblem": record({"path": STR, "message": STR}),
    "SequenceCreate": body(
        {
            "namespace": {**null(STR), "description": "default: default"},
            "name": STR,
            "definition": {**OBJECT, "description": "see docs/SQL_API.md#definition-shape"},
        },
        ("name", "definition"),
    ),
    "SequenceSummary": record(SEQUENCE_SUMMARY),
    "Sequence": record({**SEQUENCE_SUMMARY, "definition": OBJECT}),
    "SequencePage": page("SequenceSummary"),
    "SequenceVersions": page("SequenceSummary", cursor=False),
    "InstanceCreate": body(
        {
            "sequence": {**STR, "description": "the sequence's name"},
            "namespace": {**null(STR), "description": "default: default"},
            "version": {
                **null(INT),
                "minimum": 1,
                "maximum": INT32_MAX,
                "description": "default: the latest",
            },
            "data": null(OBJECT),
            "config": null(OBJECT),
            "priority": {**null(INT), "minimum": INT32_MIN, "maximum": INT32_MAX},
            "idempotency_key": {
                **null(STR),
                "minLength": 1,
                "maxLength": 256,
                "description": "1-256 bytes (UTF-8); a repeated key returns the first instance",
            },
        },
        ("sequence",),
    ),
    "InstanceSummary": record(INSTANCE_SUMMARY),
    "Instance": record(INSTANCE),
    "InstanceCreated": record({**INSTANCE, "deduplicated": BOOL}),
    "InstancePage": page("InstanceSummary"),
    "Output": record(
        {
            "seq": INT64,
            "block_id": STR,
            "attempt": INT,
            "sentinel": enum(["__in_progress__", "__retry__", "__error__"], nullable=True),
            "output": ANY,
            "retryable": null(BOOL),
            "effect_id": null(UUID),
            "created_at": TIME,
        }
    ),
    "OutputList": page("Output", cursor=False),
    "Transition": record(
        {
            "seq": INT64,
            "from_state": enum(INSTANCE_STATES, nullable=True),
            "to_state": enum(INSTANCE_STATES),
            "actor": STR,
            "reason": null(STR),
            "at": TIME,
        }
    ),
    "TransitionList": page("Transition", cursor=False),
    "Signal": record(
        {
            "id": INT64,
            "type": STR,
            "payload": ANY,
            "actor": STR,
            "outcome": null(STR),
            "created_at": TIME,
        }
    ),
    "SignalList": page("Signal", cursor=False),
    "SignalSend": body(
        {
            "type": {**STR, "description": "cancel, pause, resume, or 1-100 of A-Za-z0-9_.:-"},
            "payload": null(OBJECT),
        },
        ("type",),
    ),
    "SignalSent": record({**MOVE, "signal_id": INT64}),
    "Reason": body({"reason": {**null(STR), "description": "at most 2000 bytes"}}),
    "Empty": body({}),
    "InstanceMove": record(MOVE),
    "RetryResult": record(
        {
            **MOVE,
            "outcome": enum(["completed_from_evidence", "rerun"]),
            "block_id": null(STR),
            "effect_id": null(UUID),
            "detail": null(STR),
        }
    ),
    "EffectReceipt": record(RECEIPT),
    "EffectReceiptList": page("EffectReceipt", cursor=False),
    "ReceiptEvent": record(
        {
            "event_id": INT64,
            "from_state": enum(EFFECT_STATES, nullable=True),
            "to_state": enum(EFFECT_STATES),
            "actor": STR,
            "note": null(STR),
            "evidence": ANY,
            "at": TIME,
        }
    ),
    "InvariantResult": record(
        {
            "id": INT64,
            "invariant_id": UUID,
            "invariant_name": null(STR),
            "rule": null(OBJECT),
            "status": enum(["pass", "fail"]),
            "effect_id": UUID,
            "competing_effect_id": null(UUID),
            "instance_id": UUID,
            "block_id": STR,
            "epoch": INT64,
            "evidence": OBJECT,
            "created_at": TIME,
        }
    ),
    "EffectDetail": record(
        {
            **RECEIPT,
            "events": {"type": "array", "items": ref("ReceiptEvent")},
            "invariant_results": {"type": "array", "items": ref("InvariantResult")},
        }
    ),
    "UnresolvedEffect": record(
        {
            "effect_id": UUID,
            "kind": enum(KINDS),
            "state": enum(["unknown", "dispatched"]),
            "age_seconds": NUM,
            "state_since": TIME,
            "instance_id": UUID,
            "block_id": STR,
            "attempt": INT,
            "epoch": INT64,
            "continuity_id": UUID,
            "handler": STR,
            "destination_fingerprint": STR,
            "request_sha256": STR,
            "idempotency_key": null(STR),
            "provider_receipt_id": null(STR),
            "error": null(STR),
            "evidence": OBJECT,
            "created_at": TIME,
        }
    ),
    "UnresolvedEffectList": page("UnresolvedEffect", cursor=False),
    "ResolveRequest": body(
        {
            "state": {
                **enum(EFFECT_STATES),
                "description": "unknown -> verified|committed|compensated|abandoned; "
                "committed|verified -> compensated; anything else is 409",
            },
            "provider_receipt_id": {**null(STR), "description": "at most 256 bytes"},
            "evidence": {
                **OBJECT,
                "description": "what you checked; must be non-empty for abandoned and compensated",
            },
            "note": {**null(STR), "description": "at most 2000 bytes"},
            "expected_state": {
                **enum(EFFECT_STATES, nullable=True),
                "description": "refuse (409) unless the receipt is still in this state",
            },
        },
        ("state", "evidence"),
    ),
    "WebhookDelivery": record(
        {
            "id": INT64,
            "subscription_id": UUID,
            "event": enum(WEBHOOK_EVENTS),
            "instance_id": UUID,
            "payload": OBJECT,
            "state": enum(WEBHOOK_STATES),
            "attempts": INT,
            "next_attempt_at": TIME,
            "last_error": null(STR),
            "last_status": null(INT),
            "claimed_by": null(STR),
            "claim_expires_at": null(TIME),
            "created_at": TIME,
            "delivered_at": null(TIME),
        }
    ),
    "WebhookPage": page("WebhookDelivery"),
    "WebhookSubscription": record(SUBSCRIPTION),
    "WebhookSubscriptionList": page("WebhookSubscription", cursor=False),
    "WebhookSubscriptionCreate": body(
        {
            "url": {
                **STR,
                "description": "http:// or https:// with a host (checked by "
                "orch8.create_webhook_subscription: 422 otherwise)",
            },
            "events": {
                "type": "array",
                "items": enum(WEBHOOK_EVENTS),
                "minItems": 1,
                "nullable": True,
                "description": "default: every event",
            },
            "secret": {
                **null(STR),
                "minLength": 1,
                "description": "the HMAC-SHA256 signing secret; default: generated and "
                "answered once",
            },
        },
        ("url",),
    ),
    "WebhookSubscriptionCreated": record(
        {
            **SUBSCRIPTION,
            "secret": {
                **STR,
                "description": "only when it was generated: shown this once, never again",
            },
        },
        optional=("secret",),
    ),
    "WebhookMove": record({"id": INT64, "state": enum(["pending", "discarded"])}),
}

PROBLEM_RESPONSES = {
    "400": "Malformed request: the body is missing, not UTF-8 or not JSON.",
    "401": "No API key, or an unknown or revoked one.",
    "403": "The key's role may not do this (workers: only GET /instances/{id}; "
    "auditors: only GET).",
    "404": "No such resource in the caller's tenant (another tenant's resources are "
    "invisible), or X-Tenant-Id names another tenant and the key is not an admin's.",
    "409": "The engine refused the move: illegal state change (current_state), a receipt "
    "to resolve first (effect_id), or reload before resolving.",
    "413": "The body is over 1 MiB.",
    "415": "The body is not sent as application/json.",
    "422": "Invalid input: every problem with its field path in `problems`.",
    "503": "The database is unavailable; try again shortly.",
}
RESPONSES = {
    code: {
        "description": text,
        "content": {"application/json": {"schema": ref("Problem")}},
    }
    for code, text in PROBLEM_RESPONSES.items()
}

# --- parameters --------------------------------------------------------------------------


def path(name: str, schema: dict, description: str = "") -> dict:
    p = {"name": name, "in": "path", "required": True, "schema": schema}
    if description:
        p["description"] = description
    return p


def q(name: str, schema: dict, description: str = "") -> dict:
    p = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        p["description"] = description
    return p


TENANT_HEADER = {
    "name": "X-Tenant-Id",
    "in": "header",
    "required": False,
    "description": "admin keys: act in this tenant; any other key gets 404 unless it names "
    "the key's own tenant. Empty: the key's own tenant.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{0,100}$"},
}
INSTANCE_ID = path("instance_id", UUID)
SUBSCRIPTION_ID = path("subscription_id", UUID)
NAME_PARAMS = [
    path("namespace", {"type": "string", "minLength": 1, "maxLength": 100}),
    path("name", {"type": "string", "minLength": 1, "maxLength": 200}),
]
LIMIT = q("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 50})
CURSOR = q("cursor", STR, "the next_cursor of the previous page")


def op(
    summary: str,
    ok: str,
    schema: str,
    *,
    params: list | None = None,
    request: str | None = None,
    request_required: bool = True,
    errors: tuple[str, ...] = ("401", "403", "404", "422", "503"),
    extra_ok: dict | None = None,
    tag: str,
) -> dict:
    out: dict[str, Any] = {
        "summary": summary,
        "tags": [tag],
        "parameters": [*(params or []), TENANT_HEADER],
        "responses": {
            ok: {
                "description": "OK",
                "content": {"application/json": {"schema": ref(schema)}},
            },
            **(extra_ok or {}),
            **{code: {"$ref": f"#/components/responses/P{code}"} for code in errors},
        },
    }
    if request:
        out["requestBody"] = {
            "required": request_required,
            "content": {"application/json": {"schema": ref(request)}},
        }
    return out


READ = ("401", "403", "404", "422", "503")
WRITE = ("400", "401", "403", "404", "413", "415", "422", "503")
MOVE_ERRORS = ("400", "401", "403", "404", "409", "413", "415", "422", "503")


def _paths() -> dict:
    seq_tag, inst_tag, eff_tag, hook_tag = "sequences", "instances", "effects", "webhooks"
    return {
        "/sequences": {
            "get": op(
                "Sequences: the latest version of each name",
                "200",
                "SequencePage",
                params=[q("namespace", STR), LIMIT, CURSOR],
                errors=READ,
                tag=seq_tag,
            ),
            "post": op(
                "Create a sequence version (validated by orch8.create_sequence)",
                "201",
                "Sequence",
                request="SequenceCreate",
                errors=WRITE,
                tag=seq_tag,
            ),
        },
        "/sequences/{namespace}/{name}": {
            "get": op(
                "The latest version of a sequence",
                "200",
                "Sequence",
                params=NAME_PARAMS,
                errors=READ,
                tag=seq_tag,
            )
        },
        "/sequences/{namespace}/{name}/versions": {
            "get": op(
                "Every version of a sequence, oldest first",
                "200",
                "SequenceVersions",
                params=NAME_PARAMS,
                errors=READ,
                tag=seq_tag,
            )
        },
        "/sequences/{namespace}/{name}/versions/{version}": {
            "get": op(
                "One version of a sequence",
                "200",
                "Sequence",
                params=[
                    *NAME_PARAMS,
                    path("version", {"type": "integer", "minimum": 1, "maximum": INT32_MAX}),
                ],
                errors=READ,
                tag=seq_tag,
            )
        },
        "/instances": {
            "get": op(
                "Instances, newest first",
                "200",
                "InstancePage",
                params=[
                    q("state", enum(INSTANCE_STATES)),
                    q("sequence", STR, "the sequence's name"),
                    q("namespace", STR, "the sequence's namespace"),
                    q("created_after", TIME, "created at or after (ISO 8601; UTC if no offset)"),
                    q("created_before", TIME, "created before"),
                    LIMIT,
                    CURSOR,
                ],
                errors=READ,
                tag=inst_tag,
            ),
            "post": op(
                "Start an instance (orch8.create_instance)",
                "201",
                "InstanceCreated",
                request="InstanceCreate",
                errors=WRITE,
                extra_ok={
                    "200": {
                        "description": "The idempotency key was used before: that instance, "
                        "deduplicated true",
                        "content": {"application/json": {"schema": ref("InstanceCreated")}},
                    }
                },
                tag=inst_tag,
            ),
        },
        "/instances/{instance_id}": {
            "get": op(
                "One instance with its context (worker keys allowed)",
                "200",
                "Instance",
                params=[INSTANCE_ID],
                errors=READ,
                tag=inst_tag,
            )
        },
        "/instances/{instance_id}/outputs": {
            "get": op(
                "The instance's block outputs and sentinels, in order",
                "200",
                "OutputList",
                params=[INSTANCE_ID],
                errors=READ,
                tag=inst_tag,
            )
        },
        "/instances/{instance_id}/audit": {
            "get": op(
                "The instance's state changes (orch8.instance_transitions)",
                "200",
                "TransitionList",
                params=[INSTANCE_ID],
                errors=READ,
                tag=inst_tag,
            )
        },
        "/instances/{instance_id}/signals": {
            "get": op(
                "Signals sent to the instance",
                "200",
                "SignalList",
                params=[INSTANCE_ID],
                errors=READ,
                tag=inst_tag,
            ),
            "post": op(
                "Send a signal (orch8.send_signal)",
                "201",
                "SignalSent",
                params=[INSTANCE_ID],
                request="SignalSend",
                errors=MOVE_ERRORS,
                tag=inst_tag,
            ),
        },
        **{
            f"/instances/{{instance_id}}/{action}": {
                "post": op(
                    summary,
                    "200",
                    "InstanceMove",
                    params=[INSTANCE_ID],
                    request=request,
                    request_required=False,
                    errors=MOVE_ERRORS,
                    tag=inst_tag,
                )
            }
            for action, summary, request in (
                ("cancel", "Cancel (orch8.cancel_instance)", "Reason"),
                ("pause", "Pause (orch8.pause_instance)", "Reason"),
                ("resume", "Resume (orch8.resume_instance)", "Empty"),
            )
        },
        "/instances/{instance_id}/retry": {
            "post": op(
                "Retry a failed instance after resolution (orch8.retry_instance)",
                "200",
                "RetryResult",
                params=[INSTANCE_ID],
                request="Empty",
                request_required=False,
                errors=MOVE_ERRORS,
                tag=inst_tag,
            )
        },
        "/instances/{instance_id}/effects": {
            "get": op(
                "The instance's effect receipts",
                "200",
                "EffectReceiptList",
                params=[INSTANCE_ID],
                errors=READ,
                tag=eff_tag,
            )
        },
        "/continuity/executions/{continuity_id}/effects": {
            "get": op(
                "The receipts of one continuity (ledger scope)",
                "200",
                "EffectReceiptList",
                params=[path("continuity_id", UUID)],
                errors=READ,
                tag=eff_tag,
            )
        },
        "/effects/unresolved": {
            "get": op(
                "The operator queue: unknown receipts and long-dispatched ones, oldest first",
                "200",
                "UnresolvedEffectList",
                params=[
                    q("kind", enum(KINDS)),
                    q(
                        "older_than",
                        {"type": "string", "pattern": "^[0-9]{1,6}[smhd]$"},
                        "e.g. 30s, 10m, 2h, 1d",
                    ),
                    LIMIT,
                ],
                errors=READ,
                tag=eff_tag,
            )
        },
        "/effects/{effect_id}": {
            "get": op(
                "One receipt, its event history and the invariant results naming it",
                "200",
                "EffectDetail",
                params=[path("effect_id", UUID)],
                errors=READ,
                tag=eff_tag,
            )
        },
        "/continuity/effects/{effect_id}/resolve": {
            "post": op(
                "Resolve a receipt with evidence (orch8.resolve_effect)",
                "200",
                "EffectReceipt",
                params=[path("effect_id", UUID)],
                request="ResolveRequest",
                errors=MOVE_ERRORS,
                tag=eff_tag,
            )
        },
        "/webhooks/subscriptions": {
            "get": op(
                "The tenant's webhook subscriptions, oldest first (never their secrets)",
                "200",
                "WebhookSubscriptionList",
                errors=READ,
                tag=hook_tag,
            ),
            "post": op(
                "Subscribe a URL (orch8.create_webhook_subscription)",
                "201",
                "WebhookSubscriptionCreated",
                request="WebhookSubscriptionCreate",
                errors=WRITE,
                tag=hook_tag,
            ),
        },
        "/webhooks/subscriptions/{subscription_id}": {
            "get": op(
                "One webhook subscription (never its secret)",
                "200",
                "WebhookSubscription",
                params=[SUBSCRIPTION_ID],
                errors=READ,
                tag=hook_tag,
            )
        },
        **{
            f"/webhooks/subscriptions/{{subscription_id}}/{action}": {
                "post": op(
                    summary,
                    "200",
                    "WebhookSubscription",
                    params=[SUBSCRIPTION_ID],
                    request="Empty",
                    request_required=False,
                    errors=WRITE,
                    tag=hook_tag,
                )
            }
            for action, summary in (
                (
                    "disable",
                    "No new events for this subscription; its queued deliveries wait "
                    "(orch8.set_webhook_subscription_enabled)",
                ),
                (
                    "enable",
                    "Events again, and its queued deliveries go out "
                    "(orch8.set_webhook_subscription_enabled)",
                ),
            )
        },
        "/webhooks/outbox": {
            "get": op(
                "Webhook deliveries, newest first",
                "200",
                "WebhookPage",
                params=[q("state", enum(WEBHOOK_STATES)), LIMIT, CURSOR],
                errors=READ,
                tag=hook_tag,
            )
        },
        **{
            f"/webhooks/outbox/{{delivery_id}}/{action}": {
                "post": op(
                    summary,
                    "200",
                    "WebhookMove",
                    params=[
                        path(
                            "delivery_id",
                            {
                                "type": "integer",
                                "format": "int64",
                                "minimum": 1,
                                "maximum": INT64_MAX,
                            },
                        )
                    ],
                    request="Empty",
                    request_required=False,
                    errors=MOVE_ERRORS,
                    tag=hook_tag,
                )
            }
            for action, summary in (
                ("redeliver", "Send a parked, discarded or delivered delivery again"),
                ("discard", "Give up on a pending or parked delivery"),
            )
        },
    }


def document() -> dict:
    paths = {PREFIX + p: item for p, item in _paths().items()}
    paths[PREFIX + "/openapi.json"] = {
        "get": {
            "summary": "This document",
            "tags": ["meta"],
            "security": [],
            "responses": {
                "200": {
                    "description": "OpenAPI 3.0",
                    "content": {"application/json": {"schema": OBJECT}},
                }
            },
        }
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "orch8 operator API",
            "version": "1",
            "description": "Durable workflows with at-most-once side effects. Every route but "
            "this document needs an API key (Authorization: Bearer <key>, or X-Api-Key). "
            "Errors are JSON problems {error, detail?, problems?}. See docs/API.md.",
        },
        "security": [{"bearer": []}, {"apiKeyHeader": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an orch8 API key"},
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            },
            "schemas": SCHEMAS,
            "responses": {f"P{code}": response for code, response in RESPONSES.items()},
        },
    }


DOCUMENT = document()


@bp.get("/openapi.json")
def serve():
    return jsonify(DOCUMENT)
