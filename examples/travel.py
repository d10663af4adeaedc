"""Handlers for the saga example of docs/WORKFLOWS.md: `orch8 run --import examples.travel`.

``travel.book`` books (a side effect: its receipt is written before it runs, and its
``ctx.idempotency_key`` is what a real one would pass to the provider); ``travel.cancel``
undoes a booking; ``travel.book`` refuses, without booking, anything listed in the
instance's ``data.sold_out``."""

from orch8_py.handlers import NotApplied, handler


@handler("travel.book")
def book(params, ctx):
    if params["what"] in (ctx.context.get("data") or {}).get("sold_out", []):
        raise NotApplied(f"{params['what']} is sold out", code="sold_out", retryable=False)
    return {"receipt_id": f"bk_{ctx.effect_id.hex[:10]}", "what": params["what"]}


@handler("travel.cancel")
def cancel(params, ctx):
    return {"receipt_id": f"rf_{ctx.effect_id.hex[:10]}", "cancelled": params["booking"]}
