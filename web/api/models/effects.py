"""Effect receipts: lists, the operator queue, one receipt with its history, resolving,
asking verifiers to settle receipts."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orch8_py import rules
from orch8_py.settlement import OUTPUT_STATES
from orch8_py.sqlapi.base import NO_OUTPUT

from ..fields import (
    RESOLVED_TO,
    Duration,
    EffectKind,
    EffectState,
    IdempotencyKey,
    InstanceState,
    Int64,
    JsonObject,
    JsonValue,
    Limit,
    Note,
    ProviderReceiptId,
    ResolvedState,
    VerificationState,
    optional,
    present_means_given,
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
    db_user: str = Field(description="the PostgreSQL login that made the change")
    api_key_id: uuid.UUID | None = Field(description="the API key it was made with, if any")


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
    blocking: bool | None = Field(
        description="true: its instance waits on it; false: superseded (the instance ended, "
        "or a later attempt of the step completed): history to settle in bulk; null: its "
        "instance is gone"
    )
    verification: VerificationState | None = Field(
        description="its verifier: pending (tries left), escalated (every try was "
        "inconclusive: left to people), settled; null when none was scheduled"
    )
    verification_tries: int | None = Field(description="tries the verifier has used")
    verification_max_tries: int | None = Field(description="tries in all (its schedule)")
    verification_next_at: dt.datetime | None = Field(description="the next try (pending only)")


class UnresolvedEffectList(Answer):
    items: list[UnresolvedEffect]


NEEDS_EVIDENCE = rules.RESOLUTIONS_NEEDING_EVIDENCE
# the targets after which the step completes with an output; the others take none
WITHOUT_OUTPUT = tuple(s for s in RESOLVED_TO if s not in OUTPUT_STATES)


def _when_state(states: tuple[str, ...], then: dict[str, Any]) -> dict[str, Any]:
    return {
        "if": {"properties": {"state": {"enum": list(states)}}, "required": ["state"]},
        "then": then,
    }


class ResolveRequest(Body):
    """Moves (rules.RESOLUTIONS): unknown to verified, committed, compensated or
    abandoned; committed or verified to compensated. Any other move is 409 with
    current_state and allowed_states."""

    model_config = ConfigDict(
        json_schema_extra={
            # the evidence and output rules of orch8.resolve_effect, in the schema as well
            "allOf": [
                _when_state(NEEDS_EVIDENCE, {"properties": {"evidence": {"minProperties": 1}}}),
                _when_state(WITHOUT_OUTPUT, {"properties": {"output": False}}),
            ]
        }
    )

    state: ResolvedState = Field(description="what happened: " + ", ".join(RESOLVED_TO))
    expected_state: EffectState = Field(
        description="the state you saw (normally unknown): refused with 409 reload before "
        "resolving unless the receipt is still in it, so two people resolving at once "
        "cannot both win",
    )
    evidence: JsonObject = Field(
        description="what you checked; not empty when resolving to "
        + " or ".join(NEEDS_EVIDENCE)
        + ". For http_request, a recorded answer of the provider as `response` ({status, "
        "json?, body?, headers?}) gives the step's output when no `output` is sent"
    )
    output: JsonValue = Field(
        default=None,
        description="the output the step would have returned ("
        + " or ".join(OUTPUT_STATES)
        + " only; null is an output too): a retry completes the step with it. Left out: "
        "derived from the evidence when the handler can (see evidence)",
        json_schema_extra=present_means_given,
    )
    provider_receipt_id: ProviderReceiptId | None = None
    note: Note | None = None

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

    @field_validator("output")
    @classmethod
    def _output_allowed(cls, output: Any, info: ValidationInfo) -> Any:
        state = info.data.get("state")
        if state in WITHOUT_OUTPUT:
            raise PydanticCustomError(
                "output_not_allowed",
                "an output belongs to a {allowed} resolution (the step then completes with "
                "it), not to {state}",
                {"allowed": " or ".join(OUTPUT_STATES), "state": state},
            )
        return output

    def given_output(self) -> Any:
        """The output sent (null included), or NO_OUTPUT when the field was left out."""
        return self.output if "output" in self.model_fields_set else NO_OUTPUT


class EffectPath(Path):
    effect_id: uuid.UUID


class ContinuityPath(Path):
    continuity_id: uuid.UUID


class UnresolvedQuery(Query):
    kind: EffectKind | None = optional()
    older_than: Duration | None = optional()
    blocking: bool | None = optional(
        "true: only receipts an instance waits on; false: only superseded ones"
    )
    limit: Limit = 50


class FindQuery(Query):
    key: IdempotencyKey = Field(
        description="a receipt id, an idempotency key a step was sent with, or a receipt "
        "id a provider answered with",
    )


class VerifyRequest(Body):
    """Which receipts' verifiers to schedule: the ones named, or every superseded unknown
    receipt of the tenant (exactly one of the two)."""

    body_required: ClassVar[bool] = True  # no field alone is required, but one must be sent

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["effect_ids"], "properties": {"effect_ids": {"type": "array"}}},
                {"required": ["superseded"], "properties": {"superseded": {"const": True}}},
            ]
        }
    )

    effect_ids: list[Annotated[uuid.UUID, Strict(False)]] | None = Field(
        default=None,
        min_length=1,
        max_length=rules.LIMITS["verify_request_receipts"],
        description="the receipts to verify (orch8.request_verifications)",
    )
    superseded: Literal[True] | None = Field(
        default=None,
        description="true: every unknown receipt of the tenant that no instance waits on",
    )

    @model_validator(mode="after")
    def _one_of(self) -> VerifyRequest:
        if (self.effect_ids is None) == (self.superseded is None):
            raise PydanticCustomError(
                "one_of", "send either effect_ids or superseded: true (exactly one of them)"
            )
        return self


class VerificationRequested(Answer):
    effect_id: uuid.UUID
    outcome: str = Field(
        description="scheduled, rescheduled (an escalated one tries again), "
        "already_scheduled, no_verifier (its step declares no verify), not_unknown "
        "(settled already), not_found (orch8.schedule_verification)"
    )


class VerificationRequestList(Answer):
    items: list[VerificationRequested]
