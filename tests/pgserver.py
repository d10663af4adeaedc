"""Which PostgreSQL the tests use, and fresh databases cloned from a migrated template.

Order of preference: ORCH8_TEST_DATABASE_URL; a Docker engine (testcontainers, image
built from docker/); the embedded server from the wheel. Shared by the pytest fixtures
and the pgTAP runner so both test the same thing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import conninfo

from orch8_py import migrate

ROOT = Path(__file__).resolve().parent.parent


def _log(msg: str) -> None:
    print(f"[test-db] {msg}", file=sys.stderr, flush=True)


def _docker_ready() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def server() -> Iterator[str]:
    """Yield an admin URL (a database where CREATE DATABASE may be run)."""
    url = os.environ.get("ORCH8_TEST_DATABASE_URL")
    if url:
        _log(f"using ORCH8_TEST_DATABASE_URL ({url.split('@')[-1]})")
        yield url
        return
    if _docker_ready():
        from testcontainers.core.image import DockerImage
        from testcontainers.postgres import PostgresContainer

        _log("using a Docker container built from docker/")
        with (
            DockerImage(path=str(ROOT / "docker"), tag="orch8-postgres-test:latest") as image,
            PostgresContainer(str(image), driver=None) as pg,
        ):
            yield pg.get_connection_url()
        return
    from orch8_py.embedded import EmbeddedPostgres

    _log("no ORCH8_TEST_DATABASE_URL and no Docker engine: using the embedded PostgreSQL")
    with tempfile.TemporaryDirectory(prefix="orch8-test-") as tmp:
        os.chmod(tmp, 0o755)
        emb = EmbeddedPostgres(Path(tmp))
        try:
            url = emb.start()
            yield url
        finally:
            emb.stop()


def with_dbname(url: str, dbname: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return conninfo.make_conninfo(**params)


def create_template(admin_url: str) -> str:
    """A freshly migrated database to clone tests from. Returns its name."""
    name = f"orch8_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(with_dbname(admin_url, name), autocommit=True) as conn:
        migrate.migrate(conn)
    return name


def clone(admin_url: str, template: str, prefix: str = "orch8_t") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


def drop(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
