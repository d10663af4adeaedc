"""How values read on a page: the template filters, and engine refusals as a sentence."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from orch8_py import errors

from .blueprint import bp

MAX_PRETTY_CHARS = 100_000


@bp.app_template_filter("o8_ts")
def format_ts(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return str(value.strftime("%Y-%m-%d %H:%M:%S UTC"))
    return str(value)


@bp.app_template_filter("o8_age")
def format_age(value: Any) -> str:
    if value is None:
        return "-"
    seconds = int(value.total_seconds()) if isinstance(value, dt.timedelta) else int(value)
    seconds = max(seconds, 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@bp.app_template_filter("o8_json")
def format_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    if len(text) > MAX_PRETTY_CHARS:
        text = text[:MAX_PRETTY_CHARS] + f"\n… ({len(text) - MAX_PRETTY_CHARS} more characters)"
    return text


def engine_message(exc: errors.Orch8Error) -> str:
    """What a person reads for an engine refusal: the message, and the current state or the
    allowed moves when the engine named them."""
    message = str(exc)
    if isinstance(exc, errors.StaleEffect) and "reload" not in message:
        message = f"reload before resolving: {message}"
    facts = exc.facts
    if facts.get("current_state") and str(facts["current_state"]) not in message:
        message = f"{message} (current state: {facts['current_state']})"
    if facts.get("allowed_states") is not None:
        allowed = ", ".join(facts["allowed_states"]) or "none"
        message = f"{message} (it can be resolved to: {allowed})"
    if facts.get("read_by"):
        readers = ", ".join(str(b) for b in facts["read_by"])
        message = (
            f"{message} (read by: {readers}): write the output the step would have returned"
            " in the retry form's output field"
        )
    return message
