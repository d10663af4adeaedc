"""HTTP for the side-effecting builtins (http_request, llm_call, tool_call).

One function, ``send``, does what all three share: URL checks and the SSRF guard, the
``Idempotency-Key`` header, an overall deadline for the exchange, a bounded response read,
and the mapping of failures onto the engine's two kinds of handler error:

* ``NotApplied`` when nothing can have reached the server: the name did not resolve, the
  connection was refused or the network was unreachable, connecting timed out, or the
  deadline passed before the request was written. The request bytes are written only
  after a connection exists, so none were sent.
* ``NotApplied(reached=True)`` when the server answered with a status the response table
  (``classify``) calls ``not_applied``: by default a 4xx other than 408, 409, 425, 429,
  a definitive refusal.
* ``StepError`` for everything else: an ambiguous status (``code`` = the status), a
  timeout (of one operation, or the overall deadline) or a broken connection after
  connecting (the server may have acted).

The engine reuses ``classify`` and ``output_from_response`` to judge and to turn a
recorded response into the output the handler would have returned.

The SSRF guard resolves the host once, refuses any address that is not public unicast,
and then connects to exactly the address it checked (the Host header and TLS server name
stay the original host), so a second DNS answer cannot swap in an internal address.
``ORCH8_ALLOW_PRIVATE_URLS=1`` turns the guard off (local development and tests).
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import ipaddress
import json
import os
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlencode

import httpx

from ..steps import NotApplied, StepContext, StepError

ALLOW_PRIVATE_ENV = "ORCH8_ALLOW_PRIVATE_URLS"
DEFAULT_TIMEOUT_MS = 10_000
MAX_BODY_TEXT = 64 * 1024  # bytes of body kept in the output
MAX_READ = 4 * 1024 * 1024  # bytes read from the wire at most; JSON beyond it is not parsed
RECEIPT_KEYS = ("provider_receipt_id", "receipt_id", "request_id")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")

# errno values that prove no connection was made
_NOT_CONNECTED = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH}

# --- what a status means -----------------------------------------------------------------

APPLIED, NOT_APPLIED, AMBIGUOUS = OUTCOMES = ("applied", "not_applied", "ambiguous")
# A 4xx is the provider refusing the request, so nothing was done, except: 408 (it gave up
# waiting, maybe mid-way), 409 (often "this idempotency key is in use": the first request
# may be running), 425 (too early: a replay), 429 (some gateways count and then act).
# A 3xx is not followed, so whether the target acted is unknown; a 5xx may have acted.
DEFAULT_RESPONSES: Mapping[str, str] = {
    "2xx": APPLIED,
    "3xx": AMBIGUOUS,
    "4xx": NOT_APPLIED,
    "408": AMBIGUOUS,
    "409": AMBIGUOUS,
    "425": AMBIGUOUS,
    "429": AMBIGUOUS,
    "5xx": AMBIGUOUS,
}
_RESPONSE_KEY = re.compile(r"[1-5](?:\d\d|xx)")


def check_responses(raw: Any) -> dict[str, str] | None:
    """A step's ``responses`` param, validated (None when absent). Raises ValueError."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError('responses must be an object such as {"404": "ambiguous"}')
    for key, outcome in raw.items():
        if not isinstance(key, str) or not _RESPONSE_KEY.fullmatch(key):
            raise ValueError(f"responses: key {key!r} is not a status 100-599 or a class 1xx..5xx")
        if outcome not in OUTCOMES:
            raise ValueError(
                f"responses[{key!r}] must be one of {', '.join(OUTCOMES)}, not {outcome!r}"
            )
    return dict(raw)


def classify(status: int, overrides: Mapping[str, str] | None = None) -> str:
    """applied, not_applied or ambiguous: the step's entry for the exact status, else for
    its class, else the default table's (exact, then class); unlisted is ambiguous."""
    for table in (overrides or {}, DEFAULT_RESPONSES):
        for key in (str(status), f"{status // 100}xx"):
            if key in table:
                return table[key]
    return AMBIGUOUS


def private_urls_allowed() -> bool:
    return os.environ.get(ALLOW_PRIVATE_ENV, "").strip() == "1"


def bad_params(message: str) -> StepError:
    return StepError(message, code="invalid_params", retryable=False)


# --- the SSRF guard ---------------------------------------------------------------------


def address_blocked(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why ``ip`` is not a public unicast address, or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            reason = address_blocked(mapped)
            return f"{reason} (embedded in {ip})" if reason else None
    for attr in ("is_unspecified", "is_loopback", "is_link_local", "is_multicast"):
        if getattr(ip, attr):
            return attr.removeprefix("is_").replace("_", "-")
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


@dataclass
class Target:
    """Where a request goes: the URL to dial, and what to tell the server it is."""

    url: httpx.URL
    original: httpx.URL
    host_header: str | None = None
    extensions: dict[str, Any] = field(default_factory=dict)  # httpx request extensions


def check_url(url: Any) -> Target:
    """Validate ``url`` and apply the SSRF guard (resolving the host, connecting nowhere).

    Raises StepError(code "invalid_url" or "ssrf_blocked", not retryable), or NotApplied
    when the name does not resolve.
    """
    if not isinstance(url, str) or not url:
        raise StepError("url must be a non-empty string", code="invalid_url", retryable=False)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise StepError(
            f"invalid url {url!r}: {exc}", code="invalid_url", retryable=False
        ) from None
    if parsed.scheme not in ("http", "https"):
        raise StepError(
            f"url scheme {parsed.scheme or '(none)'!r} is not allowed; use http or https",
            code="invalid_url",
            retryable=False,
        )
    host = parsed.host
    if not host:
        raise StepError(f"url {url!r} has no host", code="invalid_url", retryable=False)
    if parsed.userinfo:
        raise StepError(
            "credentials in the url are not allowed; pass an Authorization header",
            code="invalid_url",
            retryable=False,
        )
    if private_urls_allowed():
        return Target(parsed, parsed)

    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise NotApplied(
                f"cannot resolve host {host!r}: {exc}",
                {"url": url, "stage": "connect", "reason": "dns"},
                code="dns",
            ) from None
        addresses = []
        for info in infos:
            # an AF_INET / AF_INET6 sockaddr starts with the address text
            sockaddr_host = cast(str, info[4][0])
            ip = ipaddress.ip_address(sockaddr_host.split("%", 1)[0])
            if ip not in addresses:
                addresses.append(ip)
        if not addresses:
            raise NotApplied(
                f"host {host!r} has no address", {"url": url, "stage": "connect", "reason": "dns"}
            )
    for ip in addresses:
        reason = address_blocked(ip)
        if reason:
            raise StepError(
                f"refusing {url!r}: {host} resolves to {ip}, a {reason} address "
                f"(set {ALLOW_PRIVATE_ENV}=1 to allow private destinations)",
                code="ssrf_blocked",
                retryable=False,
            )
    if literal is not None:
        return Target(parsed, parsed)
    # pin the checked address: dial it, keep the name for Host and TLS
    pinned = parsed.copy_with(host=str(addresses[0]))
    host_header = host if parsed.port is None else f"{host}:{parsed.port}"
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return Target(pinned, parsed, host_header, extensions)


# --- sending ----------------------------------------------------------------------------


def timeout_seconds(params: dict[str, Any], ctx: StepContext) -> float:
    raw = params.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise bad_params("timeout_ms must be a positive number")
    seconds = raw / 1000.0
    if ctx.timeout and ctx.timeout > 0:
        seconds = min(seconds, float(ctx.timeout))
    return seconds


def idempotency_key(params: dict[str, Any], ctx: StepContext) -> str | None:
    # the receipt records ctx.idempotency_key (computed by the engine from the same
    # param): send exactly that, so the ledger and the provider agree
    if ctx.idempotency_key is not None:
        return ctx.idempotency_key
    key = params.get("idempotency_key")
    if key is not None:
        if not isinstance(key, str | int) or isinstance(key, bool) or str(key) == "":
            raise bad_params("idempotency_key must be a non-empty string")
        return str(key)
    return str(ctx.effect_id) if ctx.effect_id is not None else None


def clean_headers(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_params("headers must be an object of name -> string")
    out: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name or any(c in name for c in "\r\n:"):
            raise bad_params(f"invalid header name {name!r}")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise bad_params(f"header {name!r} must be a string")
        text = str(value)
        if "\r" in text or "\n" in text:
            raise bad_params(f"header {name!r} contains a line break")
        out[name] = text
    return out


def form_body(raw: Any) -> str:
    """``form`` (name -> scalar, or a list of scalars for a repeated field), urlencoded."""
    if not isinstance(raw, dict):
        raise bad_params("form must be an object of name -> string, number or boolean")
    pairs: list[tuple[str, str]] = []
    for name, value in raw.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool):
                pairs.append((name, "true" if item else "false"))  # as JSON spells them
            elif isinstance(item, str | int | float):
                pairs.append((name, str(item)))
            else:
                raise bad_params(
                    f"form field {name!r} must be a string, number, boolean or a list of them"
                )
    return urlencode(pairs)


def _root_oserror(exc: BaseException) -> BaseException | None:
    """The innermost OSError (or gaierror) in ``exc``'s cause/context chain."""
    seen: set[int] = set()
    found = None
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError):
            found = cur
        cur = cur.__cause__ or cur.__context__
    return found


def _not_connected(exc: BaseException) -> str | None:
    """Why ``exc`` proves no connection was made, or None."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout"
    if not isinstance(exc, httpx.ConnectError):
        return None
    root = _root_oserror(exc)
    if isinstance(root, socket.gaierror):
        return "dns"
    if isinstance(root, ConnectionRefusedError) or getattr(root, "errno", None) in _NOT_CONNECTED:
        return "refused" if getattr(root, "errno", None) == errno.ECONNREFUSED else "unreachable"
    return None


def _encoding(resp: httpx.Response) -> str:
    name = resp.charset_encoding or "utf-8"
    try:
        return codecs.lookup(name).name
    except LookupError:
        return "utf-8"


def json_receipts(value: Any) -> dict[str, str]:
    """The provider receipt ids at the top level of a JSON body (string values)."""
    if not isinstance(value, dict):
        return {}
    return {k: value[k] for k in RECEIPT_KEYS if isinstance(value.get(k), str)}


def receipt_path_parts(path: Any) -> list[str] | None:
    """``receipt_path`` ("json.id", "headers.request-id") split on dots; raises ValueError."""
    if path is None:
        return None
    if not isinstance(path, str) or not path or "" in path.split("."):
        raise ValueError('receipt_path must be a dotted path such as "json.id"')
    parts = path.split(".")
    if parts[0] == "headers" and len(parts) > 1:
        parts[1] = parts[1].lower()  # the output's header names are lowercase
    return parts


def _resolve(value: Any, parts: list[str]) -> str | None:
    for part in parts:
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return str(value)


def response_output(
    status: int,
    headers: Mapping[str, str],
    *,
    body: str,
    json: Any = None,
    has_json: bool = False,
    truncated: bool = False,
    receipt_path: str | None = None,
) -> dict[str, Any]:
    """The http_request output for an answer: status, headers, json (when ``has_json``),
    body, truncated (only when true), the top-level receipt ids of the JSON, and
    provider_receipt_id from ``receipt_path`` when it resolves (it wins over the JSON's)."""
    parts = receipt_path_parts(receipt_path)
    out: dict[str, Any] = {"status": status, "headers": dict(headers)}
    if has_json:
        out["json"] = json
    out["body"] = body
    if truncated:
        out["truncated"] = True
    out.update(json_receipts(json))
    # a path that does not resolve adds nothing: a bookkeeping path must not fail a 2xx
    receipt = _resolve(out, parts) if parts else None
    if receipt is not None:
        out["provider_receipt_id"] = receipt
    return out


_EVIDENCE_KEYS = {"status", "headers", "json", "body", "truncated", *RECEIPT_KEYS}


def output_from_response(response: Any, receipt_path: str | None) -> dict[str, Any]:
    """What http_request returns for a recorded answer ``{"status", "headers"?, "json"?,
    "body"?, "truncated"?}`` (a handler output is accepted too: its receipt ids are
    derived again). Without ``body`` the body is the compact JSON text. Raises ValueError
    with a one-line reason when the shape is wrong."""
    if not isinstance(response, dict):
        raise ValueError("the response must be an object with a status")
    unknown = sorted(str(k) for k in response if k not in _EVIDENCE_KEYS)
    if unknown:
        raise ValueError(f"the response has unknown keys: {', '.join(unknown)}")
    status = response.get("status")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"the response status must be an integer 100-599, not {status!r}")
    raw_headers = response.get("headers") or {}
    if not isinstance(raw_headers, dict):
        raise ValueError("the response headers must be an object of name -> string")
    headers: dict[str, str] = {}
    for name, value in raw_headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"the response header {name!r} must be a string")
        low = name.lower()
        headers[low] = f"{headers[low]}, {value}" if low in headers else value
    has_json = "json" in response
    body = response.get("body")
    if body is None:
        body = json.dumps(response.get("json"), separators=(",", ":")) if has_json else ""
    if not isinstance(body, str):
        raise ValueError("the response body must be a string")
    truncated = response.get("truncated", False)
    if not isinstance(truncated, bool):
        raise ValueError("the response truncated must be true or false")
    if len(body) > MAX_BODY_TEXT:  # the handler keeps no more (a kept body is never longer)
        body, truncated = body[:MAX_BODY_TEXT], True
    return response_output(
        status,
        headers,
        body=body,
        json=response.get("json"),
        has_json=has_json,
        truncated=truncated,
        receipt_path=receipt_path,
    )


class _Deadline:
    """Abandons an exchange when its overall deadline passes, whatever it is blocked in.

    httpx's timeouts bound each socket operation, not the exchange: a server that trickles
    a byte per read (TLS handshake, status line, headers or body) never trips them. Reading
    the body in chunks and checking the clock between them would not do either: one read
    can still block for the whole per-read timeout, and the headers are read inside
    httpcore. So a timer shuts the connection's socket down at the deadline: shutdown,
    unlike close, wakes a recv or send blocked in the handler thread, which then fails at
    once, and the peer sees the connection end. The socket comes from httpcore's documented
    ``trace`` request extension when it connects, and is duplicated: the timer acts on its
    own descriptor, so it never touches one httpcore has closed and the OS handed out again,
    and the duplicate is dropped before httpcore closes the connection.
    """

    def __init__(self, seconds: float):
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._stopped = False
        self.fired = False  # the deadline passed during the exchange
        self.sending = False  # the first request byte may have been written
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.name = "orch8-http-deadline"
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace callback (called on the handler thread)."""
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            with self._lock:
                if self._stopped or not isinstance(sock, socket.socket):
                    return
                if self._sock is not None:
                    self._sock.close()
                self._sock = sock.dup()
                if self.fired:  # connected after the deadline: end it before anything is sent
                    self._shutdown()
        elif event.endswith(".send_request_headers.started"):
            self.sending = True
        elif event.endswith(".response_closed.started"):
            self.stop()  # httpcore is about to close (or pool) the connection

    def _fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):  # already gone
                self._sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._timer.cancel()
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _timed_out(method: str, shown_url: str, why: str) -> StepError:
    return StepError(
        f"{method} {shown_url}: timed out after connecting ({why}); "
        "the request may have been received",
        code="timeout",
    )


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool
    json: Any = None
    has_json: bool = False

    def receipts(self) -> dict[str, str]:
        return json_receipts(self.json)

    def output(self, receipt_path: str | None = None) -> dict[str, Any]:
        return response_output(
            self.status,
            self.headers,
            body=self.body,
            json=self.json,
            has_json=self.has_json,
            truncated=self.truncated,
            receipt_path=receipt_path,
        )

    def evidence(self) -> dict[str, Any]:
        """The answer as output_from_response takes it back (json, else the body)."""
        out: dict[str, Any] = {"status": self.status, "headers": self.headers}
        if self.has_json and not self.truncated:  # bounded: evidence is stored with the receipt
            out["json"] = self.json
        else:
            out["body"] = self.body
            if self.truncated:
                out["truncated"] = True
        return out


def send(
    ctx: StepContext,
    method: str,
    url: Any,
    *,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    content: str | bytes | None = None,
    content_type: str | None = None,
    timeout: float,
    key: str | None,
    responses: Mapping[str, str] | None = None,
) -> Response:
    """Send one request (no redirects followed, no environment proxies) and read the reply.

    ``content_type`` goes with ``content`` unless ``headers`` name one. The status is
    judged by ``classify(status, responses)``: applied returns the Response, not_applied
    raises NotApplied(reached=True) with the answer as evidence, ambiguous a StepError.

    The whole exchange (resolving, connecting, sending, reading the status, headers and
    body) ends by ``timeout`` seconds from now or ``ctx.deadline``, whichever is first;
    each socket operation is bounded by what is left. An exchange cut off by that deadline
    ends as a timeout: NotApplied before the first request byte is written, else an
    ambiguous StepError(code="timeout").
    """
    deadline = time.monotonic() + timeout
    if ctx.deadline is not None:
        deadline = min(deadline, ctx.deadline)
    target = check_url(url)
    shown_url = str(target.original)
    hdrs = {
        k: v for k, v in (headers or {}).items() if k.lower() not in ("idempotency-key", "host")
    }
    if key is not None:
        hdrs["Idempotency-Key"] = key
    if target.host_header:
        hdrs["Host"] = target.host_header
    kwargs: dict[str, Any] = {"headers": hdrs}
    if json_body is not None:
        kwargs["content"] = json.dumps(json_body, separators=(",", ":"), allow_nan=False)
        content_type = "application/json"
    elif content is not None:
        kwargs["content"] = content
    else:
        content_type = None
    if content_type and not any(k.lower() == "content-type" for k in hdrs):
        hdrs["Content-Type"] = content_type
    budget = deadline - time.monotonic()
    if budget <= 0:
        raise NotApplied(
            f"{method} {shown_url}: the step's time ran out before the request was sent",
            {"url": shown_url, "stage": "connect", "reason": "deadline"},
            code="connect",
        )
    guard = _Deadline(budget)
    kwargs["extensions"] = {**target.extensions, "trace": guard.trace}
    try:
        guard.start()
        with (
            httpx.Client(timeout=httpx.Timeout(budget), trust_env=False) as client,
            client.stream(method, target.url, **kwargs) as resp,
        ):
            raw = bytearray()
            truncated = False
            for chunk in resp.iter_bytes():
                raw += chunk
                if len(raw) > MAX_READ:
                    truncated = True
                    del raw[MAX_READ:]
                    break
            encoding = _encoding(resp)
            status = resp.status_code
            resp_headers: dict[str, str] = {}
            for name, value in resp.headers.multi_items():
                name = name.lower()
                resp_headers[name] = (
                    f"{resp_headers[name]}, {value}" if name in resp_headers else value
                )
    except httpx.HTTPError as exc:
        why = _not_connected(exc)
        if why is None and guard.fired and not guard.sending:
            why = "deadline"  # connected too late: the guard ended it before any byte went
        if why is not None:
            raise NotApplied(
                f"{method} {shown_url}: {why}: {exc}",
                {"url": shown_url, "stage": "connect", "reason": why},
                code="connect",
            ) from None
        if guard.fired:  # whatever the cut-off connection raised
            raise _timed_out(method, shown_url, f"overall deadline of {budget:g}s") from None
        if isinstance(exc, httpx.TimeoutException):
            raise _timed_out(method, shown_url, type(exc).__name__) from None
        raise StepError(
            f"{method} {shown_url}: {type(exc).__name__}: {exc or 'connection broken'}; "
            "the request may have been received",
            code="connection_error",
        ) from None
    except (TypeError, ValueError) as exc:  # unencodable body and the like
        raise bad_params(f"{method} {shown_url}: cannot send: {exc}") from None
    finally:
        guard.stop()
    if guard.fired:
        # a body read until the connection closes looks complete when the guard closed it
        raise _timed_out(method, shown_url, f"overall deadline of {budget:g}s")

    text = bytes(raw[:MAX_BODY_TEXT]).decode(encoding, errors="replace")
    out = Response(status, resp_headers, text, truncated or len(raw) > MAX_BODY_TEXT)
    ctype = resp_headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not truncated and (ctype == "application/json" or ctype.endswith("+json")) and raw:
        try:
            out.json = json.loads(bytes(raw).decode(encoding, errors="strict"))
            out.has_json = True
        except ValueError:  # includes UnicodeDecodeError
            pass
    outcome = classify(status, responses)
    if outcome == APPLIED:
        return out
    detail = text[:300].strip()
    said = f"{method} {shown_url} returned HTTP {status}" + (f": {detail}" if detail else "")
    if outcome == NOT_APPLIED:
        # a definitive refusal: the engine abandons the receipt with this answer as proof
        raise NotApplied(
            f"{said} (refused: not applied)",
            {"url": shown_url, "stage": "response", "response": out.evidence()},
            code=str(status),
            retryable=True,
            reached=True,
        )
    raise StepError(said, code=str(status), retryable=True)  # ambiguous: it may have acted
