"""The Python lists of states and kinds equal what the database defines."""

from __future__ import annotations

from orch8_py import states


def enum(conn, name):
    return tuple(r[0] for r in conn.execute(f"SELECT unnest(enum_range(NULL::orch8.{name}))::text"))


def test_states_match_the_database(conn):
    assert enum(conn, "instance_state") == states.INSTANCE_STATES
    assert enum(conn, "effect_state") == states.EFFECT_STATES
    checks = " ".join(
        r[0]
        for r in conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid IN ('orch8.effect_receipts'::regclass,"
            " 'orch8.webhook_outbox'::regclass) AND contype = 'c'"
        )
    )
    for name in states.EFFECT_KINDS + states.OUTBOX_STATES + states.WEBHOOK_EVENTS:
        assert f"'{name}'" in checks, name
