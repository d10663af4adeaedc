"""The verifier loop: settles unknown receipts whose step declares ``verify``.

It runs beside the claim loop in every runner (``Settings.verifiers``). It claims a few
due verifications at a time (orch8.claim_verifications: SKIP LOCKED and a lease that
outlasts the try, so two runners never verify one receipt at once) and, for each on its
own thread, re-renders the
step's params exactly as they were sent and check them against the receipt's request
hash, ask the provider, and record the verdict (orch8.record_verification), which
settles the receipt and moves the instance on as the step says. The three ways:

* ``http``: a lookup request rendered from ``verify.http`` over the receipt
  (``{{ effect.idempotency_key }}``, ``{{ params.url }}``...); ``applied_if`` and
  ``not_applied_if`` are expressions over ``response`` (the lookup's output, shaped as
  http_request's), ``effect`` and ``params``. Neither true: inconclusive.
* ``replay``: the step's own handler called again with the same params and the same
  idempotency key (only for ``provider_idempotency`` steps: the provider deduplicates).
  Its output is the step's output; a definitive refusal is not applied; anything else
  is inconclusive.
* ``handler``: the Python verifier registered beside the step's handler
  (``@charge.verifier``), returning Applied, NotApplied or Inconclusive.

A call that raises, times out or cannot be rendered is inconclusive: the receipt stays
``unknown``, and the schedule decides when to try again or to escalate.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from . import db, expression, handlers, rules, sqlapi
from .handlers import http as _http
from .scope import outputs_seen_from
from .settlement import derive_output
from .sqlapi.base import Conn
from .sqlapi.effects import VerificationClaim
from .steps import (
    Applied,
    EffectReceipt,
    Inconclusive,
    NotApplied,
    StepContext,
    StepError,
    Verdict,
    call_user,
    replay_verdict,
)
from .templates import VERIFY, TemplateError, params_as_sent, render

log = logging.getLogger("orch8.verifier")

ALL_ANSWERS = {f"{c}xx": _http.APPLIED for c in range(1, 6)}  # a lookup judges every status


class Verifier:
    def __init__(
        self,
        call: Callable[[Callable[[Conn], Any]], Any],
        worker_id: str,
        *,
        interval: float = 0.5,
        lease_margin: float = 10.0,
        batch: int = 4,
        fault: Callable[[str], None] = lambda name: None,
    ):
        self.call = call  # runs a door call on a pooled connection (the runner's)
        self.worker_id = worker_id
        self.interval = interval
        self.lease_margin = lease_margin  # a try's lease outlasts its timeout by this much
        self.fault = fault
        self.batch = batch  # tries claimed and run at once
        self.settled = 0  # verdicts recorded
        self.lock = threading.Lock()
        self.workers = cf.ThreadPoolExecutor(batch, thread_name_prefix="verify")
        # twice as many: a call that overran its timeout keeps its thread (Python cannot
        # kill it), and the next tries still get one
        self.pool = cf.ThreadPoolExecutor(2 * batch, thread_name_prefix="verify-call")

    def run(self, stop: threading.Event) -> None:
        log.info("event=verifier.start worker=%s interval=%gs", self.worker_id, self.interval)
        while not stop.is_set():
            try:
                busy = self.once()
            except db.CONNECTION_LOST as exc:  # a read-only (failed-over) node included
                log.warning("event=verifier.db_lost error=%r", str(exc)[:200])
                busy = False
            except Exception:
                log.exception("event=verifier.error")
                busy = False
            if not busy:
                stop.wait(self.interval)
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def once(self) -> bool:
        """Claim up to ``batch`` due verifications and settle them, each on its own thread;
        False when none was due."""
        claims: list[VerificationClaim] = self.call(
            lambda c: sqlapi.effects.claim_verifications(
                c,
                worker_id=self.worker_id,
                batch=self.batch,
                lease_seconds=self.lease_margin,
                handlers=handlers.names(),
                verifiers=handlers.verifier_names(),
            )
        )
        for future in [self.workers.submit(self.verify, claim) for claim in claims]:
            try:
                future.result()
            except Exception:  # that try's lease runs out and another verifier retries it
                log.exception("event=verifier.try_failed")
        return bool(claims)

    # --- one try --------------------------------------------------------------------

    def verify(self, claim: VerificationClaim) -> dict[str, Any]:
        receipt = EffectReceipt.from_row(claim.receipt)
        step = claim.step or {}
        where = (
            f"tenant={claim.tenant_id} effect={claim.effect_id} method={claim.method}"
            f" try={claim.try_}/{claim.tries}"
        )
        params, verdict = self._verdict(claim, receipt, step)
        self.fault("before_verdict")
        row: dict[str, Any] = self.call(lambda c: self._record(c, claim, receipt, params, verdict))
        with self.lock:
            self.settled += 1
        log.info(
            "event=verifier.verdict %s verdict=%s outcome=%s instance_state=%s detail=%r",
            where,
            _name(verdict),
            row["outcome"],
            row["instance_state"],
            row["detail"],
        )
        return row

    def _verdict(
        self, claim: VerificationClaim, receipt: EffectReceipt, step: dict[str, Any]
    ) -> tuple[dict[str, Any], Verdict]:
        """The step's params as sent, and what the verifier says."""
        outputs = outputs_seen_from(claim.progress or {}, receipt.block_id)
        try:
            params = params_as_sent(
                step,
                claim.context,
                claim.progress or {},
                receipt.instance_id,
                receipt.attempt,
                receipt.block_id,
                claim.vars or {},
            )
        except TemplateError as exc:
            return {}, Inconclusive(f"the step's params no longer render: {exc}")
        same = self.call(
            lambda c: sqlapi.effects.verification_request_matches(
                c, tenant_id=claim.tenant_id, effect_id=claim.effect_id, params=params
            )
        )
        if not same:
            return params, Inconclusive(
                "the step's params re-render differently from what was sent (a template over "
                "a changing value?): nothing to verify against"
            )
        timeout = claim.timeout_seconds
        ctx = StepContext(
            tenant_id=claim.tenant_id,
            instance_id=receipt.instance_id,
            block_id=receipt.block_id,
            attempt=receipt.attempt,
            handler=receipt.handler,
            effect_id=receipt.id,
            idempotency_key=receipt.idempotency_key,
            context=claim.context,
            outputs=outputs,
            timeout=timeout,
            vars=claim.vars or {},
        )
        method = {"http": self._http, "replay": self._replay, "handler": self._handler}.get(
            claim.method
        )
        if method is None:
            return params, Inconclusive(f"unknown verification method {claim.method!r}")
        future = self.pool.submit(method, params, receipt, step, ctx)
        try:
            return params, future.result(timeout=timeout + 1)
        except cf.TimeoutError:
            return params, Inconclusive(f"the verifier did not answer within {timeout:g}s")
        except NotApplied as exc:
            return params, exc if claim.method == "handler" else _as_inconclusive(exc)
        except Exception as exc:
            return params, _as_inconclusive(exc)

    def _record(
        self,
        conn: Conn,
        claim: VerificationClaim,
        receipt: EffectReceipt,
        params: dict[str, Any],
        verdict: Verdict,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if isinstance(verdict, Applied):
            output = verdict.output
            if output is None:
                output = derive_output(verdict.evidence, receipt, params)
            kwargs = {
                "verdict": "applied",
                "evidence": verdict.evidence,
                "provider_receipt_id": verdict.provider_receipt_id,
                "output": output,
            }
        elif isinstance(verdict, NotApplied):
            kwargs = {"verdict": "not_applied", "evidence": verdict.evidence}
        else:
            kwargs = {
                "verdict": "inconclusive",
                "evidence": {"reason": verdict.reason, **verdict.evidence},
            }
        return sqlapi.effects.record_verification(
            conn,
            tenant_id=claim.tenant_id,
            effect_id=claim.effect_id,
            lease_token=claim.lease_token,
            **kwargs,
        )

    # --- the three ways -------------------------------------------------------------

    def _http(
        self,
        params: dict[str, Any],
        receipt: EffectReceipt,
        step: dict[str, Any],
        ctx: StepContext,
    ) -> Verdict:
        verify = step.get("verify") or {}
        names = {
            "effect": _effect_view(receipt),
            "params": params,
            "data": ctx.context.get("data", {}),
            "config": ctx.context.get("config", {}),
            "instance_id": str(receipt.instance_id),
        }
        try:
            request = render(verify.get("http") or {}, names, VERIFY)
        except TemplateError as exc:
            return Inconclusive(f"verify.http does not render: {exc}")
        method = str(request.get("method", "GET")).upper()
        resp = _http.send(
            ctx,
            method,
            request.get("url"),
            headers=_http.clean_headers(request.get("headers")),
            timeout=ctx.timeout,
            key=None,
            responses=ALL_ANSWERS,
        )
        out = resp.output(verify.get("receipt_path"))
        scope = {**names, "response": out}
        lookup = {"method": method, "url": request.get("url")}
        evidence: dict[str, Any] = {
            "lookup": lookup,
            "response": resp.evidence(),
            "body_sha256": hashlib.sha256(resp.body.encode()).hexdigest(),
        }
        if _holds(verify.get("applied_if"), scope):
            return Applied(
                {**evidence, "matched": {"applied_if": verify.get("applied_if")}},
                provider_receipt_id=_receipt_id(out),
            )
        if _holds(verify.get("not_applied_if"), scope):
            return NotApplied(
                f"HTTP {resp.status}: not_applied_if holds",
                {**evidence, "matched": {"not_applied_if": verify.get("not_applied_if")}},
            )
        return Inconclusive(
            f"HTTP {resp.status}: neither applied_if nor not_applied_if holds", evidence
        )

    def _replay(
        self,
        params: dict[str, Any],
        receipt: EffectReceipt,
        step: dict[str, Any],
        ctx: StepContext,
    ) -> Verdict:
        fn = handlers.get(receipt.handler)
        if fn is None:  # the claim only hands out replays of handlers this runner has
            return Inconclusive(f"handler {receipt.handler!r} is not registered here")
        return replay_verdict(lambda: call_user(fn, params, ctx), receipt.idempotency_key)

    def _handler(
        self,
        params: dict[str, Any],
        receipt: EffectReceipt,
        step: dict[str, Any],
        ctx: StepContext,
    ) -> Verdict:
        fn = handlers.verifier_of(receipt.handler)
        if fn is None:  # the claim only hands out handlers whose verifier this runner has
            return Inconclusive(f"no verifier is registered for {receipt.handler!r} here")
        verdict: Any = call_user(fn, params, receipt, ctx)  # somebody's code: check it
        if not isinstance(verdict, Applied | NotApplied | Inconclusive):
            return Inconclusive(
                f"the verifier of {receipt.handler!r} returned {type(verdict).__name__}, "
                "not Applied, NotApplied or Inconclusive"
            )
        return verdict


def _effect_view(receipt: EffectReceipt) -> dict[str, Any]:
    """What ``effect`` is in a verifier's templates and expressions."""
    return {
        "id": str(receipt.id),
        "idempotency_key": receipt.idempotency_key,
        "provider_receipt_id": receipt.provider_receipt_id,
        "attempt": receipt.attempt,
        "block_id": receipt.block_id,
        "instance_id": str(receipt.instance_id),
    }


def _holds(text: Any, scope: dict[str, Any]) -> bool:
    if not isinstance(text, str) or not text:
        return False
    return expression.truthy(expression.evaluate(text, scope, rules.VERIFY_EXPRESSION_ROOTS))


def _receipt_id(output: Any) -> str | None:
    receipts = _http.json_receipts(output)
    for key in _http.RECEIPT_KEYS:
        if key in receipts:
            return receipts[key]
    return None


def _as_inconclusive(exc: BaseException) -> Inconclusive:
    if isinstance(exc, StepError):
        return Inconclusive(str(exc), {"code": exc.code} if exc.code else {})
    return Inconclusive(f"{type(exc).__name__}: {exc}")


def _name(verdict: Verdict) -> str:
    if isinstance(verdict, Applied):
        return "applied"
    return "not_applied" if isinstance(verdict, NotApplied) else "inconclusive"
