"""A custom handler for the quick start: `orch8 up --import examples.payments`.

A real one would call the payment provider, passing ``ctx.effect_id`` (or the step's
``idempotency_key``) as the provider's idempotency key, and return the provider's
receipt id so the ledger records it.
"""

from orch8_py.handlers import StepError, handler


@handler("payments.charge")
def charge(params, ctx):
    if params["amount"] > 100_000:
        raise StepError("amount over the card limit", code="limit", retryable=False)
    return {"receipt_id": f"ch_{ctx.effect_id.hex[:12]}", "amount": params["amount"]}
