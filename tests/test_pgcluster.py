"""A positive control for the PostgreSQL tests: MP_TEST_POSTGRES (tests/conftest.py) reaches a real server,
configured for durability (fsync and synchronous_commit on), where a fresh database takes a table and a row."""

from __future__ import annotations


def test_pg_url_is_a_fresh_durable_database(pg_url):
    import psycopg

    with psycopg.connect(pg_url, connect_timeout=10) as conn:
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SELECT current_database()").fetchone()[0].startswith("mp_test_")
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO t VALUES (%s, %s)", (1, "hello"))
        conn.commit()
    with psycopg.connect(pg_url, connect_timeout=10) as conn:
        assert conn.execute("SELECT id, body FROM t").fetchall() == [(1, "hello")]
