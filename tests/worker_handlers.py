"""Handlers an external worker process serves in the tests (`orch8 worker --import
tests.worker_handlers`). Each sends a real HTTP request to the test provider named in its
params, with the task's idempotency key, so a test counts what reached the provider per
key. The provider's scripted answer decides: 2xx done, 402 a definitive refusal
(NotApplied), 5xx or no answer an error (the receipt becomes unknown)."""

from __future__ import annotations

from typing import Any

import httpx

from orch8_py.worker import Applied, Inconclusive, NotApplied, StepError, Task, Verification
from orch8_py.worker import handler as worker_handler


def _send(url: str, key: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return httpx.post(url, json=body, headers={"Idempotency-Key": key}, timeout=120)
    except httpx.ConnectError as exc:  # nothing left this process
        raise NotApplied(f"connection refused: {exc}", {"connect_error": str(exc)}) from None
    except httpx.HTTPError as exc:  # it may have arrived
        raise StepError(f"{type(exc).__name__}: {exc}", code="transport") from None


@worker_handler("test.charge")
def charge(task: Task) -> dict[str, Any]:
    resp = _send(task.params["url"], task.idempotency_key, {"amount": task.params.get("amount")})
    if resp.status_code == 402:
        raise NotApplied("declined", {"status": 402}, reached=True)
    if resp.status_code >= 400:
        raise StepError(f"provider answered {resp.status_code}", code=f"http_{resp.status_code}")
    return {"receipt_id": resp.json().get("receipt_id"), "attempt": task.attempt}


@charge.verifier
def charge_verifier(v: Verification) -> Any:
    resp = httpx.get(v.params["lookup"], params={"key": v.idempotency_key}, timeout=10)
    if resp.status_code == 200:
        found = resp.json()
        return Applied(
            {"lookup": found}, found.get("receipt_id"), {"receipt_id": found["receipt_id"]}
        )
    if resp.status_code == 404:
        return NotApplied("the provider has no such charge", {"status": 404})
    return Inconclusive(f"lookup answered {resp.status_code}")


@worker_handler("test.async_charge")
async def async_charge(task: Task) -> dict[str, Any]:
    """test.charge as an async def: the worker runs it to its end on its task's thread."""
    async with httpx.AsyncClient(timeout=120) as client:
        resp = await client.post(
            task.params["url"],
            json={"amount": task.params.get("amount")},
            headers={"Idempotency-Key": task.idempotency_key},
        )
    if resp.status_code >= 400:
        raise StepError(f"provider answered {resp.status_code}", code=f"http_{resp.status_code}")
    return {"receipt_id": resp.json().get("receipt_id"), "async": True}


@async_charge.verifier
async def async_charge_verifier(v: Verification) -> Any:
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.get(v.params["lookup"], params={"key": v.idempotency_key})
    if resp.status_code == 200:
        found = resp.json()
        return Applied(
            {"lookup": found}, found.get("receipt_id"), {"receipt_id": found["receipt_id"]}
        )
    return Inconclusive(f"lookup answered {resp.status_code}")
