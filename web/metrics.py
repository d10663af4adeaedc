"""GET /metrics: Prometheus text for scrapers.

Two sources in one answer:
- the process-local runner metrics of ``orch8_py.metrics.REGISTRY`` (steps, durations,
  claim batches, lost leases): non-zero only when a runner runs in this process
  (``orch8 up``);
- gauges read from the database at scrape time, in one statement (one round trip,
  pipelined with its statement timeout): the unresolved-effects queue by tenant, kind,
  state and whether an instance waits on it (``blocking``), with the age of its oldest
  receipt, the verifications not yet settled by state (pending, escalated), instances by
  state, the webhook outbox by state, delivered webhooks, lease reclaims, per rate
  limit the steps it defers now and its admitted and deferred counters, and per worker
  handler the tasks queued and running and the age of the oldest queued one.

If the database cannot be read the answer is still 200, with the process metrics and
``orch8_database_up 0``. No API key: Prometheus scrapes this, and it exposes counts, not
data. Keep it off the public internet all the same (bind to a private address, or
filter ``/metrics`` at the proxy).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import psycopg
from flask import Blueprint, Response, current_app
from flask.typing import ResponseReturnValue
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg_pool import ConnectionPool, PoolTimeout

from orch8_py import metrics as process_metrics
from orch8_py import rules, sqlapi

log = logging.getLogger("orch8.web.metrics")

bp = Blueprint("metrics", __name__)

POOL_TIMEOUT = 2.0  # seconds to wait for a connection before reporting the database down
STATEMENT_TIMEOUT = "5s"  # the scrape query never holds a pool connection longer


class ProcessMetrics:
    """The runner's process-local registry, as one collector of the scrape registry."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from process_metrics.REGISTRY.collect()


class DatabaseMetrics:
    """Gauges computed from the database at scrape time."""

    def __init__(self, pool: ConnectionPool):
        self.pool = pool

    def describe(self) -> list[Metric]:
        return []  # nothing is queried when the collector is registered

    def query(self) -> list[tuple[Any, ...]]:
        if self.pool.closed:
            self.pool.open(wait=False)
        with self.pool.connection(timeout=POOL_TIMEOUT) as conn:
            return sqlapi.observe.metrics_snapshot(conn, timeout=STATEMENT_TIMEOUT)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "orch8_database_up",
            "1 when the metrics query read the database, 0 when it failed "
            "(unreachable, schema missing or timed out: see the web service log).",
        )
        took = GaugeMetricFamily(
            "orch8_database_query_seconds", "Time the database part of this scrape took."
        )
        started = time.monotonic()
        try:
            rows = self.query()
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("event=metrics.database_unavailable error=%r", str(exc)[:300])
            up.add_metric([], 0)
            took.add_metric([], time.monotonic() - started)
            yield up
            yield took
            return
        up.add_metric([], 1)
        took.add_metric([], time.monotonic() - started)
        yield up
        yield took
        yield from families(rows)


# the verification states a gauge shows: the open ones (settled rows only accumulate)
OPEN_VERIFICATIONS = tuple(v for v in rules.VERIFICATION_STATES if v != "settled")


def _blocking(value: Any) -> str:
    return "true" if value else "false"


def families(rows: list[tuple[Any, ...]]) -> Iterator[Metric]:
    """The metric families of the query's rows."""
    unresolved = GaugeMetricFamily(
        "orch8_unresolved_effects",
        "Effect receipts waiting for an operator (orch8.unresolved_effects): unknown, or "
        "dispatched for longer than orch8.dispatched_alert_after. blocking=true: an instance "
        "waits on it; false: superseded (the instance ended, or a later attempt of the step "
        'completed). Alert on the depth of blocking="true".',
        labels=["tenant", "kind", "state", "blocking"],
    )
    oldest = GaugeMetricFamily(
        "orch8_unresolved_effect_oldest_age_seconds",
        "Age (since the receipt was created) of the oldest unresolved effect receipt.",
        labels=["tenant", "kind", "blocking"],
    )
    verifications = GaugeMetricFamily(
        "orch8_effect_verifications",
        "Verifications of unknown receipts by state: pending (a verifier has tries left), "
        "escalated (every try was inconclusive: left to people). Every open state of a "
        "tenant that has one is present, 0 when empty.",
        labels=["tenant", "state"],
    )
    instances = GaugeMetricFamily(
        "orch8_instances", "Workflow instances by state.", labels=["tenant", "state"]
    )
    outbox = GaugeMetricFamily(
        "orch8_webhook_outbox", "Webhook outbox rows by state.", labels=["tenant", "state"]
    )
    delivered = CounterMetricFamily(
        "orch8_webhook_deliveries",
        "Webhook deliveries confirmed by the receiver (outbox rows in state delivered).",
        labels=["tenant"],
    )
    reclaims = CounterMetricFamily(
        "orch8_lease_reclaims",
        "Running instances whose lease expired and that the lease sweep handed back to "
        "scheduled (instance_transitions with actor lease-sweep): a runner died or stalled.",
    )
    rate_waiting = GaugeMetricFamily(
        "orch8_rate_limit_waiting_steps",
        "Steps a rate limit defers now (ready, waiting for a token; or for the key to be "
        "defined, when it has no bucket).",
        labels=["tenant", "key"],
    )
    rate_deferred = CounterMetricFamily(
        "orch8_rate_limit_deferrals",
        "Times a step found no token in its rate limit and was deferred (never failed).",
        labels=["tenant", "key"],
    )
    rate_admitted = CounterMetricFamily(
        "orch8_rate_limit_admitted",
        "Steps that took a token from their rate limit.",
        labels=["tenant", "key"],
    )
    rate_families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "rate_limit_waiting": rate_waiting,
        "rate_limit_deferred": rate_deferred,
        "rate_limit_admitted": rate_admitted,
    }
    worker_tasks = GaugeMetricFamily(
        "orch8_worker_tasks",
        "Tasks of a registered external-worker handler: queued (waiting for a worker) and "
        "running (a worker holds its lease).",
        labels=["tenant", "handler", "state"],
    )
    worker_oldest = GaugeMetricFamily(
        "orch8_worker_task_oldest_queued_seconds",
        "How long the oldest queued task of a handler has waited for a worker (0: none). "
        "Alert when it grows: no worker serves the handler.",
        labels=["tenant", "handler"],
    )
    ages: dict[tuple[str, str, str], float] = {}
    by_state: dict[str, dict[str, dict[str, int]]] = {
        "instances": defaultdict(dict),
        "webhooks": defaultdict(dict),
        "verifications": defaultdict(dict),
    }
    reclaimed = 0
    for metric, tenant, kind, state, blocking, n, seconds in rows:
        if metric == "unresolved":
            unresolved.add_metric([tenant, kind, state, _blocking(blocking)], n)
            key = (tenant, kind, _blocking(blocking))
            ages[key] = max(ages.get(key, 0.0), seconds or 0.0)
        elif metric in by_state:
            by_state[metric][tenant][state] = n
        elif metric == "lease_reclaims":
            reclaimed = n
        elif metric in rate_families:
            rate_families[metric].add_metric([tenant, kind], n)
        elif metric == "worker_tasks":
            worker_tasks.add_metric([tenant, kind, state], n)
            if state == "queued":
                worker_oldest.add_metric([tenant, kind], seconds or 0.0)
    for (tenant, kind, blocks), age in sorted(ages.items()):
        oldest.add_metric([tenant, kind, blocks], age)
    for family, states, counts in (
        (instances, rules.INSTANCE_STATES, by_state["instances"]),
        (outbox, rules.OUTBOX_STATES, by_state["webhooks"]),
        (verifications, OPEN_VERIFICATIONS, by_state["verifications"]),
    ):
        for tenant in sorted(counts):
            for state in (*states, *sorted(set(counts[tenant]) - set(states))):
                family.add_metric([tenant, state], counts[tenant].get(state, 0))
    for tenant in sorted(by_state["webhooks"]):
        delivered.add_metric([tenant], by_state["webhooks"][tenant].get("delivered", 0))
    reclaims.add_metric([], reclaimed)
    yield from (unresolved, oldest, verifications, instances, outbox, delivered, reclaims)
    yield from (rate_waiting, rate_deferred, rate_admitted, worker_tasks, worker_oldest)


def render(pool: ConnectionPool) -> bytes:
    """The whole scrape: process metrics, then the database's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessMetrics())
    registry.register(DatabaseMetrics(pool))
    return generate_latest(registry)


@bp.get("/metrics")
def scrape() -> ResponseReturnValue:
    body = render(current_app.extensions["orch8.pool"])
    return Response(body, status=200, content_type=CONTENT_TYPE_LATEST)
