"""The one door into the database: every SQL statement the engine, the CLI, the REST
API, the console, the demo and the webhook deliverer run is written in this package,
one typed function per SQL function or shared read, with named arguments.

    from orch8_py import sqlapi
    sqlapi.effects.resolve_effect(conn, tenant_id=..., effect_id=..., state="committed", ...)

Functions take a connection the caller owns (its pool, transaction, role and tenant) and
raise the exceptions of orch8_py.errors for the engine's SQLSTATEs. Modules follow the
SQL files: steps (the runner), effects, flow_control (rate limits), instances, sequences,
webhooks, schedules, bulk, workers (external workers), history (the history tables'
months), keys, tenancy (the web role), observe (metrics), server (databases, sessions),
benchmarks (what bench/ measures around a run), catalog (the rules orch8_py/rules.py is
generated from), psql (the statements shown to people).
tests/test_one_door.py keeps SQL text out of every other module (the migrator and the
tests aside).
"""

from __future__ import annotations

from . import (
    benchmarks,
    bulk,
    catalog,
    effects,
    flow_control,
    history,
    instances,
    keys,
    observe,
    psql,
    schedules,
    sequences,
    server,
    steps,
    tenancy,
    webhooks,
    workers,
)
from .base import Conn, Row

__all__ = [
    "Conn",
    "Row",
    "benchmarks",
    "bulk",
    "catalog",
    "effects",
    "flow_control",
    "history",
    "instances",
    "keys",
    "observe",
    "psql",
    "schedules",
    "sequences",
    "server",
    "steps",
    "tenancy",
    "webhooks",
    "workers",
]
