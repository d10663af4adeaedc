"""The statements we tell people to type in psql (the CLI's hints, the demo's guide),
kept beside the ones we run so that a changed signature changes both."""

from __future__ import annotations


def _literal(value: object) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def unresolved_queue() -> str:
    return "SELECT * FROM orch8.unresolved_effects;"


def resolve_effect(
    tenant_id: str, effect_id: object, state: str, provider_receipt_id: str, evidence: str
) -> list[str]:
    """orch8.resolve_effect as two lines of psql, the actor left for the reader to fill."""
    return [
        f"SELECT state FROM orch8.resolve_effect({_literal(tenant_id)}, {_literal(effect_id)},"
        f" {_literal(state)},",
        f"    {_literal(provider_receipt_id)}, {_literal(evidence)}, 'you@ops');",
    ]


def mark_effect_unknown(tenant_id: str, effect_id: object) -> str:
    return (
        f"SELECT orch8.mark_effect_unknown({_literal(tenant_id)}, {_literal(effect_id)}, 'reason');"
    )
