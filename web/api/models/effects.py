"""Effect receipts: lists, the operator queue, one receipt with its history, resolving."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from orch8_py import rules

from ..fields import (
    Duration,
    EffectKind,
    EffectState,
    InstanceState,
    Int64,
    JsonObject,
    Limit,
    Note,
    ProviderReceiptId,
    ResolvedState,
    optional,
)
from .base import Answer, Body, Path, Query


class EffectReceipt(Answer):
    id: uuid.UUID
    continuity_id: uuid.UUID
    epoch: Int64
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    kind: EffectKind
    state: EffectState
    handler: str
    destination_fingerprint: str
    request_sha256: str
    idempotency_key: str | None
    provider_receipt_id: str | None
    error: str | None
    evidence: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime


class EffectReceiptList(Answer):
    items: list[EffectReceipt]


class ReceiptEvent(Answer):
    event_id: Int64
    from_state: EffectState | None
    to_state: EffectState
    actor: str
    note: str | None
    evidence: Any
    at: dt.datetime


class InvariantResult(Answer):
    id: Int64
    invariant_id: uuid.UUID
    invariant_name: str | None
    rule: dict[str, Any] | None
    status: str = Field(description="pass or fail")
    effect_id: uuid.UUID
    competing_effect_id: uuid.UUID | None
    instance_id: uuid.UUID
    block_id: str
    epoch: Int64
    evidence: dict[str, Any]
    created_at: dt.datetime


class EffectDetail(EffectReceipt):
    age_seconds: float = Field(description="seconds since the receipt was created")
    instance_state: InstanceState | None = Field(description="its instance's state now")
    events: list[ReceiptEvent] = Field(description="its history, oldest first")
    invariant_results: list[InvariantResult] = Field(
        description="the guard decisions naming it (as the dispatched or competing receipt)"
    )


class UnresolvedEffect(Answer):
    effect_id: uuid.UUID
    kind: EffectKind
    state: EffectState
    age_seconds: float = Field(description="seconds since the receipt was created")
    state_since: dt.datetime
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    epoch: Int64
    continuity_id: uuid.UUID
    handler: str
    destination_fingerprint: str
    request_sha256: str
    idempotency_key: str | None
    provider_receipt_id: str | None
    error: str | None
    evidence: dict[str, Any]
    created_at: dt.datetime


class UnresolvedEffectList(Answer):
    items: list[UnresolvedEffect]


NEEDS_EVIDENCE = rules.RESOLUTIONS_NEEDING_EVIDENCE


class ResolveRequest(Body):
    """Moves (rules.RESOLUTIONS): unknown to verified, committed, compensated or
    abandoned; committed or verified to compensated. Any other move is 409 with
    current_state and allowed_states."""

    model_config = ConfigDict(
        json_schema_extra={
            # the evidence rule of orch8.resolve_effect, in the schema as well
            "if": {
                "properties": {"state": {"enum": list(NEEDS_EVIDENCE)}},
                "required": ["state"],
            },
            "then": {"properties": {"evidence": {"minProperties": 1}}},
        }
    )

    state: ResolvedState
    provider_receipt_id: ProviderReceiptId | None = None
    evidence: JsonObject = Field(
        description="what you checked; not empty when resolving to " + " or ".join(NEEDS_EVIDENCE)
    )
    note: Note | None = None
    expected_state: EffectState | None = Field(
        default=None,
        description="refuse (409 reload before resolving) unless the receipt is still in it",
    )

    @field_validator("evidence")
    @classmethod
    def _evidence_given(cls, evidence: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        state = info.data.get("state")
        if state in NEEDS_EVIDENCE and not evidence:
            raise PydanticCustomError(
                "evidence_needed",
                "resolving to {state} needs evidence (what you looked at)",
                {"state": state},
            )
        return evidence


class EffectPath(Path):
    effect_id: uuid.UUID


class ContinuityPath(Path):
    continuity_id: uuid.UUID


class UnresolvedQuery(Query):
    kind: EffectKind | None = optional()
    older_than: Duration | None = optional()
    limit: Limit = 50
