"""The operator service's HTTP server: waitress, with limits a client without a key cannot
use up.

With waitress's defaults, 100 connections that send half a request header and then
nothing hold every connection slot (waitress stops accepting at ``connection_limit``)
for up to 150 s (``channel_timeout`` 120 s, checked every ``cleanup_interval`` 30 s):
``/health/live`` stops answering. A client that sends one header byte now and then is
never timed out at all (each byte counts as activity), and a body up to 1 GiB is read
before the application can refuse it. Here:

- ``connection_limit`` (ORCH8_HTTP_CONNECTION_LIMIT, 100) bounds the open connections,
  and a full server makes room instead of going deaf: a new connection closes the one
  that has waited longest without a request being served (idle, or still sending its
  request). Only when every connection has a request being served does it stop accepting.
- ``channel_timeout`` (ORCH8_HTTP_CHANNEL_TIMEOUT, 10 s) closes a connection idle that
  long, and one whose request has not fully arrived that long after its first byte
  (a slow sender), checked every second.
- the body limit is the application's own (``web.MAX_BODY_BYTES``): a larger
  Content-Length is answered 413 from the headers, before the body is read.
- ``max_request_header_size`` (ORCH8_HTTP_MAX_HEADER_BYTES, 64 KiB).
- workers' long-polls (POST /api/v1/workers/tasks/poll) hold a thread while they wait: at
  most ORCH8_HTTP_LONG_POLLS wait at once (default: the threads less two), the rest
  answer at once.

Behind a reverse proxy (docs/SECURITY.md), the proxy does the same per client address.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, MultiSocketServer, TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from web import MAX_BODY_BYTES

from .errors import ConfigError, cannot_listen

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger("orch8")

DEFAULT_THREADS = 8
# Each connection holds one to three file descriptors; 100 stays far below the usual
# 1024 open files next to the database pool, the runner and the log, and is ten times
# what the console and a few API clients keep open. A full server closes idle or stalled
# connections to admit new ones, so the limit is not what a flood of connections uses up.
DEFAULT_CONNECTION_LIMIT = 100
# API clients and the console send a whole request in milliseconds; a connection quiet
# for 10 s, or still sending one request (headers and body, at most web.MAX_BODY_BYTES)
# after 10 s, is closed. Keep-alive clients reconnect.
DEFAULT_CHANNEL_TIMEOUT = 10
DEFAULT_MAX_HEADER_BYTES = 64 * 1024  # waitress's default is 256 KiB
CLEANUP_INTERVAL = 1  # seconds between looks for timed-out connections (waitress: 30)


@dataclass(frozen=True)
class Limits:
    threads: int = DEFAULT_THREADS
    connection_limit: int = DEFAULT_CONNECTION_LIMIT
    channel_timeout: int = DEFAULT_CHANNEL_TIMEOUT
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    long_polls: int | None = None  # workers' polls waiting at once; None: threads - 2

    @property
    def waiting_polls(self) -> int:
        """How many long-polls may wait at once (web/api/long_poll.py): two threads are
        always left for the API, the console and /health."""
        if self.long_polls is not None:
            return self.long_polls
        return max(self.threads - 2, 0)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, threads: int | None = None
    ) -> Limits:
        """The limits from ORCH8_HTTP_* (unset or empty: the default). ``threads``, when
        given (`orch8 serve --threads`), wins over ORCH8_HTTP_THREADS."""
        env = os.environ if environ is None else environ
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads {threads} must be at least 1")
        return cls(
            threads=threads or _positive(env, "ORCH8_HTTP_THREADS", DEFAULT_THREADS),
            connection_limit=_positive(
                env, "ORCH8_HTTP_CONNECTION_LIMIT", DEFAULT_CONNECTION_LIMIT
            ),
            channel_timeout=_positive(env, "ORCH8_HTTP_CHANNEL_TIMEOUT", DEFAULT_CHANNEL_TIMEOUT),
            max_header_bytes=_positive(
                env, "ORCH8_HTTP_MAX_HEADER_BYTES", DEFAULT_MAX_HEADER_BYTES
            ),
            long_polls=_positive(env, "ORCH8_HTTP_LONG_POLLS", 0) or None,
        )

    def adjustments(self) -> dict[str, Any]:
        """waitress's settings (waitress.adjustments.Adjustments) for these limits."""
        return {
            "threads": self.threads,
            "connection_limit": self.connection_limit,
            "channel_timeout": self.channel_timeout,
            "cleanup_interval": CLEANUP_INTERVAL,
            "max_request_header_size": self.max_header_bytes,
            # waitress refuses a Content-Length >= its limit, Flask one > MAX_CONTENT_LENGTH:
            # + 1 lets a body of exactly MAX_BODY_BYTES through to the application, as
            # Flask would. Anything larger is answered 413 before its first byte is read.
            "max_request_body_size": MAX_BODY_BYTES + 1,
            # poll(2) has no FD_SETSIZE ceiling (select(2) fails past descriptor 1023)
            "asyncore_use_poll": True,
        }


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be at least 1")
    return value


def create_server(
    app: WSGIApplication, host: str, port: int, limits: Limits | None = None
) -> MultiSocketServer | BaseWSGIServer:
    """A waitress server for ``app`` on host:port (port 0: any free one), not yet running:
    call ``run()`` on a thread, ``close()`` to stop. Bad limits and a port in use raise
    ConfigError with one line to show."""
    limits = limits if limits is not None else Limits.from_env()
    try:
        return _create(app, host, port, limits.adjustments())
    except OSError as exc:
        raise cannot_listen(
            exc,
            host,
            port,
            server="the operator service",
            remedy="stop the other process or pick another port with --port (or ORCH8_PORT)",
        ) from None


def _create(
    app: WSGIApplication, host: str, port: int, adjustments: dict[str, Any]
) -> MultiSocketServer | BaseWSGIServer:
    """waitress.server.create_server for TCP, with GuardedServer as the listener (one per
    address the host resolves to, sharing one socket map and one thread pool)."""
    adj = Adjustments(host=host, port=port, **adjustments)
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    socket_map: dict[int, Any] = {}
    listeners: list[GuardedServer] = []
    try:
        # waitress resolves host and port into (family, type, proto, address) tuples
        for sockinfo in cast("list[tuple[int, int, int | None, Any]]", adj.listen):
            listeners.append(
                GuardedServer(app, socket_map, dispatcher=dispatcher, adj=adj, sockinfo=sockinfo)
            )
    except BaseException:
        for listener in listeners:  # a second address failed: free the first
            listener.close()
        dispatcher.shutdown()
        raise
    if len(listeners) == 1:
        return listeners[0]
    return MultiSocketServer(
        socket_map,
        adj,
        [(s.effective_host, s.effective_port) for s in listeners],
        dispatcher,
        listeners[-1].log_info,
    )


class GuardedChannel(HTTPChannel):
    """A waitress channel that remembers when the request it is receiving began."""

    request_started = 0.0

    def received(self, data: bytes) -> bool:
        before = self.request
        now = time.time()
        done = super().received(data)
        if self.request is not None and self.request is not before:
            self.request_started = now  # its first byte came in this read
        return done

    def waiting_since(self) -> float:
        """Since when this connection has been waiting on its client: the first byte of
        the request it is still receiving, else its last activity."""
        if self.request is not None:
            return self.request_started
        return self.last_activity

    def evictable(self) -> bool:
        """No request being served, nothing left to send, not closing already: closing it
        loses nothing the server has accepted."""
        return not (self.requests or self.total_outbufs_len or self.will_close)


class GuardedServer(TcpWSGIServer):
    """waitress's TCP listener with the timeouts and the connection limit of this module:
    a slow sender times out like an idle connection, and a full server closes its
    longest-waiting connection for a new one rather than stop accepting."""

    channel_class = GuardedChannel
    full = False  # at the limit (logged once per spell)
    # set by waitress, missing from its type stubs
    _map: dict[int, Any]
    effective_host: str
    effective_port: int

    def close(self) -> None:
        """Stop after the requests being answered: a handler thread that finishes its
        response wakes the main loop through the trigger, and once the trigger is closed
        that write fails (EBADF, logged by waitress with a traceback). The threads finish
        their task first (at most 5 s), as MultiSocketServer.close does for several
        listeners; a second call finds no thread left."""
        self.task_dispatcher.shutdown()
        super().close()

    def _open_channels(self) -> list[GuardedChannel]:
        return [c for c in self._map.values() if isinstance(c, GuardedChannel) and not c.will_close]

    def maintenance(self, now: float) -> None:
        cutoff = now - self.adj.channel_timeout
        channels = cast("dict[int, GuardedChannel]", self.active_channels)
        for channel in list(channels.values()):
            if not channel.requests and channel.waiting_since() < cutoff:
                channel.will_close = True

    def readable(self) -> bool:
        """Called by the main loop before each wait: time out channels every
        cleanup_interval, and listen unless full with nothing to let go."""
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = int(now) + self.adj.cleanup_interval
            self.maintenance(now)
        if not self.accepting:
            return False
        limit = self.adj.connection_limit
        in_map = len(self._map)  # the listeners and the trigger too: a little more
        if in_map < limit:
            if self.full and in_map <= limit - max(2, limit // 10):  # no flapping
                self._note_full(False)
            return True
        channels = self._open_channels()
        if len(channels) < limit:
            return True
        can_evict = any(c.evictable() for c in channels)
        self._note_full(True, can_evict)
        return can_evict

    def handle_accept(self) -> None:
        super().handle_accept()
        channels = self._open_channels()
        if len(channels) > self.adj.connection_limit:
            idle = [c for c in channels if c.evictable()]
            if idle:
                min(idle, key=GuardedChannel.waiting_since).will_close = True

    def _note_full(self, full: bool, can_evict: bool = True) -> None:
        if full == self.full:
            return
        self.full = full
        if full:
            log.warning(
                "event=http_connection_limit limit=%d action=%s",
                self.adj.connection_limit,
                "close_longest_waiting" if can_evict else "stop_accepting",
            )
        else:
            log.info("event=http_connection_limit_cleared")
