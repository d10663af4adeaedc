"""Settling an unknown receipt from Python: the output a resolution carries for its step.

SQL records a resolution (orch8.resolve_effect, orch8.record_verification) and continues
the step with the output the resolution carries. What that output is depends on the
handler, so it is derived here: given explicitly (``--output``), or from the evidence by
the handler's ``output_from_evidence`` (for ``http_request``: a recorded ``response``
becomes exactly what the handler returns for that answer). The CLI, the REST API, the
console and the verifiers all resolve through ``resolve``.
"""

from __future__ import annotations

import uuid
from typing import Any

from . import handlers, sqlapi
from .errors import InvalidInput, NotFound
from .sqlapi.base import NO_OUTPUT, Conn, Row
from .steps import EffectReceipt

OUTPUT_STATES = ("committed", "verified")  # the resolutions after which the step completes


def derive_output(evidence: dict[str, Any], receipt: EffectReceipt, step: dict[str, Any]) -> Any:
    """The output the step would have returned, derived from ``evidence`` by its handler's
    ``output_from_evidence``; NO_OUTPUT when the handler defines none or the evidence says
    nothing it can use. A malformed piece of evidence raises InvalidInput."""
    deriver = handlers.deriver_of(receipt.handler)
    if deriver is None:
        return NO_OUTPUT
    params = step.get("params") if isinstance(step.get("params"), dict) else {}
    try:
        output = deriver(evidence, receipt, params or {})
    except ValueError as exc:
        raise InvalidInput(
            f"cannot derive the {receipt.handler} output from the evidence: {exc}",
            facts={"field": "evidence"},
        ) from None
    return NO_OUTPUT if output is None else output


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
    if output is NO_OUTPUT and state in OUTPUT_STATES and evidence:
        found = sqlapi.effects.receipt_with_step(conn, tenant_id=tenant_id, effect_id=effect_id)
        if found is None:
            raise NotFound(f"effect receipt {effect_id} not found", facts={"effect_id": effect_id})
        receipt, step = found
        output = derive_output(evidence, EffectReceipt.from_row(receipt), step)
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
