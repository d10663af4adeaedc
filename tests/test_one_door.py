"""One door into the database: no module outside orch8_py/sqlapi holds SQL text or runs a
statement (the migrator, which applies migration files, and the tests aside)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("orch8_py", "web", "bench", "examples")
ALLOWED = (
    "orch8_py/sqlapi/",  # the door
    "orch8_py/migrate.py",  # applies sql/migrations and keeps their ledger
)
SQL = re.compile(
    r"\bSELECT\s|\bINSERT\s+INTO\b|\bUPDATE\s+\S+\s+SET\b|\bDELETE\s+FROM\b|\bFROM\s+orch8\."
    r"|\b(?:CREATE|DROP|ALTER)\s+(?:TABLE|DATABASE|INDEX|FUNCTION|VIEW|ROLE)\b|\bLISTEN\s+\w"
    r"|\bset_config\(|\borch8\.[a-z_]+\("
)


def sources() -> list[Path]:
    files = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(ALLOWED):
                files.append(path)
    return files


def strings(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def test_the_scan_sees_the_code():
    files = {p.relative_to(ROOT).as_posix() for p in sources()}
    assert {"orch8_py/runner.py", "web/console/instances.py", "orch8_py/cli/effects.py"} <= files
    assert not any(f.startswith("orch8_py/sqlapi/") for f in files)
    # and the pattern knows SQL when it sees it
    assert SQL.search("SELECT * FROM orch8.unresolved_effects")
    assert SQL.search("SELECT orch8.finish_step(%s)")
    assert SQL.search("LISTEN orch8_work")


def test_no_sql_text_outside_the_door():
    offenders = []
    for path in sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doc_lines = {
            n.body[0].value.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for line, text in strings(tree):
            if line not in doc_lines and SQL.search(text):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text[:70]!r}")
    assert not offenders, "SQL outside orch8_py/sqlapi:\n" + "\n".join(offenders)


def test_no_statement_run_outside_the_door():
    offenders = []
    for path in sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "copy")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, "statements run outside orch8_py/sqlapi: " + ", ".join(offenders)
