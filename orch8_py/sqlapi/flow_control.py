"""Rate limits (sql/functions/flow_control.sql): define or change one
(orch8.set_rate_limit) and read them with what they admitted, deferred and hold now
(orch8.rate_limit_status). Concurrency keys need no call: steps declare them and the
claim enforces them."""

from __future__ import annotations

from .base import Conn, Row, all_rows, first, one

# What is answered of a rate limit (orch8.rate_limit_status, less the tenant).
RATE_LIMIT = (
    "key, rate, per_ms, burst, tokens_now, admitted, deferred, waiting, created_by,"
    " updated_by, created_at, updated_at"
)


def set_rate_limit(
    conn: Conn,
    *,
    tenant_id: str,
    key: str,
    rate: int,
    per: str,
    burst: int | None = None,
    actor: str | None = None,
) -> Row:
    """Define or change the bucket; ``per`` is a duration (1s, 1m, 1h or milliseconds).
    Bad input is InvalidInput with ``facts["field"]``. Returns it as rate_limit_status
    shows it."""
    one(
        conn,
        "SELECT 1 FROM orch8.set_rate_limit(p_tenant_id => %(tenant)s, p_key => %(key)s,"
        " p_rate => %(rate)s, p_per => %(per)s, p_burst => %(burst)s, p_actor => %(actor)s)",
        {"tenant": tenant_id, "key": key, "rate": rate, "per": per, "burst": burst, "actor": actor},
    )
    found = get_rate_limit(conn, tenant_id=tenant_id, key=key)
    assert found is not None  # just written, in this transaction
    return found


def get_rate_limit(conn: Conn, *, tenant_id: str, key: str) -> Row | None:
    return first(
        conn,
        f"SELECT {RATE_LIMIT} FROM orch8.rate_limit_status"
        " WHERE tenant_id = %(tenant)s AND key = %(key)s",
        {"tenant": tenant_id, "key": key},
    )


def list_rate_limits(conn: Conn, *, tenant_id: str) -> list[Row]:
    """The tenant's rate limits by key."""
    return all_rows(
        conn,
        f"SELECT {RATE_LIMIT} FROM orch8.rate_limit_status WHERE tenant_id = %(tenant)s"
        " ORDER BY key",
        {"tenant": tenant_id},
    )
