"""Engine errors, and the one place that maps the engine's SQLSTATEs to them.

The SQL functions raise codes of the class ``O8`` (documented in docs/SQL_API.md) with
their facts as a JSON object in DETAIL (``{"current_state": "paused"}``,
``{"effect_id": ...}``, ``{"problems": [...]}``, ``{"field": ..., "limit": 256}``).
``translate`` turns a psycopg error carrying one of them into its exception class with
those facts in ``facts``; everything else is returned unchanged so the caller can
re-raise it.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping
from typing import Any, ClassVar


class Orch8Error(Exception):
    """Base of every error the engine raises on purpose. ``facts`` holds what the SQL
    DETAIL named (empty for errors raised in Python); ``hint`` is the SQL HINT."""

    sqlstate: ClassVar[str | None] = None

    def __init__(
        self, message: str, *, facts: Mapping[str, Any] | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message)
        self.facts: dict[str, Any] = dict(facts or {})
        self.hint = hint


# --- raised by the SQL functions (class O8) -------------------------------------------


class StaleLease(Orch8Error):
    """The caller's lease token no longer owns the instance: stop quietly."""

    sqlstate = "O8001"


class StaleEffect(Orch8Error):
    """A receipt moved under the caller (lost CAS or stale dispatch)."""

    sqlstate = "O8002"


class InvariantViolation(Orch8Error):
    """A declared invariant (e.g. effect_at_most_once) refused the action."""

    sqlstate = "O8003"


class InvalidTransition(Orch8Error):
    """The requested state move is not in the transition table."""

    sqlstate = "O8004"


class InvalidConfig(Orch8Error):
    """Stored data or configuration contradicts itself (e.g. an effect id collision)."""

    sqlstate = "O8005"


class EffectBlocked(Orch8Error):
    """A receipt in dispatched/unknown (or already settled) blocks this dispatch."""

    sqlstate = "O8006"


class NotFound(Orch8Error):
    """The named row does not exist (in this tenant)."""

    sqlstate = "O8007"


class InvalidInput(Orch8Error):
    """An argument is malformed or out of range."""

    sqlstate = "O8008"


class Forbidden(Orch8Error):
    """The caller may not act on this: no usable credential, another tenant, another
    instance's receipt."""

    sqlstate = "O8009"


class HistoryInUse(Orch8Error):
    """A month of history still holds an instance that has not ended or a receipt that
    is not settled, so it cannot be archived."""

    sqlstate = "O8010"


class InvalidSequence(InvalidInput):
    """A sequence definition with problems: ``problems`` lists each {path, message}."""

    @property
    def problems(self) -> list[dict[str, str]]:
        return list(self.facts.get("problems") or [])


SQLSTATE_CLASS = "O8"

BY_SQLSTATE: dict[str, type[Orch8Error]] = {
    cls.sqlstate: cls
    for cls in (
        StaleLease,
        StaleEffect,
        InvariantViolation,
        InvalidTransition,
        InvalidConfig,
        EffectBlocked,
        NotFound,
        InvalidInput,
        Forbidden,
        HistoryInUse,
    )
    if cls.sqlstate
}


# --- raised by the Python side, for people --------------------------------------------


class ConfigError(Orch8Error):
    """Bad configuration (an environment variable, a flag)."""


def cannot_listen(exc: OSError, host: str, port: int, *, server: str, remedy: str) -> ConfigError:
    """The one wording for a server (``server``: "the operator service", "metrics"...) that
    cannot bind host:port; a port in use names ``remedy``."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(f"port {port} on {host} is already in use: {remedy}")
    return ConfigError(f"{server} cannot listen on {host}:{port} ({exc.strerror})")


class DatabaseUnavailable(Orch8Error):
    """PostgreSQL cannot be reached."""


class EmbeddedUnavailable(Orch8Error):
    """The embedded PostgreSQL cannot be started."""


class MigrationError(Orch8Error):
    """A migration cannot be applied (edited after it was applied, failed SQL...)."""


class SchemaMismatch(Orch8Error):
    """The database schema is not the one this build of orch8 expects."""


def facts_of(detail: str | None) -> dict[str, Any]:
    """The facts of an engine error's DETAIL (a JSON object); {} for anything else."""
    if not detail:
        return {}
    try:
        value = json.loads(detail)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def translate(exc: BaseException) -> BaseException:
    """Return the engine exception for a psycopg error with an O8 SQLSTATE, else ``exc``."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate not in BY_SQLSTATE:
        return exc
    diag = getattr(exc, "diag", None)
    return engine_error(
        sqlstate,
        getattr(diag, "message_primary", None) or str(exc),
        getattr(diag, "message_detail", None),
        getattr(diag, "message_hint", None),
    )


class BatchedCallFailed(Exception):
    """A call of a group-committed batch raised an error that is not the engine's own (its
    subtransaction was undone, the batch's other calls kept): the SQLSTATE and message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate


def engine_error(
    sqlstate: str, message: str, detail: str | None = None, hint: str | None = None
) -> Exception:
    """The exception for an error reported as its parts (a batched call's row): the
    matching Orch8Error for an engine SQLSTATE, else BatchedCallFailed."""
    cls = BY_SQLSTATE.get(sqlstate)
    if cls is None:
        return BatchedCallFailed(sqlstate, message)
    facts = facts_of(detail)
    if cls is InvalidInput and "problems" in facts:
        cls = InvalidSequence
    return cls(message, facts=facts, hint=hint)
