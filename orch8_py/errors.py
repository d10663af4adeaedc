"""Engine errors, and the one place that maps the engine's SQLSTATEs to them.

The SQL functions raise codes of the class ``O8`` (documented in docs/SQL_API.md).
``translate`` turns a psycopg error carrying one of them into its exception class;
everything else is returned unchanged so the caller can re-raise it.
"""

from __future__ import annotations


class Orch8Error(Exception):
    """Base of every error the engine raises on purpose."""

    sqlstate: str | None = None


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
    )
    if cls.sqlstate
}


# --- raised by the Python side, for people --------------------------------------------


class ConfigError(Orch8Error):
    """Bad configuration (an environment variable, a flag)."""


class DatabaseUnavailable(Orch8Error):
    """PostgreSQL cannot be reached."""


class EmbeddedUnavailable(Orch8Error):
    """The embedded PostgreSQL cannot be started."""


class MigrationError(Orch8Error):
    """A migration cannot be applied (edited after it was applied, failed SQL...)."""


class SchemaMismatch(Orch8Error):
    """The database schema is not the one this build of orch8 expects."""


def translate(exc: BaseException) -> BaseException:
    """Return the engine exception for a psycopg error with an O8 SQLSTATE, else ``exc``."""
    sqlstate = getattr(exc, "sqlstate", None)
    cls = BY_SQLSTATE.get(sqlstate or "")
    if cls is None:
        return exc
    diag = getattr(exc, "diag", None)
    message = getattr(diag, "message_primary", None) or str(exc)
    err = cls(message)
    err.detail = getattr(diag, "message_detail", None)
    err.hint = getattr(diag, "message_hint", None)
    return err
