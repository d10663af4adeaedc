"""The watchdog of handler calls (orch8_py/deadlines.py): a deadline fires once, only for
a call still running, and the heap stays near the number of calls in flight however long
the timeouts are."""

from __future__ import annotations

import threading
import time

from orch8_py.deadlines import Watchdog


def test_a_deadline_fires_once_for_a_call_still_running():
    w = Watchdog()
    fired = threading.Event()
    calls = []

    def on_timeout():
        calls.append(time.monotonic())
        fired.set()

    start = time.monotonic()
    race = w.watch(start + 0.05, on_timeout)
    assert fired.wait(5)
    assert calls[0] - start >= 0.05
    assert not race.finish()  # the handler returned too late: its result is dropped
    time.sleep(0.05)
    assert len(calls) == 1
    w.close()


def test_a_call_that_returned_first_is_never_timed_out():
    w = Watchdog()
    fired = []
    races = [w.watch(time.monotonic() + 0.05, lambda: fired.append(1)) for _ in range(50)]
    assert all(r.finish() for r in races)
    late = w.watch(time.monotonic() + 0.1, lambda: fired.append(2))
    time.sleep(0.3)
    assert fired == [2]  # the earlier deadlines passed with their calls already finished
    assert not late.finish()
    w.close()


def test_an_earlier_deadline_wakes_the_watchdog():
    w = Watchdog()
    fired = threading.Event()
    w.watch(time.monotonic() + 300, lambda: None)  # the default step timeout
    w.watch(time.monotonic() + 0.05, fired.set)
    assert fired.wait(2)
    w.close()


def test_finished_calls_do_not_pile_up():
    w = Watchdog()
    running = [w.watch(time.monotonic() + 300, lambda: None) for _ in range(100)]
    for _ in range(20_000):
        w.watch(time.monotonic() + 300, lambda: None).finish()
    assert len(w._heap) <= 2 * (len(running) + 1) + 64
    assert all(r.state == "running" for r in running)
    w.close()
