"""The REST API under /api/v1: one blueprint per resource, nested in ``api``.

Each route declares its models and answers once (web/api/spec.py, web/api/models/):
spectree validates requests and serializes answers from them, and the OpenAPI document
served at GET /api/v1/openapi.json is generated from the same declarations. Routes call
the door (orch8_py.sqlapi) in one ``tenant_tx``, so a request writes everything or
nothing and row-level security confines it to the caller's tenant. Every refusal is an
RFC 9457 problem document (web/problems.py); engine errors are mapped there too.
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response

from . import bulk, effects, instances, rate_limits, schedules, sequences, webhooks, workers
from .spec import PREFIX, document, dumps


def register(app: Flask) -> None:
    api = Blueprint("api", __name__, url_prefix=PREFIX)
    for module in (sequences, instances, bulk, effects, webhooks, schedules, rate_limits, workers):
        api.register_blueprint(module.bp)

    @api.get("/openapi.json")
    def openapi() -> Response:
        """The OpenAPI document (no key needed)."""
        return Response(dumps(document()) + "\n", mimetype="application/json")

    app.register_blueprint(api)
