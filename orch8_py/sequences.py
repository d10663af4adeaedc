"""Sequence definitions from Python: create one through orch8.create_sequence (which
validates it and picks the next version) and read one from a JSON file.

The SQL function refuses an invalid definition with O8008 and a DETAIL holding every
problem as a JSON array of {path, message}; ``InvalidSequence.problems`` is that list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from .db import engine_errors
from .errors import InvalidInput


class InvalidSequence(InvalidInput):
    """A sequence definition with problems; ``problems`` lists each {path, message}."""

    def __init__(self, message: str, problems: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.problems = problems


_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _problems(detail: str | None) -> list[dict[str, str]] | None:
    """The problems of an O8008 DETAIL, or None when it is not a JSON array of them."""
    if not detail:
        return None
    try:
        value = json.loads(detail)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        return None
    return value


def create_sequence(
    conn: psycopg.Connection,
    tenant_id: str,
    namespace: str,
    name: str,
    definition: dict[str, Any],
) -> dict[str, Any]:
    """Validate and store ``definition`` as the next version; return the stored row.

    Runs in the caller's transaction (commit it unless the connection is autocommit).
    Raises InvalidSequence listing every problem, InvalidInput for a bad tenant,
    namespace or name.
    """
    try:
        with engine_errors(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                "SELECT * FROM orch8.create_sequence(%s, %s, %s, %s)",
                (tenant_id, namespace, name, Jsonb(definition)),
            )
            row = cur.fetchone()
    except InvalidInput as exc:
        problems = _problems(getattr(exc, "detail", None))
        if problems is None:
            raise
        err = InvalidSequence(str(exc), problems)
        err.detail = exc.detail
        err.hint = getattr(exc, "hint", None)
        raise err from exc.__cause__
    assert row is not None
    return row


def load_definition_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a sequence definition (a JSON object) from a file.

    Raises InvalidInput with a one-line message when the file cannot be read or does not
    hold a JSON object.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"sequence definition file {p} not found") from None
    except IsADirectoryError:
        raise InvalidInput(f"sequence definition file {p} is a directory") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"sequence definition file {p} is not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read sequence definition file {p}: {exc.strerror}") from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"sequence definition file {p} is not valid JSON: {exc.msg} "
            f"at line {exc.lineno}, column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise InvalidInput(f"sequence definition file {p} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "a number")
        raise InvalidInput(f"sequence definition file {p} must hold a JSON object, not {kind}")
    return value
