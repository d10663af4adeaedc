"""The operator service: a Flask app factory. Routes live in one blueprint per resource."""

from __future__ import annotations

from flask import Flask
from psycopg_pool import ConnectionPool

from .health import bp as health_bp
from .metrics import bp as metrics_bp


def create_app(database_url: str) -> Flask:
    app = Flask(__name__)
    # Opened lazily: the app starts (and /health/live answers) while PostgreSQL is down.
    app.extensions["orch8.pool"] = ConnectionPool(
        database_url,
        min_size=1,
        max_size=8,
        open=False,
        kwargs={"autocommit": True, "connect_timeout": 5},
    )
    app.register_blueprint(health_bp)
    app.register_blueprint(metrics_bp)
    return app
