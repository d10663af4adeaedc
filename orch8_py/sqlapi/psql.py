"""The statements we tell people to type in psql (the CLI's hints, the demo's guide),
kept beside the ones we run so that a changed signature changes both."""

from __future__ import annotations


def _literal(value: object) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def unresolved_queue() -> str:
    return "SELECT * FROM orch8.unresolved_effects;"


def resolve_effect(
    tenant_id: str,
    effect_id: object,
    expected_state: str,
    state: str,
    provider_receipt_id: str,
    evidence: str,
    output: str | None = None,
) -> list[str]:
    """orch8.resolve_effect as psql lines, the actor left for the reader to fill; ``output``
    (JSON text) is what the step would have returned."""
    lines = [
        f"SELECT state FROM orch8.resolve_effect({_literal(tenant_id)}, {_literal(effect_id)},",
        f"    {_literal(expected_state)}, {_literal(state)}, {_literal(provider_receipt_id)},",
    ]
    if output is None:
        return [*lines, f"    {_literal(evidence)}, 'you@ops');"]
    return [
        *lines,
        f"    {_literal(evidence)}, 'you@ops', NULL,",
        f"    {_literal(output)});",
    ]


def mark_effect_unknown(tenant_id: str, effect_id: object) -> str:
    return (
        f"SELECT orch8.mark_effect_unknown({_literal(tenant_id)}, {_literal(effect_id)}, 'reason');"
    )
