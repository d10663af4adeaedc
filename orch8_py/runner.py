"""The engine runner: claims due instances in batches and runs their steps.

Per claim (one round trip for the batch) the runner gets each instance's context and
progress; per step it makes at most two calls: ``begin_step`` (side-effecting handlers
only) and ``finish_step``. All state lives in PostgreSQL; the runner holds leases, and
every write it makes carries the lease token, so a runner that lost its lease is
refused (StaleLease) and stops quietly.

Threads: the claim loop (the caller's), a pool of ``concurrency`` instance workers, a
pool for handler calls (so a step can time out), a heartbeat thread extending the
leases of in-flight instances, and a listener that wakes the claim loop on
NOTIFY orch8_work (polling every ``poll_interval`` stays as the fallback).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from . import handlers as registry
from . import metrics
from .errors import StaleLease
from .handlers import NotApplied, StepContext, StepError
from .retry import RetryPolicy
from .templates import TemplateError, render

log = logging.getLogger("orch8.runner")

MAX_BACKOFF = 5.0
DEFAULT_STEP_TIMEOUT = 300.0
CONNECTION_ERRORS = (psycopg.OperationalError, PoolTimeout)


@dataclass
class Settings:
    concurrency: int = 8
    lease: float = 30.0
    heartbeat: float = 10.0
    poll_interval: float = 0.1
    grace: float = 30.0
    webhooks: bool = True  # also deliver the webhook outbox from this process
    worker_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )


class LeaseLost(Exception):
    """Internal: the instance is no longer ours; stop working on it."""


def attempt_for(progress: dict, block_id: str) -> int:
    """compute_attempt, from the progress the claim returned."""
    last = progress.get(block_id)
    if last is None:
        return 0
    return last["attempt"] if last["sentinel"] == "__in_progress__" else last["attempt"] + 1


class Runner:
    def __init__(self, url: str, settings: Settings | None = None, **overrides: Any):
        self.url = url
        self.settings = settings or Settings(**overrides)
        s = self.settings
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=s.concurrency + 2,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": 5},
            timeout=10,
            name="orch8-runner",
        )
        self.wake = threading.Event()
        self.draining = threading.Event()
        self.stranded = 0  # steps still running when the grace period ended
        self.inflight: dict[uuid.UUID, dict] = {}  # lease token -> claimed row
        self.lock = threading.Lock()
        self.definitions: dict[tuple[str, uuid.UUID], dict] = {}
        self.pure_handlers: set[str] | None = None
        self.builtin_names: set[str] = set()  # every name in orch8.builtin_handlers
        # Twice the instance threads: a handler that overran its timeout keeps its thread
        # (Python cannot kill one), and the spare threads keep steps flowing meanwhile.
        self.handler_threads = s.concurrency * 2
        self.handler_pool = cf.ThreadPoolExecutor(
            self.handler_threads, thread_name_prefix="handler"
        )
        self.round_trips = 0  # database calls made on the step path (counted for the bench)
        self.ticks = 0
        self.steps_run = 0

    # --- database calls -------------------------------------------------------------

    def _call(self, sql: str, args: tuple, *, fetch: str = "one") -> Any:
        with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            with self.lock:
                self.round_trips += 1
            cur.execute(sql, args)
            return cur.fetchone() if fetch == "one" else cur.fetchall()

    def _call_until_done(self, sql: str, args: tuple, stop_at: float | None = None) -> Any:
        """Repeat a call across connection loss. begin_step and finish_step are safe to
        repeat under the same lease; a lost lease surfaces as LeaseLost."""
        backoff = 0.1
        while True:
            try:
                return self._call(sql, args)
            except PoolClosed:
                # The runner stopped while this step outlived the grace period: its lease
                # runs out and the next runner settles the receipt. Retrying would never end.
                raise LeaseLost("the runner stopped before the step finished") from None
            except psycopg.Error as exc:
                if getattr(exc, "sqlstate", None) == StaleLease.sqlstate:
                    raise LeaseLost(str(exc)) from None
                if not isinstance(exc, psycopg.OperationalError):
                    raise
                reason = exc
            except PoolTimeout as exc:
                reason = exc
            if stop_at is not None and time.monotonic() > stop_at:
                raise LeaseLost(f"gave up after connection loss: {reason}")
            log.warning("event=runner.db_retry error=%r retry_in=%.1fs", str(reason)[:200], backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _load_pure_handlers(self) -> set[str]:
        if self.pure_handlers is None:
            rows = self._call(
                "SELECT name, has_side_effects FROM orch8.builtin_handlers", (), fetch="all"
            )
            self.builtin_names = {r["name"] for r in rows}
            self.pure_handlers = {r["name"] for r in rows if not r["has_side_effects"]}
        return self.pure_handlers

    def definition(self, tenant: str, sequence_id: uuid.UUID) -> dict:
        key = (tenant, sequence_id)
        if key not in self.definitions:  # sequences are immutable: cache forever
            row = self._call_until_done(
                "SELECT definition FROM orch8.sequences WHERE tenant_id = %s AND id = %s",
                (tenant, sequence_id),
            )
            self.definitions[key] = row["definition"]
        return self.definitions[key]

    def claim(self, n: int) -> list[dict]:
        return self._call(
            "SELECT * FROM orch8.claim_work(%s, %s, make_interval(secs => %s))",
            (self.settings.worker_id, n, self.settings.lease),
            fetch="all",
        )

    # --- the loops ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        log.info(
            "event=runner.start worker=%s concurrency=%d lease=%gs heartbeat=%gs",
            s.worker_id,
            s.concurrency,
            s.lease,
            s.heartbeat,
        )
        self.pool.open(wait=False)
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
        for t in helpers:
            t.start()
        workers = cf.ThreadPoolExecutor(s.concurrency, thread_name_prefix="instance")
        futures: set[cf.Future] = set()
        backoff = 0.1
        while not stop.is_set():
            self.ticks += 1
            futures = {f for f in futures if not f.done()}
            # Keep up to two batches claimed: the running one and one queued behind it
            # (leased and heartbeated), and claim only when at least a batch is free, so a
            # busy runner claims many instances per round trip instead of one at a time.
            outstanding = len(futures)
            free = 2 * s.concurrency - outstanding if outstanding <= s.concurrency else 0
            claimed: list[dict] = []
            if free > 0:
                try:
                    if self.pure_handlers is None:
                        self._load_pure_handlers()
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
            for row in claimed:
                with self.lock:
                    self.inflight[row["lease_token"]] = row
                future = workers.submit(self._run_instance, row)
                future.add_done_callback(lambda _f: self.wake.set())  # a slot is free
                futures.add(future)
            if claimed and len(claimed) == free:
                continue  # more may be due: claim again at once
            self.wake.wait(s.poll_interval)
            self.wake.clear()
        self._drain(workers, futures)
        stop.set()
        for t in helpers:
            t.join(timeout=5)
        if deliverer is not None:
            deliverer.close()
        self.handler_pool.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
        log.info("event=runner.stop ticks=%d steps=%d", self.ticks, self.steps_run)

    def _drain(self, workers: cf.ThreadPoolExecutor, futures: set[cf.Future]) -> None:
        """Finish in-flight steps within the grace period; instances between steps hand
        their lease back (``_run_instance`` checks ``draining``)."""
        self.draining.set()
        pending = {f for f in futures if not f.done()}
        log.info("event=runner.drain in_flight=%d grace=%.0fs", len(pending), self.settings.grace)
        _done, not_done = cf.wait(pending, timeout=self.settings.grace)
        self.stranded = len(not_done)
        if not_done:
            log.warning(
                "event=runner.drain_timeout still_running=%d (their leases will expire)",
                len(not_done),
            )
        workers.shutdown(wait=False, cancel_futures=True)

    def _listen(self, stop: threading.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute("LISTEN orch8_work")
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
            try:
                rows = self._call(
                    "SELECT orch8.heartbeat_leases(%s, make_interval(secs => %s)) AS token",
                    (tokens, self.settings.lease),
                    fetch="all",
                )
            except CONNECTION_ERRORS as exc:
                log.warning("event=runner.heartbeat_failed error=%r", str(exc)[:200])
                continue
            held = {r["token"] for r in rows}
            with self.lock:
                # an instance that completed or was handed back meanwhile is not lost
                lost = [t for t in tokens if t not in held and t in self.inflight]
            for token in lost:
                log.warning("event=runner.lease_lost token=%s", token)

    # --- one instance ---------------------------------------------------------------

    def _run_instance(self, row: dict) -> None:
        token = row["lease_token"]
        try:
            self._steps(row)
        except LeaseLost as exc:
            metrics.lease_lost()
            log.info(
                "event=instance.lease_lost tenant=%s instance=%s reason=%r",
                row["tenant_id"],
                row["id"],
                str(exc)[:200],
            )
        except Exception:
            log.exception(
                "event=instance.runner_error tenant=%s instance=%s", row["tenant_id"], row["id"]
            )
        finally:
            with self.lock:
                self.inflight.pop(token, None)

    def _fail(self, row: dict, block_id: str, attempt: int, message: str) -> None:
        """Fail the instance for a reason found before any handler ran (no effect)."""
        self._finish(row, block_id, attempt, None, "error", {}, error=message)

    def _finish(
        self,
        row,
        block_id,
        attempt,
        effect_id,
        result,
        output,
        *,
        error=None,
        retry_in=None,
        next_block=None,
    ) -> str:
        got = self._call_until_done(
            "SELECT orch8.finish_step(%s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " make_interval(secs => %s), %s)::text AS state",
            (
                row["tenant_id"],
                row["id"],
                row["lease_token"],
                block_id,
                attempt,
                effect_id,
                result,
                Jsonb(output),
                error,
                retry_in,
                next_block,
            ),
        )
        return got["state"]

    def _steps(self, row: dict) -> None:
        tenant, instance = row["tenant_id"], row["id"]
        definition = self.definition(tenant, row["sequence_id"])
        blocks = definition.get("blocks") or []
        ids = [b.get("id") for b in blocks]
        progress = row["progress"] or {}
        outputs = {k: v.get("output") for k, v in progress.items()}
        index = ids.index(row["current_block"]) if row["current_block"] in ids else 0
        while index < len(blocks):
            if self.draining.is_set():
                self._call_until_done(
                    "SELECT orch8.release_lease(%s, %s, %s, NULL, 'runner shutting down')",
                    (tenant, instance, row["lease_token"]),
                )
                return
            block = blocks[index]
            block_id = block["id"]
            attempt = attempt_for(progress, block_id)
            next_block = ids[index + 1] if index + 1 < len(ids) else None
            state, output = self._step(row, block, attempt, outputs, next_block)
            if state != "running":
                return
            outputs[block_id] = output
            progress[block_id] = {"attempt": attempt, "sentinel": None, "output": output}
            index += 1

    def _step(self, row, block, attempt, outputs, next_block) -> tuple[str, Any]:
        tenant, instance = row["tenant_id"], row["id"]
        block_id = block["id"]
        where = f"tenant={tenant} instance={instance} block={block_id} attempt={attempt}"
        if block.get("type", "step") != "step":
            msg = f"block {block_id!r}: type {block.get('type')!r} is not supported by this runner"
            return self._fail(row, block_id, attempt, msg), None
        name = block.get("handler")
        fn = registry.get(name) if name else None
        if fn is None:
            self._load_pure_handlers()
            if name in self.builtin_names:
                msg = (
                    f"block {block_id!r}: handler {name!r} is a builtin name that orch8-py "
                    "does not implement yet (docs/HANDLERS.md lists the ones it does)"
                )
            else:
                msg = (
                    f"block {block_id!r}: handler {name!r} is not registered in this runner "
                    "(load the module that registers it: --import MODULE or "
                    "ORCH8_HANDLER_MODULES)"
                )
            log.warning("event=step.unknown_handler %s handler=%s", where, name)
            return self._fail(row, block_id, attempt, msg), None
        context = row["context"]
        scope = {
            "data": context.get("data", {}),
            "config": context.get("config", {}),
            "outputs": outputs,
            "instance_id": str(instance),
            "runtime": {**context.get("runtime", {}), "attempt": attempt},
        }
        try:
            params = render(block.get("params") or {}, scope)
        except TemplateError as exc:
            return self._fail(row, block_id, attempt, f"block {block_id!r}: {exc}"), None

        effect_id = None
        if name not in self._load_pure_handlers():
            began = self._call_until_done(
                "SELECT * FROM orch8.begin_step(%s, %s, %s, %s, %s, %s, %s)",
                (tenant, instance, row["lease_token"], block_id, name, Jsonb(params), attempt),
            )
            if began["outcome"] == "stopped":  # paused or cancelled by an operator
                log.info("event=step.stopped %s state=%s", where, began["detail"])
                return began["detail"], None
            if began["outcome"] is not None and began["outcome"] != "dispatched":
                log.warning(
                    "event=step.refused %s outcome=%s effect=%s state=%s detail=%r",
                    where,
                    began["outcome"],
                    began["effect_id"],
                    began["state"],
                    began["detail"],
                )
                return "failed", None
            effect_id = began["effect_id"]
            fault_point("after_dispatch")

        timeout = float(block.get("timeout", DEFAULT_STEP_TIMEOUT * 1000)) / 1000
        ctx = StepContext(
            tenant_id=tenant,
            instance_id=instance,
            block_id=block_id,
            attempt=attempt,
            handler=name,
            effect_id=effect_id,
            context=context,
            outputs=outputs,
            timeout=timeout,
            state=self._state_store(row),
        )
        metrics.step_started(name, effect_id is not None)
        started = time.monotonic()
        result, output, error, code, retryable = self._invoke(fn, params, ctx, timeout)
        with self.lock:
            self.steps_run += 1
        if effect_id is not None:
            fault_point("before_finish")
        retry_in = None
        if result != "ok":
            delay = RetryPolicy.from_block(block).next_delay(
                attempt, retryable=retryable, code=code
            )
            retry_in = delay.total_seconds() if delay is not None else None
        state = self._finish(
            row,
            block_id,
            attempt,
            effect_id,
            result,
            output,
            error=error,
            retry_in=retry_in,
            next_block=next_block,
        )
        metrics.step_finished(name, result, state, time.monotonic() - started)
        log.info(
            "event=step.done %s handler=%s effect=%s result=%s state=%s ms=%d%s",
            where,
            name,
            effect_id,
            result,
            state,
            (time.monotonic() - started) * 1000,
            f" error={error!r}" if error else "",
        )
        return state, output

    def _invoke(self, fn: Callable, params: dict, ctx: StepContext, timeout: float):
        """Run a handler with its timeout: (result, output, error, code, retryable)."""
        future = self.handler_pool.submit(fn, params, ctx)
        try:
            output = future.result(timeout=timeout)
            return "ok", output if output is not None else {}, None, None, True
        except cf.TimeoutError:
            if future.cancel():
                # Every handler thread is still busy with calls that overran their own
                # timeouts, and this call never started. Cancelled, it never will: nothing
                # was sent, so the receipt is abandoned with that evidence, not left unknown
                # (and no late send can follow the retry).
                log.warning(
                    "event=step.not_started handler_threads=%d timeout=%gs",
                    self.handler_threads,
                    timeout,
                )
                evidence = {"not_started": True, "reason": "every handler thread was busy"}
                message = f"did not start within {timeout:g}s: every handler thread was busy"
                return "not_applied", evidence, message, "timeout", True
            # the call may still complete: ambiguous, so the receipt becomes unknown
            return "error", {}, f"timed out after {timeout:g}s", "timeout", True
        except StaleLease as exc:  # e.g. set_state found the lease gone
            raise LeaseLost(str(exc)) from None
        except NotApplied as exc:
            return "not_applied", exc.evidence, str(exc), exc.code, exc.retryable
        except StepError as exc:
            return "error", {}, str(exc), exc.code, exc.retryable
        except Exception as exc:
            return "error", {}, f"{type(exc).__name__}: {exc}", None, True

    def _state_store(self, row: dict):
        builtin = _builtin_module()
        store = getattr(builtin, "SqlInstanceState", None) if builtin else None
        if store is None:
            return None
        return store(self.pool.connection, row["tenant_id"], row["id"], row["lease_token"])


def _builtin_module():
    try:
        from .handlers import builtin
    except ImportError:
        return None
    return builtin


def fault_point(name: str) -> None:
    """Test hook: ORCH8_FAULT_POINT=<name> kills this process with SIGKILL right here.

    after_dispatch: the receipt is dispatched, the handler has not run.
    before_finish: the handler of a side-effecting step returned, nothing recorded yet.
    """
    if os.environ.get("ORCH8_FAULT_POINT") == name:
        log.warning("event=fault_point name=%s action=SIGKILL", name)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
