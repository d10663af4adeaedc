"""An external worker: serves handlers (and their verifiers) for orch8 from any process
that can reach the operator service's REST API (docs/WORKERS.md)::

    from orch8_py.worker import Worker, NotApplied

    worker = Worker("http://orch8:8080", api_key, worker_id="billing-1")

    @worker.handler("payments.charge")
    def charge(task):               # task.params, task.effect_id, task.idempotency_key
        ...                         # raise NotApplied(...) when nothing was sent
        return {"provider_receipt_id": "..."}

    worker.run(concurrency=8)       # until SIGTERM or SIGINT

What it guarantees on its side of the protocol:

- it confirms pickup (a first heartbeat) before it calls the handler, so a task it never
  started can be redelivered when its handler is registered ``redeliver_unstarted``;
- it heartbeats every task every lease/3 and never reports a task whose lease it lost
  (a 409, or a lease that ran out while the API was unreachable): another worker or the
  engine owns it then, and its receipt is settled without this worker;
- it repeats a report whose answer was lost (the engine answers a repeat the same);
- it reconnects with backoff (at most ``MAX_BACKOFF`` seconds) when the API is down;
- on SIGTERM or SIGINT it stops polling, finishes the tasks it holds (the poll it is in
  returns within ``poll_wait``) and returns.

A handler raises ``NotApplied`` (with evidence) when it can prove nothing was sent: the
receipt is abandoned and a retry is safe. ``StepError(code=..., retryable=False)``
fails it for good; any other exception is a retryable failure whose receipt becomes
``unknown`` (the step's ambiguity mode decides whether it is retried).
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import httpx

from .steps import Applied, Inconclusive, NotApplied, StepError, call_user, replay_verdict

__all__ = [
    "Applied",
    "Inconclusive",
    "LeaseLost",
    "NotApplied",
    "StepError",
    "Task",
    "Verification",
    "Worker",
    "WorkerError",
    "handler",
]

log = logging.getLogger("orch8.worker")

MAX_BACKOFF = 30.0  # seconds between tries while the API does not answer
DEFAULT_POLL_WAIT = 5.0  # seconds a long-poll waits for a task (the server caps it)


class WorkerError(Exception):
    """The API refused this worker for good (a bad key, a role without the right, an
    invalid poll): polling again would be refused again."""


class LeaseLost(Exception):
    """The task is no longer this worker's (its lease ran out, it was claimed again or it
    timed out): stop, and do not report it."""


@dataclass
class Task:
    """A task this worker holds: what its handler needs."""

    task_id: uuid.UUID
    handler: str
    params: dict[str, Any]
    effect_id: uuid.UUID  # the receipt, dispatched before the task was handed out
    idempotency_key: str  # give this to the provider as its idempotency key
    attempt: int
    claim_epoch: int
    instance_id: uuid.UUID
    block_id: str
    checkpoint: Any  # what an earlier attempt saved (task.heartbeat(checkpoint=...))
    lease_ms: int
    lease_expires_at: float  # time.monotonic() clock
    close_by: dt.datetime
    cancel_requested: bool = False  # set by a heartbeat's answer: finish or fail soon
    lost: bool = False  # the lease is gone: the result will not be reported
    _worker: Worker | None = field(default=None, repr=False)

    def is_lost(self) -> bool:
        """Whether the lease is gone (a heartbeat thread may set it at any time)."""
        return self.lost

    def heartbeat(self, checkpoint: Any = None) -> None:
        """Extend the lease now and, with ``checkpoint``, save it for the step's next
        attempt. Raises LeaseLost when the task is no longer this worker's."""
        if self._worker is None:
            raise RuntimeError("this task is not held by a worker")
        self._worker.beat(self, {"checkpoint": checkpoint} if checkpoint is not None else {})
        if self.is_lost():
            raise LeaseLost(f"task {self.task_id} is no longer held by this worker")


@dataclass
class Verification:
    """A verifier try this worker claimed: settle ``effect_id``, whose outcome is unknown.
    ``method`` handler: the handler's verifier answers; replay: the handler is called
    again with the same idempotency key (steps whose provider deduplicates)."""

    effect_id: uuid.UUID
    method: str
    claim_token: uuid.UUID
    handler: str
    params: dict[str, Any]  # as they were dispatched
    idempotency_key: str
    attempt: int
    instance_id: uuid.UUID
    block_id: str
    receipt: dict[str, Any]
    try_number: int
    tries: int


Handler = Callable[[Task], Any]
VerifierFn = Callable[[Verification], Any]


class Registered:
    """A handler, callable as the function itself, with ``.verifier`` to register how to
    settle its unknown outcomes (steps with ``verify: {"handler": true}``)."""

    def __init__(self, name: str, fn: Handler, verifiers: dict[str, VerifierFn]):
        self.name, self.fn, self._verifiers = name, fn, verifiers
        self.__doc__ = fn.__doc__

    def __call__(self, task: Task) -> Any:
        return self.fn(task)

    def verifier(self, fn: VerifierFn) -> VerifierFn:
        """fn(verification) -> Applied | NotApplied | Inconclusive (raising NotApplied
        works too; any other exception is inconclusive)."""
        self._verifiers[self.name] = fn
        return fn


_HANDLERS: dict[str, Handler] = {}
_VERIFIERS: dict[str, VerifierFn] = {}


def handler(name: str) -> Callable[[Handler], Registered]:
    """Register a handler for every Worker of this process (what `orch8 worker --import
    module` serves)."""
    return _registrar(name, _HANDLERS, _VERIFIERS)


def _registrar(
    name: str, handlers: dict[str, Handler], verifiers: dict[str, VerifierFn]
) -> Callable[[Handler], Registered]:
    if not name or not isinstance(name, str):
        raise ValueError("a handler needs a non-empty name")

    def register(fn: Handler) -> Registered:
        handlers[name] = fn
        return Registered(name, fn, verifiers)

    return register


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        worker_id: str | None = None,
        *,
        queue: str | None = None,
        lease: float = 30.0,
        poll_wait: float = DEFAULT_POLL_WAIT,
        grace: float = 60.0,
    ):
        if lease < 3:
            raise ValueError("lease must be at least 3 seconds (a heartbeat every lease/3)")
        self.base_url = base_url.rstrip("/") + "/api/v1"
        self.api_key = api_key
        self.worker_id = worker_id or default_worker_id()
        self.queue = queue
        self.lease = lease
        self.poll_wait = poll_wait
        self.grace = grace  # seconds run() waits for held tasks after a stop
        self.handlers: dict[str, Handler] = {}
        self.verifiers: dict[str, VerifierFn] = {}
        self.held: dict[uuid.UUID, Task] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.failure: str | None = None  # why run() ended, when the API refused us for good
        self.completed = self.failed = self.dropped = 0
        self._local = threading.local()

    # --- registration -----------------------------------------------------------------

    def handler(self, name: str) -> Callable[[Handler], Registered]:
        """Register a handler on this worker."""
        return _registrar(name, self.handlers, self.verifiers)

    def _all_handlers(self) -> dict[str, Handler]:
        return {**_HANDLERS, **self.handlers}

    def _all_verifiers(self) -> dict[str, VerifierFn]:
        return {**_VERIFIERS, **self.verifiers}

    # --- HTTP -------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(
                headers={"Authorization": f"Bearer {self.api_key}"},
                timeout=httpx.Timeout(10.0, read=self.poll_wait + 20.0),
            )
            self._local.client = client
        return client

    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self._client().post(self.base_url + path, json=body)

    # --- the loops --------------------------------------------------------------------

    def stop(self) -> None:
        """Stop polling; run() returns once the held tasks are done."""
        self.stopping.set()

    def run(self, concurrency: int = 8, *, install_signals: bool = True) -> None:
        """Poll and run tasks until stop() (or SIGTERM/SIGINT when ``install_signals``)."""
        if not self._all_handlers():
            raise WorkerError("no handler is registered on this worker")
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        log.info(
            "event=worker.start worker=%s handlers=%s verifiers=%s concurrency=%d lease=%gs",
            self.worker_id,
            ",".join(sorted(self._all_handlers())),
            ",".join(sorted(self._all_verifiers())) or "-",
            concurrency,
            self.lease,
        )
        pool = cf.ThreadPoolExecutor(concurrency, thread_name_prefix="task")
        slots = threading.BoundedSemaphore(concurrency)
        beats = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        beats.start()
        backoff = 0.5
        try:
            while not self.stopping.is_set():
                free = _acquire_all(slots, concurrency)
                if not free:
                    if slots.acquire(timeout=0.5):  # wait for a slot, then count them again
                        slots.release()
                    continue
                try:
                    tasks, tries = self._poll(free)
                    backoff = 0.5
                except WorkerError as exc:
                    self.failure = str(exc)
                    log.error("event=worker.refused error=%r", self.failure)
                    _release(slots, free)
                    break
                except (httpx.HTTPError, _Unavailable) as exc:
                    _release(slots, free)
                    wait = backoff * random.uniform(0.5, 1.0)
                    log.warning("event=worker.api_down error=%r retry_in=%.1fs", str(exc), wait)
                    self.stopping.wait(wait)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                _release(slots, free - len(tasks) - len(tries))
                for task in tasks:
                    pool.submit(self._run_task, task).add_done_callback(lambda _f: slots.release())
                for verification in tries:
                    pool.submit(self._verify, verification).add_done_callback(
                        lambda _f: slots.release()
                    )
        finally:
            self.stopping.set()
            pool.shutdown(wait=False)
            deadline = time.monotonic() + self.grace
            while self.held and time.monotonic() < deadline:
                time.sleep(0.1)
            if self.held:
                log.warning("event=worker.stop_with_tasks held=%d", len(self.held))
            log.info(
                "event=worker.stop worker=%s completed=%d failed=%d dropped=%d",
                self.worker_id,
                self.completed,
                self.failed,
                self.dropped,
            )

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        log.info("event=worker.signal signal=%s", signal.Signals(signum).name)
        self.stop()

    def _poll(self, free: int) -> tuple[list[Task], list[Verification]]:
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "handlers": sorted(self._all_handlers()),
            "max_tasks": free,
            "wait_ms": int(self.poll_wait * 1000),
            "lease_ms": int(self.lease * 1000),
        }
        if self._all_verifiers():
            body["verifiers"] = sorted(self._all_verifiers())
        if self.queue:
            body["queue"] = self.queue
        sent = time.monotonic()
        resp = self._post("/workers/tasks/poll", body)
        if resp.status_code in (401, 403, 404, 422):
            raise WorkerError(f"the API refused the poll ({resp.status_code}): {_detail(resp)}")
        if resp.status_code != 200:
            raise _Unavailable(f"poll answered {resp.status_code}: {_detail(resp)}")
        answer = resp.json()
        tasks = [self._task(t, sent) for t in answer["tasks"]]
        tries = [_verification(v) for v in answer["verifications"]]
        with self.lock:
            for task in tasks:
                self.held[task.task_id] = task
        return tasks, tries

    def _task(self, raw: dict[str, Any], sent: float) -> Task:
        # the lease counted from when the poll was sent: never later than the server's
        return Task(
            task_id=uuid.UUID(raw["task_id"]),
            handler=raw["handler"],
            params=raw["params"],
            effect_id=uuid.UUID(raw["effect_id"]),
            idempotency_key=raw["idempotency_key"],
            attempt=raw["attempt"],
            claim_epoch=raw["claim_epoch"],
            instance_id=uuid.UUID(raw["instance_id"]),
            block_id=raw["block_id"],
            checkpoint=raw.get("checkpoint"),
            lease_ms=raw["lease_ms"],
            lease_expires_at=sent + raw["lease_ms"] / 1000,
            close_by=dt.datetime.fromisoformat(raw["close_by"].replace("Z", "+00:00")),
            _worker=self,
        )

    # --- one task ---------------------------------------------------------------------

    def _run_task(self, task: Task) -> None:
        where = f"task={task.task_id} handler={task.handler} attempt={task.attempt}"
        try:
            self.beat(task, {})  # confirm pickup before anything can be sent
            if task.lost:
                self._count("dropped")
                log.warning("event=task.not_started %s reason=lease_lost", where)
                return
            fn = self._all_handlers().get(task.handler)
            report: tuple[str, dict[str, Any]]
            if fn is None:  # the poll names only our handlers: a registry changed under us
                report = ("fail", _failure("no handler registered", None, False, None))
            else:
                report = self._call(fn, task)
            if task.is_lost():
                self._count("dropped")
                log.warning("event=task.result_dropped %s reason=lease_lost", where)
                return
            self._report(task, *report)
        except Exception:
            log.exception("event=task.error %s", where)
        finally:
            with self.lock:
                self.held.pop(task.task_id, None)

    def _call(self, fn: Handler, task: Task) -> tuple[str, dict[str, Any]]:
        try:
            output = call_user(fn, task)
            return "complete", {"output": output if output is not None else {}}
        except LeaseLost:
            task.lost = True
            return "fail", {}
        except NotApplied as exc:
            return "fail", _failure(str(exc), exc.code, exc.retryable, exc.evidence)
        except StepError as exc:
            return "fail", _failure(str(exc), exc.code, exc.retryable, None)
        except Exception as exc:
            return "fail", _failure(f"{type(exc).__name__}: {exc}", None, True, None)

    def _report(self, task: Task, what: str, body: dict[str, Any]) -> None:
        """complete or fail, repeated across a lost API until the lease runs out (the
        engine answers a repeat the same)."""
        body = {"worker_id": self.worker_id, "claim_epoch": task.claim_epoch, **body}
        backoff = 0.2
        while True:
            try:
                resp = self._post(f"/workers/tasks/{task.task_id}/{what}", body)
                if resp.status_code == 200:
                    answer = resp.json()
                    self._count("completed" if what == "complete" else "failed")
                    log.info(
                        "event=task.reported task=%s handler=%s report=%s instance_state=%s%s",
                        task.task_id,
                        task.handler,
                        what,
                        answer.get("instance_state"),
                        f" error={body.get('error')!r}" if what == "fail" else "",
                    )
                    return
                if resp.status_code in (404, 409):
                    task.lost = True
                    self._count("dropped")
                    log.warning(
                        "event=task.report_refused task=%s status=%d detail=%r",
                        task.task_id,
                        resp.status_code,
                        _detail(resp),
                    )
                    return
                if resp.status_code < 500:
                    log.error(
                        "event=task.report_invalid task=%s status=%d detail=%r",
                        task.task_id,
                        resp.status_code,
                        _detail(resp),
                    )
                    return
            except httpx.HTTPError as exc:
                log.warning("event=task.report_retry task=%s error=%r", task.task_id, str(exc))
            if time.monotonic() > task.lease_expires_at:
                task.lost = True
                self._count("dropped")
                log.warning("event=task.report_gave_up task=%s reason=lease_ran_out", task.task_id)
                return
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    # --- heartbeats -------------------------------------------------------------------

    def _heartbeats(self) -> None:
        interval = self.lease / 3
        while not (self.stopping.is_set() and not self.held):
            time.sleep(min(interval, 0.5) if self.stopping.is_set() else interval / 3)
            with self.lock:
                due = [
                    t
                    for t in self.held.values()
                    if not t.lost and t.lease_expires_at - time.monotonic() < 2 * interval
                ]
            for task in due:
                self.beat(task, {})

    def beat(self, task: Task, extra: dict[str, Any]) -> None:
        """One heartbeat; marks the task lost on a 409 or when its lease has run out."""
        if task.lost:
            return
        sent = time.monotonic()
        body = {"worker_id": self.worker_id, "claim_epoch": task.claim_epoch, **extra}
        try:
            resp = self._post(f"/workers/tasks/{task.task_id}/heartbeat", body)
        except httpx.HTTPError as exc:
            log.warning("event=task.heartbeat_failed task=%s error=%r", task.task_id, str(exc))
            if time.monotonic() > task.lease_expires_at:
                task.lost = True
            return
        if resp.status_code == 200:
            answer = resp.json()
            task.lease_expires_at = sent + task.lease_ms / 1000
            if answer.get("cancel_requested") and not task.cancel_requested:
                task.cancel_requested = True
                log.info("event=task.cancel_requested task=%s", task.task_id)
        elif resp.status_code in (404, 409):
            task.lost = True
            log.warning(
                "event=task.lease_lost task=%s status=%d detail=%r",
                task.task_id,
                resp.status_code,
                _detail(resp),
            )
        elif time.monotonic() > task.lease_expires_at:
            task.lost = True

    # --- verifier tries ---------------------------------------------------------------

    def _verify(self, verification: Verification) -> None:
        verdict: Any
        fn = self._all_verifiers().get(verification.handler)
        try:
            if verification.method == "replay":
                verdict = self._replay(verification)
            elif fn is None:
                verdict = Inconclusive("no verifier registered")
            else:
                verdict = call_user(fn, verification)
        except NotApplied as exc:
            verdict = exc
        except Exception as exc:
            verdict = Inconclusive(f"{type(exc).__name__}: {exc}")
        body: dict[str, Any] = {
            "worker_id": self.worker_id,
            "claim_token": str(verification.claim_token),
        }
        if isinstance(verdict, Applied):
            body |= {"verdict": "applied", "evidence": verdict.evidence}
            if verdict.provider_receipt_id:
                body["provider_receipt_id"] = verdict.provider_receipt_id
            if verdict.output is not None:
                body["output"] = verdict.output
        elif isinstance(verdict, NotApplied):
            body |= {"verdict": "not_applied", "evidence": verdict.evidence}
        elif isinstance(verdict, Inconclusive):
            body |= {"verdict": "inconclusive", "evidence": {"reason": verdict.reason}}
            body["evidence"] |= verdict.evidence
        else:
            body |= {
                "verdict": "inconclusive",
                "evidence": {"reason": f"the verifier returned {type(verdict).__name__}"},
            }
        try:
            resp = self._post(f"/workers/verifications/{verification.effect_id}/verdict", body)
            log.info(
                "event=verify.reported effect=%s verdict=%s status=%d detail=%r",
                verification.effect_id,
                body["verdict"],
                resp.status_code,
                resp.json().get("detail") if resp.status_code in (200, 409) else _detail(resp),
            )
        except httpx.HTTPError as exc:  # the try's lease runs out and it is tried again
            log.warning(
                "event=verify.report_failed effect=%s error=%r", verification.effect_id, exc
            )

    def _replay(self, v: Verification) -> Any:
        """The handler called again with the same params and idempotency key
        (steps.replay_verdict says what its answer means)."""
        fn = self._all_handlers().get(v.handler)
        if fn is None:
            return Inconclusive(f"handler {v.handler!r} is not registered here")
        task = Task(
            task_id=v.effect_id,
            handler=v.handler,
            params=v.params,
            effect_id=v.effect_id,
            idempotency_key=v.idempotency_key,
            attempt=v.attempt,
            claim_epoch=0,
            instance_id=v.instance_id,
            block_id=v.block_id,
            checkpoint=None,
            lease_ms=0,
            lease_expires_at=0.0,
            close_by=dt.datetime.now(dt.UTC),
        )
        return replay_verdict(lambda: call_user(fn, task), v.idempotency_key)


class _Unavailable(Exception):
    """The API answered, but not now (5xx): try again later."""


def _failure(
    error: str, code: str | None, retryable: bool, evidence: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"error": error[:10000] or "failed", "retryable": retryable}
    if code:
        body["code"] = code[:100]
    if evidence:
        body |= {"not_applied": True, "evidence": evidence}
    return body


def _verification(raw: dict[str, Any]) -> Verification:
    return Verification(
        effect_id=uuid.UUID(raw["effect_id"]),
        method=raw["method"],
        claim_token=uuid.UUID(raw["claim_token"]),
        handler=raw["handler"],
        params=raw["params"],
        idempotency_key=raw["idempotency_key"],
        attempt=raw["attempt"],
        instance_id=uuid.UUID(raw["instance_id"]),
        block_id=raw["block_id"],
        receipt=raw["receipt"],
        try_number=raw["try_number"],
        tries=raw["tries"],
    )


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("detail") or body.get("title") or body)[:300]
    except ValueError:
        return resp.text[:300]


def _acquire_all(slots: threading.BoundedSemaphore, most: int) -> int:
    """Take every free slot at once (without waiting): how many were taken."""
    taken = 0
    while taken < most and slots.acquire(blocking=False):
        taken += 1
    return taken


def _release(slots: threading.BoundedSemaphore, n: int) -> None:
    for _ in range(n):
        slots.release()
