"""The builtin step handlers. Importing this module registers them (see handlers/__init__).

Pure (never get a receipt): noop, log, sleep, fail, assert, transform, set_state,
get_state, delete_state, merge_state. Side-effecting (a receipt, and
``ctx.idempotency_key`` sent as the provider's idempotency key): http_request, llm_call,
tool_call. The names are those of
orch8.builtin_handlers marked implemented (rules.BUILTIN_HANDLERS; a test holds them
equal). docs/HANDLERS.md describes every parameter, output and error.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from .. import expression, rules
from ..errors import InvalidInput
from ..scope import roots as scope_roots
from ..steps import EffectReceipt, InstanceState, StepContext, StepError
from . import http as _http
from .http import bad_params
from .registry import handler

log = logging.getLogger("orch8.handlers")

MAX_STATE_KEY_BYTES = rules.LIMITS["state_key_bytes"]
MAX_STATE_VALUE_BYTES = rules.LIMITS["state_value_bytes"]
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_MISSING = object()


def _params(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise bad_params(f"params must be an object, not {type(params).__name__}")
    return params


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_params(f"{name} must be a number")
    return value


def _config(ctx: StepContext) -> dict[str, Any]:
    config = (ctx.context or {}).get("config") or {}
    return config if isinstance(config, dict) else {}


def expression_scope(ctx: StepContext) -> dict[str, Any]:
    """The roots an expression sees: data, config, runtime (with attempt, ids), outputs,
    and the variables bound around the step (item, index, iteration, error)."""
    context = ctx.context or {}
    runtime = dict(context.get("runtime") or {})
    runtime.update(
        attempt=ctx.attempt,
        instance_id=str(ctx.instance_id),
        block_id=ctx.block_id,
        tenant_id=ctx.tenant_id,
    )
    return {
        "data": context.get("data") or {},
        "config": context.get("config") or {},
        "runtime": runtime,
        "outputs": ctx.outputs or {},
        **ctx.vars,
    }


def _kv(value: Any) -> str:
    """One value of a key=value log line: bare when safe, else JSON-quoted."""
    text = str(value)
    return text if re.fullmatch(r"[\w.:/@+-]{1,200}", text) else json.dumps(text)


# --- pure builtins ----------------------------------------------------------------------


@handler("noop")
def noop(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    return {}


@handler("log")
def log_(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    message = params.get("message", "")
    if not isinstance(message, str):
        message = json.dumps(message, separators=(",", ":"), default=str)
    level_name = str(params.get("level", "info")).lower()
    if level_name not in LOG_LEVELS:
        raise bad_params(f"level must be one of {', '.join(sorted(LOG_LEVELS))}")
    log.log(
        LOG_LEVELS[level_name],
        "event=step.log tenant=%s instance=%s block=%s attempt=%s level=%s message=%s",
        _kv(ctx.tenant_id),
        _kv(ctx.instance_id),
        _kv(ctx.block_id),
        ctx.attempt,
        level_name,
        json.dumps(message),
    )
    return {"message": message}


@handler("sleep")
def sleep(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """Kept for definitions stored before the sleep block (the validator refuses this
    handler now): it holds a handler thread, so it never sleeps past the step's time."""
    params = _params(params)
    duration_ms = _number(params, "duration_ms", 100)
    if duration_ms < 0:
        raise bad_params("duration_ms must be >= 0")
    if ctx.timeout and duration_ms > ctx.timeout * 1000.0:
        raise StepError(
            f"sleep of {round(duration_ms)} ms is longer than the step's timeout "
            f"({round(ctx.timeout * 1000)} ms); a sleep block waits without a runner",
            code="sleep_too_long",
            retryable=False,
        )
    remaining = ctx.remaining()  # not ctx.timeout: time spent queued for a thread counts
    if remaining is not None and duration_ms > remaining * 1000.0:
        time.sleep(remaining)
        raise StepError(
            f"the step's time ran out after {round(remaining * 1000)} ms of a "
            f"{round(duration_ms)} ms sleep (it waited for a thread first)",
            code="timeout",
        )
    time.sleep(duration_ms / 1000.0)
    return {"slept_ms": round(duration_ms)}


@handler("fail")
def fail(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    message = str(params.get("message") or "step failed (fail handler)")
    code = params.get("code")
    retryable = params.get("retryable", True)
    if not isinstance(retryable, bool):
        raise bad_params("retryable must be true or false")
    raise StepError(message, code=None if code is None else str(code), retryable=retryable)


@handler("assert")
def assert_(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    if "condition" not in params:
        raise bad_params("assert needs a condition (an expression string or a boolean)")
    condition = params["condition"]
    if isinstance(condition, str):
        passed = expression.truthy(
            expression.evaluate(condition, expression_scope(ctx), scope_roots(ctx.vars))
        )
    else:
        passed = expression.truthy(condition)
    if not passed:
        message = params.get("message") or f"assertion failed: {condition}"
        raise StepError(str(message), code="assertion_failed", retryable=False)
    return {"passed": True}


@handler("transform")
def transform(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    has_expr, has_value = "expression" in params, "value" in params
    if has_expr == has_value:
        raise bad_params("transform needs exactly one of expression (a string) or value")
    if has_value:
        return {"result": params["value"]}
    text = params["expression"]
    if not isinstance(text, str):
        raise bad_params("expression must be a string (use value for a literal)")
    return {"result": expression.evaluate(text, expression_scope(ctx), scope_roots(ctx.vars))}


# --- instance state ---------------------------------------------------------------------


def _state(ctx: StepContext) -> InstanceState:
    if ctx.state is None:
        raise StepError("no state store", code="no_state_store", retryable=False)
    return ctx.state


def _state_key(params: dict[str, Any]) -> str:
    key = params.get("key")
    if not isinstance(key, str) or not 1 <= len(key.encode()) <= MAX_STATE_KEY_BYTES:
        raise bad_params(f"key must be a string of 1 to {MAX_STATE_KEY_BYTES} bytes")
    return key


@handler("set_state")
def set_state(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    key = _state_key(params)
    if "value" not in params:
        raise bad_params("set_state needs a value (null is allowed)")
    value = params["value"]
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise bad_params(f"value is not JSON: {exc}") from None
    if size > MAX_STATE_VALUE_BYTES:
        raise bad_params(f"value is {size} bytes, over the limit of {MAX_STATE_VALUE_BYTES}")
    try:
        _state(ctx).set(key, value)
    except InvalidInput as exc:
        raise StepError(str(exc), code="invalid_params", retryable=False) from None
    return {"key": key, "value": value}


@handler("get_state")
def get_state(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    key = _state_key(params)
    value = _state(ctx).get(key, _MISSING)
    if value is _MISSING:
        return {"key": key, "value": params.get("default"), "found": False}
    return {"key": key, "value": value, "found": True}


@handler("delete_state")
def delete_state(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    key = _state_key(_params(params))
    return {"key": key, "deleted": _state(ctx).delete(key)}


@handler("merge_state")
def merge_state(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    key = _state_key(params)
    patch = params.get("value")
    if not isinstance(patch, dict):
        raise bad_params("merge_state needs a value that is a JSON object")
    try:
        merged = _state(ctx).merge(key, patch)
    except InvalidInput as exc:
        raise StepError(str(exc), code="invalid_params", retryable=False) from None
    return {"key": key, "value": merged}


# --- side-effecting builtins ------------------------------------------------------------


def _request_body(params: dict[str, Any]) -> tuple[str | None, str | None]:
    """(content, its default Content-Type) from form or body; json goes to send as is."""
    given = [name for name in ("json", "form", "body") if name in params]
    if len(given) > 1:
        raise bad_params(f"give at most one of json, form or body, not {' and '.join(given)}")
    if "form" in params:
        return _http.form_body(params["form"]), "application/x-www-form-urlencoded"
    body = params.get("body")
    if body is not None and not isinstance(body, str):
        raise bad_params("body must be a string (use json or form for structured data)")
    return body, "text/plain; charset=utf-8"


@handler("http_request")
def http_request(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    method = params.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in _http.METHODS:
        raise bad_params(f"method must be one of {', '.join(_http.METHODS)}")
    method = method.upper()
    content, content_type = _request_body(params)
    receipt_path = params.get("receipt_path")
    try:  # checked before sending: after the answer it would be too late to refuse
        _http.receipt_path_parts(receipt_path)
        responses = _http.check_responses(params.get("responses"))
    except ValueError as exc:
        raise bad_params(str(exc)) from None
    resp = _http.send(
        ctx,
        method,
        params.get("url"),
        headers=_http.clean_headers(params.get("headers")),
        json_body=params.get("json"),
        content=content,
        content_type=content_type,
        timeout=_http.timeout_seconds(params, ctx),
        key=_http.idempotency_key(params, ctx),
        responses=responses,
    )
    return resp.output(receipt_path)


@http_request.output_from_evidence
def http_request_output(
    evidence: dict[str, Any], effect: EffectReceipt, params: dict[str, Any]
) -> dict[str, Any] | None:
    """The output http_request returns for the provider's answer recorded as
    ``evidence["response"]`` (by a verifier's lookup, or an operator), with the step's
    receipt_path; None when the evidence holds no response."""
    response = evidence.get("response")
    if response is None:
        return None
    receipt_path = params.get("receipt_path")
    return _http.output_from_response(
        response, receipt_path if isinstance(receipt_path, str) else None
    )


@handler("llm_call")
def llm_call(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    config = _config(ctx)
    if "api_key" in params:
        raise bad_params(
            "api_key is not accepted in params (they are stored and hashed); put the key in "
            "the instance config and name it with api_key_config (default llm_api_key)"
        )
    base_url = params.get("base_url") or config.get("llm_base_url")
    if not isinstance(base_url, str) or not base_url:
        raise bad_params("llm_call needs base_url (or config.llm_base_url)")
    model = params.get("model") or config.get("llm_model")
    if not isinstance(model, str) or not model:
        raise bad_params("llm_call needs a model")
    messages = params.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise bad_params("messages must be a non-empty list of {role, content} objects")
    key_name = params.get("api_key_config", "llm_api_key")
    if not isinstance(key_name, str):
        raise bad_params("api_key_config must name a config key")
    api_key = config.get(key_name)
    if api_key is None and "api_key_config" in params:
        raise bad_params(f"config has no {key_name!r} (named by api_key_config)")
    if api_key is not None and not isinstance(api_key, str):
        raise bad_params(f"config.{key_name} must be a string")

    request: dict[str, Any] = {"model": model, "messages": messages}
    for name in ("temperature", "max_tokens"):
        if params.get(name) is not None:
            request[name] = _number(params, name, 0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = _http.send(
        ctx,
        "POST",
        base_url.rstrip("/") + "/chat/completions",
        headers=headers,
        json_body=request,
        timeout=_http.timeout_seconds(params, ctx),
        key=_http.idempotency_key(params, ctx),
    )
    data: Any = resp.json if resp.has_json else None  # any JSON: the try below checks it
    try:
        choice = data["choices"][0]
        content = choice["message"].get("content")
    except (TypeError, KeyError, IndexError, AttributeError):
        raise StepError(
            f"llm_call: HTTP {resp.status} without choices[0].message in the body: "
            f"{resp.body[:200]!r}",
            code="bad_response",
        ) from None
    out: dict[str, Any] = {
        "content": content,
        "usage": data.get("usage"),
        "model": data.get("model") or model,
        "finish_reason": choice.get("finish_reason") if isinstance(choice, dict) else None,
    }
    if isinstance(data.get("id"), str):
        out["request_id"] = data["id"]
    return out


@handler("tool_call")
def tool_call(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    params = _params(params)
    tool = params.get("tool")
    if not isinstance(tool, str) or not tool:
        raise bad_params("tool_call needs tool (a name)")
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise bad_params("arguments must be an object")
    resp = _http.send(
        ctx,
        "POST",
        params.get("url"),
        headers=_http.clean_headers(params.get("headers")),
        json_body={"tool": tool, "arguments": arguments},
        timeout=_http.timeout_seconds(params, ctx),
        key=_http.idempotency_key(params, ctx),
    )
    out: dict[str, Any] = {"status": resp.status}
    if resp.has_json:
        out["json"] = resp.json
    else:
        out["body"] = resp.body
    out.update(resp.receipts())
    return out
