"""Opaque paging cursors: the position of a page's last item, as unpadded URL-safe base64
of a JSON array (instances: ``[created_at, id]``; sequences: ``[namespace, name]``; the
webhook outbox: ``[id]``). The REST API hands them out as ``next_cursor`` and reads them
back as ``?cursor=``; the console pages its instance list with the same ones.

``cursor(kind, ...)`` makes a parser that raises ValueError for anything this module did
not make; the ``*Cursor`` types are the same parsers as query fields, declared in the
OpenAPI document as strings of a named ``format`` (``orch8-instance-cursor`` ...).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

INT64_MAX = 2**63 - 1

Kind = Callable[[Any], Any]


def _to_json(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    raise TypeError(f"{type(value).__name__} cannot be part of a cursor")


def encode_cursor(*parts: Any) -> str:
    """The cursor of a position: ``parts`` are the sort key of the last item."""
    raw = json.dumps(list(parts), default=_to_json, ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def cursor(*kinds: Kind) -> Callable[[str], tuple[Any, ...]]:
    """A parser for a cursor made by encode_cursor from values of ``kinds``; ValueError
    for anything else."""

    def parse(value: str) -> tuple[Any, ...]:
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            parts = json.loads(raw.decode("utf-8"))
            if not isinstance(parts, list) or len(parts) != len(kinds):
                raise ValueError
            return tuple(kind(p) for kind, p in zip(kinds, parts, strict=True))
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, OverflowError):
            raise ValueError("is not a cursor this API returned") from None

    return parse


def cursor_text(value: Any) -> str:
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError
    value.encode("utf-8")  # an unpaired surrogate: UnicodeEncodeError, a ValueError
    return value


def cursor_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
        raise ValueError
    return value


def cursor_time(value: Any) -> dt.datetime:
    if not isinstance(value, str):
        raise ValueError
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def cursor_uuid(value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise ValueError
    return uuid.UUID(value)


def _validator(*kinds: Kind) -> PlainValidator:
    parse = cursor(*kinds)

    def validate(value: Any) -> tuple[Any, ...]:
        try:
            if not isinstance(value, str):
                raise ValueError
            return parse(value)
        except ValueError:
            raise PydanticCustomError(
                "cursor", "is not a cursor this API returned (pass next_cursor back)"
            ) from None

    return PlainValidator(validate)


def _schema(fmt: str, position: str) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "type": "string",
            "format": fmt,
            "description": "the next_cursor of the previous page (opaque: the position "
            f"{position} of its last item)",
        }
    )


# Query fields: (created_at, id), (namespace, name), (id)
InstanceCursor = Annotated[
    tuple[dt.datetime, uuid.UUID],
    _validator(cursor_time, cursor_uuid),
    _schema("orch8-instance-cursor", "(created_at, id)"),
]
SequenceCursor = Annotated[
    tuple[str, str],
    _validator(cursor_text, cursor_text),
    _schema("orch8-sequence-cursor", "(namespace, name)"),
]
DeliveryCursor = Annotated[
    tuple[int], _validator(cursor_int), _schema("orch8-delivery-cursor", "(id)")
]
ScheduleCursor = Annotated[
    tuple[str, uuid.UUID],
    _validator(cursor_text, cursor_uuid),
    _schema("orch8-schedule-cursor", "(name, id)"),
]
TaskCursor = Annotated[
    tuple[dt.datetime, uuid.UUID],
    _validator(cursor_time, cursor_uuid),
    _schema("orch8-task-cursor", "(created_at, id)"),
]
