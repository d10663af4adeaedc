"""The effect ledger's id, hash and canonical-JSON rules recomputed independently in
Python, to check the SQL against (docs/SQL_API.md describes each rule)."""

from __future__ import annotations

import hashlib
import json
import uuid
from decimal import Decimal
from typing import Any

DESTINATION_KEYS = ("url", "provider", "model", "topic", "queue", "resource", "endpoint")

# --- the rules, recomputed in Python -------------------------------------------------


def uuid_from_digest(digest: bytes) -> uuid.UUID:
    b = bytearray(digest[:16])
    b[6] = (b[6] & 0x0F) | 0x80  # version 8
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return uuid.UUID(bytes=bytes(b))


def deterministic_effect_id(
    continuity_id: uuid.UUID, epoch: int, instance_id: uuid.UUID, block_id: str, attempt: int
) -> uuid.UUID:
    h = hashlib.sha256(b"orch8-effect-v1\x00")
    h.update(continuity_id.bytes)
    h.update(epoch.to_bytes(8, "big"))
    h.update(instance_id.bytes)
    h.update(block_id.encode("utf-8"))
    h.update(attempt.to_bytes(4, "big"))
    return uuid_from_digest(h.digest())


def effect_receipt_id(
    version: int,
    continuity_id: uuid.UUID,
    epoch: int,
    instance_id: uuid.UUID,
    block_id: str,
    attempt: int,
) -> uuid.UUID:
    # version 1 is deterministic_effect_id; version 2 (every scope made since migration
    # 0032) leads it with the instance id's first six bytes
    v1 = deterministic_effect_id(continuity_id, epoch, instance_id, block_id, attempt)
    if version == 1:
        return v1
    assert version == 2, version
    return uuid.UUID(bytes=instance_id.bytes[:6] + v1.bytes[6:])


def scope_id(prefix: str, instance_id: uuid.UUID) -> uuid.UUID:
    # the instance id's first six bytes (its time, for a time-ordered id), then the hash's
    digest = hashlib.sha256(prefix.encode() + b"\x00" + instance_id.bytes).digest()
    return uuid_from_digest(instance_id.bytes[:6] + digest[6:])


def continuity_id_for(instance_id: uuid.UUID) -> uuid.UUID:
    return scope_id("orch8-effect-scope-v1", instance_id)


def runtime_id_for(instance_id: uuid.UUID) -> uuid.UUID:
    return scope_id("orch8-effect-runtime-v1", instance_id)


def _number(value: int | float | Decimal) -> str:
    d = value if isinstance(value, Decimal) else Decimal(repr(value))
    if d == 0:
        d = abs(d)  # PostgreSQL prints -0 as 0
    return format(d, "f")


def canonical_json(value: Any) -> str:
    """The canonical form that orch8.canonical_json() computes (see docs/SQL_API.md)."""
    if isinstance(value, dict):
        items = sorted(value.items())  # str order is code-point order
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items)
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_sha256(handler: str, params: Any) -> str:
    return sha256_hex(canonical_json({"handler": handler, "params": params}))


def destination_fingerprint(handler: str, params: Any) -> str:
    dest = {k: params[k] for k in DESTINATION_KEYS if isinstance(params, dict) and k in params}
    return sha256_hex(canonical_json({"handler": handler, "destination": dest}))
