"""A custom handler for the quick start: `orch8 up --import examples.payments`.

A real one would call the payment provider, passing ``ctx.idempotency_key`` (the step's
``idempotency_key`` param, the same on every attempt) as the provider's idempotency key,
and return the provider's receipt id so the ledger records it. Beside it,
``charge_output`` says what the step returns when an operator settles an unknown charge,
so the steps after it can go on.
"""

from orch8_py.handlers import StepError, handler


@handler("payments.charge")
def charge(params, ctx):
    if params["amount"] > 100_000:
        raise StepError("amount over the card limit", code="limit", retryable=False)
    return {"receipt_id": f"ch_{ctx.effect_id.hex[:12]}", "amount": params["amount"]}


@charge.output_from_evidence
def charge_output(evidence, effect, params):
    """What the step returns when an operator settles a charge (`orch8 effects resolve ...
    --provider-receipt-id ch_…`): the provider's charge id is all the workflow reads."""
    if effect.provider_receipt_id is None:
        return None
    return {"receipt_id": effect.provider_receipt_id, "amount": params["amount"]}
