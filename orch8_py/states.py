"""The state and kind names the database defines, for Python code that lists or checks
them (a test holds them equal to the SQL enums and CHECK constraints)."""

from __future__ import annotations

INSTANCE_STATES = (
    "scheduled",
    "running",
    "waiting",
    "paused",
    "completed",
    "failed",
    "cancelled",
)

EFFECT_STATES = (
    "planned",
    "prepared",
    "dispatched",
    "committed",
    "unknown",
    "verified",
    "compensated",
    "abandoned",
)

EFFECT_KINDS = ("http", "model", "message", "storage", "custom", "worker")

OUTBOX_STATES = ("pending", "delivering", "delivered", "parked", "discarded")

WEBHOOK_EVENTS = ("instance.completed", "instance.failed")
