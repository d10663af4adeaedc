"""`orch8 up|run|serve|db`: start the engine's processes (the runner, the operator
service, both) and manage the schema."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from .. import config, db, metrics, migrate, sqlapi
from ..runner import Runner
from ..runner import Settings as RunnerSettings
from ..startup import (
    check_schema,
    database,
    describe_replication,
    require_primary,
    run_migrations,
    say,
    service_database,
)
from . import history
from .common import import_flag, import_handler_modules

if TYPE_CHECKING:
    from waitress.server import BaseWSGIServer, MultiSocketServer

log = logging.getLogger("orch8")


def make_server(
    url: str, host: str, port: int, threads: int | None = None
) -> MultiSocketServer | BaseWSGIServer:
    """The operator service on host:port, with the HTTP limits of orch8_py/serving.py
    (ORCH8_HTTP_*); ``threads`` (``--threads``) wins over ORCH8_HTTP_THREADS."""
    from web import create_app

    from .. import serving

    limits = serving.Limits.from_env(threads=threads)
    app = create_app(url)
    app.config["ORCH8_LONG_POLLS"] = limits.waiting_polls
    return serving.create_server(app, host, port, limits)


def make_runner(url: str, settings: config.Settings) -> Runner:
    return Runner(
        url,
        RunnerSettings(
            concurrency=settings.concurrency,
            lease=settings.lease,
            heartbeat=settings.heartbeat,
            poll_interval=settings.tick_interval,
            grace=settings.grace,
            verify_interval=settings.verify_interval,
            group_commit=settings.group_commit,
        ),
    )


def wait_for_signal(stop: threading.Event) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("event=signal signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop.wait(0.5):
        pass


def exit_now_if_stranded(runner: Runner) -> None:
    """Steps that outlived the grace period still hold threads, which Python would wait
    for at exit, for as long as a handler runs. Leave without them: their leases run out
    and the next runner settles their receipts (unknown when they had dispatched)."""
    if runner.stranded:
        say(
            f"orch8: {runner.stranded} step(s) still running after the grace period; "
            "exiting without them (their leases expire; the next runner settles them)"
        )
        logging.shutdown()
        sys.stderr.flush()
        os._exit(0)


def exit_now_if_failed(runner: Runner) -> None:
    """A runner that ended on an unexpected error (a role without the rights it needs, a
    bug) ends the process with one line and a non-zero status: a supervisor restarts it
    or a person reads why, instead of a process that looks alive and does nothing."""
    if runner.failure:
        print(f"orch8: error: the runner stopped: {runner.failure}", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(1)


def first_start_key(url: str, settings: config.Settings) -> None:
    """On the first start (no API key at all), create an operator key for the default
    tenant, print it once and keep a copy readable only by this user."""
    from .. import apikeys

    with db.connect(url, autocommit=True) as conn:
        if sqlapi.keys.any_api_key(conn):
            return
        _key_id, secret = apikeys.create(conn, "default", "operator", "first-start")
    path = settings.data_dir / "operator-key"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        where = f"a copy is in {path} (mode 600)"
    except OSError as exc:
        where = f"no copy was saved ({exc.strerror}): note it now"
    say(f"orch8: created an operator API key for tenant 'default'; {where}:")
    say(f"orch8:   {secret}")
    say("orch8: log in to the console with it, or send it as 'Authorization: Bearer <key>'")


def cmd_up(args: argparse.Namespace, settings: config.Settings) -> int:
    import_handler_modules(args.imports)
    with database(settings) as url:
        require_primary(url)
        run_migrations(url)
        first_start_key(url, settings)
        server = make_server(settings.web_database_url or url, args.host, args.port)
        stop = threading.Event()
        runner = make_runner(settings.runner_database_url or url, settings)
        threads = [
            threading.Thread(target=runner.run, args=(stop,), name="runner"),
            threading.Thread(target=server.run, name="web", daemon=True),
        ]
        for t in threads:
            t.start()
        say(f"orch8: database {db.describe(url)}")
        say(f"orch8: console on http://{args.host}:{args.port}/console/ (Ctrl-C to stop)")
        try:
            wait_for_signal(stop)
        finally:
            stop.set()
            server.close()
            for t in threads:
                t.join(timeout=10)
        say("orch8: stopped")
    exit_now_if_failed(runner)
    exit_now_if_stranded(runner)
    return 0


def cmd_run(args: argparse.Namespace, settings: config.Settings) -> int:
    import_handler_modules(args.imports)
    runner_url = settings.runner_database_url
    with service_database(settings, runner_url, "ORCH8_RUNNER_DATABASE_URL") as url:
        require_primary(url)
        check_schema(url)
        exporter = metrics.serve_from_env()
        stop = threading.Event()
        runner = make_runner(url, settings)
        t = threading.Thread(target=runner.run, args=(stop,), name="runner")
        t.start()
        say(f"orch8: runner started on {db.describe(url)}")
        if exporter is not None:
            host, port = exporter[0].server_address[:2]
            shown = host.decode() if isinstance(host, bytes) else host
            say(f"orch8: runner metrics on http://{shown}:{port}/metrics")
        try:
            wait_for_signal(stop)
        finally:
            stop.set()
            t.join()
    exit_now_if_failed(runner)
    exit_now_if_stranded(runner)
    return 0


def cmd_serve(args: argparse.Namespace, settings: config.Settings) -> int:
    web_url = settings.web_database_url
    with service_database(settings, web_url, "ORCH8_WEB_DATABASE_URL") as url:
        require_primary(url)
        check_schema(url)
        server = make_server(url, args.host, args.port, threads=args.threads)
        say(f"orch8: operator service on http://{args.host}:{args.port}/")
        stop = threading.Event()
        t = threading.Thread(target=server.run, name="web", daemon=True)
        t.start()
        try:
            wait_for_signal(stop)
        finally:
            server.close()
            t.join(timeout=10)
    return 0


def cmd_db_migrate(args: argparse.Namespace, settings: config.Settings) -> int:
    with database(settings) as url:
        require_primary(url)
        run_migrations(url)
    return 0


def cmd_db_status(args: argparse.Namespace, settings: config.Settings) -> int:
    with database(settings) as url, db.connect(url, autocommit=True) as conn:
        st = migrate.status(conn)
        rep = sqlapi.server.replication(conn)
    say(f"database version {st.database_version}, this orch8 knows {st.known_version}")
    say(f"server: {describe_replication(rep)}")
    say(
        f"lease: {settings.lease:g}s (ORCH8_LEASE_SECONDS); keep it longer than a failover "
        "takes, or steps of a runner waiting for the new primary are taken over"
    )
    for m in st.pending:
        say(f"  pending  {m.kind} {m.name}")
    for name in st.edited:
        say(f"  EDITED   {name} (changed after it was applied)")
    for name in st.unknown:
        say(f"  UNKNOWN  {name} (applied by a newer orch8)")
    return 0 if st.current else 3


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], settings: config.Settings | None
) -> None:
    host = settings.host if settings else config.DEFAULT_HOST
    port = settings.port if settings else config.DEFAULT_PORT

    def web_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--host", default=host, help=f"listen address (default {host})")
        sp.add_argument("--port", type=int, default=port, help=f"listen port (default {port})")

    up = sub.add_parser("up", help="run the engine and the operator service together")
    web_flags(up)
    import_flag(up)
    up.set_defaults(func=cmd_up)
    run = sub.add_parser("run", help="run the engine runner only")
    import_flag(run)
    run.set_defaults(func=cmd_run)
    serve = sub.add_parser("serve", help="run the operator service only (waitress)")
    web_flags(serve)
    serve.add_argument("--threads", type=int, default=8, help="worker threads (default 8)")
    serve.set_defaults(func=cmd_serve)
    dbp = sub.add_parser("db", help="database schema commands")
    dbsub = dbp.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    dbsub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_db_migrate)
    dbsub.add_parser("status", help="show the schema version").set_defaults(func=cmd_db_status)
    history.add_parsers(dbsub)
