"""The rules the database defines, read from its catalog, and rendered as the Python
module ``orch8_py/rules.py`` (``make rules``; tests/test_rules.py fails when the file
differs from what a freshly migrated database says)."""

from __future__ import annotations

import pprint
import re
from typing import Any

from .base import Conn, all_rows, value

HEADER = '''"""The engine's rules as the database defines them, for Python code that needs them
without a connection (argparse choices, request models, the OpenAPI document, templates).

GENERATED from a migrated database by `make rules` (orch8_py/sqlapi/catalog.py): do not
edit. The definitions are in sql/migrations/ and sql/functions/ (docs/SQL_API.md);
tests/test_rules.py fails when this file is stale.
"""
# ruff: noqa: E501
# fmt: off

'''

_DOMAIN_PATTERN = re.compile(r"CHECK \(\(VALUE ~ '((?:[^']|'')*)'::text\)\)")


def _enum(conn: Conn, name: str) -> tuple[str, ...]:
    return tuple(value(conn, f"SELECT enum_range(NULL::orch8.{name})::text[]"))


def _moves(conn: Conn, view: str) -> dict[str, tuple[str, ...]]:
    rows = all_rows(
        conn,
        f"SELECT from_state::text AS f, array_agg(to_state::text ORDER BY to_state) AS t"
        f" FROM orch8.{view} GROUP BY from_state ORDER BY from_state",
    )
    return {r["f"]: tuple(r["t"]) for r in rows}


def _domains(conn: Conn) -> dict[str, dict[str, str]]:
    rows = all_rows(
        conn,
        "SELECT t.typname::text AS name, pg_get_constraintdef(c.oid) AS check_sql,"
        " obj_description(t.oid, 'pg_type') AS rule"
        " FROM pg_type AS t JOIN pg_constraint AS c ON c.contypid = t.oid"
        " WHERE t.typnamespace = 'orch8'::regnamespace AND t.typtype = 'd'"
        " ORDER BY t.typname",
    )
    out = {}
    for r in rows:
        # the other domains (json_object, natural_int, ...) hold rules the API states itself
        m = _DOMAIN_PATTERN.fullmatch(r["check_sql"].removesuffix(" NOT VALID"))
        if m is None:
            continue
        out[r["name"]] = {"pattern": m.group(1).replace("''", "'"), "rule": r["rule"]}
    return out


def read(conn: Conn) -> dict[str, Any]:
    """Every generated rule, by the name it has in rules.py."""
    return {
        "INSTANCE_STATES": _enum(conn, "instance_state"),
        "EFFECT_STATES": _enum(conn, "effect_state"),
        "EFFECT_KINDS": tuple(value(conn, "SELECT orch8.effect_kinds()")),
        "WEBHOOK_EVENTS": tuple(value(conn, "SELECT orch8.webhook_events()")),
        "OUTBOX_STATES": tuple(value(conn, "SELECT orch8.outbox_states()")),
        "API_KEY_ROLES": tuple(value(conn, "SELECT orch8.api_key_roles()")),
        "BULK_ACTIONS": tuple(value(conn, "SELECT orch8.bulk_actions()")),
        "SCHEDULE_STATES": tuple(value(conn, "SELECT orch8.schedule_states()")),
        "OVERLAP_POLICIES": tuple(value(conn, "SELECT orch8.schedule_overlap_policies()")),
        "SCHEDULE_FIRE_OUTCOMES": tuple(value(conn, "SELECT orch8.schedule_fire_outcomes()")),
        "EFFECT_TRANSITIONS": _moves(conn, "effect_transitions"),
        "INSTANCE_TRANSITIONS": _moves(conn, "instance_transition_table"),
        "RESOLUTIONS": _moves(conn, "effect_resolutions"),
        "RESOLUTIONS_NEEDING_EVIDENCE": tuple(
            value(
                conn,
                "SELECT array_agg(DISTINCT to_state::text ORDER BY to_state::text)"
                " FROM orch8.effect_resolutions WHERE needs_evidence",
            )
        ),
        "LIMITS": {
            r["name"]: r["value"]
            for r in all_rows(conn, "SELECT name, value FROM orch8.limits() ORDER BY name")
        },
        "PATTERNS": _domains(conn),
        "TEMPLATE_ROOTS": tuple(value(conn, "SELECT orch8.template_roots()")),
        "TEMPLATE_PLACEHOLDER": value(conn, "SELECT orch8.template_placeholder_pattern()"),
        "TEMPLATE_EXPRESSION": value(conn, "SELECT orch8.template_expression_pattern()"),
        # the same with the roots left to fill in: (ROOTS) is replaced by the names in scope
        "TEMPLATE_EXPRESSION_SHAPE": value(
            conn, "SELECT orch8.template_expression_pattern(ARRAY['ROOTS'])"
        ),
        "VERIFY_TEMPLATE_ROOTS": tuple(value(conn, "SELECT orch8.verify_template_roots()")),
        "VERIFY_TEMPLATE_EXPRESSION": value(
            conn, "SELECT orch8.template_expression_pattern(orch8.verify_template_roots())"
        ),
        "VERIFY_EXPRESSION_ROOTS": tuple(value(conn, "SELECT orch8.verify_expression_roots()")),
        "AMBIGUITY_MODES": tuple(value(conn, "SELECT orch8.ambiguity_modes()")),
        "VERIFICATION_METHODS": tuple(value(conn, "SELECT orch8.verification_methods()")),
        "VERIFICATION_STATES": tuple(value(conn, "SELECT orch8.verification_states()")),
        "VERIFY_HTTP_METHODS": tuple(value(conn, "SELECT orch8.verify_http_methods()")),
        "DEFAULT_VERIFY_SCHEDULE": tuple(value(conn, "SELECT orch8.default_verify_schedule()")),
        "RETRY_DEFAULTS": {
            r["field"]: float(r["value"]) if r["field"] == "backoff_multiplier" else int(r["value"])
            for r in all_rows(conn, "SELECT field, value FROM orch8.retry_defaults()")
        },
        "BUILTIN_HANDLERS": {
            r["name"]: {
                "side_effects": r["has_side_effects"],
                "kind": r["kind"],
                "implemented": r["implemented"],
            }
            for r in all_rows(
                conn,
                "SELECT name, has_side_effects, kind, implemented FROM orch8.builtin_handlers"
                " ORDER BY name",
            )
        },
        "NODE_STATES": _enum(conn, "node_state"),
        "NODE_TRANSITIONS": _moves(conn, "node_transition_table"),
        "NODE_KINDS": tuple(value(conn, "SELECT orch8.node_kinds()")),
        "CLAIMABLE_KINDS": tuple(value(conn, "SELECT orch8.claimable_kinds()")),
        "BUILTIN_SIGNALS": tuple(value(conn, "SELECT orch8.builtin_signals()")),
        "WAIT_REASONS": tuple(value(conn, "SELECT orch8.wait_reasons()")),
        "DEFERRAL_REASONS": tuple(value(conn, "SELECT orch8.deferral_reasons()")),
        "WORKER_TASK_STATES": tuple(value(conn, "SELECT orch8.worker_task_states()")),
        "WORKER_TASK_TRANSITIONS": _moves(conn, "worker_task_transitions"),
        "WORKER_TASK_EVENTS": tuple(value(conn, "SELECT orch8.worker_task_event_kinds()")),
        "BLOCK_DEFAULTS": {
            r["field"]: r["value"]
            for r in all_rows(conn, "SELECT field, value FROM orch8.block_defaults()")
        },
        "SEQUENCE_LANGUAGE": tuple(
            (r["scope"], r["field"], r["supported"], r["note"])
            for r in all_rows(
                conn, "SELECT scope, field, supported, note FROM orch8.sequence_language()"
            )
        ),
    }


def render(rules: dict[str, Any]) -> str:
    """rules.py's text: one assignment per rule, values pretty-printed (stable order)."""
    parts = [HEADER]
    for name, rule in rules.items():
        text = pprint.pformat(rule, width=96, sort_dicts=False)
        parts.append(f"{name} = {text}\n\n")
    return "".join(parts).rstrip("\n") + "\n# fmt: on\n"
