"""What the operator commands share: exit codes, one-line errors, ``--json`` output,
tables for people, and parsing of UUIDs, JSON objects, durations and limits.

Exit codes (docs/CLI.md): 0 ok, 1 error, 2 bad input or usage, 3 blocked by an
unresolved effect, 4 stale (something changed meanwhile: reload and look again).
"""

from __future__ import annotations

import argparse
import functools
import getpass
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg

from ..errors import (
    ConfigError,
    EffectBlocked,
    InvalidInput,
    InvalidTransition,
    Orch8Error,
    StaleEffect,
)

# what add_subparsers() returns (generic only to the type checker), and what a command is
if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction
Command = Callable[[argparse.Namespace, str], int]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_BLOCKED = 3
EXIT_STALE = 4

DEFAULT_TENANT = "default"


MAX_LIMIT = 10_000


def fail(message: str, code: int) -> int:
    """Print one ``orch8: error:`` line on stderr and return the exit code."""
    line = " ".join(str(message).split())
    print(f"orch8: error: {line}", file=sys.stderr, flush=True)
    return code


def _with_detail(exc: Orch8Error) -> str:
    """An illegal move with the current state and the allowed moves the engine named."""
    extra = []
    if exc.facts.get("current_state"):
        extra.append(f"current state: {exc.facts['current_state']}")
    if exc.facts.get("allowed_states") is not None:
        allowed = ", ".join(exc.facts["allowed_states"]) or "none"
        extra.append(f"it can be resolved to: {allowed}")
    elif exc.hint:
        extra.append(f"allowed: {exc.hint}")
    return f"{exc} ({'; '.join(extra)})" if extra else str(exc)


def command(func: Command) -> Command:
    """Map the engine's refusals to exit codes: bad input 2, blocked 3, stale 4, an illegal
    state move 1 (with the current state). Other Orch8Errors (NotFound...) go to cli.main,
    which prints them in one line with exit code 1."""

    @functools.wraps(func)
    def run(args: argparse.Namespace, url: str) -> int:
        try:
            return func(args, url)
        except InvalidInput as exc:
            return fail(str(exc), EXIT_USAGE)
        except EffectBlocked as exc:
            return fail(str(exc), EXIT_BLOCKED)
        except StaleEffect as exc:
            return fail(str(exc), EXIT_STALE)
        except InvalidTransition as exc:
            return fail(_with_detail(exc), EXIT_ERROR)
        except psycopg.Error as exc:
            text = str(exc).strip().splitlines()
            state = f" [SQLSTATE {exc.sqlstate}]" if exc.sqlstate else ""
            return fail(f"database error: {text[0] if text else type(exc).__name__}{state}", 1)

    return run


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, indent=2)


def emit(value: Any, as_json: bool, text: str) -> None:
    """``--json``: the value as JSON; else the human-readable text."""
    print(to_json(value) if as_json else text, flush=True)


def json_value(raw: str, flag: str) -> Any:
    """Parse a flag's JSON (any value); ``@FILE`` reads it from a file (``@-``: stdin).
    InvalidInput in one line when it is not JSON or the file cannot be read."""
    text = raw
    if raw.startswith("@"):
        path = raw[1:]
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
        except OSError as exc:
            raise InvalidInput(f"{flag} {raw}: cannot read {path!r} ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise InvalidInput(f"{flag} {raw}: {path!r} is not UTF-8 text") from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{flag} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"{flag} is not valid JSON ({exc})") from None


def json_object(raw: str | None, flag: str) -> dict[str, Any] | None:
    """Parse a flag's JSON object (None stays None; ``@FILE`` as in json_value);
    InvalidInput in one line otherwise."""
    if raw is None:
        return None
    value = json_value(raw, flag)
    if not isinstance(value, dict):
        raise InvalidInput(f'{flag} must be a JSON object, e.g. \'{{"checked": "..."}}\'')
    return value


def parse_uuid(raw: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except (ValueError, AttributeError):
        raise InvalidInput(f"{raw!r} is not {what} (a UUID)") from None


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    return limit


_DURATION_PART = re.compile(r"(\d+)([smhd])")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(raw: str, flag: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d`` (or a sum such as ``1h30m``)."""
    text = raw.strip().lower()
    if not text or _DURATION_PART.sub("", text):
        raise InvalidInput(
            f"{flag} {raw!r} is not a duration: use a number and a unit s, m, h or d "
            "(30s, 10m, 2h, 1d, 1h30m)"
        )
    seconds = sum(int(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidInput(f"{flag} {raw!r} is too long") from None


def default_actor() -> str:
    """``cli:$USER`` (or the login name), recorded as who did it."""
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not name:
        try:
            name = getpass.getuser()
        except Exception:
            name = "unknown"
    return f"cli:{name}"


def import_flag(sp: argparse.ArgumentParser) -> None:
    """--import MODULE (repeatable), defaulting to ORCH8_HANDLER_MODULES."""
    modules = [m for m in os.environ.get("ORCH8_HANDLER_MODULES", "").split(",") if m.strip()]
    sp.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=modules,
        metavar="MODULE",
        help="import a module that registers handlers (repeatable; ORCH8_HANDLER_MODULES)",
    )


def import_handler_modules(modules: list[str]) -> None:
    """Import the modules that register custom handlers (--import, ORCH8_HANDLER_MODULES)."""
    import importlib

    if os.getcwd() not in sys.path:  # as `python -m` would: modules beside you import
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                f"cannot import handler module {name!r} ({type(exc).__name__}: {exc}); "
                "check the name and that it is on PYTHONPATH"
            ) from None


def actor_of(args: argparse.Namespace) -> str:
    actor: str | None = getattr(args, "actor", None)
    if actor is not None and not actor.strip():
        raise InvalidInput("--actor must not be empty")
    return actor or default_actor()


def tenant_flag(args: argparse.Namespace) -> str:
    """`` --tenant T`` for the commands a message suggests, empty for the default tenant."""
    return "" if args.tenant == DEFAULT_TENANT else f" --tenant {args.tenant}"


def ts(value: datetime | None) -> str:
    """A timestamp for people: UTC, to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_age(value: timedelta | None) -> str:
    if value is None:
        return "-"
    s = max(0, int(value.total_seconds()))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def cell(value: Any, width: int | None = None) -> str:
    if value is None or value == "":
        text = "-"
    elif isinstance(value, datetime):
        text = ts(value)
    elif isinstance(value, timedelta):
        text = fmt_age(value)
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=_json_default)
    else:
        text = " ".join(str(value).split())
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under upper-case headers."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line([h.upper() for h in headers])] + [line(r) for r in cells])


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


def common_flags(sp: argparse.ArgumentParser) -> None:
    """``--tenant`` and ``--json``, on every operator command."""
    sp.add_argument("--tenant", default=DEFAULT_TENANT, help=f"tenant (default: {DEFAULT_TENANT})")
    sp.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def actor_flag(sp: argparse.ArgumentParser) -> None:
    """``--actor``, on commands that change something and record who did it."""
    sp.add_argument(
        "--actor", default=None, help="who is doing this, recorded (default: cli:$USER)"
    )
