"""Sequences: a version to create, the list of names, the versions of one, one version."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from pydantic import Field

from ..cursors import SequenceCursor
from ..fields import Identifier, JsonObject, Limit, SequenceName, Version, optional
from .base import Answer, Body, Path, Query


class SequenceCreate(Body):
    namespace: Identifier | None = Field(default=None, description="default: `default`")
    name: SequenceName
    definition: JsonObject = Field(
        description="the definition, validated by orch8.create_sequence (422 `invalid "
        "definition` listing every problem); see docs/SQL_API.md#definition-shape"
    )


class SequenceVersion(Answer):
    """One stored version, without its definition."""

    id: uuid.UUID
    namespace: str
    name: str
    version: int
    created_at: dt.datetime


class Sequence(SequenceVersion):
    """One stored version with its definition."""

    definition: dict[str, Any]


class SequenceVersionOverview(SequenceVersion):
    blocks: int = Field(description="how many blocks the definition has")
    problems: int = Field(
        description="how many problems today's validator finds in it (0: it runs as "
        "written; more: stored before a rule refused what it holds)"
    )


class SequenceOverview(Answer):
    """The latest version of one name."""

    id: uuid.UUID = Field(description="the latest version's id")
    namespace: str
    name: str
    version: int = Field(description="the latest version (the same as latest_version)")
    latest_version: int
    versions: int = Field(description="how many versions the name has")
    blocks: int = Field(description="how many blocks the latest version has")
    problems: int = Field(
        description="how many problems today's validator finds in the latest version"
    )
    created_at: dt.datetime = Field(description="when the latest version was created")


class SequencePage(Answer):
    items: list[SequenceOverview]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null last")


class SequenceVersionList(Answer):
    items: list[SequenceVersionOverview]


class SequenceListQuery(Query):
    namespace: Identifier | None = optional("only this namespace")
    limit: Limit = 50
    cursor: SequenceCursor | None = optional()


class SequencePath(Path):
    namespace: Identifier
    name: SequenceName


class SequenceVersionPath(SequencePath):
    version: Version
