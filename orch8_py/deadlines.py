"""A handler call racing its timeout, and the one thread that keeps every deadline.

Python cannot stop a thread, so a handler that overruns its timeout keeps the thread it
runs on. A `Watchdog` keeps the deadlines of every call in flight, and the timers of the
instances waiting to retry a call (docs/ARCHITECTURE.md, "An instance waits without a
thread"). Whichever comes first wins a call, once: the handler's return (`Race.finish`)
or its deadline, on which the watchdog calls the call's `on_timeout` (the runner then
carries the instance on from a step thread, and the handler's thread drops the result
when the handler returns).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("orch8.runner")


class Race:
    """One call: ``running`` until either its return or its deadline settles it."""

    __slots__ = ("_lock", "state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state = "running"

    def _settle(self, state: str) -> bool:
        with self._lock:
            if self.state != "running":
                return False
            self.state = state
            return True

    def finish(self) -> bool:
        """The handler returned: True if it did so before the deadline took the call."""
        return self._settle("returned")

    def expire(self) -> bool:
        """The deadline passed: True if the handler had not returned by then."""
        return self._settle("timed_out")


class Watchdog:
    """One thread that fires the deadlines of the calls still running.

    A call that returns leaves its entry in the heap (removing it would cost a search);
    the heap is rebuilt from the running calls once it has doubled since the last
    rebuild, so it holds about twice the calls in flight at most, whatever the timeouts
    are (the default is five minutes)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Race, Callable[[], None]]] = []
        self._cv = threading.Condition()
        self._order = itertools.count()  # ties broken by arrival, never by comparing races
        self._closed = False
        self._thread: threading.Thread | None = None
        self._rebuild_at = 64  # heap size that triggers the next rebuild

    def watch(self, deadline: float, on_timeout: Callable[[], None]) -> Race:
        """A race whose ``on_timeout`` runs on the watchdog's thread at ``deadline``
        (time.monotonic()) unless the handler's thread has finished it first. It must be
        quick: hand work to another thread."""
        race = Race()
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="deadlines", daemon=True)
                self._thread.start()
            if len(self._heap) >= self._rebuild_at:
                # amortized: at least as many pushes as running calls between rebuilds
                self._heap = [entry for entry in self._heap if entry[2].state == "running"]
                heapq.heapify(self._heap)
                self._rebuild_at = 2 * len(self._heap) + 64
            heapq.heappush(self._heap, (deadline, next(self._order), race, on_timeout))
            if self._heap[0][2] is race:
                self._cv.notify()  # the earliest deadline changed
        return race

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            due: list[Callable[[], None]] = []
            with self._cv:
                while not self._closed:
                    now = time.monotonic()
                    while self._heap and self._heap[0][0] <= now:
                        _, _, race, on_timeout = heapq.heappop(self._heap)
                        if race.expire():
                            due.append(on_timeout)
                    if due:
                        break
                    wait = self._heap[0][0] - now if self._heap else None
                    self._cv.wait(wait)
                if self._closed:
                    return
            for on_timeout in due:
                try:
                    on_timeout()
                except Exception:
                    log.exception("event=runner.timeout_failed")
