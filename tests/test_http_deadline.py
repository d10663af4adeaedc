"""The overall deadline of the HTTP builtins, against real trickling servers on loopback.

httpx's timeouts bound each read, so a server sending one byte at a time never trips them.
``send`` ends the whole exchange at min(timeout_ms, the step's remaining time): these
tests hold it to that within a second, check the outcome is the ambiguous ``timeout`` a
timeout after connecting gives, and check the server sees the client let go.
"""

from __future__ import annotations

import itertools
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from orch8_py.handlers import NotApplied, StepError
from tests.handler_helpers import make_ctx, run
from tests.http_provider import Provider, provider_fixture  # noqa: F401  (fixture: provider)

PACE = 0.3  # seconds between two trickled bytes
SLACK = 1.0  # how long past its deadline a request may take to be abandoned


@pytest.fixture(autouse=True)
def _loopback_allowed(monkeypatch):
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")


class Trickler:
    """One connection on 127.0.0.1: read the request head, write ``head`` at once, then
    ``trickle`` one byte every PACE seconds until the client goes (or the test ends)."""

    def __init__(self, head: bytes, trickle: Iterator[int]):
        self.head, self.trickle = head, trickle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/slow"
        self.request_seen = threading.Event()
        self.client_gone = threading.Event()  # the server saw EOF or a reset from the client
        self.trickled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Trickler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # closed by __exit__ without a client
            return
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    self.client_gone.set()
                    return
                data += chunk
            self.request_seen.set()
            conn.sendall(self.head)
            for byte in self.trickle:
                if self._stop.is_set():
                    return
                # waiting for readability paces the trickle and wakes on the client's FIN
                readable, _, _ = select.select([conn], [], [], PACE)
                try:
                    if readable and conn.recv(4096) == b"":
                        break
                    conn.sendall(bytes([byte]))
                except OSError:  # reset by the client
                    break
                self.trickled += 1
            self.client_gone.set()


def forever(text: bytes) -> Iterator[int]:
    return itertools.chain.from_iterable(itertools.repeat(text))


def assert_cut_off(server: Trickler, call, budget: float) -> StepError:
    """Run ``call``; it must fail as an ambiguous timeout between ``budget`` and
    ``budget + SLACK`` seconds, after the request arrived, and the server must see the
    connection end."""
    t0 = time.monotonic()
    with pytest.raises(StepError) as info:
        call()
    elapsed = time.monotonic() - t0
    assert budget - 0.05 <= elapsed < budget + SLACK, elapsed
    assert not isinstance(info.value, NotApplied)  # after connecting: the server may have acted
    assert (info.value.code, info.value.retryable) == ("timeout", True)
    assert "overall deadline" in str(info.value)
    assert server.request_seen.is_set()
    assert server.trickled >= 2  # it was still sending: no per-read timeout ended it
    assert server.client_gone.wait(2), "the client kept the connection open"
    return info.value


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n",
        # no length: the body ends when the connection does, so the guard closing it must
        # not pass for the end of a complete answer
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
    ],
    ids=["content-length", "until-close"],
)
def test_a_trickled_body_is_cut_off_at_timeout_ms(head):
    with Trickler(head, forever(b"x")) as server:
        assert_cut_off(
            server,
            lambda: run("http_request", {"url": server.url, "method": "POST", "timeout_ms": 1500}),
            1.5,
        )


def test_trickled_status_and_headers_are_cut_off_at_the_step_timeout():
    trickle = itertools.chain(b"HTTP/1.1 200 OK\r\n", forever(b"X-Pad: y\r\n"))
    with Trickler(b"", trickle) as server:
        # no timeout_ms: the default 10 s is capped by the step's 1.5 s
        assert_cut_off(
            server, lambda: run("http_request", {"url": server.url}, make_ctx(timeout=1.5)), 1.5
        )


def test_the_deadline_is_the_step_s_remaining_time_not_its_whole_timeout():
    """A handler that started late (queued for a thread) has less than ctx.timeout left;
    the deadline set when the context was made is what counts."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    with Trickler(head, forever(b"x")) as server:
        ctx = make_ctx(timeout=30.0, deadline=time.monotonic() + 1.0)
        assert_cut_off(
            server,
            lambda: run("tool_call", {"url": server.url, "tool": "t", "timeout_ms": 20_000}, ctx),
            1.0,
        )


def test_no_time_left_is_not_applied_and_nothing_connects():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/charge"
        ctx = make_ctx(deadline=time.monotonic())
        with pytest.raises(NotApplied) as info:
            run("http_request", {"url": url, "method": "POST", "json": {}}, ctx)
        ev = info.value.evidence
        assert (ev["stage"], ev["reason"]) == ("connect", "deadline")
        assert info.value.retryable is True
        with pytest.raises(BlockingIOError):  # no connection is waiting to be accepted
            listener.accept()
    finally:
        listener.close()


def test_an_answer_in_time_is_unchanged_and_releases_its_timer(provider):
    provider.reply("/ok", status=200, json={"request_id": "r1"})
    out = run("http_request", {"url": provider.url + "/ok", "timeout_ms": 1500})
    assert (out["status"], out["json"], out["request_id"]) == (200, {"request_id": "r1"}, "r1")
    for timer in [t for t in threading.enumerate() if t.name == "orch8-http-deadline"]:
        timer.join(timeout=1)
        assert not timer.is_alive()


def test_sleep_ends_at_the_step_s_deadline():
    ctx = make_ctx(timeout=30.0, deadline=time.monotonic() + 0.2)
    t0 = time.monotonic()
    with pytest.raises(StepError) as info:
        run("sleep", {"duration_ms": 20_000}, ctx)
    assert time.monotonic() - t0 < 0.2 + SLACK
    assert info.value.code == "timeout" and "ms of a 20000 ms sleep" in str(info.value)
