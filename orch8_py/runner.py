"""The engine runner: claims due instances in batches and runs their steps.

Per claim (one round trip for the batch) the runner gets each instance's context and
progress; per step it makes at most two calls: ``begin_step`` (side-effecting handlers
only) and ``finish_step``. All state lives in PostgreSQL; the runner holds leases, and
every write it makes carries the lease token, so a runner that lost its lease is
refused (StaleLease) and stops quietly.

Threads: the claim loop (the caller's); a few step threads that run the instances' code
between waits (an instance waiting for its group-committed batch, or for a retry after a
lost connection, holds no thread: docs/ARCHITECTURE.md, "An instance waits without a
thread"); a thread per handler call in progress, racing its timeout (deadlines.py); a
heartbeat thread extending the leases of in-flight instances; a listener that wakes the
claim loop on NOTIFY orch8_work (polling every ``poll_interval`` stays as the fallback);
the webhook deliverer, the verifier loop (orch8_py.verifier) settling unknown receipts, and
the schedule loop (orch8_py.schedules) firing due cron schedules.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import datetime as dt
import functools
import inspect
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed

from . import config, db, metrics, rules, sqlapi
from . import handlers as registry
from .deadlines import Watchdog
from .errors import BatchedCallFailed, NotFound, StaleLease
from .expression import ExpressionError, truthy
from .group_commit import Batcher, Closed
from .handler_loop import HandlerLoop
from .instance_state import SqlInstanceState
from .retry import RetryPolicy
from .schemas import input_problem, output_problem
from .scope import evaluate, expression_scope, outputs_seen_from, roots
from .sqlapi.base import Conn
from .sqlapi.steps import (
    BeginCall,
    Claimed,
    FinishCall,
    Finished,
    LostReceipt,
    Node,
    Outcome,
    StoredSequence,
)
from .steps import Handler, NotApplied, StepContext, StepError, is_async
from .templates import TemplateError, params_scope, render_params
from .verifier import Verifier

log = logging.getLogger("orch8.runner")

# Between retries of a call that met a lost database. Each retry waits in the pool, which
# itself reaches for the server at most every db.RECONNECT_BACKOFF_CAP seconds: waiting
# longer here only delays the first step after a failover.
MAX_BACKOFF = 1.0
# After an outage, every runner waits this long before it starts new steps, so that the
# finish_step / keep_lost_receipts calls all runners had pending (each retried at least
# every MAX_BACKOFF through a pool that reconnects every db.RECONNECT_BACKOFF_CAP) land
# first: a step whose claim and receipt were lost with an asynchronous primary is then
# found recorded by whoever claims it, instead of being sent again (docs/HA.md).
SETTLE_AFTER_OUTAGE = 2 * max(MAX_BACKOFF, db.RECONNECT_BACKOFF_CAP)
# An asynchronous standby promoted by a failover lacks the primary's last commits. After
# an outage the runner rechecks the receipts of the side effects it finished this long
# before the database went away (at most RECENT_EFFECTS_KEPT of them): a step whose
# begin_step and finish_step were both lost would otherwise be sent again when its lease
# runs out (docs/HA.md).
RECHECK_WINDOW = 30.0
RECENT_EFFECTS_KEPT = 10_000
DEFAULT_STEP_TIMEOUT = 300.0
CONNECTION_ERRORS = db.CONNECTION_LOST
# How often a runner makes sure the coming months of history have their partitions
# (orch8.ensure_history_partitions, a no-op when they exist; docs/STORAGE.md).
HISTORY_EVERY = 3600.0
# How long a token must be missing from the heartbeats before it counts as lost (the
# heartbeat interval when that is longer): a finished step's answer in transit is not.
LOST_AFTER = 1.0
# a call of a group-committed batch undone by these is simply sent again
RETRY_IN_BATCH = ("40P01", "40001")  # deadlock detected, serialization failure
# what a step's database call may meet and Runner._retry_after sorts out
RETRIED: tuple[type[Exception], ...] = (
    PoolClosed,
    Closed,
    StaleLease,
    BatchedCallFailed,
    *CONNECTION_ERRORS,
)
# Step threads with group commit: enough to keep the connection pool's calls (decisions,
# children, definitions) going side by side; the instances' Python needs one core.
STEP_THREADS = 8
T = TypeVar("T")
A = TypeVar("A")


@dataclass
class Settings:
    concurrency: int = config.DEFAULT_CONCURRENCY
    lease: float = 30.0
    heartbeat: float = 10.0
    poll_interval: float = 0.1
    grace: float = 30.0
    webhooks: bool = True  # also deliver the webhook outbox from this process
    verifiers: bool = True  # also run the verifiers of unknown receipts from this process
    schedules: bool = True  # also fire due cron schedules from this process
    verify_interval: float = 0.5  # seconds between looks for due verifications when idle
    group_commit: bool = True  # begin and finish steps in batches (group_commit.py)
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )


class LeaseLost(Exception):
    """Internal: the instance is no longer ours; stop working on it."""


class Wait(NamedTuple):
    """What an instance's code yields to wait for a group-committed call's answer without
    holding a thread: the answer (or its exception) comes back into the code on a step
    thread."""

    batcher: Batcher[Any, Any]
    call: Any


class Sleep(NamedTuple):
    """Yielded to wait before a retry without holding a thread."""

    seconds: float


class HandlerCall(NamedTuple):
    """Yielded to call a handler: it runs on a thread of its own, racing ``deadline``
    (time.monotonic()); the Invocation comes back into the code."""

    fn: Handler
    params: dict[str, Any]
    ctx: StepContext
    timeout: float
    deadline: float


# An instance's code between its claim and its end: it yields what it waits for (Wait,
# Sleep, HandlerCall) and gets the answer back (Runner._advance).
Steps = Generator["Wait | Sleep | HandlerCall", Any, T]


class InFlight:
    """One claimed instance in flight: its code, suspended where it waits."""

    __slots__ = ("code", "ended", "row")

    def __init__(self, row: Claimed, code: Steps[None], ended: threading.Event | None = None):
        self.row = row
        self.code = code
        self.ended = ended  # set when the code ends, for a caller waiting on it (tests)


class LeaseTaken(LeaseLost):
    """The database refused the lease (StaleLease), as opposed to the runner giving up."""


@dataclass(frozen=True)
class Invocation:
    """What a handler call came to: the result finish_step records, and for the retry
    policy whether (and by which code) it may be retried."""

    result: str  # ok | error | not_applied | skipped (when) | invalid_output (output_schema)
    output: Any
    error: str | None = None
    code: str | None = None
    retryable: bool = True


class Runner:
    def __init__(self, url: str, settings: Settings | None = None, **overrides: Any):
        # Every connection (the pool, the listener, the deliverer, the verifier) acts as
        # orch8_runner: it may call the engine's functions and write no table directly.
        self.url = url = db.as_role(url, db.RUNNER_ROLE)
        self.settings = settings or Settings(**overrides)
        s = self.settings
        self.pool: ConnectionPool[Conn] = ConnectionPool(
            url,
            min_size=1,
            # with group commit, begin and finish go through four lanes; the instance
            # threads still read and write through the pool (decide, state, children)
            max_size=min(s.concurrency, 8) + 6 if s.group_commit else s.concurrency + 2,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": 5},
            timeout=10,
            name="orch8-runner",
        )
        self.wake = threading.Event()
        self.draining = threading.Event()
        self.stranded = 0  # steps still running when the grace period ended
        self.failure: str | None = None  # why run() ended on an unexpected error
        self.db_host: str | None = None  # host:port of the server that last answered
        self.lost_since: float | None = None  # when the database stopped answering
        self.settle_until = 0.0  # no new steps before this (monotonic): SETTLE_AFTER_OUTAGE
        self.recheck_since: float | None = None  # an outage began then: recheck receipts
        # side effects finished lately, with when (monotonic): what a recheck sends
        self.recent_effects: collections.deque[tuple[float, LostReceipt]] = collections.deque(
            maxlen=RECENT_EFFECTS_KEPT
        )
        self.inflight: dict[uuid.UUID, Claimed] = {}  # lease token -> claimed instance
        # tokens the heartbeats have not found since (monotonic time of the first miss)
        self.missing_since: dict[uuid.UUID, float] = {}
        self.lock = threading.Lock()
        self.definitions: dict[tuple[str, uuid.UUID], StoredSequence] = {}
        self.definition_lock = threading.Lock()
        self.builtins: dict[str, bool] | None = None  # builtin name -> has side effects
        self.history_due = 0.0  # time.monotonic() of the next ensure_history_partitions
        # A handler runs on a thread of its own, racing its timeout (deadlines.py).
        # Handler calls running at once, those that overran their timeout included, are
        # at most twice the slots: a handler that overran keeps its thread (Python cannot
        # kill one) while the instance carries on, and the spare room keeps steps flowing
        # meanwhile. A call that finds no room within its timeout never starts.
        self.handler_threads = s.concurrency * 2
        self.call_permits = threading.BoundedSemaphore(self.handler_threads)
        self.deadlines = Watchdog()
        # async def handlers are awaited here instead, holding no thread while they wait
        self.handler_loop = HandlerLoop()
        # Instances claimed and leased, waiting for one of the `concurrency` slots; at
        # most a batch beyond the running ones (see _run). Guarded by `lock`.
        self.backlog: collections.deque[Claimed] = collections.deque()
        self.active = 0  # instances holding a slot
        self.slot_freed = threading.Condition(self.lock)
        # An instance's code runs on a step thread up to its next wait (Runner._advance):
        # a few threads, since what they do between waits is Python and the connection
        # pool's calls; without group commit every begin and finish is such a call, so
        # one per slot. A handler call takes a thread of its own (room for the slots and
        # the calls that overran their timeouts). Both make threads only as work needs.
        self.stepping = cf.ThreadPoolExecutor(
            min(s.concurrency, STEP_THREADS) if s.group_commit else s.concurrency,
            thread_name_prefix="steps",
        )
        self.calling = cf.ThreadPoolExecutor(
            s.concurrency + self.handler_threads, thread_name_prefix="instance"
        )
        self.verifier: Verifier | None = None  # the verifier loop, while run() runs it
        # group commit: two lanes per kind keep both of a small machine's cores busy
        self.begins: Batcher[BeginCall, Outcome] | None = None
        self.finishes: Batcher[FinishCall, Finished] | None = None
        self.round_trips = 0  # database calls made on the step path (counted for the bench)
        self.ticks = 0
        self.steps_run = 0

    # --- database calls -------------------------------------------------------------

    def _call(self, fn: Callable[[Conn], T]) -> T:
        try:
            with self.pool.connection() as conn:
                with self.lock:
                    self.round_trips += 1
                try:
                    out = fn(conn)
                except CONNECTION_ERRORS as exc:
                    db.drop_if_read_only(conn, exc)  # a standby now: the pool must not reuse it
                    raise
                if self.lost_since is not None or self.db_host is None:
                    self._connected(conn)
                return out
        except CONNECTION_ERRORS as exc:
            self._lost(exc)
            raise

    def _lost(self, exc: BaseException) -> None:
        """One line when the database goes away (the retries log their own)."""
        with self.lock:
            if self.lost_since is not None:
                return
            self.lost_since = time.monotonic()
        log.warning("event=runner.db_down host=%s error=%r", self.db_host or "?", str(exc)[:200])

    def _connected(self, conn: Conn) -> None:
        """One line when it is back, naming the server now answering: after a failover,
        the new primary. A standby answers reads too: it is not back until it writes."""
        if self.lost_since is not None and sqlapi.server.replication(conn).standby:
            return
        host = f"{conn.info.host}:{conn.info.port}"
        with self.lock:
            since, self.lost_since = self.lost_since, None
            before, self.db_host = self.db_host, host
            if since is not None:
                self.settle_until = time.monotonic() + SETTLE_AFTER_OUTAGE
                self.recheck_since = since
        if since is not None:
            log.warning(
                "event=runner.db_reconnected host=%s was=%s after=%.1fs",
                host,
                before or "?",
                time.monotonic() - since,
            )

    def _call_until_done(self, fn: Callable[[Conn], T], stop_at: float | None = None) -> T:
        """Repeat a call across connection loss (_until_done)."""
        return self._until_done(lambda: self._call(fn), stop_at)

    def _until_done(self, attempt: Callable[[], T], stop_at: float | None = None) -> T:
        """Repeat a call across connection loss (_retry_after says when)."""
        backoff = 0.1
        while True:
            try:
                return attempt()
            except RETRIED as exc:
                self._retry_after(exc, backoff, stop_at)
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _batched(self, batcher: Batcher[Any, A], call: Any) -> Steps[A]:
        """A call sent with the next group-committed batch, repeated as _until_done does;
        the instance waits for the answer, and between retries, without a thread."""
        backoff = 0.1
        while True:
            try:
                return (yield Wait(batcher, call))  # type: ignore[no-any-return]
            except RETRIED as exc:
                self._retry_after(exc, backoff, None)
            yield Sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _retry_after(self, exc: Exception, backoff: float, stop_at: float | None) -> None:
        """Raise what ends a call that failed with ``exc``, or log its retry. Repeated: a
        call (alone, or in a group-committed batch) that met connection loss and, in a
        batch, a deadlock or serialization failure that undid only that call. begin_step
        and finish_step are safe to repeat under the same lease; a lost lease surfaces as
        LeaseLost."""
        if isinstance(exc, (PoolClosed, Closed)):
            # The runner stopped while this step outlived the grace period: its lease
            # runs out and the next runner settles the receipt. Retrying would never end.
            raise LeaseLost("the runner stopped before the step finished") from None
        if isinstance(exc, StaleLease):
            raise LeaseTaken(str(exc)) from None
        if isinstance(exc, BatchedCallFailed) and exc.sqlstate not in RETRY_IN_BATCH:
            raise exc
        if stop_at is not None and time.monotonic() > stop_at:
            raise LeaseLost(f"gave up after connection loss: {exc}")
        log.warning("event=runner.db_retry error=%r retry_in=%.1fs", str(exc)[:200], backoff)

    def _builtins(self) -> dict[str, bool]:
        if self.builtins is None:
            self.builtins = self._call(sqlapi.steps.builtin_handlers)
        return self.builtins

    def _ensure_history(self) -> None:
        """At start and hourly: this month's and the next months' history partitions. A
        refusal (a role without the grant) is logged, not fatal: rows then wait in the
        default partition, and the next call that can moves them into their month."""
        now = time.monotonic()
        if now < self.history_due:
            return
        self.history_due = now + HISTORY_EVERY
        try:
            made = self._call(sqlapi.history.ensure_partitions)
        except CONNECTION_ERRORS:
            self.history_due = 0.0  # the claim that follows waits for the database
            raise
        except psycopg.Error as exc:
            log.warning("event=history.ensure_failed error=%r", str(exc).strip()[:200])
            return
        for p in made:
            log.info(
                "event=history.partition_made partition=%s rows_moved=%d",
                p.partition_name,
                p.rows_moved,
            )

    def has_side_effects(self, handler: str) -> bool:
        """orch8.handler_has_side_effects: a side-effecting builtin, or any other name."""
        return self._builtins().get(handler, True)

    def definition(self, tenant: str, sequence_id: uuid.UUID) -> StoredSequence:
        key = (tenant, sequence_id)
        if key not in self.definitions:  # sequences are immutable: cache forever
            # one read per sequence, not one per thread that starts before it is cached
            with self.definition_lock:
                if key not in self.definitions:
                    self.definitions[key] = self._call_until_done(
                        lambda c: sqlapi.steps.stored_sequence(
                            c, tenant_id=tenant, sequence_id=sequence_id
                        )
                    )
        return self.definitions[key]

    def claim(self, n: int) -> list[Claimed]:
        return self._call(
            lambda c: sqlapi.steps.claim_work(
                c, worker_id=self.settings.worker_id, batch=n, lease_seconds=self.settings.lease
            )
        )

    # --- the loops ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Claim and run instances until ``stop`` is set. An error no loop expects ends the
        runner (``failure`` says why, for ``orch8 run`` to exit non-zero) instead of leaving
        a process that looks alive and does nothing."""
        try:
            self._run(stop)
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            self.failure = f"{type(exc).__name__}: {first_line}".rstrip(": ")
            log.error("event=runner.failed error=%r", self.failure)
            stop.set()
            self.deadlines.close()
            self.handler_loop.close(timeout=1.0)
            self._close_batchers()
            self.pool.close()

    def _run(self, stop: threading.Event) -> None:
        s = self.settings
        log.info(
            "event=runner.start worker=%s concurrency=%d lease=%gs heartbeat=%gs",
            s.worker_id,
            s.concurrency,
            s.lease,
            s.heartbeat,
        )
        self.pool.open(wait=False)
        if s.group_commit:  # the lanes live as long as run()
            step_batch = rules.LIMITS["step_batch"]
            self.begins = Batcher(
                "begin-steps",
                lambda calls: self._call(lambda c: sqlapi.steps.begin_steps(c, calls)),
                lanes=2,
                max_batch=step_batch,
                after_send=lambda calls: batch_fault("begin_batch", calls),
            )
            self.finishes = Batcher(
                "finish-steps",
                lambda calls: self._call(lambda c: sqlapi.steps.finish_steps(c, calls)),
                lanes=2,
                max_batch=step_batch,
                before_send=lambda calls: batch_fault("finish_batch", calls),
            )
        helpers = [
            threading.Thread(target=self._listen, args=(stop,), name="listen", daemon=True),
            threading.Thread(target=self._heartbeat, args=(stop,), name="heartbeat", daemon=True),
        ]
        deliverer = None
        if s.webhooks:
            from .webhooks import WebhookDeliverer

            deliverer = WebhookDeliverer(self.url, f"{s.worker_id}:webhooks")
            helpers.append(
                threading.Thread(target=deliverer.run, args=(stop,), name="webhooks", daemon=True)
            )
        if s.verifiers:
            self.verifier = Verifier(
                self._call,
                f"{s.worker_id}:verifier",
                interval=s.verify_interval,
                lease_margin=s.lease,
                fault=fault_point,
            )
            helpers.append(
                threading.Thread(
                    target=self.verifier.run, args=(stop,), name="verifier", daemon=True
                )
            )
        schedule_pool: ConnectionPool[Conn] | None = None
        if s.schedules:
            from .schedules import ScheduleFirer

            # Its own connection, so a tick never waits for (or holds) one the steps need;
            # cron's resolution is a minute, so a tick a second is on time.
            schedule_pool = ConnectionPool(
                self.url,
                min_size=1,
                max_size=1,
                open=True,
                kwargs={"autocommit": True, "connect_timeout": 5},
                timeout=10,
                name="orch8-schedules",
            )
            firer = ScheduleFirer(
                schedule_pool, f"{s.worker_id}:schedules", interval=max(s.poll_interval, 1.0)
            )
            helpers.append(
                threading.Thread(target=firer.run, args=(stop,), name="schedules", daemon=True)
            )
        for t in helpers:
            t.start()
        backoff = 0.1
        while not stop.is_set():
            self.ticks += 1
            # Keep up to two batches claimed: the running one and one queued behind it
            # (leased and heartbeated), and claim only when at least a batch is free, so a
            # busy runner claims many instances per round trip instead of one at a time.
            with self.lock:
                outstanding = self.active + len(self.backlog)
            free = 2 * s.concurrency - outstanding if outstanding <= s.concurrency else 0
            claimed: list[Claimed] = []
            if self._settling(stop):
                continue
            if free > 0:
                try:
                    self._builtins()
                    self._ensure_history()
                    claimed = self.claim(free)
                    metrics.claimed(len(claimed))
                    backoff = 0.1
                except CONNECTION_ERRORS as exc:
                    log.warning(
                        "event=runner.db_lost error=%r retry_in=%.1fs", str(exc)[:200], backoff
                    )
                    stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
            self._settling(stop)  # this very claim may have found the database back
            with self.lock:
                for row in claimed:
                    self.inflight[row.lease_token] = row
                    self.backlog.append(row)
            self._start_waiting()
            if claimed and len(claimed) == free:
                continue  # more may be due: claim again at once
            self.wake.wait(s.poll_interval)
            self.wake.clear()
        self._drain()
        stop.set()
        for t in helpers:
            t.join(timeout=5)
        if deliverer is not None:
            deliverer.close()
        if schedule_pool is not None:
            schedule_pool.close()
        self.deadlines.close()
        self._close_batchers()
        self.pool.close()
        log.info("event=runner.stop ticks=%d steps=%d", self.ticks, self.steps_run)

    def _close_batchers(self) -> None:
        for batcher in (self.begins, self.finishes):
            if batcher is not None:
                batcher.close()

    def _settling(self, stop: threading.Event) -> bool:
        """When an outage just ended: recheck recent receipts, then wait out
        SETTLE_AFTER_OUTAGE; True if it waited."""
        self._recheck_receipts()
        pause = self.settle_until - time.monotonic()
        if pause <= 0:
            return False
        log.info("event=runner.settling seconds=%.1f", pause)
        stop.wait(pause)
        return True

    def _start_waiting(self) -> None:
        """Give free slots to claimed instances, oldest claim first. Takes ``lock``; the
        instances start outside it (their first step would wait for it)."""
        with self.lock:
            starting = []
            while self.backlog and (
                self.active < self.settings.concurrency or self.draining.is_set()
            ):
                starting.append(self.backlog.popleft())
                self.active += 1
        for row in starting:
            self.stepping.submit(self._advance, InFlight(row, self._instance(row)))

    def _advance(
        self, inflight: InFlight, answer: Any = None, error: BaseException | None = None
    ) -> None:
        """Run an instance's code on this thread, from where it waited (with ``answer`` or
        ``error``) to its next wait, which is then handed over: to a batch whose lane calls
        back, to the watchdog's timer, or to a handler's thread. When the code ends, the
        next claimed instance takes the slot and starts here."""
        while True:
            try:
                if error is not None:
                    wanted = inflight.code.throw(error)
                else:
                    wanted = inflight.code.send(answer)
            except StopIteration:
                if inflight.ended is not None:
                    inflight.ended.set()
                    return
                with self.lock:
                    row = self.backlog.popleft() if self.backlog else None
                    if row is None:
                        self.active -= 1
                        self.slot_freed.notify_all()
                self.wake.set()  # room for more claimed instances: the loop may claim
                if row is None:
                    return
                inflight, answer, error = InFlight(row, self._instance(row)), None, None
                continue
            if isinstance(wanted, Wait):
                wanted.batcher.submit(wanted.call, functools.partial(self._resume, inflight))
            elif isinstance(wanted, Sleep):
                self.deadlines.watch(
                    time.monotonic() + wanted.seconds, functools.partial(self._resume, inflight)
                )
            elif is_async(wanted.fn):
                self._call_async(inflight, wanted)
            else:
                self.calling.submit(self._call_then_advance, inflight, wanted)
            return

    def _resume(
        self, inflight: InFlight, answer: Any = None, error: BaseException | None = None
    ) -> None:
        """Carry an instance on from where it waited, on a step thread."""
        try:
            self.stepping.submit(self._advance, inflight, answer, error)
        except RuntimeError:  # the runner stopped past its grace period: the lease runs out
            log_stranded(inflight.row)

    def _call_then_advance(self, inflight: InFlight, call: HandlerCall) -> None:
        """A handler's thread: the call, then the instance's code up to its next wait,
        unless the deadline took the call (the watchdog carried the instance on)."""
        got = self._invoke(inflight, call)
        if got is not None:
            self._advance(inflight, *got)

    def _call_async(self, inflight: InFlight, call: HandlerCall) -> None:
        """Hand an async def handler to the handler loop (no thread while it waits)."""
        try:
            self.handler_loop.submit(self._await_handler(inflight, call))
        except RuntimeError:  # the runner stopped past its grace period: the lease runs out
            log_stranded(inflight.row)

    async def _await_handler(self, inflight: InFlight, call: HandlerCall) -> None:
        """An async handler racing its deadline, as `_invoke` races a thread's. The
        deadline also cancels the coroutine: unlike a thread it can be stopped, though
        what it sent stays ambiguous (the receipt becomes unknown all the same). The
        instance carries on from a step thread, never from the loop's."""
        task = asyncio.current_task()
        assert task is not None
        timed_out = Invocation("error", {}, f"timed out after {call.timeout:g}s", "timeout")

        def on_timeout() -> None:
            self.handler_loop.cancel_soon(task)
            self._resume(inflight, timed_out)

        race = self.deadlines.watch(call.deadline, on_timeout)
        got: tuple[Invocation | None, BaseException | None]
        try:
            try:
                output = await call.fn(call.params, call.ctx)
            except Exception as exc:  # CancelledError is not one: it passes
                got = failed_call(exc), None
            else:
                got = returned(output), None
        except LeaseLost as exc:
            got = None, exc
        except asyncio.CancelledError:
            if race.finish():  # not the deadline: the loop closed as the runner stopped
                log_stranded(inflight.row)
            return
        if race.finish():
            self._resume(inflight, *got)
            return
        log_returned_late(call.ctx)

    def _run_instance(self, row: Claimed) -> None:
        """Run one claimed instance to its end, on the runner's threads (tests)."""
        ended = threading.Event()
        self.stepping.submit(self._advance, InFlight(row, self._instance(row), ended))
        ended.wait()

    def _drain(self) -> None:
        """Finish in-flight steps within the grace period; instances between steps hand
        their lease back (``_run_instance`` checks ``draining``)."""
        self.draining.set()
        ends = time.monotonic() + self.settings.grace
        self._start_waiting()  # the claimed ones waiting for a slot hand back at once
        with self.lock:
            log.info(
                "event=runner.drain in_flight=%d grace=%.0fs", self.active, self.settings.grace
            )
            # a slot, not a thread: a handler past its timeout is no longer waited for
            while self.active > 0 and (left := ends - time.monotonic()) > 0:
                self.slot_freed.wait(left)
            self.stranded = self.active
        if self.stranded:
            log.warning(
                "event=runner.drain_timeout still_running=%d (their leases will expire)",
                self.stranded,
            )
        self.stepping.shutdown(wait=False, cancel_futures=True)
        self.calling.shutdown(wait=False, cancel_futures=True)
        self.handler_loop.close(timeout=1.0)

    def _listen(self, stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    sqlapi.steps.listen_for_work(conn)
                    backoff = 0.1
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake.set()
            except psycopg.Error as exc:
                log.debug("event=runner.listen_lost error=%r", str(exc)[:200])
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.heartbeat):
            with self.lock:
                tokens = list(self.inflight)
            if not tokens:
                continue

            def extend(c: Conn, tokens: list[uuid.UUID] = tokens) -> set[uuid.UUID]:
                return sqlapi.steps.heartbeat_leases(
                    c, lease_tokens=tokens, lease_seconds=self.settings.lease
                )

            try:
                held = self._call(extend)
            except CONNECTION_ERRORS as exc:
                log.warning("event=runner.heartbeat_failed error=%r", str(exc)[:200])
                continue
            with self.lock:
                # an instance that completed or was handed back meanwhile is not lost
                missing = {t for t in tokens if t not in held and t in self.inflight}
            # A step's finish may have committed (its token gone) while its answer is still
            # on the way to the worker, which then drops the token: only a token missing
            # from every heartbeat for LOST_AFTER seconds (at least two heartbeats), still in
            # flight, was lost. Two heartbeats alone were not enough at a 10 ms interval
            # on a busy machine, where an answer can take longer than that to arrive.
            now = time.monotonic()
            since = {t: self.missing_since.get(t, now) for t in missing}
            wait = max(self.settings.heartbeat, LOST_AFTER)
            for token in sorted(t for t, first in since.items() if 0 <= first < now - wait):
                log.warning("event=runner.lease_lost token=%s", token)
                since[token] = -1.0  # reported: once is enough
            self.missing_since = since

    # --- one chain of nodes ---------------------------------------------------------

    def _instance(self, row: Claimed) -> Steps[None]:
        """An instance's code from its claim to where this runner lets it go."""
        try:
            yield from self._steps(row)
        except LeaseLost as exc:
            metrics.lease_lost()
            log.info(
                "event=instance.lease_lost tenant=%s instance=%s reason=%r",
                row.tenant_id,
                row.id,
                str(exc)[:200],
            )
        except Exception:
            log.exception(
                "event=instance.runner_error tenant=%s instance=%s", row.tenant_id, row.id
            )
        with self.lock:
            self.inflight.pop(row.lease_token, None)

    def _steps(self, row: Claimed) -> Steps[None]:
        """Run the claimed node, then each node the database hands over under the same
        lease (the next step of the same list, a branch, a composite asking for a value),
        until none is left for this runner."""
        sequence = self.definition(row.tenant_id, row.sequence_id)
        progress = dict(row.progress or {})
        node: Node | None = row.node
        while node is not None:
            if self.draining.is_set():
                self._hand_back(row)
                return
            elif node.kind in ("loop", "for_each", "router"):
                done = self._decide(row, sequence, node, progress)
            elif node.kind == "sub_sequence":
                done = self._child(row, sequence, node, progress)
            elif node.kind == "wait_for_input":
                done = self._input(row, sequence, node, progress)
            else:
                done = yield from self._step(row, node_block(sequence, node), node, progress)
            if done.progress is not None:
                progress = dict(done.progress)
            node = done.next
            if node is not None and (done.context_version or 0) > row.context_version:
                row = self._fresh_context(row)  # an update_context signal came meanwhile

    def _step(
        self, row: Claimed, block: dict[str, Any], node: Node, progress: dict[str, Any]
    ) -> Steps[Finished]:
        """One step: check it can run here, evaluate its when, render its params, begin it
        (receipt before dispatch), call the handler, finish it. ``progress`` gains its
        output."""
        path, attempt = node.path, node.attempt
        where = f"tenant={row.tenant_id} instance={row.id} block={path} attempt={attempt}"
        if node.worker_result is not None:
            return (yield from self._worker_result(row, block, node, progress, where))
        fn, problem = self._handler_of(block)
        # a handler this runner has not loaded may be served by external workers:
        # begin_step decides (it fails the step before any receipt when none serve it)
        remote = fn is None and self._maybe_remote(block)
        if fn is None and not remote:
            log.warning("event=step.not_runnable %s reason=%r", where, problem)
            return (yield from self._fail(row, path, attempt, problem))
        name = block["handler"]
        outputs = outputs_seen_from(progress, path)
        if node.kind == "step" and isinstance(block.get("when"), str):
            try:
                value = evaluate(
                    block["when"],
                    expression_scope(row.context, outputs, node.vars, attempt=attempt),
                    roots(node.vars),
                )
            except ExpressionError as exc:
                return (yield from self._fail(row, path, attempt, f"block {path!r}: when: {exc}"))
            if not truthy(value):
                log.info("event=step.skipped %s when=%r", where, block["when"])
                skipped = Invocation("skipped", {"when": block["when"], "value": value})
                return (yield from self._finish(row, path, attempt, None, skipped, None))
        try:
            params = render_params(
                block.get("params") or {},
                params_scope(row.context, row.id, attempt, outputs, node.vars),
                node.vars,
            )
        except TemplateError as exc:
            return (yield from self._fail(row, path, attempt, f"block {path!r}: {exc}"))

        effect_id = idempotency_key = None
        if self.has_side_effects(name):
            began = yield from self._begin(
                row, path, name, params, attempt, not_runnable=problem if remote else None
            )
            if began.outcome == "stopped":  # its branch was cancelled, or a pause/cancel
                log.info("event=step.stopped %s state=%s", where, began.detail)
                return Finished(began.detail or "paused")
            if began.outcome == "queued":  # external workers run it; the runner moves on
                log.info(
                    "event=step.queued %s handler=%s effect=%s detail=%r",
                    where,
                    name,
                    began.effect_id,
                    began.detail,
                )
                return Finished("waiting")
            if began.outcome is not None and began.outcome != "dispatched":
                # begin_step recorded why and moved the node (failed, or waiting for the
                # receipt's verifier, or blocked): this runner stops here
                log.warning(
                    "event=step.refused %s outcome=%s effect=%s state=%s detail=%r",
                    where,
                    began.outcome,
                    began.effect_id,
                    began.state,
                    began.detail,
                )
                return Finished("stopped")
            effect_id, idempotency_key = began.effect_id, began.idempotency_key
            fault_point("after_dispatch", path)
        if fn is None:
            # cannot happen (begin_step queues what workers serve and fails the rest), but
            # if it did, nothing was sent: settle the receipt so, never leave it dispatched
            call = Invocation("not_applied", {"not_sent": problem}, problem, retryable=False)
            return (yield from self._finish(row, path, attempt, effect_id, call, None))

        timeout = float(block.get("timeout", DEFAULT_STEP_TIMEOUT * 1000)) / 1000
        ctx = StepContext(
            tenant_id=row.tenant_id,
            instance_id=row.id,
            block_id=path,
            attempt=attempt,
            handler=name,
            effect_id=effect_id,
            idempotency_key=idempotency_key,
            context=row.context,
            outputs=outputs,
            timeout=timeout,
            state=SqlInstanceState(self.pool.connection, row.tenant_id, row.id, row.lease_token),
            vars=node.vars,
        )
        metrics.step_started(name, effect_id is not None)
        started = time.monotonic()
        call = yield HandlerCall(fn, params, ctx, timeout, started + timeout)
        if call.result == "ok" and isinstance(block.get("output_schema"), dict):
            call = checked_output(call, block["output_schema"])
        with self.lock:
            self.steps_run += 1
        if effect_id is not None:
            fault_point("before_finish", path)
        retry_in = None
        if call.result in ("error", "not_applied"):
            retry_in = self._retry_delay(row, block, node, outputs, attempt, call)
        done = yield from self._finish(row, path, attempt, effect_id, call, retry_in)
        metrics.step_finished(name, call.result, done.state, time.monotonic() - started)
        log.info(
            "event=step.done %s handler=%s effect=%s result=%s state=%s ms=%d%s",
            where,
            name,
            effect_id,
            call.result,
            done.state,
            (time.monotonic() - started) * 1000,
            f" error={call.error!r}" if call.error else "",
        )
        if call.result == "ok":
            progress[path] = {"attempt": attempt, "sentinel": None, "output": call.output}
        return done

    def _worker_result(
        self,
        row: Claimed,
        block: dict[str, Any],
        node: Node,
        progress: dict[str, Any],
        where: str,
    ) -> Steps[Finished]:
        """An external worker's failure or timeout (its receipt settled when it was
        reported): decided by the step's retry policy, as the runner's own handler's
        failure is, and recorded with finish_step."""
        result = node.worker_result or {}
        call = Invocation(
            str(result.get("result") or "error"),
            result.get("evidence") or {},
            result.get("error"),
            result.get("code"),
            bool(result.get("retryable", True)),
        )
        outputs = outputs_seen_from(progress, node.path)
        retry_in = self._retry_delay(row, block, node, outputs, node.attempt, call)
        effect_id = uuid.UUID(str(result["effect_id"]))
        done = yield from self._finish(row, node.path, node.attempt, effect_id, call, retry_in)
        log.info(
            "event=step.worker_result %s task=%s effect=%s result=%s state=%s retry_in=%s error=%r",
            where,
            result.get("task_id"),
            effect_id,
            call.result,
            done.state,
            retry_in,
            call.error,
        )
        return done

    def _retry_delay(
        self,
        row: Claimed,
        block: dict[str, Any],
        node: Node,
        outputs: dict[str, Any],
        attempt: int,
        call: Invocation,
    ) -> dt.timedelta | None:
        """The step's retry policy, and its retry_if over the error."""
        delay = RetryPolicy.from_block(block).next_delay(
            attempt, retryable=call.retryable, code=call.code
        )
        retry_if = (block.get("retry") or {}).get("retry_if")
        if delay is None or not isinstance(retry_if, str):
            return delay
        error = {"message": call.error, "code": call.code, "attempt": attempt}
        scope = expression_scope(row.context, outputs, {**node.vars, "error": error})
        try:
            again = truthy(evaluate(retry_if, scope, roots(node.vars, "error")))
        except ExpressionError as exc:
            log.warning("event=step.retry_if_failed block=%s error=%r", node.path, str(exc))
            return None
        return delay if again else None

    def _decide(
        self, row: Claimed, sequence: StoredSequence, node: Node, progress: dict[str, Any]
    ) -> Finished:
        """A loop's condition or break_on, a for_each's collection, a router's route:
        evaluated here, answered with orch8.decide."""
        block = sequence.blocks.get(node.block_id or "") or {}
        variables = dict(node.vars)
        if node.kind == "loop":
            variables["iteration"] = node.position
        scope = expression_scope(row.context, outputs_seen_from(progress, node.path), variables)
        names = roots(variables)
        value: Any = None
        error = None
        try:
            if node.kind == "loop":
                value = truthy(evaluate(block[node.phase or "condition"], scope, names))
            elif node.kind == "for_each":
                value = evaluate(block["collection"], scope, names)
                if not isinstance(value, list):
                    error = (
                        f"collection {block['collection']!r} is {json.dumps(value)[:100]}, "
                        "not a list"
                    )
            else:
                for i, route in enumerate(block.get("routes") or []):
                    if truthy(evaluate(route["condition"], scope, names)):
                        value = i
                        break
        except ExpressionError as exc:
            error = str(exc)
        except (KeyError, TypeError) as exc:  # a definition stored before it was checked
            error = f"the block cannot be evaluated: {exc!r}"
        log.info(
            "event=node.decided tenant=%s instance=%s block=%s asking=%s value=%s%s",
            row.tenant_id,
            row.id,
            node.path,
            node.phase,
            json.dumps(value)[:200],
            f" error={error!r}" if error else "",
        )
        return self._call_until_done(
            lambda c: sqlapi.steps.decide(
                c,
                tenant_id=row.tenant_id,
                instance_id=row.id,
                lease_token=row.lease_token,
                path=node.path,
                value=None if error else value,
                error=error,
            )
        )

    def _child(
        self, row: Claimed, sequence: StoredSequence, node: Node, progress: dict[str, Any]
    ) -> Finished:
        """A sub_sequence: start its child (input rendered and checked against the child's
        input_schema here), or collect the child that ended."""
        block = sequence.blocks.get(node.block_id or "") or {}
        child_id = input_ = error = None
        if node.child_instance_id is None:
            try:
                child = self._child_sequence(row, sequence, block)
                input_ = render_params(
                    block.get("input") or {},
                    params_scope(
                        row.context,
                        row.id,
                        node.attempt,
                        outputs_seen_from(progress, node.path),
                        node.vars,
                    ),
                    node.vars,
                )
                if not isinstance(input_, dict):
                    raise TemplateError("input must render to a JSON object")
                child_id = child.id
                error = input_problem(child.definition, input_)
            except (TemplateError, NotFound) as exc:
                error = f"block {node.path!r}: {exc}"
        log.info(
            "event=node.child tenant=%s instance=%s block=%s child=%s%s",
            row.tenant_id,
            row.id,
            node.path,
            node.child_instance_id or "new",
            f" error={error!r}" if error else "",
        )
        return self._call_until_done(
            lambda c: sqlapi.steps.run_child(
                c,
                tenant_id=row.tenant_id,
                instance_id=row.id,
                lease_token=row.lease_token,
                path=node.path,
                sequence_id=child_id,
                input_=None if error else input_,
                error=error,
            )
        )

    def _hand_back(self, row: Claimed) -> None:
        self._call_until_done(
            lambda c: sqlapi.steps.release_lease(
                c,
                tenant_id=row.tenant_id,
                instance_id=row.id,
                lease_token=row.lease_token,
                reason="runner shutting down",
            )
        )

    def _fresh_context(self, row: Claimed) -> Claimed:
        context, version = self._call_until_done(
            lambda c: sqlapi.steps.instance_context(c, tenant_id=row.tenant_id, instance_id=row.id)
        )
        return replace(row, context=context, context_version=version)

    def _input(
        self, row: Claimed, sequence: StoredSequence, node: Node, progress: dict[str, Any]
    ) -> Finished:
        """A wait_for_input: its prompt rendered here (templates are the runner's), then the
        node waits for a person without a lease (orch8.await_input)."""
        block = sequence.blocks.get(node.block_id or "") or {}
        prompt = error = None
        try:
            rendered = render_params(
                {"prompt": block.get("prompt") or ""},
                params_scope(
                    row.context,
                    row.id,
                    node.attempt,
                    outputs_seen_from(progress, node.path),
                    node.vars,
                ),
                node.vars,
            )["prompt"]
            prompt = rendered if isinstance(rendered, str) else json.dumps(rendered)
        except TemplateError as exc:
            error = f"block {node.path!r}: prompt: {exc}"
        log.info(
            "event=node.awaits_input tenant=%s instance=%s block=%s%s",
            row.tenant_id,
            row.id,
            node.path,
            f" error={error!r}" if error else "",
        )
        return self._call_until_done(
            lambda c: sqlapi.steps.await_input(
                c,
                tenant_id=row.tenant_id,
                instance_id=row.id,
                lease_token=row.lease_token,
                path=node.path,
                prompt=prompt,
                error=error,
            )
        )

    def _child_sequence(
        self, row: Claimed, sequence: StoredSequence, block: dict[str, Any]
    ) -> ChildSequence:
        namespace = block.get("namespace") or sequence.namespace
        name = str(block.get("sequence_name"))
        found = self._call_until_done(
            lambda c: sqlapi.sequences.get_sequence(
                c,
                tenant_id=row.tenant_id,
                namespace=namespace,
                name=name,
                version=block.get("version"),
            )
        )
        if found is None:
            version = f" version {block['version']}" if "version" in block else ""
            raise NotFound(f"sequence {namespace}/{name}{version} not found")
        return ChildSequence(found["id"], found["definition"])

    def _handler_of(self, block: dict[str, Any]) -> tuple[Handler | None, str]:
        """The handler a step names, or why this runner cannot run the block (a definition
        stored before the validator refused what it uses, or a handler not loaded here)."""
        block_id = block["id"]
        if block.get("type", "step") != "step":
            return None, f"block {block_id!r}: type {block.get('type')!r} is not supported"
        name = block.get("handler")
        fn = registry.get(name) if isinstance(name, str) else None
        if fn is not None:
            return fn, ""
        if name in self._builtins():
            return None, (
                f"block {block_id!r}: handler {name!r} is a builtin name that orch8-py "
                "does not implement yet (docs/HANDLERS.md lists the ones it does)"
            )
        return None, (
            f"block {block_id!r}: handler {name!r} is neither registered in this runner "
            "(load the module that registers it: --import MODULE or ORCH8_HANDLER_MODULES) "
            "nor served by external workers (orch8 workers register)"
        )

    def _maybe_remote(self, block: dict[str, Any]) -> bool:
        """A step whose handler is a name this runner has not loaded and no builtin: external
        workers may serve it (begin_step looks it up)."""
        name = block.get("handler")
        return (
            block.get("type", "step") == "step"
            and isinstance(name, str)
            and name not in self._builtins()
        )

    def _begin(
        self,
        row: Claimed,
        block_id: str,
        handler: str,
        params: dict[str, Any],
        attempt: int,
        not_runnable: str | None = None,
    ) -> Steps[Outcome]:
        call = BeginCall(
            tenant_id=row.tenant_id,
            instance_id=row.id,
            lease_token=row.lease_token,
            block_id=block_id,
            handler=handler,
            params=params,
            attempt=attempt,
            not_runnable=not_runnable,
        )
        if self.begins is not None:
            return (yield from self._batched(self.begins, call))
        return self._call_until_done(lambda c: sqlapi.steps.begin_step(c, **vars(call)))

    def _finish(
        self,
        row: Claimed,
        block_id: str,
        attempt: int,
        effect_id: uuid.UUID | None,
        call: Invocation,
        retry_in: dt.timedelta | None,
    ) -> Steps[Finished]:
        lost = None
        if effect_id is not None:
            lost = LostReceipt(
                row.tenant_id,
                row.id,
                block_id,
                attempt,
                effect_id,
                call.result,
                call.output,
                call.error,
            )
        finish = FinishCall(
            tenant_id=row.tenant_id,
            instance_id=row.id,
            lease_token=row.lease_token,
            block_id=block_id,
            attempt=attempt,
            effect_id=effect_id,
            result=call.result,
            output=call.output,
            error=call.error,
            retry_in=retry_in,
            error_code=call.code,
        )
        try:
            if self.finishes is not None:
                done = yield from self._batched(self.finishes, finish)
            else:
                done = self._call_until_done(lambda c: sqlapi.steps.finish_step(c, **vars(finish)))
        except LeaseTaken:
            if lost is not None:  # the lease is gone: make sure the receipt is not gone too
                self._keep_lost_receipts([lost], "the lease and the receipt were lost")
            raise
        if lost is not None:
            with self.lock:
                self.recent_effects.append((time.monotonic(), lost))
        return done

    def _keep_lost_receipts(self, items: list[LostReceipt], reason: str) -> None:
        """Record the receipts of these dispatched effects where a failover lost them (a
        claim and begin_step lost together, or begin_step and finish_step), so whoever
        runs the step next finds them and blocks instead of sending again."""
        try:
            answers = self._call_until_done(
                lambda c: sqlapi.steps.keep_lost_receipts(c, items),
                stop_at=time.monotonic() + self.settings.lease,
            )
        except Exception as exc:  # nothing else can record them: say so loudly
            answers = [(i.effect_id, f"not checked: {exc}") for i in items]
        by_id = {i.effect_id: i for i in items}
        for effect_id, outcome in answers:
            item = by_id[effect_id]
            if outcome == "recorded":
                log.error(
                    "event=step.receipt_recovered tenant=%s instance=%s block=%s effect=%s "
                    "reason=%r",
                    item.tenant_id,
                    item.instance_id,
                    item.block_id,
                    effect_id,
                    f"{reason} with the primary",
                )
            else:
                log.error(
                    "event=step.receipt_unrecorded tenant=%s instance=%s block=%s effect=%s "
                    "result=%s output=%r error=%r",
                    item.tenant_id,
                    item.instance_id,
                    item.block_id,
                    effect_id,
                    item.result,
                    str(item.output)[:500],
                    outcome[:200],
                )

    def _recheck_receipts(self) -> None:
        """After an outage: the receipts of the side effects finished shortly before it."""
        with self.lock:
            since, self.recheck_since = self.recheck_since, None
            if since is None:
                return
            items = [lost for at, lost in self.recent_effects if at >= since - RECHECK_WINDOW]
        if items:
            self._keep_lost_receipts(items, "begin_step and finish_step were lost")
        log.info("event=runner.receipts_rechecked count=%d", len(items))

    def _fail(self, row: Claimed, block_id: str, attempt: int, message: str) -> Steps[Finished]:
        """Fail the instance for a reason found before any handler ran (no effect)."""
        call = Invocation("error", {}, message, retryable=False)
        return (yield from self._finish(row, block_id, attempt, None, call, None))

    def _invoke(
        self, inflight: InFlight, call: HandlerCall
    ) -> tuple[Invocation | None, BaseException | None] | None:
        """Run a handler on this thread, racing its deadline: its Invocation (or the
        LeaseLost it raised) for the instance's code, or None if the deadline came first.
        The watchdog then carried the instance on with the timeout (the call may still
        complete: ambiguous, so the receipt becomes unknown) and the result, when the
        handler returns, is dropped."""
        if not self.call_permits.acquire(timeout=max(call.deadline - time.monotonic(), 0)):
            # Every room is taken by calls still running, some past their own timeouts,
            # and this call never started. Nothing was sent, so the receipt is abandoned
            # with that evidence, not left unknown (and no late send can follow the retry).
            log.warning(
                "event=step.not_started handler_threads=%d timeout=%gs",
                self.handler_threads,
                call.timeout,
            )
            evidence = {"not_started": True, "reason": "every handler thread was busy"}
            message = f"did not start within {call.timeout:g}s: every handler thread was busy"
            return Invocation("not_applied", evidence, message, "timeout"), None
        timed_out = Invocation("error", {}, f"timed out after {call.timeout:g}s", "timeout")
        race = self.deadlines.watch(call.deadline, lambda: self._resume(inflight, timed_out))
        got: tuple[Invocation | None, BaseException | None]
        try:
            got = self._call_handler(call.fn, call.params, call.ctx), None
        except LeaseLost as exc:
            got = None, exc
        finally:
            self.call_permits.release()
        if race.finish():
            return got
        log_returned_late(call.ctx)
        return None

    def _call_handler(self, fn: Handler, params: dict[str, Any], ctx: StepContext) -> Invocation:
        """The handler's return or exception as an Invocation (LeaseLost raised)."""
        try:
            output = fn(params, ctx)
        except Exception as exc:
            return failed_call(exc)
        if inspect.isawaitable(output):
            # a callable is_async could not recognise: what it returned never ran
            if inspect.iscoroutine(output):
                output.close()
            message = f"handler {ctx.handler!r} returned an awaitable: declare it async def"
            return Invocation(
                "not_applied", {"not_started": True, "reason": message}, message, retryable=False
            )
        return returned(output)


def log_stranded(row: Claimed) -> None:
    """The runner stopped past its grace period with this instance in flight: its lease
    runs out and another runner takes it on."""
    log.warning("event=instance.stranded tenant=%s instance=%s", row.tenant_id, row.id)


def log_returned_late(ctx: StepContext) -> None:
    """A handler returned after its deadline had taken the call: the result is dropped."""
    log.warning(
        "event=step.returned_late tenant=%s instance=%s block=%s (after its timeout:"
        " its result was not recorded)",
        ctx.tenant_id,
        ctx.instance_id,
        ctx.block_id,
    )


def returned(output: Any) -> Invocation:
    return Invocation("ok", output if output is not None else {})


def failed_call(exc: Exception) -> Invocation:
    """What a handler's exception comes to; a StaleLease (e.g. set_state found the lease
    gone) is raised as LeaseLost."""
    if isinstance(exc, StaleLease):
        raise LeaseLost(str(exc)) from None
    if isinstance(exc, NotApplied):
        return Invocation("not_applied", exc.evidence, str(exc), exc.code, exc.retryable)
    if isinstance(exc, StepError):
        return Invocation("error", {}, str(exc), exc.code, exc.retryable)
    return Invocation("error", {}, f"{type(exc).__name__}: {exc}")


class ChildSequence(NamedTuple):
    """The sequence a sub_sequence's child runs: its id and definition."""

    id: uuid.UUID
    definition: dict[str, Any]


def node_block(sequence: StoredSequence, node: Node) -> dict[str, Any]:
    """The block a step or compensation node runs (orch8.instance_step says the same): a
    compensation is its step's ``compensation`` with the step's id."""
    block = sequence.blocks.get(node.block_id or "") or {"id": node.block_id or node.path}
    if node.kind == "compensation":
        return {**(block.get("compensation") or {}), "id": block.get("id"), "type": "step"}
    return block


def checked_output(call: Invocation, schema: dict[str, Any]) -> Invocation:
    """A successful call whose output breaks the step's output_schema becomes
    invalid_output: it happened, and no retry repairs it."""
    problem = output_problem(schema, call.output)
    if problem is None:
        return call
    return Invocation("invalid_output", call.output, problem, "output_schema", retryable=False)


def batch_fault(name: str, calls: list[Any]) -> None:
    """fault_point for a group-committed batch of more than one call."""
    if len(calls) > 1:
        fault_point(name)


def fault_point(name: str, path: str | None = None) -> None:
    """Test hook: ORCH8_FAULT_POINT=<name> kills this process with SIGKILL right here;
    with ORCH8_FAULT_PATH=<regex>, only at a node whose path matches (a step inside a
    branch, an iteration, a compensation).

    after_dispatch: the receipt is dispatched, the handler has not run.
    before_finish: the handler of a side-effecting step returned, nothing recorded yet.
    before_verdict: a verifier asked the provider, its verdict is not recorded yet.
    begin_batch: a batch of several begin_step calls committed, no thread told yet.
    finish_batch: a batch of several finish_step calls is about to be sent.
    """
    where = os.environ.get("ORCH8_FAULT_PATH")
    if where and not (path and re.search(where, path)):
        return
    if os.environ.get("ORCH8_FAULT_POINT") == name:
        log.warning("event=fault_point name=%s action=SIGKILL", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
