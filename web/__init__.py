"""The operator service: a Flask app factory. Routes live in one blueprint per resource."""

from __future__ import annotations

import os
import secrets

from flask import Flask
from psycopg_pool import ConnectionPool

from orch8_py.db import WEB_ROLE, as_role

from . import problems
from .console import bp as console_bp
from .health import bp as health_bp
from .metrics import bp as metrics_bp

MAX_BODY_BYTES = 1024 * 1024
POOL_TIMEOUT = 5.0  # seconds


def create_app(database_url: str, *, secret_key: str | None = None) -> Flask:
    app = Flask(__name__)
    # Signs the console's session cookie. Without ORCH8_SECRET_KEY a restart logs people out.
    app.secret_key = secret_key or os.environ.get("ORCH8_SECRET_KEY") or secrets.token_hex(32)
    app.config.update(
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        # Behind TLS (a proxy that terminates it), the cookie must never travel in clear.
        SESSION_COOKIE_SECURE=os.environ.get("ORCH8_SECURE_COOKIES") == "1",
        JSON_SORT_KEYS=False,
    )
    # Every request acts as orch8_web: no table writes, no other tenant's rows.
    app.extensions["orch8.url"] = web_url = as_role(database_url, WEB_ROLE)
    # Opened lazily: the app starts (and /health/live answers) while PostgreSQL is down.
    app.extensions["orch8.pool"] = ConnectionPool(
        web_url,
        min_size=1,
        max_size=8,
        # A request waits this long for a connection, then answers 503 (not 30 s, the
        # pool's default, while PostgreSQL is down).
        timeout=POOL_TIMEOUT,
        open=False,
        kwargs={"autocommit": True, "connect_timeout": 5},
    )
    problems.install(app)
    from . import api
    from .api.bodies import StrictRequest

    app.request_class = StrictRequest  # strict JSON for every get_json() (web/api/bodies.py)

    api.register(app)
    app.register_blueprint(console_bp)
    app.register_blueprint(health_bp)
    app.register_blueprint(metrics_bp)
    return app
