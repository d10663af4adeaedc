"""Group commit: the runner's begin_step and finish_step calls from many instances,
sent to the database together (orch8.begin_steps, orch8.finish_steps): one round trip and
one commit for all the calls waiting, instead of one each (docs/ARCHITECTURE.md, "Group
commit").

Each kind of call has a few lanes (threads). A lane that is free sends every call waiting,
up to the limit step_batch, at once; calls that arrive while every lane is busy wait for
the next free lane. Nothing waits on a timer: a call waits at most for the batches in
flight to end, so an idle runner's step goes at once and a busy one's calls pile up into
larger batches. A caller is called back with its own answer, or the exception
its call raised (its subtransaction undone, the batch's other calls kept), or the
exception that ended the whole batch (a lost connection), which it handles as before:
begin_step and finish_step are safe to repeat under the same lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

C = TypeVar("C")  # a call
A = TypeVar("A")  # its answer

log = logging.getLogger("orch8.runner")


class _Slot(Generic[C, A]):
    __slots__ = ("answer", "call", "error", "then")

    def __init__(self, call: C, then: Callable[[A | None, BaseException | None], None]):
        self.call = call
        self.answer: A | None = None
        self.error: BaseException | None = None
        self.then = then  # called by the lane once the answer is in

    def answered(self) -> None:
        try:
            self.then(self.answer, self.error)
        except Exception:  # the lane goes on with the batch's other callers
            log.exception("event=batch.callback_failed")


class Closed(Exception):
    """The runner is stopping: no more batches are sent."""


class Batcher(Generic[C, A]):
    def __init__(
        self,
        name: str,
        send: Callable[[list[C]], list[A | Exception]],
        *,
        lanes: int,
        max_batch: int,
        before_send: Callable[[list[C]], None] | None = None,
        after_send: Callable[[list[C]], None] | None = None,
    ) -> None:
        self.send = send
        # test hooks (the runner's fault points): before a batch goes, after it committed
        self.before_send = before_send
        self.after_send = after_send
        self.max_batch = max_batch
        self.waiting: list[_Slot[C, A]] = []
        self.cv = threading.Condition()
        self.closed = False
        self.batches = 0  # sent (for the bench and the tests)
        self.calls = 0
        self.threads = [
            threading.Thread(target=self._lane, name=f"{name}-{i}", daemon=True)
            for i in range(lanes)
        ]
        for t in self.threads:
            t.start()

    def submit(self, call: C, then: Callable[[A | None, BaseException | None], None]) -> None:
        """Send ``call`` with the next batch; the lane calls ``then(answer, None)``, or
        ``then(None, exception)``, when it is in. Nothing waits meanwhile: the runner's
        instances wait for their batch without a thread. After close, ``then`` gets
        Closed at once."""
        with self.cv:
            if not self.closed:
                self.waiting.append(_Slot(call, then))
                self.cv.notify()
                return
        then(None, Closed("the runner is stopping"))

    def close(self) -> None:
        """Send what is waiting, then stop the lanes."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        for t in self.threads:
            t.join(timeout=30)

    def _lane(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.closed:
                    self.cv.wait()
                if not self.waiting:
                    return
                batch = self.waiting[: self.max_batch]
                del self.waiting[: self.max_batch]
                self.batches += 1
                self.calls += len(batch)
            calls = [s.call for s in batch]
            try:
                if self.before_send is not None:
                    self.before_send(calls)
                answers = self.send(calls)
                if self.after_send is not None:
                    self.after_send(calls)
            except BaseException as exc:  # the whole batch: every caller sees it
                for s in batch:
                    s.error = exc
                    s.answered()
                continue
            for s, answer in zip(batch, answers, strict=True):
                if isinstance(answer, Exception):
                    s.error = answer
                else:
                    s.answer = answer
                s.answered()
