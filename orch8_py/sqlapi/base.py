"""How every door function runs its statement: engine SQLSTATEs become the exceptions of
orch8_py.errors, rows come back as dicts (reads) or dataclasses (engine outcomes)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from .. import errors

Row = dict[str, Any]
Conn = psycopg.Connection[Any]
T = TypeVar("T")

# "No output given" where a JSON null (None) is itself an output a step may return.
NO_OUTPUT: Any = object()

__all__ = [
    "NO_OUTPUT",
    "Conn",
    "Jsonb",
    "Row",
    "all_rows",
    "engine_errors",
    "first",
    "objects",
    "one",
    "value",
]


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """Re-raise psycopg errors with an engine SQLSTATE as the matching Orch8Error."""
    try:
        yield
    except psycopg.Error as exc:
        translated = errors.translate(exc)
        if translated is exc:
            raise
        raise translated from exc


def all_rows(conn: Conn, sql: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    with engine_errors(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchall()


def first(conn: Conn, sql: str, params: Mapping[str, Any] | None = None) -> Row | None:
    """The first row, or None."""
    with engine_errors(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return cur.fetchone()


def one(conn: Conn, sql: str, params: Mapping[str, Any] | None = None) -> Row:
    """The row of a statement that always answers one (a function call)."""
    row = first(conn, sql, params)
    if row is None:  # a function call always yields a row: this is a broken statement
        raise RuntimeError(f"no row from {sql.split('(')[0].strip()!r}")
    return row


def value(conn: Conn, sql: str, params: Mapping[str, Any] | None = None) -> Any:
    """The first column of the first row (None when there is no row)."""
    with engine_errors(), conn.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None else row[0]


def objects(conn: Conn, cls: type[T], sql: str, params: Mapping[str, Any] | None = None) -> list[T]:
    """Rows as instances of a dataclass whose fields are the columns."""
    with engine_errors(), conn.cursor(row_factory=class_row(cls)) as cur:
        cur.execute(sql, params)
        return cur.fetchall()
