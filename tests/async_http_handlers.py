"""An async def handler that a spawned `orch8 run` loads (ORCH8_HANDLER_MODULES): a POST
with httpx's async client, carrying the receipt's idempotency key, so the crash tests
count what reached the provider exactly as they do for the threaded http_request."""

from __future__ import annotations

from typing import Any

import httpx

from orch8_py.handlers import StepError, handler


@handler("test.async_post")
async def async_post(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=ctx.remaining()) as client:
        resp = await client.post(
            params["url"], json=params.get("json"), headers={"Idempotency-Key": ctx.idempotency_key}
        )
    if resp.status_code >= 400:
        raise StepError(f"provider answered {resp.status_code}", code=f"http_{resp.status_code}")
    return {"status": resp.status_code, "json": resp.json()}
