"""Shared fixtures of tests/.

PostgreSQL: ``MP_TEST_POSTGRES`` is a libpq URL of a database where the test user may CREATE DATABASE.
``python3 build.py test`` sets it to a throwaway cluster it starts (tests/pgcluster.py) when PostgreSQL's
binaries are installed. Unset, the PostgreSQL tests are skipped, except in CI (``CI`` set to a true value),
where they fail: they are never silently skipped in CI.
"""

from __future__ import annotations

import gc
import os
import secrets
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from monitor_protocol.doors import collector
from pgcluster import ci_is_true

PG_ENV = "MP_TEST_POSTGRES"


@pytest.fixture(autouse=True)
def _collector_left_on() -> Iterator[None]:
    """The HTTP door holds the garbage collector off while a wake's replies are written
    (doors/collector.py): no test may leave it off for the tests after it."""
    yield
    held = collector.HOLD.held
    while collector.HOLD.held:
        collector.HOLD.release()
    if not gc.isenabled():
        gc.enable()
        pytest.fail("the test left the garbage collector disabled", pytrace=False)
    if held:
        pytest.fail("the test left a hold on the garbage collector (doors/collector.py)", pytrace=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """The ``MP_TEST_POSTGRES`` URL: skips the test when it is unset, fails it when it is unset in CI."""
    url = os.environ.get(PG_ENV, "").strip()
    if url:
        return url
    why = (
        f"{PG_ENV} is not set (python3 build.py test starts a throwaway PostgreSQL cluster when PostgreSQL "
        "is installed: apt-get install postgresql)"
    )
    if ci_is_true():
        pytest.fail(f"{why}; CI is set, and PostgreSQL tests are never silently skipped in CI", pytrace=False)
    pytest.skip(why)


def _with_dbname(url: str, dbname: str) -> str:
    """``url`` with its database replaced by ``dbname`` (a URL stays a URL; key=value conninfo too)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(dbname)))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, dbname=dbname)


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty database ``mp_test_<random hex>`` on the ``MP_TEST_POSTGRES`` server: yields its URL
    and drops it afterwards (``WITH (FORCE)``: connections the test left open are ended)."""
    try:
        import psycopg
        from psycopg import sql
    except ImportError as exc:
        why = f"psycopg is not installed ({exc}); pip install -e '.[test]'"
        if ci_is_true():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    name = f"mp_test_{secrets.token_hex(8)}"
    with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_dbname(pg_admin_url, name)
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True, connect_timeout=10) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg(pg_url: str) -> Iterator[Any]:
    """A PostgresStore on a fresh database (`pg_url`), closed after the test."""
    from monitor_protocol.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    yield store
    store.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs PostgreSQL (a PostgreSQL fixture, or a parameter named postgres) is marked
    `postgres`, so the quick lane can leave it out (python3 build.py test --quick)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        needs = {"pg_url", "pg_admin_url"} & set(getattr(item, "fixturenames", ()))
        if needs or "postgres" in params.values():
            item.add_marker(pytest.mark.postgres)
