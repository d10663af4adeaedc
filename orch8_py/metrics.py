"""Process-local runner metrics (Prometheus, prometheus-client).

Everything here lives in this module's own ``REGISTRY``, not prometheus_client's global
default one, so tests can build any number of runners and the web service can combine
these with the database-derived gauges (``web/metrics.py``) into one ``/metrics``.

The runner calls four small functions: ``step_started``, ``step_finished``, ``claimed``
and ``lease_lost``. They only touch in-memory counters: no I/O, safe from any thread.

Where the numbers can be read:
- ``orch8 up`` (runner and web in one process): ``GET /metrics`` on the operator service;
- ``orch8 run`` (runner alone): set ``ORCH8_METRICS_PORT`` (and optionally
  ``ORCH8_METRICS_HOST``, default 127.0.0.1) and ``serve_from_env()`` exposes them;
- ``orch8 serve`` (web alone): ``GET /metrics`` has the database gauges; the runner
  counters there stay at zero, because no runner runs in that process.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client import start_http_server as _start_http_server

from .errors import ConfigError, cannot_listen

log = logging.getLogger("orch8.metrics")

# No *_created series: they double the series count and no alert here needs them.
# (A process-wide prometheus_client switch; orch8 is its only user in its processes.)
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it bare

REGISTRY = CollectorRegistry(auto_describe=True)

# process_cpu_seconds_total, process_resident_memory_bytes, process_start_time_seconds...
# (Linux; a no-op elsewhere). process_start_time_seconds shows restarts.
ProcessCollector(registry=REGISTRY)

STEP_DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CLAIM_BATCH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)

STEPS_STARTED = Counter(
    "orch8_steps_started_total",
    "Steps whose handler was invoked by this process (after begin_step dispatched it).",
    ["handler", "handler_kind"],  # handler_kind: pure | effect
    registry=REGISTRY,
)
STEPS_SUCCEEDED = Counter(
    "orch8_steps_succeeded_total",
    "Steps whose handler returned and whose result was recorded (finish_step ok).",
    ["handler"],
    registry=REGISTRY,
)
STEPS_FAILED = Counter(
    "orch8_steps_failed_total",
    "Steps that left their instance failed (permanent error, retries exhausted, "
    "or a receipt moved by someone else).",
    ["handler"],
    registry=REGISTRY,
)
STEPS_RETRIED = Counter(
    "orch8_steps_retried_total",
    "Steps that failed retryably: the instance was rescheduled for a new attempt.",
    ["handler"],
    registry=REGISTRY,
)
STEP_DURATION = Histogram(
    "orch8_step_duration_seconds",
    "Wall time of a step in the runner: handler call plus recording its result.",
    ["handler"],
    buckets=STEP_DURATION_BUCKETS,
    registry=REGISTRY,
)
CLAIM_BATCH = Histogram(
    "orch8_claim_batch_size",
    "Instances returned by each claim_work call (0 when nothing was due).",
    buckets=CLAIM_BATCH_BUCKETS,
    registry=REGISTRY,
)
LEASE_LOST = Counter(
    "orch8_lease_lost_total",
    "Instances this process stopped working on because its lease was gone "
    "(expired and taken over, or given up after a long connection loss).",
    registry=REGISTRY,
)


def step_started(handler: str, effect: bool) -> None:
    """A handler is about to be invoked; ``effect`` is True for side-effecting handlers."""
    STEPS_STARTED.labels(handler=handler, handler_kind="effect" if effect else "pure").inc()


def classify(result: str, new_state: str) -> str:
    """succeeded | retried | failed, from finish_step's result and the instance's state.

    A failed instance is a failed step even when the handler said ok (finish_step fails
    the instance when somebody else moved the step's receipt meanwhile).
    """
    if new_state == "failed":
        return "failed"
    if result == "ok":
        return "succeeded"
    if new_state == "scheduled":
        return "retried"
    return "failed"


def step_finished(handler: str, result: str, new_state: str, seconds: float) -> None:
    """After finish_step: ``result`` is ok | error | not_applied, ``new_state`` the
    instance state finish_step returned, ``seconds`` the step's wall time."""
    outcome = classify(result, new_state)
    counter = {"succeeded": STEPS_SUCCEEDED, "retried": STEPS_RETRIED, "failed": STEPS_FAILED}
    counter[outcome].labels(handler=handler).inc()
    STEP_DURATION.labels(handler=handler).observe(max(seconds, 0.0))


def claimed(n: int) -> None:
    """One claim_work call returned ``n`` instances."""
    CLAIM_BATCH.observe(n)


def lease_lost() -> None:
    """The runner stopped working on an instance because its lease was gone."""
    LEASE_LOST.inc()


def serve(port: int, host: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
    """Expose ``REGISTRY`` on http://host:port/ (any path) from a daemon thread.

    For a runner without the web service (``orch8 run``). Returns the server and its
    thread; ``server.shutdown()`` stops it. Port 0 picks a free port
    (``server.server_port``).
    """
    try:
        server, thread = _start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        raise cannot_listen(
            exc,
            host,
            port,
            server="the runner's metrics",
            remedy="pick another metrics port with ORCH8_METRICS_PORT",
        ) from None
    log.info("event=metrics.serving host=%s port=%d", host, server.server_port)
    return server, thread


def serve_from_env(
    environ: Mapping[str, str] | None = None,
) -> tuple[WSGIServer, threading.Thread] | None:
    """``serve()`` when ORCH8_METRICS_PORT is set (host: ORCH8_METRICS_HOST, default
    127.0.0.1); None when it is not set. A bad value is a ConfigError."""
    env = os.environ if environ is None else environ
    raw = (env.get("ORCH8_METRICS_PORT") or "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"ORCH8_METRICS_PORT={raw!r} is not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"ORCH8_METRICS_PORT={raw!r} is not a TCP port (1-65535)")
    host = (env.get("ORCH8_METRICS_HOST") or "").strip() or "127.0.0.1"
    return serve(port, host)
