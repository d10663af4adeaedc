"""The DBA's manual as psql scripts: every ```sql block of the manual's documents, in
order, run by the real psql against a freshly migrated database.

A ```text block right after a ```sql block is what psql printed for it; the test
compares the two after `normalise` (ids, times and column widths vary from run to run,
nothing else may). A block without one must run without an error. The documents run as
two sessions: the README's example on its own, and SQL_API.md followed by
CONTINUITY_OPERATIONS.md in one psql session, so the ids the first one keeps with
`\\gset` are there for the second, as they are for a reader who copy-pastes in order.

`python -m tests.dba_manual --write` runs the scripts and writes what psql printed into
the ```text blocks (after you add an empty one where output should be shown); read the
diff before committing it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
# Each session: the documents whose blocks it runs, in order.
SESSIONS: dict[str, list[str]] = {
    "readme": ["README.md"],
    "manual": ["docs/SQL_API.md", "docs/CONTINUITY_OPERATIONS.md"],
}
MARK = "@@orch8-dba-manual-block"
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    doc: str
    line: int  # 1-based line of the opening fence
    sql: str
    shown: str | None  # the ```text block after it, if any
    shown_span: tuple[int, int] | None  # 0-based line range of that block's body


def blocks(doc: str) -> list[Block]:
    lines = (ROOT / doc).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        lang, start = m.group(1), i
        end = start + 1
        while not lines[end].startswith("```"):
            end += 1
        if lang == "sql":
            body = "\n".join(lines[start + 1 : end])
            nxt = end + 1
            while nxt < len(lines) and not lines[nxt].strip():
                nxt += 1
            shown = span = None
            if nxt < len(lines) and FENCE.match(lines[nxt]) and lines[nxt].strip() == "```text":
                close = nxt + 1
                while not lines[close].startswith("```"):
                    close += 1
                shown = "\n".join(lines[nxt + 1 : close])
                span = (nxt + 1, close)
            found.append(Block(doc, start + 1, body, shown, span))
        i = end + 1
    return found


def script(session: list[Block]) -> str:
    parts = []
    for n, b in enumerate(session):
        parts.append(f"\\echo {MARK} {n}\n{b.sql}\n")
    parts.append(f"\\echo {MARK} end\n")
    return "".join(parts)


def run_psql(url: str, text: str) -> list[str]:
    """What psql printed for each block (stdout and stderr in order)."""
    proc = subprocess.run(
        ["psql", "-X", "--no-psqlrc", "-d", url],
        input=text,
        capture_output=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PGOPTIONS": "-c client_min_messages=notice", "PAGER": ""},
        timeout=300,
    )
    outputs: list[str] = []
    current: list[str] | None = None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            if current is not None:
                outputs.append(clean("\n".join(current)))
            current = []
        elif current is not None:
            current.append(line)
    return outputs


def clean(out: str) -> str:
    """psql's output as a reader at a prompt sees it: no script line prefixes."""
    out = re.sub(r"^psql:<stdin>:\d+: ", "", out, flags=re.M)
    return out.strip("\n")


UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
TIME = re.compile(
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d(?::\d\d)?)?"
    r"|\b\d\d:\d\d:\d\d\.\d+\b"
)


def normalise(out: str) -> list[str]:
    """What must match: ids and times as placeholders (they differ on every run), runs of
    spaces and table rules as one (column widths follow the values)."""
    lines = []
    for line in clean(out).splitlines():
        line = TIME.sub("<time>", UUID.sub("<uuid>", line))
        line = re.sub(r"\s+", " ", line).strip()
        if re.fullmatch(r"[-+]+", line):
            line = "---"
        lines.append(line)
    return lines


def fresh_database(admin_url: str) -> str:
    """A new, empty database, migrated the way the manual says: `orch8 db migrate`."""
    from tests.pgserver import with_dbname

    name = f"orch8_manual_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_dbname(admin_url, name)
    subprocess.run(
        [sys.executable, "-m", "orch8_py", "db", "migrate"],
        env={**os.environ, "ORCH8_DATABASE_URL": url},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return url


def drop_database(admin_url: str, url: str) -> None:
    from tests.pgserver import drop

    drop(admin_url, psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def run_session(admin_url: str, docs: list[str]) -> tuple[list[Block], list[str], str]:
    """Run one session's blocks in a fresh database; (blocks, outputs, url) with the
    database left for the caller to inspect and drop."""
    session = [b for doc in docs for b in blocks(doc)]
    url = fresh_database(admin_url)
    return session, run_psql(url, script(session)), url


def problems(session: list[Block], outputs: list[str]) -> list[str]:
    """Every block that broke or printed something else than the manual shows."""
    found = []
    if len(outputs) != len(session):
        found.append(f"psql stopped after {len(outputs)} of {len(session)} blocks")
    for b, out in zip(session, outputs, strict=False):
        where = f"{b.doc}:{b.line}"
        if b.shown is None:
            bad = [ln for ln in out.splitlines() if re.match(r"(ERROR|FATAL|WARNING):", ln)]
            if bad:
                found.append(f"{where}: {bad[0]}")
        elif normalise(out) != normalise(b.shown):
            found.append(f"{where}: psql printed\n{out}\n--- the manual shows\n{b.shown}")
    return found


def write(session: list[Block], outputs: list[str]) -> None:
    """Put what psql printed into each ```text block, keeping real values that
    normalise to the same as the old ones (so a run does not churn the documents)."""
    by_doc: dict[str, list[tuple[Block, str]]] = {}
    for b, out in zip(session, outputs, strict=False):
        if b.shown_span is not None and normalise(out) != normalise(b.shown or ""):
            by_doc.setdefault(b.doc, []).append((b, out))
    for doc, changes in by_doc.items():
        lines = (ROOT / doc).read_text().splitlines()
        for b, out in sorted(changes, key=lambda c: -c[0].line):
            assert b.shown_span is not None
            start, end = b.shown_span
            lines[start:end] = [ln.rstrip() for ln in out.splitlines()]
        (ROOT / doc).write_text("\n".join(lines) + "\n")
        print(f"wrote {len(changes)} output block(s) of {doc}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write psql's output into the docs")
    p.add_argument("--session", choices=sorted(SESSIONS), action="append")
    args = p.parse_args()
    admin = os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not admin:
        print("set ORCH8_TEST_DATABASE_URL (a server where CREATE DATABASE may be run)")
        return 2
    failed = 0
    for name in args.session or sorted(SESSIONS):
        session, outputs, url = run_session(admin, SESSIONS[name])
        drop_database(admin, url)
        if args.write:
            write(session, outputs)
        for problem in problems(session, outputs):
            failed += 1
            print(f"[{name}] {problem}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
