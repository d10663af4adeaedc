"""Fixtures: one PostgreSQL per session, one fresh database per test."""

from __future__ import annotations

import psycopg
import pytest

from tests import pgserver
from tests.http_provider import provider  # noqa: F401  (a fixture for every test module)


@pytest.fixture(scope="session")
def admin_url():
    with pgserver.server() as url:
        yield url


@pytest.fixture(scope="session")
def template_db(admin_url):
    name = pgserver.create_template(admin_url)
    yield name
    pgserver.drop(admin_url, name)


@pytest.fixture
def empty_db_url(admin_url):
    """A database with nothing in it (for migration tests)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        name = f"orch8_e_{__import__('uuid').uuid4().hex[:12]}"
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pgserver.with_dbname(admin_url, name)
    pgserver.drop(admin_url, name)


@pytest.fixture
def db_url(admin_url, template_db):
    """A fresh, migrated database cloned from the session template."""
    name = pgserver.clone(admin_url, template_db)
    yield pgserver.with_dbname(admin_url, name)
    pgserver.drop(admin_url, name)


@pytest.fixture
def conn(db_url):
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c
