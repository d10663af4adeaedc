"""`make rules`: regenerate orch8_py/rules.py from a freshly migrated database."""

from __future__ import annotations

import sys

import psycopg

from orch8_py.sqlapi import catalog
from tests import pgserver

RULES = pgserver.ROOT / "orch8_py" / "rules.py"


def generate() -> str:
    with pgserver.server() as admin_url:
        template = pgserver.create_template(admin_url)
        name = pgserver.clone(admin_url, template, prefix="orch8_rules")
        try:
            with psycopg.connect(pgserver.with_dbname(admin_url, name)) as conn:
                return catalog.render(catalog.read(conn))
        finally:
            pgserver.drop(admin_url, name)


def main() -> int:
    text = generate()
    if RULES.exists() and RULES.read_text(encoding="utf-8") == text:
        print(f"{RULES.relative_to(pgserver.ROOT)} is current")
        return 0
    RULES.write_text(text, encoding="utf-8")
    print(f"wrote {RULES.relative_to(pgserver.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
