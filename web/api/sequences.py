"""Sequences: create a version (orch8.create_sequence), list the names, read versions."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g

from orch8_py import sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from .cursors import encode_cursor
from .models.sequences import (
    Sequence,
    SequenceCreate,
    SequenceListQuery,
    SequencePage,
    SequencePath,
    SequenceVersionList,
    SequenceVersionPath,
)
from .spec import READ, WRITE, operation

bp = Blueprint("sequences", __name__)
TAG = "sequences"
AT_NAME = {"namespace": "$response.body#/namespace", "name": "$response.body#/name"}


@bp.post("/sequences")
@operation(
    roles=OPERATOR,
    ok={201: Sequence},
    errors=WRITE,
    tag=TAG,
    operation_id="createSequence",
    links={
        201: {
            "GetLatestVersion": ("getSequence", AT_NAME),
            "ListVersions": ("listSequenceVersions", AT_NAME),
            "GetThisVersion": (
                "getSequenceVersion",
                {**AT_NAME, "version": "$response.body#/version"},
            ),
        }
    },
)
def create(json: SequenceCreate) -> tuple[Sequence, int]:
    """Create a version of a sequence

    The definition is validated by orch8.create_sequence and stored as the next version
    of the name (422 `invalid definition` with every problem otherwise)."""
    with tenant_tx() as conn:
        row = sqlapi.sequences.create_sequence(
            conn,
            tenant_id=g.tenant,
            namespace=json.namespace or "default",
            name=json.name,
            definition=json.definition,
        )
    return Sequence.model_validate(row), 201


@bp.get("/sequences")
@operation(
    roles=OPERATOR, ok={200: SequencePage}, errors=READ, tag=TAG, operation_id="listSequences"
)
def list_latest(query: SequenceListQuery) -> SequencePage:
    """The latest version of each name, by namespace and name"""
    with tenant_tx() as conn:
        rows = sqlapi.sequences.list_sequences(
            conn,
            tenant_id=g.tenant,
            limit=query.limit + 1,
            namespace=query.namespace,
            after=query.cursor,
        )
    items = [{**row, "version": row["latest_version"]} for row in rows[: query.limit]]
    more = len(rows) > query.limit
    next_cursor = encode_cursor(items[-1]["namespace"], items[-1]["name"]) if more else None
    return SequencePage.model_validate({"items": items, "next_cursor": next_cursor})


def _get(path: SequencePath, version: int | None) -> Sequence:
    with tenant_tx() as conn:
        row = sqlapi.sequences.get_sequence(
            conn, tenant_id=g.tenant, namespace=path.namespace, name=path.name, version=version
        )
    if row is None:
        which = f" version {version}" if version else ""
        raise Problem(404, "not found", f"sequence {path.namespace}/{path.name}{which} not found")
    return Sequence.model_validate(row)


@bp.get("/sequences/<namespace>/<name>")
@operation(roles=OPERATOR, ok={200: Sequence}, errors=READ, tag=TAG, operation_id="getSequence")
def get_latest(path: SequencePath) -> Sequence:
    """The latest version of a sequence, with its definition"""
    return _get(path, None)


@bp.get("/sequences/<namespace>/<name>/versions/<version>")
@operation(
    roles=OPERATOR, ok={200: Sequence}, errors=READ, tag=TAG, operation_id="getSequenceVersion"
)
def get_version(path: SequenceVersionPath) -> Sequence:
    """One version of a sequence, with its definition"""
    return _get(path, path.version)


@bp.get("/sequences/<namespace>/<name>/versions")
@operation(
    roles=OPERATOR,
    ok={200: SequenceVersionList},
    errors=READ,
    tag=TAG,
    operation_id="listSequenceVersions",
)
def list_versions(path: SequencePath) -> SequenceVersionList:
    """Every version of a sequence, oldest first, without definitions"""
    with tenant_tx() as conn:
        rows: list[dict[str, Any]] = sqlapi.sequences.sequence_versions(
            conn, tenant_id=g.tenant, namespace=path.namespace, name=path.name
        )
    if not rows:
        raise Problem(404, "not found", f"sequence {path.namespace}/{path.name} not found")
    return SequenceVersionList.model_validate({"items": rows})
