"""Effect-receipt reads shared by the instance and effect pages."""

from __future__ import annotations

import uuid

from flask import g

from orch8_py import sqlapi
from orch8_py.sqlapi import Conn, Row


def load_receipt(conn: Conn, effect_id: uuid.UUID) -> Row | None:
    return sqlapi.effects.effect_receipt(conn, tenant_id=g.tenant, effect_id=effect_id)


def receipt_events(conn: Conn, receipt_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[Row]]:
    return sqlapi.effects.receipt_events(conn, tenant_id=g.tenant, receipt_ids=receipt_ids)
