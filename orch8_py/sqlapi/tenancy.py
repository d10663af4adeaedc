"""Tenant confinement for the web service: a transaction as the role orch8_web with the
tenant set (row-level security then shows that tenant only), and the tenant ids an admin
may pick from."""

from __future__ import annotations

from .base import Conn, all_rows, one

WEB_ROLE = "orch8_web"

# The distinct tenant ids of sequences and instances, each by a skip scan of the primary
# key (tenant_id, id): one index probe per tenant, not a scan of every row.
_KNOWN_TENANTS = """
WITH RECURSIVE
s(tenant, n) AS (
    SELECT min(tenant_id), 1 FROM orch8.sequences
    UNION ALL
    SELECT (SELECT min(x.tenant_id) FROM orch8.sequences AS x WHERE x.tenant_id > s.tenant),
           s.n + 1
    FROM s WHERE s.tenant IS NOT NULL AND s.n <= %(limit)s
),
i(tenant, n) AS (
    SELECT min(tenant_id), 1 FROM orch8.task_instances
    UNION ALL
    SELECT (SELECT min(x.tenant_id) FROM orch8.task_instances AS x
            WHERE x.tenant_id > i.tenant),
           i.n + 1
    FROM i WHERE i.tenant IS NOT NULL AND i.n <= %(limit)s
)
SELECT tenant FROM s WHERE tenant IS NOT NULL
UNION
SELECT tenant FROM i WHERE tenant IS NOT NULL
ORDER BY 1
LIMIT %(limit)s
"""


def enter_tenant(conn: Conn, tenant_id: str) -> None:
    """In the caller's open transaction: act as orch8_web for ``tenant_id`` until it ends
    (one round trip for both settings)."""
    one(
        conn,
        "SELECT set_config('role', %(role)s, true),"
        " set_config('orch8.tenant_id', %(tenant)s, true)",
        {"role": WEB_ROLE, "tenant": tenant_id},
    )


def known_tenants(conn: Conn, *, limit: int, timeout: str) -> list[str]:
    """Tenant ids that have sequences or instances, read in a read-only transaction bounded
    by ``timeout`` (a PostgreSQL interval such as '2s'). Across tenants: call it with a
    role that row-level security does not confine."""
    with conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        one(conn, "SELECT set_config('statement_timeout', %(t)s, true)", {"t": timeout})
        return [r["tenant"] for r in all_rows(conn, _KNOWN_TENANTS, {"limit": limit})]
