"""The operator console: server-rendered pages (Jinja, no build step) for people.

Log in with an API key; the session keeps who you are (tenant, role, key id, name), never
the secret. Every read and write runs in ``tenant_tx(<session tenant>)``, so row-level
security confines it to that tenant, and every query also names the tenant (the view
``orch8.unresolved_effects`` runs as its owner, so RLS alone would not filter it).
The session tenant is the key's own, or for an admin the one it switched to in the header
(the console's ``X-Tenant-Id``, see ``tenants.py``); other roles cannot switch.

Auditors read; operators and admins may also resolve receipts, retry and cancel. Every
POST carries the session's CSRF token. Engine refusals are shown as a message on the page.

Everything registers on the one blueprint ``bp`` as its module is imported, so each module
holding hooks, filters, error handlers or routes is imported here.
"""

from __future__ import annotations

from . import (  # noqa: F401
    dashboard,
    effects,
    formatting,
    instances,
    login,
    pages,
    schedules,
    sequences,
    session,
    tenants,
    waiting,
)
from .blueprint import bp

__all__ = ["bp"]
