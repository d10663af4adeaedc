"""The long-poll of POST /workers/tasks/poll: one listener thread per web process holds a
connection with LISTEN orch8_tasks (NOTIFY'd with {tenant, handler} for every task
queued: dispatch_worker_task, a redelivery) and wakes the polls waiting for that tenant
and handler. A waiting poll holds a server thread but no database connection; it claims
again when woken, and at least every ``recheck`` seconds (every second while the listener
is down, so a lost listener costs latency, never tasks).

At most ``ORCH8_LONG_POLLS`` polls wait at once per process (``orch8 serve`` sets it to
two fewer than its HTTP threads): a poll beyond that answers at once, so waiting workers
never take every thread from the API and the console.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time

import psycopg
from flask import Flask

from orch8_py import sqlapi

log = logging.getLogger("orch8.web.long_poll")

DEFAULT_SLOTS = 16  # an app not served by `orch8 serve` (tests, another WSGI server)
RECENT = 1024  # notifications remembered; a poll that missed more simply claims again
DOWN_RECHECK = 1.0  # seconds between claims while the listener is down
IDLE_STOP = 60.0  # the listener stops after this long without a poll (the next restarts it)


class TaskWakeup:
    def __init__(self, url: str, slots: int):
        self.url = url
        self.slots = slots
        self.waiting = 0  # polls waiting now
        self.seq = 0  # notifications seen so far
        self.recent: collections.deque[tuple[int, str, str]] = collections.deque(maxlen=RECENT)
        self.listening = False
        self.used = time.monotonic()  # the last poll
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def ensure_listening(self) -> None:
        """Start the listener thread unless it runs (it stops when idle, or when its
        application was dropped: nothing then keeps a connection open)."""
        with self.cond:
            self.used = time.monotonic()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._listen, name="task-wakeup", daemon=True)
                self.thread.start()

    def _idle(self) -> bool:
        with self.cond:
            return self.waiting == 0 and time.monotonic() - self.used > IDLE_STOP

    def _listen(self) -> None:
        backoff = 0.1
        while not self.stop.is_set() and not self._idle():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    sqlapi.workers.listen_for_tasks(conn)
                    self._listening(True)
                    backoff = 0.1
                    while not self.stop.is_set() and not self._idle():
                        for note in conn.notifies(timeout=0.5):
                            self._notified(note.payload)
            except psycopg.Error as exc:
                log.debug("event=long_poll.listen_lost error=%r", str(exc)[:200])
            self._listening(False)
            self.stop.wait(backoff)
            backoff = min(backoff * 2, DOWN_RECHECK)

    def _listening(self, up: bool) -> None:
        with self.cond:
            self.listening = up
            self.seq += 1  # whatever happened meanwhile, waiting polls claim once more
            self.recent.clear()
            self.cond.notify_all()

    def _notified(self, payload: str) -> None:
        try:
            note = json.loads(payload)
            tenant, handler = str(note["tenant"]), str(note["handler"])
        except (ValueError, KeyError, TypeError):
            return
        with self.cond:
            self.seq += 1
            self.recent.append((self.seq, tenant, handler))
            self.cond.notify_all()

    def _news(self, since: int, tenant: str, handlers: set[str]) -> bool:
        """A notification after ``since`` for this tenant and one of these handlers (or
        one the window no longer holds: then maybe)."""
        if self.seq == since:
            return False
        oldest = self.recent[0][0] if self.recent else self.seq + 1
        if oldest > since + 1:
            return True  # some were forgotten, or the listener restarted
        return any(s > since and t == tenant and h in handlers for s, t, h in self.recent)

    def mark(self) -> int:
        """Call before a claim: notifications after this mark wake the wait that follows."""
        self.ensure_listening()
        with self.cond:
            return self.seq

    def wait(self, mark: int, tenant: str, handlers: set[str], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a task of these handlers queued after
        ``mark``; True when woken by one (or by a restarted listener)."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                if self._news(mark, tenant, handlers):
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, DOWN_RECHECK) if not self.listening else left)
                if not self.listening:
                    return True  # no listener: claim again every DOWN_RECHECK

    def take_slot(self) -> bool:
        with self.cond:
            if self.waiting >= self.slots:
                return False
            self.waiting += 1
            return True

    def give_slot(self) -> None:
        with self.cond:
            self.waiting -= 1

    def close(self) -> None:
        self.stop.set()


_LOCK = threading.Lock()


def wakeup(app: Flask) -> TaskWakeup:
    """The app's listener, started on first use."""
    with _LOCK:
        found = app.extensions.get("orch8.task_wakeup")
        if found is None:
            found = TaskWakeup(
                app.extensions["orch8.url"], int(app.config.get("ORCH8_LONG_POLLS", DEFAULT_SLOTS))
            )
            app.extensions["orch8.task_wakeup"] = found
        assert isinstance(found, TaskWakeup)
        return found
