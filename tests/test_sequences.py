"""Sequence definitions from Python: every problem reported with its path, versions under
concurrent creators, and one-line errors for definition files."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from orch8_py import sqlapi
from orch8_py.cli.sequences import load_definition_file
from orch8_py.errors import InvalidInput, InvalidSequence

TENANT = "acme"

GOOD = {
    "blocks": [
        {
            "id": "charge",
            "type": "step",
            "handler": "http_request",
            "params": {"url": "https://pay.example/{{ data.order_id }}"},
            "retry": {"max_attempts": 3, "initial_backoff": 1000, "max_backoff": 60000},
        }
    ]
}

BAD = {
    "owner": "me",
    "blocks": [
        {
            "id": "fetch",
            "type": "step",
            "handler": "http_request",
            "params": {"url": "{{ nope.x }}", "body": ["{{ data.x"]},
            "retry": {"max_attempts": 0},
        },
        {"id": "fetch", "type": "step", "handler": "log"},
        {"id": "jump", "type": "teleport"},
        {"id": "fan", "type": "parallel", "branches": [[{"id": "inner", "type": "step"}]]},
        {"id": "jump", "type": "step", "handler": "noop", "when": "data.x =="},
    ],
    "invariants": [
        {"name": "once", "type": "effect_at_most_once", "kind": "telepathy", "commit_guard": True}
    ],
}

BAD_PATHS = [
    "$.owner",
    "$.blocks[0].params.url",
    "$.blocks[0].params.body[0]",
    "$.blocks[0].retry.max_attempts",
    "$.blocks[1].id",
    "$.blocks[2].type",
    "$.blocks[3].branches[0][0].handler",
    "$.blocks[4].when",
    "$.blocks[4].id",
    "$.invariants[0].kind",
]


def create(conn, name, definition, namespace="default"):
    return sqlapi.sequences.create_sequence(
        conn, tenant_id=TENANT, namespace=namespace, name=name, definition=definition
    )


def test_create_stores_versions_and_returns_the_row(conn):
    first = create(conn, "checkout", GOOD)
    second = create(conn, "checkout", GOOD)
    assert (first["version"], second["version"]) == (1, 2)
    assert first["definition"] == GOOD
    assert (first["namespace"], first["name"]) == ("default", "checkout")


def test_invalid_sequence_lists_every_problem_with_its_path(conn):
    with pytest.raises(InvalidSequence) as info:
        create(conn, "broken", BAD)
    err = info.value
    assert isinstance(err, InvalidInput)
    assert str(err) == f"sequence definition has {len(BAD_PATHS)} problem(s)"
    assert sorted(p["path"] for p in err.problems) == sorted(BAD_PATHS)
    assert all(set(p) == {"path", "message"} and p["message"] for p in err.problems)
    by_path = {p["path"]: p["message"] for p in err.problems}
    assert by_path["$.blocks[1].id"] == 'duplicate block id "fetch" (first used at $.blocks[0])'
    assert by_path["$.blocks[4].id"].startswith('duplicate block id "jump"')
    assert by_path["$.blocks[3].branches[0][0].handler"] == (
        "handler is required (a non-empty string)"
    )  # blocks inside blocks are checked too
    assert by_path["$.blocks[4].when"].startswith("expression 'data.x ==': ")
    assert "at position" in by_path["$.blocks[4].when"]  # the parse error says where
    assert by_path["$.owner"] == "unknown field"
    stored = conn.execute(
        "SELECT count(*) FROM orch8.sequences WHERE tenant_id = %s", (TENANT,)
    ).fetchone()
    assert stored == (0,)


def test_bad_name_is_invalid_input_without_problems(conn):
    with pytest.raises(InvalidInput) as info:
        create(conn, "no spaces", GOOD)
    assert not isinstance(info.value, InvalidSequence)
    assert "invalid sequence name" in str(info.value)
    assert info.value.facts == {
        "field": "sequence name",
        "rule": "1 to 200 characters among A-Z a-z 0-9 _ . -",
    }


def test_concurrent_creators_get_consecutive_versions(db_url):
    rounds = 20
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(2)]
    try:
        for n in range(rounds):
            barrier = threading.Barrier(2)

            def make(c: psycopg.Connection, barrier: threading.Barrier = barrier) -> int:
                barrier.wait(timeout=30)
                return int(create(c, "race", GOOD)["version"])

            with ThreadPoolExecutor(2) as pool:
                versions = sorted(pool.map(make, conns))
            assert versions == [2 * n + 1, 2 * n + 2], f"round {n}: {versions}"
        latest = (
            conns[0]
            .execute("SELECT version FROM orch8.get_sequence(%s, 'default', 'race')", (TENANT,))
            .fetchone()
        )
        assert latest == (2 * rounds,)
    finally:
        for c in conns:
            c.close()


def test_load_definition_file_reads_an_object(tmp_path):
    path = tmp_path / "checkout.json"
    path.write_text('{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}')
    assert load_definition_file(path) == {
        "blocks": [{"id": "a", "type": "step", "handler": "noop"}]
    }


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "not found"),
        ('{\n  "blocks": [\n    {"id": "a",,}\n  ]\n}\n', "at line 3, column 16"),
        ("", "at line 1, column 1"),
        ('{"timeout": NaN}', "NaN is not a JSON number"),
        ("[1, 2]", "must hold a JSON object, not an array"),
        (b"\xff\xfe{}", "is not UTF-8 text"),
    ],
)
def test_load_definition_file_errors_are_one_line(tmp_path, content, expected):
    path = tmp_path / "def.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InvalidInput) as info:
        load_definition_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message
    assert str(path) in message


def test_load_definition_file_of_a_directory(tmp_path):
    with pytest.raises(InvalidInput) as info:
        load_definition_file(tmp_path)
    assert "\n" not in str(info.value)
    assert "is a directory" in str(info.value)
