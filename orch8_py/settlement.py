"""Settling an unknown receipt from Python: the output a resolution carries for its step.

SQL records a resolution (orch8.resolve_effect, orch8.record_verification) and continues
the step with the output the resolution carries. What that output is depends on the
handler, so it is derived here: given explicitly (``--output``), or from the evidence by
the handler's ``output_from_evidence`` (for ``http_request``: a recorded ``response``
becomes exactly what the handler returns for that answer). The CLI, the REST API, the
console and the verifiers all resolve through ``resolve``.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from . import handlers, sqlapi
from .errors import InvalidInput, NotFound
from .sqlapi.base import NO_OUTPUT, Conn, Row
from .sqlapi.effects import ReceiptInContext
from .steps import EffectReceipt, call_user
from .templates import TemplateError, params_as_sent

OUTPUT_STATES = ("committed", "verified")  # the resolutions after which the step completes


def derive_output(evidence: dict[str, Any], receipt: EffectReceipt, params: dict[str, Any]) -> Any:
    """The output the step would have returned, derived from ``evidence`` by its handler's
    ``output_from_evidence`` (given the params as sent); NO_OUTPUT when the handler
    defines none or the evidence says nothing it can use. Evidence the handler finds
    malformed raises InvalidInput."""
    deriver = handlers.deriver_of(receipt.handler)
    if deriver is None:
        return NO_OUTPUT
    try:
        output = call_user(deriver, evidence, receipt, params)
    except ValueError as exc:
        raise InvalidInput(
            f"cannot derive the {receipt.handler} output from the evidence: {exc}",
            facts={"field": "evidence"},
        ) from None
    return NO_OUTPUT if output is None else output


def params_of(found: ReceiptInContext) -> dict[str, Any]:
    """The step's params as sent for the receipt's attempt; InvalidInput when they no
    longer render."""
    try:
        return params_as_sent(
            found.step,
            found.context,
            found.progress,
            found.receipt["instance_id"],
            found.receipt["attempt"],
            found.receipt["block_id"],
            found.vars,
        )
    except TemplateError as exc:
        raise InvalidInput(
            f"the step's params no longer render ({exc}): give the output explicitly",
            facts={"field": "output"},
        ) from None


def resolve(
    conn: Conn,
    *,
    tenant_id: str,
    effect_id: uuid.UUID,
    expected_state: str,
    state: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
    provider_receipt_id: str | None = None,
    note: str | None = None,
    output: Any = NO_OUTPUT,
) -> Row:
    """Resolve a receipt (orch8.resolve_effect). For committed or verified without an
    ``output``, the output is derived from the evidence when the handler can; the step
    then completes with it on retry. Raises what resolve_effect raises, and InvalidInput
    for evidence the handler cannot read."""
    if output is NO_OUTPUT and state in OUTPUT_STATES:
        found = sqlapi.effects.receipt_in_context(conn, tenant_id=tenant_id, effect_id=effect_id)
        if found is None:
            raise NotFound(f"effect receipt {effect_id} not found", facts={"effect_id": effect_id})
        receipt = EffectReceipt.from_row(found.receipt)
        if provider_receipt_id is not None:  # what the receipt will hold once resolved
            receipt = dataclasses.replace(receipt, provider_receipt_id=provider_receipt_id)
        if handlers.deriver_of(receipt.handler) is not None:
            output = derive_output(evidence or {}, receipt, params_of(found))
    return sqlapi.effects.resolve_effect(
        conn,
        tenant_id=tenant_id,
        effect_id=effect_id,
        expected_state=expected_state,
        state=state,
        actor=actor,
        evidence=evidence,
        provider_receipt_id=provider_receipt_id,
        note=note,
        output=output,
    )
