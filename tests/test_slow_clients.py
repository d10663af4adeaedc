"""Clients without a key cannot stall the operator service (orch8_py/serving.py): real
sockets against a real waitress server on 127.0.0.1, as `orch8 up` and `orch8 serve`
build it.

With waitress's defaults, 150 connections that send half a request header made
/health/live time out for 120 s, and a 100 MB body with no key was read in full before
the 401."""

from __future__ import annotations

import dataclasses
import errno
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from waitress.adjustments import Adjustments

from orch8_py import serving
from orch8_py.errors import ConfigError
from web import MAX_BODY_BYTES, create_app

HALF_OPEN = b"GET /health/live HTTP/1.1\r\nHost: x\r\n"  # and never the blank line
LIVE = b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

Serve = Callable[[serving.Limits], int]


@pytest.fixture
def serve(admin_url) -> Iterator[Serve]:
    """Start the operator service with the given limits on a free port; return the port.
    /health/live needs no database, so the session's server URL is enough."""
    started = []

    def start(limits: serving.Limits) -> int:
        app = create_app(admin_url, secret_key="slow-clients-test")
        srv = serving.create_server(app, "127.0.0.1", 0, limits)
        thread = threading.Thread(target=srv.run, name="waitress", daemon=True)
        thread.start()
        started.append((srv, thread, app))
        return srv.effective_port

    yield start
    for srv, thread, app in started:
        srv.close()
        srv.task_dispatcher.shutdown(timeout=2)
        thread.join(timeout=3)
        app.extensions["orch8.pool"].close()


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    """Sockets a test opens, closed at its end."""
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def connect(port: int, socks: list[socket.socket], first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    socks.append(s)
    if first:
        s.sendall(first)
    return s


def read_all(s: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (a reset ends it too)."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return data


def closed_by_server(s: socket.socket, within: float) -> bool:
    """Whether the server closes its end within `within` seconds (waits on the event)."""
    readable, _, _ = select.select([s], [], [], within)
    if not readable:
        return False
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def get_live(port: int, socks: list[socket.socket], timeout: float) -> bytes:
    s = connect(port, socks)
    s.settimeout(timeout)
    s.sendall(LIVE)
    return read_all(s, timeout)


# --- the limits themselves ---------------------------------------------------------------


def test_defaults_are_safe_and_valid_waitress_settings():
    limits = serving.Limits.from_env({})
    assert limits == serving.Limits()
    adj = limits.adjustments()
    assert adj["threads"] == 8
    assert adj["connection_limit"] == 100
    assert adj["channel_timeout"] == 10  # waitress: 120
    assert adj["cleanup_interval"] == 1  # waitress: 30 (timeouts were checked that seldom)
    assert adj["max_request_header_size"] == 64 * 1024  # waitress: 256 KiB
    # the application's body cap, not waitress's 1 GiB (waitress refuses >= its value)
    assert adj["max_request_body_size"] == MAX_BODY_BYTES + 1
    waitress_adj = Adjustments(host="127.0.0.1", port=0, **adj)
    assert waitress_adj.channel_timeout == 10
    assert waitress_adj.asyncore_use_poll is True


def test_limits_are_read_from_the_environment():
    env = {
        "ORCH8_HTTP_THREADS": "16",
        "ORCH8_HTTP_CONNECTION_LIMIT": "500",
        "ORCH8_HTTP_CHANNEL_TIMEOUT": " 30 ",
        "ORCH8_HTTP_MAX_HEADER_BYTES": "",  # empty: the default
    }
    assert serving.Limits.from_env(env) == serving.Limits(16, 500, 30, 64 * 1024)
    # --threads wins over the environment
    assert serving.Limits.from_env(env, threads=2).threads == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ORCH8_HTTP_CONNECTION_LIMIT": "lots"}, "ORCH8_HTTP_CONNECTION_LIMIT='lots' is not"),
        ({"ORCH8_HTTP_CHANNEL_TIMEOUT": "1.5"}, "ORCH8_HTTP_CHANNEL_TIMEOUT='1.5' is not"),
        ({"ORCH8_HTTP_THREADS": "0"}, "ORCH8_HTTP_THREADS='0' must be at least 1"),
        ({"ORCH8_HTTP_MAX_HEADER_BYTES": "-1"}, "ORCH8_HTTP_MAX_HEADER_BYTES='-1' must be"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_variable(env, message):
    with pytest.raises(ConfigError) as raised:
        serving.Limits.from_env(env)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_bad_threads_flag_is_refused():
    with pytest.raises(ConfigError, match=r"^--threads 0 must be at least 1$"):
        serving.Limits.from_env({}, threads=0)


def test_a_port_in_use_is_one_line():
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="is already in use") as raised:
            serving.create_server(lambda env, start: [], "127.0.0.1", port, serving.Limits())
        assert str(raised.value) == (
            f"port {port} on 127.0.0.1 is already in use: stop the other process "
            "or pick another port with --port (or ORCH8_PORT)"
        )
    finally:
        taken.close()


# --- real sockets --------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_half_open_connections_beyond_the_limit_do_not_stall_health_live(serve, clients):
    """150 connections that never finish their header, with the default limits (100
    connections, 10 s timeout): a new client is answered at once, and the connections
    that have waited longest are the ones let go."""
    limits = serving.Limits()
    port = serve(limits)
    half_open = [connect(port, clients, HALF_OPEN) for _ in range(150)]

    started = time.monotonic()
    response = get_live(port, clients, timeout=2)
    elapsed = time.monotonic() - started

    assert response.startswith(b"HTTP/1.1 200 "), response[:80]
    assert b'"status":"ok"' in response.replace(b" ", b"")
    assert elapsed < 2
    assert closed_by_server(half_open[0], within=2), "the oldest half-open one stays open"
    assert not closed_by_server(half_open[-1], within=0), "the newest one was closed"
    # and it keeps answering while the flood is still connected
    for _ in range(3):
        assert get_live(port, clients, timeout=2).startswith(b"HTTP/1.1 200 ")


@pytest.mark.timeout(30)
def test_an_idle_half_open_connection_is_closed_after_the_channel_timeout(serve, clients):
    port = serve(dataclasses.replace(serving.Limits(), channel_timeout=1))
    s = connect(port, clients, HALF_OPEN)
    started = time.monotonic()
    assert closed_by_server(s, within=5)
    # 1 s timeout, checked every second
    assert 0.9 <= time.monotonic() - started <= 3.5


@pytest.mark.timeout(30)
def test_a_client_trickling_its_header_is_closed_after_the_channel_timeout(serve, clients):
    """One header byte per 0.2 s is activity to waitress, so its idle timeout alone never
    closes this client; the time allowed for a whole request does."""
    timeout = 1
    port = serve(dataclasses.replace(serving.Limits(), channel_timeout=timeout))
    header = HALF_OPEN + b"X-Slow: " + b"a" * 1000
    s = connect(port, clients)
    started = time.monotonic()
    sent = 0
    closed = False
    while sent < len(header) and time.monotonic() - started < 6:
        try:
            s.sendall(header[sent : sent + 1])
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        sent += 1
        # the pacing is the wait for the server's close: it ends the moment it comes
        if closed_by_server(s, within=0.2):
            closed = True
            break
    elapsed = time.monotonic() - started
    assert closed, f"still connected after {elapsed:.1f} s and {sent} bytes"
    assert sent >= 4, "it should have been trickling, not idle"
    assert timeout - 0.1 <= elapsed <= timeout + 2.5


@pytest.mark.timeout(30)
def test_a_100_mb_body_without_a_key_is_refused_from_its_headers(serve, clients):
    port = serve(serving.Limits())
    headers = (
        b"POST /api/v1/instances HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
    )
    # the headers alone bring the answer: nothing of the body is waited for
    s = connect(port, clients, headers)
    started = time.monotonic()
    response = read_all(s, timeout=2)
    assert response.startswith(b"HTTP/1.1 413 "), response[:80]
    assert time.monotonic() - started < 2
    assert b"exceeds max_body" in response  # waitress answered, before the application

    # a client that sends the body blindly is cut off after what the socket buffers hold
    total = 100_000_000
    s = connect(port, clients, headers)
    sent = 0
    failure: list[OSError] = []

    def send_body() -> None:
        nonlocal sent
        chunk = b"x" * 65536
        try:
            while sent < total:
                sent += s.send(chunk[: total - sent])
        except OSError as exc:
            failure.append(exc)

    started = time.monotonic()
    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    response = read_all(s, timeout=5)
    sender.join(timeout=5)
    assert not sender.is_alive()
    assert failure and failure[0].errno in (errno.EPIPE, errno.ECONNRESET), failure
    assert sent < 32 * 1024 * 1024, f"{sent} bytes of the body went through"
    assert time.monotonic() - started < 5
    # the 413 arrives unless the reset overtook it
    assert response == b"" or response.startswith(b"HTTP/1.1 413 ")


@pytest.mark.timeout(30)
def test_waitress_and_flask_agree_on_the_body_limit(serve, clients):
    """A body of exactly MAX_BODY_BYTES reaches the application (here: 401, no key); one
    byte more is refused by waitress from the Content-Length."""
    port = serve(serving.Limits())

    def post(length: int, body: bytes) -> bytes:
        s = connect(port, clients)
        s.sendall(
            b"POST /api/v1/instances HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
        )
        if body:
            s.sendall(body)
        return read_all(s, timeout=5)

    assert post(MAX_BODY_BYTES, b"x" * MAX_BODY_BYTES).startswith(b"HTTP/1.1 401 ")
    assert post(MAX_BODY_BYTES + 1, b"").startswith(b"HTTP/1.1 413 ")


@pytest.mark.timeout(30)
def test_an_oversized_header_is_refused(serve, clients):
    port = serve(serving.Limits())
    s = connect(port, clients, b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
    s.sendall(b"a" * (64 * 1024) + b"\r\n\r\n")
    response = read_all(s, timeout=5)
    assert response.split(b" ", 2)[1] == b"431", response[:80]  # waitress says HTTP/1.0


def test_closing_while_a_request_runs_finishes_it_quietly(caplog):
    """`orch8 up` closes the server on SIGTERM; a request still being answered then must
    not hit the closed trigger (waitress logged EBADF with a traceback on stderr)."""
    entered = threading.Event()

    def app(environ, start_response):
        entered.set()
        time.sleep(0.3)  # still answering when close() is called
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"done"]

    srv = serving.create_server(app, "127.0.0.1", 0, serving.Limits.from_env({}))
    thread = threading.Thread(target=srv.run, name="waitress", daemon=True)
    thread.start()
    s = socket.create_connection(("127.0.0.1", srv.effective_port), timeout=5)
    try:
        s.sendall(LIVE)
        assert entered.wait(5)
        with caplog.at_level(logging.ERROR, logger="waitress"):
            srv.close()
            srv.task_dispatcher.shutdown(timeout=2)
            thread.join(timeout=3)
    finally:
        s.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
