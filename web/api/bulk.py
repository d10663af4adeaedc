"""Bulk operator actions by filter: POST /bulk/instances counts what matches (dry run) or
acts on it, every batch in its own transaction (orch8_py/bulk.py, orch8.bulk_apply)."""

from __future__ import annotations

from flask import Blueprint, g

from orch8_py import bulk, sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from .models.bulk import BulkRequest, BulkResult
from .spec import WRITE, operation

bp = Blueprint("bulk", __name__)


@bp.post("/bulk/instances")
@operation(
    roles=OPERATOR, ok={200: BulkResult}, errors=WRITE, tag="instances", operation_id="bulkAction"
)
def bulk_action(json: BulkRequest) -> BulkResult:
    """Retry, cancel, pause or resume every instance matching a filter

    `dry_run` true answers how many match now and changes nothing. `dry_run` false acts on
    them in batches, each its own transaction, in id order: each instance is re-checked
    against the filter and moved by the single-instance call (retry_instance,
    cancel_instance, pause_instance, resume_instance); one that refuses (not failed any
    more, a receipt to resolve first) or no longer matches is skipped with its reason and
    never stops the run. The answer counts what was applied and skipped, by reason. Keys
    of operator or admin role (an auditor's key is 403)."""
    wanted = json.filter.as_json()
    with tenant_tx() as conn:
        matched = sqlapi.bulk.bulk_count(conn, tenant_id=g.tenant, filter=wanted)
    if json.dry_run:
        return BulkResult.model_validate(
            {
                "action": json.action,
                "dry_run": True,
                "matched": matched,
                "processed": None,
                "applied": None,
                "skipped": None,
                "skipped_reasons": None,
                "skipped_sample": None,
            }
        )
    progress = bulk.run(
        tenant_tx,
        tenant_id=g.tenant,
        action=json.action,
        filter=wanted,
        actor=g.actor,
        matched=matched,
        reason=json.reason,
        batch=json.batch or bulk.DEFAULT_BATCH,
    )
    done = progress.summary()
    return BulkResult.model_validate(
        {
            "action": json.action,
            "dry_run": False,
            **{k: done[k] for k in ("matched", "processed", "applied", "skipped")},
            "skipped_reasons": done["skipped_reasons"],
            "skipped_sample": done["skipped_sample"],
        }
    )
