"""Sequences: create a version (orch8.create_sequence), list, read (orch8.get_sequence)."""

from __future__ import annotations

from flask import Blueprint, g

from orch8_py.sequences import InvalidSequence, create_sequence

from ..auth import OPERATOR, require
from ..db import tenant_tx
from ..problems import Problem
from .validation import (
    INT32_MAX,
    LIMIT,
    Field,
    answer,
    cursor,
    cursor_text,
    encode_cursor,
    json_body,
    not_found,
    path_int,
    path_text,
    query,
    text,
)

bp = Blueprint("sequences", __name__)

SUMMARY = "id, namespace, name, version, created_at"
FULL = "id, namespace, name, version, definition, created_at"

CREATE = {
    "namespace": Field(str, nullable=True),
    "name": Field(str, required=True),
    "definition": Field(dict, required=True),
}


@bp.post("/sequences")
@require(*OPERATOR)
def create():
    query({})
    body = json_body(CREATE)
    with tenant_tx() as conn:
        try:
            row = create_sequence(
                conn, g.tenant, body.get("namespace", "default"), body["name"], body["definition"]
            )
        except InvalidSequence as exc:
            raise Problem(422, "invalid definition", str(exc), problems=exc.problems) from None
    return answer({k: row[k] for k in FULL.split(", ")}, 201)


@bp.get("/sequences")
@require(*OPERATOR)
def list_latest():
    q = query(
        {"namespace": text(100), "limit": LIMIT, "cursor": cursor(cursor_text, cursor_text)},
        {"limit": 50},
    )
    after = q.get("cursor")
    with tenant_tx() as conn:
        rows = conn.execute(
            f"SELECT {SUMMARY} FROM ("
            "  SELECT DISTINCT ON (namespace, name) * FROM orch8.sequences"
            "  WHERE tenant_id = %(t)s AND (%(ns)s::text IS NULL OR namespace = %(ns)s)"
            "    AND (%(c_ns)s::text IS NULL OR (namespace, name) > (%(c_ns)s, %(c_name)s))"
            "  ORDER BY namespace, name, version DESC"
            ") AS latest ORDER BY namespace, name LIMIT %(limit)s",
            {
                "t": g.tenant,
                "ns": q.get("namespace"),
                "c_ns": after[0] if after else None,
                "c_name": after[1] if after else None,
                "limit": q["limit"] + 1,
            },
        ).fetchall()
    items = rows[: q["limit"]]
    more = len(rows) > q["limit"]
    next_cursor = encode_cursor(items[-1]["namespace"], items[-1]["name"]) if more else None
    return answer({"items": items, "next_cursor": next_cursor})


def _get(namespace: str, name: str, version: int | None):
    namespace, name = path_text(namespace, "namespace"), path_text(name, "name")
    with tenant_tx() as conn:
        row = conn.execute(
            f"SELECT {FULL} FROM orch8.get_sequence(%s, %s, %s, %s::integer)",
            (g.tenant, namespace, name, version),
        ).fetchone()
    if row is None or row["id"] is None:
        label = f"sequence {namespace}/{name}" + (f" version {version}" if version else "")
        raise not_found(label)
    return answer(row)


@bp.get("/sequences/<namespace>/<name>")
@require(*OPERATOR)
def get_latest(namespace: str, name: str):
    query({})
    return _get(namespace, name, None)


@bp.get("/sequences/<namespace>/<name>/versions/<version>")
@require(*OPERATOR)
def get_version(namespace: str, name: str, version: str):
    query({})
    return _get(namespace, name, path_int(version, "version", INT32_MAX))


@bp.get("/sequences/<namespace>/<name>/versions")
@require(*OPERATOR)
def list_versions(namespace: str, name: str):
    query({})
    namespace, name = path_text(namespace, "namespace"), path_text(name, "name")
    with tenant_tx() as conn:
        rows = conn.execute(
            f"SELECT {SUMMARY} FROM orch8.sequences"
            " WHERE tenant_id = %s AND namespace = %s AND name = %s ORDER BY version",
            (g.tenant, namespace, name),
        ).fetchall()
    if not rows:
        raise not_found(f"sequence {namespace}/{name}")
    return answer({"items": rows})
