"""Bulk operator actions by filter: the request (an action, the filter, dry run or not)
and the answer (the count, and after a run what was applied and skipped, by reason). The
filter's keys are orch8.bulk_filter_fields(); SQL checks the values again."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orch8_py import bulk, rules

from ..fields import (
    NUL_FREE,
    DateTime,
    Identifier,
    InstanceState,
    Note,
    OneOf,
    SequenceName,
    optional,
)
from .base import Answer, Body

BulkAction = Annotated[str, OneOf(rules.BULK_ACTIONS)]
ErrorText = Annotated[
    str,
    StringConstraints(min_length=1, max_length=rules.LIMITS["error_chars"], pattern=NUL_FREE),
]
BatchSize = Annotated[int, Field(ge=1, le=rules.LIMITS["bulk_batch"])]
WITHOUT_REASON = ("retry", "resume")  # the actions whose single-instance call takes none


class BulkFilter(Body):
    """Every key given must hold, and at least one is given; a key is left out rather than
    sent as null (orch8.bulk_filter refuses a filter of nulls only)."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    sequence: SequenceName = optional("the sequence's name")
    namespace: Identifier = optional("the sequence's namespace")
    state: InstanceState | Annotated[list[InstanceState], Field(min_length=1)] = optional(
        "one instance state, or a list of them"
    )
    error_contains: ErrorText = optional("the instance's error contains this text, ignoring case")
    created_after: DateTime = optional("created at or after")
    created_before: DateTime = optional("created before")
    updated_after: DateTime = optional("last changed at or after")
    updated_before: DateTime = optional("last changed before")

    @model_validator(mode="after")
    def _not_empty(self) -> BulkFilter:
        if not self.model_fields_set:
            raise PydanticCustomError(
                "filter_empty",
                "a bulk filter needs at least one of {keys}",
                {"keys": ", ".join(type(self).model_fields)},
            )
        return self

    def as_json(self) -> dict[str, Any]:
        """The filter for orch8.bulk_filter: the keys given, times in UTC (an RFC 3339
        offset may be larger than PostgreSQL reads)."""
        return {k: _utc(v) for k, v in self.model_dump(exclude_unset=True).items()}


def _utc(value: Any) -> Any:
    if not isinstance(value, dt.datetime):
        return value
    try:
        return value.astimezone(dt.UTC).isoformat()
    except OverflowError:  # the first or last day Python has, in UTC: out of its range
        return value.isoformat()


class BulkRequest(Body):
    model_config = ConfigDict(
        json_schema_extra={
            # orch8.bulk_apply's rule, in the schema as well: retry and resume record none
            "allOf": [
                {
                    "if": {
                        "properties": {"action": {"enum": list(WITHOUT_REASON)}},
                        "required": ["action"],
                    },
                    "then": {"properties": {"reason": False}},
                }
            ]
        }
    )

    action: BulkAction = Field(description="each instance moves by that single-instance call")
    filter: BulkFilter = Field(description="which instances")
    dry_run: bool = Field(description="true: only count what matches now; false: act on it")
    reason: Note = optional(
        "kept in the audit trail of a cancel or a pause (retry and resume record none)"
    )
    batch: BatchSize | None = Field(
        default=None,
        description=f"instances per transaction (default {bulk.DEFAULT_BATCH})",
    )

    @field_validator("reason")
    @classmethod
    def _reason_recorded(cls, reason: str, info: ValidationInfo) -> str:
        action = info.data.get("action")
        if action in WITHOUT_REASON:
            raise PydanticCustomError(
                "reason_not_recorded",
                "a reason is recorded by cancel and pause only, not by {action}",
                {"action": action},
            )
        return reason


class BulkResult(Answer):
    action: BulkAction
    dry_run: bool
    matched: int = Field(description="instances matching the filter when the count was made")
    processed: int | None = Field(description="instances read and tried (null on a dry run)")
    applied: int | None = Field(description="instances moved (null on a dry run)")
    skipped: int | None = Field(
        description="instances that refused or no longer matched (null on a dry run)"
    )
    skipped_reasons: dict[str, int] | None = Field(
        description="skipped instances by reason (the refusal's message)"
    )
    skipped_sample: list[dict[str, Any]] | None = Field(
        description="up to 10 skipped instances: instance_id, reason, the SQLSTATE (error) "
        "and the refusal's facts"
    )
