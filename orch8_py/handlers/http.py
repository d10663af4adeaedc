"""HTTP for the side-effecting builtins (http_request, llm_call, tool_call).

One function, ``send``, does what all three share: URL checks and the SSRF guard, the
``Idempotency-Key`` header, a bounded timeout, a bounded response read, and the mapping
of failures onto the engine's two kinds of handler error:

* ``NotApplied`` when nothing can have reached the server: the name did not resolve, the
  connection was refused or the network was unreachable, or connecting timed out. The
  request bytes are written only after a connection exists, so none were sent.
* ``StepError`` for everything else: an HTTP error status (``code`` = the status), a
  timeout or a broken connection after connecting (ambiguous: the server may have acted).

The SSRF guard resolves the host once, refuses any address that is not public unicast,
and then connects to exactly the address it checked (the Host header and TLS server name
stay the original host), so a second DNS answer cannot swap in an internal address.
``ORCH8_ALLOW_PRIVATE_URLS=1`` turns the guard off (local development and tests).
"""

from __future__ import annotations

import codecs
import errno
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, cast

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


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool
    json: Any = None
    has_json: bool = False

    def receipts(self) -> dict[str, str]:
        """The provider receipt ids at the top level of the JSON body (string values)."""
        if not isinstance(self.json, dict):
            return {}
        return {k: self.json[k] for k in RECEIPT_KEYS if isinstance(self.json.get(k), str)}


def send(
    ctx: StepContext,
    method: str,
    url: Any,
    *,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    content: str | bytes | None = None,
    timeout: float,
    key: str | None,
    raise_for_status: bool = True,
) -> Response:
    """Send one request (no redirects followed, no environment proxies) and read the reply."""
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
        if not any(k.lower() == "content-type" for k in hdrs):
            hdrs["Content-Type"] = "application/json"
    elif content is not None:
        kwargs["content"] = content
    if target.extensions:
        kwargs["extensions"] = target.extensions
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client,
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
        if why is not None:
            raise NotApplied(
                f"{method} {shown_url}: {why}: {exc}",
                {"url": shown_url, "stage": "connect", "reason": why},
                code="connect",
            ) from None
        if isinstance(exc, httpx.TimeoutException):
            raise StepError(
                f"{method} {shown_url}: timed out after connecting ({type(exc).__name__}); "
                "the request may have been received",
                code="timeout",
            ) from None
        raise StepError(
            f"{method} {shown_url}: {type(exc).__name__}: {exc or 'connection broken'}; "
            "the request may have been received",
            code="connection_error",
        ) from None
    except (TypeError, ValueError) as exc:  # unencodable body and the like
        raise bad_params(f"{method} {shown_url}: cannot send: {exc}") from None

    text = bytes(raw[:MAX_BODY_TEXT]).decode(encoding, errors="replace")
    out = Response(status, resp_headers, text, truncated or len(raw) > MAX_BODY_TEXT)
    ctype = resp_headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if not truncated and (ctype == "application/json" or ctype.endswith("+json")) and raw:
        try:
            out.json = json.loads(bytes(raw).decode(encoding, errors="strict"))
            out.has_json = True
        except ValueError:  # includes UnicodeDecodeError
            pass
    if raise_for_status and (status >= 400):
        detail = text[:300].strip()
        raise StepError(
            f"{method} {shown_url} returned HTTP {status}" + (f": {detail}" if detail else ""),
            code=str(status),
            retryable=True,
        )
    return out
