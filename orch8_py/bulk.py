"""The loop of a bulk operator action, once for every front end (the CLI, the REST API):
batches of orch8.bulk_apply in keyset order, each in its own transaction, until one comes
back short. The cursor only moves forward, so no instance is acted on twice in a run.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import sqlapi
from .sqlapi import Conn

# the skipped instances a run keeps as examples (each batch answers up to 5)
SAMPLE = 10
DEFAULT_BATCH = 50

Transaction = Callable[[], contextlib.AbstractContextManager[Conn]]


@dataclass
class Progress:
    """Where a run is: counts so far, skips by reason, and whether it ended."""

    action: str
    matched: int
    processed: int = 0
    applied: int = 0
    skipped: int = 0
    batches: int = 0
    skip_reasons: Counter[str] = field(default_factory=Counter)
    skip_sample: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False  # the last batch came back short: nothing matching is left
    interrupted: bool = False  # stopped by the caller after a batch
    started: float = field(default_factory=time.monotonic)

    def add(self, batch: sqlapi.bulk.BulkBatch) -> None:
        self.batches += 1
        self.processed += batch.processed
        self.applied += batch.applied
        self.skipped += batch.skipped
        self.skip_reasons.update(batch.skip_reasons)
        self.skip_sample.extend(batch.skip_sample[: SAMPLE - len(self.skip_sample)])

    def rate(self) -> float:
        """Instances processed per second so far."""
        elapsed = time.monotonic() - self.started
        return self.processed / elapsed if elapsed > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "matched": self.matched,
            "processed": self.processed,
            "applied": self.applied,
            "skipped": self.skipped,
            "skipped_reasons": dict(self.skip_reasons.most_common()),
            "skipped_sample": self.skip_sample,
            "batches": self.batches,
            "interrupted": self.interrupted,
        }


def run(
    transaction: Transaction,
    *,
    tenant_id: str,
    action: str,
    filter: dict[str, Any],
    actor: str,
    matched: int,
    reason: str | None = None,
    batch: int = DEFAULT_BATCH,
    on_batch: Callable[[Progress], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> Progress:
    """Apply ``action`` to every instance matching ``filter``, a batch per transaction
    (``transaction()`` opens one and yields its connection). ``on_batch`` sees the
    progress after each batch; ``stop`` is asked after each one (a Ctrl-C), and ends the
    run there. ``matched`` is the dry run's count, for progress only."""
    progress = Progress(action=action, matched=matched)
    cursor: uuid.UUID | None = None
    while True:
        with transaction() as conn:
            done = sqlapi.bulk.bulk_apply(
                conn,
                tenant_id=tenant_id,
                action=action,
                filter=filter,
                actor=actor,
                reason=reason,
                after_id=cursor,
                batch=batch,
            )
        progress.add(done)
        progress.finished = done.processed < batch or done.last_id is None
        if on_batch is not None:
            on_batch(progress)
        if progress.finished:
            return progress
        cursor = done.last_id
        if stop is not None and stop():
            progress.interrupted = True
            return progress
