"""Sequence definitions: create a version (validated by orch8.create_sequence), read one,
list them (orch8.sequence_overview, with how many problems today's validator finds in
the latest version of each: definitions stored before a field was refused)."""

from __future__ import annotations

from typing import Any

from ..definitions import definition_problems
from ..errors import InvalidSequence
from .base import Conn, Jsonb, Row, all_rows, first, one

# A version as the API, the CLI and the console show it.
VERSION = "id, namespace::text AS namespace, name::text AS name, version, created_at"


def create_sequence(
    conn: Conn, *, tenant_id: str, namespace: str, name: str, definition: dict[str, Any]
) -> Row:
    """Validate and store ``definition`` as the next version; the stored row. Raises
    InvalidSequence listing every problem (``problems``: the SQL validator's, then the
    expressions that do not parse and the schemas that are not), InvalidInput for a bad
    tenant, namespace or name."""
    if python_problems(conn, definition):
        problems = validate_sequence(conn, definition=definition)
        raise InvalidSequence(
            f"sequence definition has {len(problems)} problem(s)",
            facts={"problems": problems},
            hint="orch8.validate_sequence(definition) lists the problems SQL finds",
        )
    return one(
        conn,
        f"SELECT {VERSION}, definition FROM orch8.create_sequence(p_tenant_id => %(tenant)s,"
        " p_namespace => %(namespace)s, p_name => %(name)s, p_definition => %(definition)s)",
        {
            "tenant": tenant_id,
            "namespace": namespace,
            "name": name,
            "definition": Jsonb(definition),
        },
    )


def validate_sequence(conn: Conn, *, definition: Any) -> list[Row]:
    """Every problem of a definition as {path, message} (orch8.validate_sequence's, then
    the expressions that do not parse and the schemas that are not); [] when it is
    valid."""
    return all_rows(
        conn,
        "SELECT path, message FROM orch8.validate_sequence(p_definition => %(definition)s)",
        {"definition": Jsonb(definition)},
    ) + list(python_problems(conn, definition))


def python_problems(conn: Conn, definition: Any) -> list[dict[str, str]]:
    """The problems only Python can find (orch8_py.definitions), over the database's walk
    of the definition's blocks."""
    if not isinstance(definition, dict):
        return []
    blocks = all_rows(
        conn,
        "SELECT json_path, scope_vars, definition"
        " FROM orch8.definition_blocks(p_definition => %(definition)s)",
        {"definition": Jsonb(definition)},
    )
    return definition_problems(definition, blocks)


def get_sequence(
    conn: Conn, *, tenant_id: str, namespace: str, name: str, version: int | None = None
) -> Row | None:
    """One version (the latest when ``version`` is None) with its definition, or None."""
    row = one(
        conn,
        f"SELECT {VERSION}, definition FROM orch8.get_sequence(p_tenant_id => %(tenant)s,"
        " p_namespace => %(namespace)s, p_name => %(name)s,"
        " p_version => %(version)s::integer)",
        {"tenant": tenant_id, "namespace": namespace, "name": name, "version": version},
    )
    return None if row["id"] is None else row


def find_sequence(
    conn: Conn, *, tenant_id: str, namespace: str, name: str, definition: dict[str, Any]
) -> Row | None:
    """The latest version of the name whose definition is exactly ``definition``."""
    return first(
        conn,
        f"SELECT {VERSION} FROM orch8.sequences WHERE tenant_id = %(tenant)s"
        " AND namespace = %(namespace)s AND name = %(name)s AND definition = %(definition)s"
        " ORDER BY version DESC LIMIT 1",
        {
            "tenant": tenant_id,
            "namespace": namespace,
            "name": name,
            "definition": Jsonb(definition),
        },
    )


def list_sequences(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    namespace: str | None = None,
    after: tuple[str, str] | None = None,
) -> list[Row]:
    """One row per name, by (namespace, name): the latest version, the version count, its
    block count, and ``problems``: how many problems today's validator finds in it (0 for a
    definition this engine runs as written)."""
    return all_rows(
        conn,
        "SELECT o.namespace, o.name, o.latest_id AS id, o.latest_version, o.versions,"
        " o.blocks, o.latest_created_at AS created_at,"
        " (SELECT count(*) FROM orch8.validate_sequence(s.definition)) AS problems"
        " FROM orch8.sequence_overview AS o"
        " JOIN orch8.sequences AS s ON s.tenant_id = o.tenant_id AND s.id = o.latest_id"
        " WHERE o.tenant_id = %(tenant)s"
        " AND (%(namespace)s::text IS NULL OR o.namespace = %(namespace)s)"
        " AND (%(c_ns)s::text IS NULL OR (o.namespace, o.name) > (%(c_ns)s, %(c_name)s))"
        " ORDER BY o.namespace, o.name LIMIT %(limit)s",
        {
            "tenant": tenant_id,
            "namespace": namespace,
            "c_ns": after[0] if after else None,
            "c_name": after[1] if after else None,
            "limit": limit,
        },
    )


def sequence_versions(conn: Conn, *, tenant_id: str, namespace: str, name: str) -> list[Row]:
    """Every version of a name, oldest first, with its block count and how many problems
    today's validator finds in it."""
    return all_rows(
        conn,
        f"SELECT {VERSION},"
        " jsonb_array_length(coalesce(s.definition -> 'blocks', '[]')) AS blocks,"
        " (SELECT count(*) FROM orch8.validate_sequence(s.definition)) AS problems"
        " FROM orch8.sequences AS s"
        " WHERE s.tenant_id = %(tenant)s AND s.namespace = %(namespace)s AND s.name = %(name)s"
        " ORDER BY s.version",
        {"tenant": tenant_id, "namespace": namespace, "name": name},
    )


def instances_per_version(
    conn: Conn, *, tenant_id: str, namespace: str, name: str
) -> dict[int, int]:
    """How many instances each version of a name has started (versions with none absent)."""
    rows = all_rows(
        conn,
        "SELECT s.version, count(*) AS n FROM orch8.sequences AS s"
        " JOIN orch8.task_instances AS t ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id"
        " WHERE s.tenant_id = %(tenant)s AND s.namespace = %(namespace)s AND s.name = %(name)s"
        " GROUP BY s.version",
        {"tenant": tenant_id, "namespace": namespace, "name": name},
    )
    return {r["version"]: r["n"] for r in rows}
