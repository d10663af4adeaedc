"""Effect receipts: an instance's or a continuity's receipts, the operator queue
(orch8.unresolved_effects), one receipt with its history, resolving one
(orch8.resolve_effect, through orch8_py.settlement) and asking verifiers to settle
receipts (orch8.request_verifications)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g

from orch8_py import settlement, sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from . import instances
from .models.effects import (
    ContinuityPath,
    EffectDetail,
    EffectPath,
    EffectReceipt,
    EffectReceiptList,
    FindQuery,
    ResolveRequest,
    UnresolvedEffectList,
    UnresolvedQuery,
    VerificationRequestList,
    VerifyRequest,
)
from .models.instances import InstancePath
from .spec import READ, WRITE, operation

bp = Blueprint("effects", __name__)
TAG = "effects"


def _aged(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its ``age`` (an interval) as ``age_seconds``."""
    aged = {k: v for k, v in row.items() if k != "age"}
    aged["age_seconds"] = row["age"].total_seconds()
    return aged


@bp.get("/instances/<instance_id>/effects")
@operation(
    roles=OPERATOR,
    ok={200: EffectReceiptList},
    errors=READ,
    tag=TAG,
    operation_id="listInstanceEffects",
)
def of_instance(path: InstancePath) -> EffectReceiptList:
    """The instance's effect receipts, oldest first"""
    with tenant_tx() as conn:
        instances.exists(conn, path.instance_id)
        rows = sqlapi.effects.receipts_of_instance(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return EffectReceiptList.model_validate({"items": rows})


@bp.get("/continuity/executions/<continuity_id>/effects")
@operation(
    roles=OPERATOR,
    ok={200: EffectReceiptList},
    errors=READ,
    tag=TAG,
    operation_id="listContinuityEffects",
)
def of_continuity(path: ContinuityPath) -> EffectReceiptList:
    """The receipts of one continuity (ledger scope), oldest first"""
    with tenant_tx() as conn:
        rows = sqlapi.effects.receipts_of_continuity(
            conn, tenant_id=g.tenant, continuity_id=path.continuity_id
        )
    if rows is None:
        raise Problem(404, "not found", f"continuity execution {path.continuity_id} not found")
    return EffectReceiptList.model_validate({"items": rows})


@bp.get("/effects/unresolved")
@operation(
    roles=OPERATOR,
    ok={200: UnresolvedEffectList},
    errors=READ,
    tag=TAG,
    operation_id="listUnresolvedEffects",
)
def unresolved(query: UnresolvedQuery) -> UnresolvedEffectList:
    """The operator queue, oldest first: unknown receipts and long-dispatched ones

    Each says whether an instance waits on it (`blocking`; false: superseded) and how far
    its verifier got (`verification`, tries, the next try)."""
    with tenant_tx() as conn:
        rows = sqlapi.effects.unresolved_effects(
            conn,
            tenant_id=g.tenant,
            kind=query.kind,
            older_than=query.older_than,
            blocking=query.blocking,
            limit=query.limit,
        )
    items = [_aged(row) for row in rows]
    return UnresolvedEffectList.model_validate({"items": items})


@bp.get("/effects/find")
@operation(
    roles=OPERATOR, ok={200: EffectReceiptList}, errors=READ, tag=TAG, operation_id="findEffects"
)
def find(query: FindQuery) -> EffectReceiptList:
    """The receipts a key points at, oldest first: the receipt of that id, those sent with
    it as idempotency key, and those the provider answered with it as receipt id (what a
    provider's dashboard shows). Empty when none."""
    with tenant_tx() as conn:
        rows = sqlapi.effects.find_receipts(conn, tenant_id=g.tenant, key=query.key)
    return EffectReceiptList.model_validate({"items": rows})


@bp.get("/effects/<effect_id>")
@operation(roles=OPERATOR, ok={200: EffectDetail}, errors=READ, tag=TAG, operation_id="getEffect")
def show(path: EffectPath) -> EffectDetail:
    """One receipt, its event history and the invariant results naming it"""
    eid = path.effect_id
    with tenant_tx() as conn:
        receipt = sqlapi.effects.effect_receipt(conn, tenant_id=g.tenant, effect_id=eid)
        if receipt is None:
            raise Problem(404, "not found", f"effect receipt {eid} not found")
        events = sqlapi.effects.receipt_events(conn, tenant_id=g.tenant, receipt_ids=[eid])
        results = sqlapi.effects.invariant_results(conn, tenant_id=g.tenant, effect_id=eid)
    return EffectDetail.model_validate(
        {**_aged(receipt), "events": events[eid], "invariant_results": results}
    )


@bp.post("/continuity/effects/<effect_id>/resolve")
@operation(
    roles=OPERATOR,
    ok={200: EffectReceipt},
    errors=WRITE,
    tag=TAG,
    operation_id="resolveEffect",
    links={200: {"GetEffect": ("getEffect", {"effect_id": "$response.body#/id"})}},
)
def resolve(path: EffectPath, json: ResolveRequest) -> EffectReceipt:
    """Resolve a receipt with evidence (orch8.resolve_effect); the actor is the API key

    `expected_state` is required: a receipt no longer in it, or that changed meanwhile,
    is 409 `reload before resolving` with `current_state` (two resolutions cannot both
    win). An illegal move is 409 `conflict` with `current_state` and `allowed_states`.
    `output` (committed or verified only) is what the step would have returned; left out,
    it is derived from the evidence when the step's handler can (http_request: a
    recorded `response`)."""
    with tenant_tx() as conn:
        row = settlement.resolve(
            conn,
            tenant_id=g.tenant,
            effect_id=path.effect_id,
            expected_state=json.expected_state,
            state=json.state,
            actor=g.actor,
            evidence=json.evidence,
            provider_receipt_id=json.provider_receipt_id,
            note=json.note,
            output=json.given_output(),
        )
    return EffectReceipt.model_validate(row)


@bp.post("/continuity/effects/verify")
@operation(
    roles=OPERATOR,
    ok={200: VerificationRequestList},
    errors=WRITE,
    tag=TAG,
    operation_id="verifyEffects",
)
def verify(json: VerifyRequest) -> VerificationRequestList:
    """Ask the steps' verifiers to settle receipts (orch8.request_verifications)

    The receipts named (`effect_ids`), or every unknown receipt of the tenant that no
    instance waits on (`superseded: true`); exactly one of the two. One item per receipt
    with its outcome; an escalated verification starts over (`rescheduled`)."""
    with tenant_tx() as conn:
        rows = sqlapi.effects.request_verifications(
            conn,
            tenant_id=g.tenant,
            actor=g.actor,
            effect_ids=json.effect_ids,
            superseded=bool(json.superseded),
        )
    return VerificationRequestList.model_validate({"items": rows})
