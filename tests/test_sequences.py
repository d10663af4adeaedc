"""Sequence definitions from Python: every problem reported with its path, versions under
concurrent creators, and one-line errors for definition files."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


COMPOSITES = json.loads((Path(__file__).parent / "data" / "bad_composites.json").read_text())


def test_composite_blocks_are_refused_with_a_precise_problem_each(conn):
    """Every rule of every composite block, nested ones included, names its JSON path;
    the expressions and JSON Schemas, parsed in Python, say where they break."""
    with pytest.raises(InvalidSequence) as info:
        create(conn, "composites", COMPOSITES)
    assert [(p["path"], p["message"]) for p in info.value.problems] == [
        ("$.on_failure", "on_failure must be a non-empty array of blocks"),
        ("$.blocks[0].branches[0]", "a branch must be a non-empty array of blocks"),
        ("$.blocks[0].on_branch_failure", "on_branch_failure must be fail or continue"),
        (
            "$.blocks[1].branches",
            "branches is required: an array of 2 to 256 branches, each a non-empty array of blocks",
        ),
        ("$.blocks[1].semantics", "semantics must be first_to_resolve or first_to_succeed"),
        ("$.blocks[2].condition", "condition is required (a non-empty string: an expression)"),
        ("$.blocks[2].max_iterations", "max_iterations must be an integer from 1 to 100000"),
        ("$.blocks[2].break_on", "break_on must be a non-empty string (an expression)"),
        ("$.blocks[3].concurrency", "concurrency must be an integer from 1 to 64"),
        (
            "$.blocks[3].item_var",
            'item_var "data" is taken (data, config, outputs, instance_id, runtime, error,'
            " iteration are names of their own)",
        ),
        (
            "$.blocks[3].body[0].item_var",
            '"i" is bound already around this block; give this for_each another name',
        ),
        (
            "$.blocks[3].body[0].body[0].params.x",
            'template "{{ item.sku }}" has an unknown root "item" (roots: data, config,'
            " outputs, instance_id, runtime, i, index)",
        ),
        (
            "$.blocks[3].body[0].body[0].params.x",
            'template "{{ nope.x }}" has an unknown root "nope" (roots: data, config,'
            " outputs, instance_id, runtime, i, index)",
        ),
        ("$.blocks[4].routes[0].extra", "unknown field"),
        ("$.blocks[4].routes[0].blocks", "blocks must be a non-empty array of blocks"),
        ("$.blocks[5]", "a try_catch needs catch_block, finally_block or both"),
        (
            "$.blocks[6].compensation",
            "compensation runs only for a step directly inside a saga block",
        ),
        ("$.blocks[7].blocks[0].compensation.when", "unknown field"),
        ("$.blocks[7].blocks[0].compensation.handler", "handler is required (a non-empty string)"),
        (
            "$.blocks[8].sequence_name",
            "sequence_name is required (a sequence name: 1 to 200 characters among"
            " A-Z a-z 0-9 _ . -)",
        ),
        ("$.blocks[8].version", "version must be an integer >= 1"),
        ("$.blocks[8].input", "input must be a JSON object"),
        (
            "$.input_schema",
            "not a valid JSON Schema at type: 'nope' is not valid under any of the given schemas",
        ),
        (
            "$.blocks[3].body[0].collection",
            "expression 'item': unknown name 'item' (paths start with one of: data, config,"
            " runtime, outputs, i; strings need quotes) at position 0",
        ),
        (
            "$.blocks[4].routes[0].condition",
            "expression 'data.x >': unexpected end of expression at position 8",
        ),
        ("$.blocks[9].when", "expression 'data.x ==': unexpected end of expression at position 9"),
        (
            "$.blocks[9].retry.retry_if",
            "expression 'error.code = 1': unexpected '=' (compare with '==') at position 11",
        ),
        (
            "$.blocks[9].output_schema",
            "not a valid JSON Schema at type: 12 is not valid under any of the given schemas",
        ),
    ]
