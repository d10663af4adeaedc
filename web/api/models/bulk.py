"""Bulk operator actions by filter: the request (an action, the filter, dry run or not)
and the answer (the count, and after a run what was applied and skipped, by reason). The
filter's keys are orch8.bulk_filter_fields(); SQL checks the values again."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from orch8_py import bulk, rules

from ..fields import NUL_FREE, DateTime, Identifier, InstanceState, Note, OneOf, SequenceName
from .base import Answer, Body

BulkAction = Annotated[str, OneOf(rules.BULK_ACTIONS)]
ErrorText = Annotated[
    str,
    StringConstraints(min_length=1, max_length=rules.LIMITS["error_chars"], pattern=NUL_FREE),
]
BatchSize = Annotated[int, Field(ge=1, le=rules.LIMITS["bulk_batch"])]


class BulkFilter(Body):
    sequence: SequenceName | None = Field(default=None, description="the sequence's name")
    namespace: Identifier | None = Field(default=None, description="the sequence's namespace")
    state: InstanceState | Annotated[list[InstanceState], Field(min_length=1)] | None = Field(
        default=None, description="one instance state, or a list of them"
    )
    error_contains: ErrorText | None = Field(
        default=None, description="the instance's error contains this text, ignoring case"
    )
    created_after: DateTime | None = Field(default=None, description="created at or after")
    created_before: DateTime | None = Field(default=None, description="created before")
    updated_after: DateTime | None = Field(default=None, description="last changed at or after")
    updated_before: DateTime | None = Field(default=None, description="last changed before")

    def as_json(self) -> dict[str, Any]:
        """The filter for orch8.bulk_filter: the keys given, times with their offset."""
        given = self.model_dump(exclude_none=True)
        return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in given.items()}


class BulkRequest(Body):
    action: BulkAction = Field(description="each instance moves by that single-instance call")
    filter: BulkFilter = Field(description="every key given must hold; at least one")
    dry_run: bool = Field(description="true: only count what matches now; false: act on it")
    reason: Note | None = Field(
        default=None, description="kept in the audit trail of a cancel or a pause"
    )
    batch: BatchSize | None = Field(
        default=None,
        description=f"instances per transaction (default {bulk.DEFAULT_BATCH})",
    )


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
