"""`orch8 workers register|unregister|list|tasks`: the handlers a tenant's external workers
serve and their tasks (through the database, as every operator command); and
`orch8 worker --import MODULE`: run an external worker (through the REST API, as any
worker anywhere, docs/WORKERS.md)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from .. import config, db, rules, sqlapi
from ..errors import ConfigError
from ..worker import DEFAULT_POLL_WAIT, Worker, WorkerError, default_worker_id
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    Subparsers,
    actor_flag,
    actor_of,
    check_limit,
    command,
    common_flags,
    emit,
    import_flag,
    import_handler_modules,
    table,
    ts,
)

log = logging.getLogger("orch8")
DEFAULT_API_URL = f"http://{config.DEFAULT_HOST}:{config.DEFAULT_PORT}"


def _line(r: dict[str, Any]) -> str:
    redeliver = ", redelivers unstarted tasks" if r["redeliver_unstarted"] else ""
    return (
        f"{r['handler']}: queue {r['queue']}, timeout {r['timeout_ms'] // 1000}s{redeliver}; "
        f"{r['queued']} queued, {r['running']} running"
    )


@command
def workers_register(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        row = sqlapi.workers.register_worker_handler(
            conn,
            tenant_id=args.tenant,
            handler=args.handler,
            queue=args.queue,
            timeout=args.timeout,
            redeliver_unstarted=args.redeliver_unstarted,
            actor=actor_of(args),
        )
    emit(row, args.json, "registered " + _line(row))
    return EXIT_OK


@command
def workers_unregister(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        done = sqlapi.workers.unregister_worker_handler(
            conn, tenant_id=args.tenant, handler=args.handler
        )
    text = (
        f"unregistered {args.handler}: its steps run in runners again; tasks already queued "
        "are still served"
        if done
        else f"{args.handler} was not registered in tenant {args.tenant!r}"
    )
    emit({"handler": args.handler, "unregistered": done}, args.json, text)
    return EXIT_OK


@command
def workers_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.workers.list_worker_handlers(conn, tenant_id=args.tenant)
    text = (
        table(
            ["handler", "queue", "timeout", "redeliver", "queued", "running", "oldest queued"],
            [
                (
                    r["handler"],
                    r["queue"],
                    f"{r['timeout_ms'] // 1000}s",
                    "yes" if r["redeliver_unstarted"] else "no",
                    r["queued"],
                    r["running"],
                    ts(r["oldest_queued_at"]) if r["oldest_queued_at"] else "-",
                )
                for r in rows
            ],
        )
        if rows
        else f"no worker handlers in tenant {args.tenant!r} (orch8 workers register NAME)"
    )
    emit(rows, args.json, text)
    return EXIT_OK


@command
def workers_tasks(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.workers.list_worker_tasks(
            conn,
            tenant_id=args.tenant,
            limit=check_limit(args.limit),
            state=args.state,
            handler=args.handler,
        )
    text = (
        table(
            ["task", "handler", "state", "epoch", "worker", "instance", "step", "queued", "error"],
            [
                (
                    r["id"],
                    r["handler"],
                    r["state"],
                    r["claim_epoch"],
                    r["worker_id"] or "-",
                    r["instance_id"],
                    f"{r['path']}#{r['attempt']}",
                    ts(r["created_at"]),
                    (r["error"] or "")[:60],
                )
                for r in rows
            ],
        )
        if rows
        else "no worker tasks"
    )
    emit(rows, args.json, text)
    return EXIT_OK


def cmd_worker(args: argparse.Namespace, settings: config.Settings) -> int:
    """Serve the handlers (and verifiers) the imported modules register with
    orch8_py.worker.handler, until SIGTERM or SIGINT."""
    key = os.environ.get("ORCH8_API_KEY") or ""
    if not key:
        raise ConfigError("set ORCH8_API_KEY to a worker (or operator) API key of the tenant")
    if not args.imports:
        raise ConfigError(
            "name the module that registers the handlers: --import MODULE "
            "(it uses orch8_py.worker.handler)"
        )
    if args.concurrency < 1:
        raise ConfigError(f"--concurrency {args.concurrency} must be at least 1")
    import_handler_modules(args.imports)
    try:
        worker = Worker(
            args.url,
            key,
            args.worker_id,
            queue=args.queue,
            lease=args.lease,
            poll_wait=args.poll_wait,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        worker.run(concurrency=args.concurrency)
    except (ValueError, WorkerError) as exc:  # a lease too short, nothing registered
        raise ConfigError(str(exc)) from None
    if worker.failure:
        print(f"orch8: error: the worker stopped: {worker.failure}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    wk = sub.add_parser(
        "worker", help="run an external worker for handlers a module registers (REST API)"
    )
    import_flag(wk)
    wk.add_argument(
        "--url",
        default=os.environ.get("ORCH8_API_URL") or DEFAULT_API_URL,
        help="the operator service (ORCH8_API_URL; default %(default)s); the key is ORCH8_API_KEY",
    )
    wk.add_argument(
        "--worker-id",
        default=os.environ.get("ORCH8_WORKER_ID") or default_worker_id(),
        help="how this worker names itself (ORCH8_WORKER_ID; default host:pid)",
    )
    wk.add_argument("--concurrency", type=int, default=8, help="tasks at once (default 8)")
    wk.add_argument("--queue", default=None, help="only this queue's tasks")
    wk.add_argument(
        "--lease", type=float, default=30.0, help="seconds each task's lease lasts (default 30)"
    )
    wk.add_argument(
        "--poll-wait",
        type=float,
        default=DEFAULT_POLL_WAIT,
        help="seconds a long-poll waits for a task; a stop waits for it (default 5)",
    )
    wk.set_defaults(func=cmd_worker)

    ws = sub.add_parser("workers", help="handlers external workers serve, and their tasks")
    wsub = ws.add_subparsers(dest="workers_command", required=True, metavar="COMMAND")
    reg = wsub.add_parser("register", help="have external workers serve a handler")
    reg.add_argument("handler", help="the handler steps name (A-Z a-z 0-9 _ . -)")
    reg.add_argument("--queue", default=None, help="its tasks' queue (default: default)")
    reg.add_argument(
        "--timeout",
        default=None,
        help="schedule-to-close for steps without a timeout: 30s, 5m, 1h or ms (default 5m)",
    )
    reg.add_argument(
        "--redeliver-unstarted",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="queue a task again when its lease runs out before the worker's first "
        "heartbeat (its worker sends nothing before it; orch8 worker does so)",
    )
    common_flags(reg)
    actor_flag(reg)
    reg.set_defaults(db_func=workers_register)
    un = wsub.add_parser("unregister", help="stop dispatching a handler to workers")
    un.add_argument("handler")
    common_flags(un)
    un.set_defaults(db_func=workers_unregister)
    lst = wsub.add_parser(
        "list", help="the registered handlers with their queued and running tasks"
    )
    common_flags(lst)
    lst.set_defaults(db_func=workers_list)
    tasks = wsub.add_parser("tasks", help="worker tasks, newest first")
    tasks.add_argument(
        "--state", default=None, choices=rules.WORKER_TASK_STATES, help="only tasks in this state"
    )
    tasks.add_argument("--handler", default=None, help="only this handler's tasks")
    tasks.add_argument("--limit", type=int, default=50, help="at most this many (1-200)")
    common_flags(tasks)
    tasks.set_defaults(db_func=workers_tasks)
