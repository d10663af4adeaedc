"""Each rule is defined once, in the database, and Python reads it from there:
orch8_py/rules.py is what a freshly migrated database says (regenerate it with
`make rules`), the patterns mean the same in Python as in PostgreSQL, and engine errors
carry their facts as JSON."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orch8_py import rules, templates
from orch8_py.sqlapi import catalog

ROOT = Path(__file__).resolve().parent.parent


def test_rules_py_is_generated_from_the_database(conn):
    stored = (ROOT / "orch8_py" / "rules.py").read_text(encoding="utf-8")
    assert stored == catalog.render(catalog.read(conn)), (
        "orch8_py/rules.py is stale: run `make rules` and commit the result"
    )


def test_the_python_builtins_are_the_implemented_ones():
    # in a fresh interpreter: other tests register handlers of their own in this one
    names = subprocess.run(
        [sys.executable, "-c", "from orch8_py import handlers; print(*handlers.names())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()
    implemented = {n for n, h in rules.BUILTIN_HANDLERS.items() if h["implemented"]}
    assert set(names) == implemented


@pytest.mark.parametrize("domain", sorted(rules.PATTERNS))
def test_patterns_match_the_same_values_in_python_and_postgresql(conn, domain):
    pattern = re.compile(rules.PATTERNS[domain]["pattern"])
    samples = ["a", "A-z_0.9", "a:b", "", "x" * 100, "x" * 101, "x" * 200, "x" * 201]
    samples += ["with space", "trailing\n", "é", "a/b", "tab\t"]
    samples += ["https://x.example/a?b=1", "HTTP://X", "ftp://x", "http://a b", "http://a\x85b"]
    for value in samples:
        in_sql = conn.execute(
            "SELECT %s ~ %s", (value, rules.PATTERNS[domain]["pattern"])
        ).fetchone()[0]
        assert bool(pattern.fullmatch(value)) == in_sql, (domain, value)


TEMPLATE_SAMPLES = [
    "{{ data.a }}",
    "{{data.a.b}}",
    "x {{ outputs.fetch-order.body.0 }} y",
    "{{ config.c | 'EUR' }}",
    "{{ instance_id }}",
    "{{ runtime.attempt }}",
    "{{ nope.x }}",
    "{{ data..x }}",
    "{{ }}",
    "{{ data.x | EUR }}",
    "{{ data.x + 1 }}",
    "a {{ data.y",
    "{{\n data.z \t}}",
    "no template }} here",
]


@pytest.mark.parametrize("text", TEMPLATE_SAMPLES)
def test_the_runner_renders_exactly_what_the_validator_accepts(conn, text):
    accepted = not conn.execute(
        "SELECT count(*) FROM orch8.sequence_template_problems(%s)", (text,)
    ).fetchone()[0]
    scope = {
        "data": {"a": {"b": 1}, "x": 1, "y": 2, "z": 3},
        "config": {},
        "outputs": {"fetch-order": {"body": ["id"]}},
        "instance_id": "i",
        "runtime": {"attempt": 0},
    }
    try:
        templates.render(text, scope)
        rendered = True
    except templates.TemplateError as exc:
        rendered = "not found" in str(exc)  # a missing value, not a grammar problem
    assert rendered == accepted, text


def test_every_engine_error_detail_is_a_json_object():
    """DETAIL carries facts for programs (errors.facts_of), never a sentence to parse."""
    offenders = []
    for path in sorted((ROOT / "sql").rglob("*.sql")):
        text = path.read_text(encoding="utf-8")
        if path.name < "0008":  # migrations applied before the rule; 0008 replaced their one
            continue
        for m in re.finditer(r"DETAIL\s*=\s*(\S+)", text):
            if not m.group(1).startswith(("json_build_object(", "jsonb_build_object(")):
                offenders.append(f"{path.name}: DETAIL = {m.group(1)}")
    assert not offenders, offenders


def test_resolution_rules_are_read_from_the_database(conn):
    rows = conn.execute(
        "SELECT from_state::text, to_state::text FROM orch8.effect_resolutions"
    ).fetchall()
    assert {(f, t) for f, ts in rules.RESOLUTIONS.items() for t in ts} == set(rows)
