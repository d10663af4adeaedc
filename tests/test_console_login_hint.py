"""The console names only `orch8` commands that exist: each one it shows in <code> parses
with the real CLI parser (the login page once said `orch8 keys create`; the command is
`orch8 api-key create`)."""

from __future__ import annotations

import argparse
import html
import re
import shlex
from pathlib import Path

import pytest

from orch8_py import cli
from web import create_app

TEMPLATES = Path(__file__).resolve().parent.parent / "web" / "templates"
COMMAND = re.compile(r"<code>\s*(orch8\s[^<]*?)\s*</code>", re.S)


def commands_in(text: str) -> list[str]:
    return [html.unescape(" ".join(m.split())) for m in COMMAND.findall(text)]


def parses(command: str) -> argparse.Namespace:
    """The command parsed by `orch8`'s own parser; a failure names the command."""
    words = shlex.split(command)
    assert words[0] == "orch8"
    try:
        args = cli.parser(None).parse_args(words[1:])
    except SystemExit:
        pytest.fail(f"the console names `{command}`, which `orch8` does not accept")
    assert hasattr(args, "func") or hasattr(args, "db_func"), command
    return args


def test_the_login_page_names_a_command_the_cli_has(admin_url):
    app = create_app(admin_url, secret_key="login-hint-test")
    try:
        page = app.test_client().get("/console/login")
        assert page.status_code == 200
        commands = commands_in(page.get_data(as_text=True))
    finally:
        app.extensions["orch8.pool"].close()
    assert commands, "the login page no longer says how to get a key"
    for command in commands:
        parses(command)
    assert any(c.startswith("orch8 api-key create") for c in commands), commands


def test_every_command_in_the_console_templates_parses():
    """The same for the commands written into any console template (those built from
    template variables are left to the page tests)."""
    found = [
        (path.name, command)
        for path in sorted(TEMPLATES.rglob("*.html"))
        for command in commands_in(path.read_text(encoding="utf-8"))
        if "{{" not in command and "{%" not in command
    ]
    assert found
    for _name, command in found:
        parses(command)


def test_the_check_catches_the_old_hint():
    with pytest.raises(pytest.fail.Exception, match="orch8 keys create"):
        parses("orch8 keys create")
