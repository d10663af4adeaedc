"""Field types of the API's models. Each says once what a field accepts, for validation
and for the OpenAPI document alike; every enum, limit and pattern of the engine comes from
orch8_py.rules (generated from the database), never typed here again.

Strings can never hold NUL (``\\u0000``), which PostgreSQL cannot store: the schema says
so with the pattern ``^[^\\x00]*$`` (or a rule pattern that excludes it), and pydantic
refuses unpaired surrogates in any ``str``. Byte limits (UTF-8) are checked exactly; the
schema carries ``maxLength`` as a looser bound (a character is at least one byte) and the
exact one as ``x-maxBytes`` and in the description.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from orch8_py import rules

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # PostgreSQL integer
INT64_MAX = 2**63 - 1  # PostgreSQL bigint
MAX_JSON_DEPTH = 512  # nesting a stored JSON document may have (and be read back with)

NUL_FREE = r"^[^\x00]*$"
NO_NUL = "must not contain NUL characters (\\u0000)"

# The webhook URL rule is the domain orch8.webhook_url: http:// or https:// with a host,
# no whitespace (spelled out there, so it means the same in every regex engine), no NUL.
WEBHOOK_URL = rules.PATTERNS["webhook_url"]["pattern"]
WEBHOOK_URL_RULE = rules.PATTERNS["webhook_url"]["rule"]

# What a problem says when a string misses a pattern: the rule, not the expression.
PATTERN_RULES: dict[str, str] = {
    NUL_FREE: NO_NUL,
    **{p["pattern"]: f"must be {p['rule']}" for p in rules.PATTERNS.values()},
}


@dataclass(frozen=True, eq=False)  # hashed by identity (typing hashes Annotated metadata)
class Schema:
    """Members added to a type's JSON Schema (unlike Field, it also works inside a union)."""

    members: Mapping[str, Any]

    def __get_pydantic_json_schema__(
        self, core: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core)
        schema.update(self.members)
        return schema


@dataclass(frozen=True)
class OneOf:
    """One of ``values`` (a tuple of rules.py): a literal schema, an ``enum`` in the doc."""

    values: tuple[str, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.literal_schema(list(self.values))


@dataclass(frozen=True)
class Utf8Bytes:
    """At most ``max`` (and at least ``min``) bytes of UTF-8."""

    max: int
    min: int = 0

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, core: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core)
        schema.update(
            {
                "x-minBytes": self.min,
                "x-maxBytes": self.max,
                "description": f"{self.min} to {self.max} bytes of UTF-8 (maxLength counts "
                "characters, a looser bound); no NUL",
            }
        )
        return schema

    def check(self, value: str) -> str:
        size = len(value.encode("utf-8"))
        if size < self.min:
            raise PydanticCustomError(
                "bytes_too_short", "must be at least {min} byte(s) of UTF-8", {"min": self.min}
            )
        if size > self.max:
            raise PydanticCustomError(
                "bytes_too_long",
                "must be at most {max} bytes of UTF-8 (it is {size})",
                {"max": self.max, "size": size},
            )
        return value


def json_problems(value: Any, path: str = "") -> list[dict[str, str]]:
    """Problems of a JSON value that PostgreSQL's jsonb refuses: NUL characters (in strings
    or keys), nesting deeper than MAX_JSON_DEPTH. Iterative: a deep document cannot
    exhaust the stack. Unpaired surrogates are refused when the value is stored."""
    found: list[dict[str, str]] = []
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack and len(found) < 50:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            found.append({"path": where, "message": f"nested deeper than {MAX_JSON_DEPTH}"})
        elif isinstance(item, str):
            if "\x00" in item or not _encodable(item):
                found.append({"path": where, "message": _string_problem(item)})
        elif isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key or not _encodable(key):
                    found.append({"path": where, "message": f"a key {_string_problem(key)}"})
                    continue
                stack.append((child, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(item, list):
            for i, child in enumerate(item):
                stack.append((child, f"{where}[{i}]", depth + 1))
    return found


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _string_problem(text: str) -> str:
    return NO_NUL if "\x00" in text else "must not contain unpaired surrogates"


@dataclass(frozen=True)
class Storable:
    """A JSON document PostgreSQL can store: ``json_problems`` finds nothing in it."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    @staticmethod
    def check(value: Any) -> Any:
        found = json_problems(value)
        if found:  # the problems' paths are inside the field: invalid.py joins them
            raise PydanticCustomError(
                "json_value", "{message}", {"message": found[0]["message"], "problems": found}
            )
        return value


def _pattern(name: str) -> StringConstraints:
    return StringConstraints(pattern=rules.PATTERNS[name]["pattern"])


def _rule(name: str) -> Schema:
    return Schema({"description": rules.PATTERNS[name]["rule"]})


def _chars(limit: str, min_bytes: int = 0) -> StringConstraints:
    return StringConstraints(min_length=min_bytes, max_length=rules.LIMITS[limit], pattern=NUL_FREE)


# --- strings ------------------------------------------------------------------------------

NonEmptyText = Annotated[str, StringConstraints(min_length=1, pattern=NUL_FREE)]
Identifier = Annotated[str, _pattern("identifier"), _rule("identifier")]
SequenceName = Annotated[str, _pattern("sequence_name"), _rule("sequence_name")]
SignalType = Annotated[str, _pattern("signal_type"), _rule("signal_type")]
IdempotencyKey = Annotated[
    str,
    _chars("idempotency_key_bytes", 1),
    Utf8Bytes(rules.LIMITS["idempotency_key_bytes"], 1),
]
Note = Annotated[str, _chars("note_bytes"), Utf8Bytes(rules.LIMITS["note_bytes"])]
ProviderReceiptId = Annotated[
    str,
    _chars("provider_receipt_id_bytes"),
    Utf8Bytes(rules.LIMITS["provider_receipt_id_bytes"]),
]
WebhookUrl = Annotated[
    str, StringConstraints(pattern=WEBHOOK_URL), Schema({"description": WEBHOOK_URL_RULE})
]

# --- names of rules.py --------------------------------------------------------------------

InstanceState = Annotated[str, OneOf(rules.INSTANCE_STATES)]
NodeState = Annotated[str, OneOf(rules.NODE_STATES)]
NodeKind = Annotated[str, OneOf(rules.NODE_KINDS)]
WaitReason = Annotated[str, OneOf(rules.WAIT_REASONS)]
DeferralReason = Annotated[str, OneOf(rules.DEFERRAL_REASONS)]
EffectState = Annotated[str, OneOf(rules.EFFECT_STATES)]
EffectKind = Annotated[str, OneOf(rules.EFFECT_KINDS)]
WebhookEvent = Annotated[str, OneOf(rules.WEBHOOK_EVENTS)]
OutboxState = Annotated[str, OneOf(rules.OUTBOX_STATES)]
VerificationState = Annotated[str, OneOf(rules.VERIFICATION_STATES)]
# the states some receipt can be resolved to, and from
RESOLVED_TO = tuple(sorted({s for moves in rules.RESOLUTIONS.values() for s in moves}))
ResolvedState = Annotated[str, OneOf(RESOLVED_TO)]

# --- numbers ------------------------------------------------------------------------------


def _whole(value: Any) -> Any:
    """JSON Schema's integer is any number without a fraction: 5.0 is 5 (true is not)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Whole = BeforeValidator(_whole)
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX), Schema({"format": "int32"}), Whole]
Int64 = Annotated[int, Schema({"format": "int64"})]
Version = Annotated[int, Field(ge=1, le=INT32_MAX), Schema({"format": "int32"}), Whole]
DeliveryId = Annotated[int, Field(ge=1, le=INT64_MAX), Schema({"format": "int64"})]
Limit = Annotated[int, Field(ge=1, le=200, description="items per page, 1 to 200")]

# --- JSON documents -------------------------------------------------------------------------

JsonObject = Annotated[
    dict[str, Any],
    Storable(),
    Schema(
        {
            "description": "a JSON object; no string or key in it may contain NUL "
            f"(\\u0000), nesting at most {MAX_JSON_DEPTH} deep",
        }
    ),
]

JsonValue = Annotated[
    Any,
    Storable(),
    Schema(
        {
            "description": "any JSON value (null included); no string or key in it may "
            f"contain NUL (\\u0000), nesting at most {MAX_JSON_DEPTH} deep",
        }
    ),
]


def present_means_given(schema: dict[str, Any]) -> None:
    """json_schema_extra of an optional field whose ``null`` is a value, not "not given":
    its schema names no default (leaving the field out is what "not given" means)."""
    schema.pop("default", None)


# --- times ----------------------------------------------------------------------------------

_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})?"
)


def parse_date_time(value: Any) -> dt.datetime:
    """An RFC 3339 date-time (its offset may be left out: UTC). A leap second is read as
    the next second; the time stays in its own offset (PostgreSQL's range is wider)."""
    m = _DATE_TIME.fullmatch(value) if isinstance(value, str) else None
    try:
        if m is None:
            raise ValueError
        year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
        micro = int((m.group(7) or ".0")[1:].ljust(6, "0")[:6])
        offset = m.group(8) or "Z"
        tz = dt.UTC
        if offset not in ("Z", "z"):
            hours, minutes = int(offset[1:3]), int(offset[4:6])
            if minutes > 59:
                raise ValueError
            sign = -1 if offset[0] == "-" else 1
            tz = dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
        leap = second == 60
        parsed = dt.datetime(
            year, month, day, hour, minute, 59 if leap else second, micro, tzinfo=tz
        )
        return parsed + dt.timedelta(seconds=1) if leap else parsed
    except (ValueError, OverflowError):
        raise PydanticCustomError(
            "date_time", "must be an RFC 3339 date-time, e.g. 2030-01-31T12:00:00Z"
        ) from None


DateTime = Annotated[
    dt.datetime,
    PlainValidator(parse_date_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]

_DURATION = re.compile(r"([0-9]{1,6})([smhd])")
DURATION_PATTERN = "^" + _DURATION.pattern + "$"
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(value: Any) -> dt.timedelta:
    m = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise PydanticCustomError("duration", "must be a number and a unit s, m, h or d, e.g. 10m")
    return dt.timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


Duration = Annotated[
    dt.timedelta,
    PlainValidator(parse_duration),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "a number (at most 6 digits) and a unit: 30s, 10m, 2h, 1d",
        }
    ),
]


def no_null_default(schema: dict[str, Any]) -> None:
    """json_schema_extra of an optional query parameter: leaving it out is "any", and
    ``null`` is not a value a query string can send."""
    schema.pop("default", None)
    members = [m for m in schema.pop("anyOf", []) if m != {"type": "null"}]
    if len(members) == 1:
        schema.update(members[0])
    elif members:
        schema["anyOf"] = members


def optional(description: str = "", **kw: Any) -> Any:
    """Field() of an optional query parameter: absent means "any"."""
    extra: Callable[[dict[str, Any]], None] = no_null_default
    return Field(default=None, description=description or None, json_schema_extra=extra, **kw)


__all__ = [
    "DateTime",
    "DeliveryId",
    "Duration",
    "EffectKind",
    "EffectState",
    "IdempotencyKey",
    "Identifier",
    "InstanceState",
    "Int32",
    "Int64",
    "JsonObject",
    "JsonValue",
    "Limit",
    "NonEmptyText",
    "Note",
    "OutboxState",
    "ProviderReceiptId",
    "ResolvedState",
    "SequenceName",
    "SignalType",
    "VerificationState",
    "Version",
    "WaitReason",
    "WebhookEvent",
    "WebhookUrl",
]
