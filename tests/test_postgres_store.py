"""What only the PostgreSQL store has to show (the store contract and the conformance suite run on it
elsewhere): its schema version is checked, text PostgreSQL cannot hold (U+0000) still round-trips and still
filters exactly, a password in the URL is never printed, and a database that is away is a 503 at once."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import Observation
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import Changes, LogQuery, StorageError, Term
from monitor_protocol.store.postgres import PostgresStore, StoreVersionError, _dec, _enc, redacted
from serverutil import mp_command, mp_env, start_server, stop_server, with_user
from test_store_contract import monitor

psycopg = pytest.importorskip(
    "psycopg"
)  # the test extra installs it; conftest's pg_url fails in CI without it


def test_a_schema_newer_than_this_release_is_refused(pg_url):
    PostgresStore(pg_url).close()  # positive control: a fresh database gets the schema and opens
    PostgresStore(pg_url).close()  # and opens again as it is
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE mp_meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreVersionError, match="schema version 99.*newer release"):
        PostgresStore(pg_url)
    done = serve_once(pg_url)
    assert done.returncode == 1 and "newer release" in done.stderr and "Traceback" not in done.stderr


# Subjects built from the characters the escape code is about, and plain ones.
ALPHABET = st.sampled_from(["\x00", "\x01", "\x02", "a", "b", "\U0010ffff", "é"])
SUBJECT = st.text(ALPHABET, min_size=1, max_size=4)


@given(st.lists(SUBJECT, min_size=1, max_size=6), SUBJECT, SUBJECT)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_text_postgresql_cannot_hold_round_trips_and_filters_exactly(pg, subjects, exact, prefix):
    assert _dec(_enc(exact)) == exact and _dec(_enc(prefix)) == prefix
    mid = f"m{abs(hash((tuple(subjects), exact, prefix))) % 10**12}"
    rows = [
        Observation.of(mid, i, {"id": str(i), "source": "x", "type": "com.example.x", "subject": s})
        for i, s in enumerate(subjects, start=1)
    ]
    with pg.transaction():
        pg.apply(Changes(monitors=[monitor(mid)], observations=rows, subjects=[(mid, s) for s in subjects]))
    assert [o.subject for o in pg.scan(mid, 1, len(rows))] == subjects  # every character comes back
    assert all(pg.has_subject(mid, s) for s in subjects)
    for query in (
        LogQuery(((((Term("subject", exact=(exact,))),),),)),
        LogQuery(((((Term("subject", prefixes=(prefix,))),),),)),
    ):
        want = [o.seq for o in rows if query.holds(o)]  # the engine's own meaning of the query
        assert [o.seq for o in pg.scan(mid, 1, len(rows), query)] == want
        assert pg.count(mid, 1, len(rows), query) == len(want)


def test_a_password_in_the_url_is_never_printed(tmp_path, pg_url):
    secret = "s3cret-never-printed"
    user = urllib.parse.unquote(urllib.parse.urlsplit(pg_url).username or "") or "mp"
    with_password = with_user(pg_url, user, secret)
    assert secret in with_password
    assert secret not in redacted(with_password) and "***" in redacted(with_password)
    as_parameter = redacted(f"postgresql://db.internal/mp?user=mp&password={secret}&sslmode=require")
    assert secret not in as_parameter and as_parameter.endswith("password=***&sslmode=require")
    base, proc = start_server(tmp_path, "--db", with_password)  # trust auth: the password is not needed
    try:
        r = __import__("httpx").get(base + "/mp/v0/discover", timeout=10)
        assert r.status_code == 200  # positive control: the server runs on that URL
    finally:
        stop_server(proc)
    with open(proc.log_path) as f:  # type: ignore[attr-defined]
        log = f.read()
    assert f"database: postgresql://{urllib.parse.quote(user, safe='')}:***@" in log and secret not in log
    # one warning with one piece of advice (there were two, each advising another place)
    warned = [line for line in log.splitlines() if "database password" in line]
    assert len(warned) == 1 and "on the command line" in warned[0] and "PGPASSWORD" in warned[0], warned


def serve_once(db: str) -> subprocess.CompletedProcess[str]:
    """`mp serve --db DB` run to its end: for a database it refuses at start."""
    return subprocess.run(
        mp_command("serve", "--db", db, "--port", "0"),
        capture_output=True,
        text=True,
        env=mp_env(),
        timeout=60,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_database_that_is_away_is_a_503_at_once(pg_url):
    store = PostgresStore(pg_url)
    service = MonitorService(store)
    assert service.create_monitor({"id": "ci", "visibility": "public"}, None)["monitor"]["id"] == "ci"
    store._conn.close()  # the database went away under the server
    port = free_port()  # and it now lives where nothing listens
    store.url = f"postgresql://mp@127.0.0.1:{port}/nothing"
    for _ in range(3):  # every call: 503 UNAVAILABLE, retry later; never a 500 or a driver error
        with pytest.raises(ProtocolError) as caught:
            service.state("ci", None)
        assert caught.value.code == "UNAVAILABLE" and caught.value.http_status == 503
        assert caught.value.extras.get("retry_after") == 1
    with pytest.raises(StorageError):
        store.get_monitor("ci")
    store.url = pg_url  # it is back: the next call after the retry window reconnects by itself
    store._retry_at = 0.0
    assert service.state("ci", None)["monitor"] == "ci"
    store.close()


def test_a_commit_whose_connection_was_lost_says_the_request_may_have_been_written(pg_url, monkeypatch):
    store = PostgresStore(pg_url)
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": ["com.example.x"]}, None)
    real_commit = store._wire.sync  # the Sync that ends a call's implicit transaction is its commit

    def lost(*_args, **kwargs):
        real_commit(**kwargs)  # the database has it...
        raise psycopg.OperationalError("server closed the connection unexpectedly")  # ...the reply is lost

    monkeypatch.setattr(store._wire, "sync", lost)
    with pytest.raises(ProtocolError) as caught:
        service.publish("ci", {"type": "com.example.x", "subject": "s", "data": {}}, owner["owner_token"])
    err = caught.value
    assert err.code == "UNAVAILABLE" and err.extras.get("outcome") == "unknown"
    assert "may have been written" in err.message and "nothing of this request was written" not in err.message
    monkeypatch.undo()
    assert service.state("ci", None)["head"] >= 2  # it was written: the head moved past the created row
    with pytest.raises(ProtocolError) as before_commit:  # positive control: a failure before the commit
        store._conn.close()
        store._retry_at = float("inf")  # no reconnection for this call
        service.state("ci", None)
    assert "nothing of this request was written" in before_commit.value.message
    store.close()


def test_an_id_with_u0000_is_not_found_not_a_storage_failure(pg_url):
    store = PostgresStore(pg_url)
    service = MonitorService(store)
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    assert service.state("ci", None)["monitor"] == "ci"  # positive control
    for call in (
        lambda: service.state("c\x00i", None),
        lambda: service.pull("sub-\x00", "mpr_x"),
        lambda: service.subscribe({"monitor": "c\x00i", "subscriber": "agent:r"}, None),
    ):
        with pytest.raises(ProtocolError) as caught:
            call()
        assert caught.value.code in ("NOT_FOUND", "UNAUTHORIZED", "INVALID"), caught.value
    store.close()


def test_a_database_that_is_away_tells_clients_nothing_of_where_it_is(pg_url):
    secret = "pw-not-for-clients"
    store = PostgresStore(pg_url)
    service = MonitorService(store)
    store._conn.close()
    store.url = f"postgresql://mp:{secret}@db-host-not-for-clients.invalid:{free_port()}/proddb"
    with pytest.raises(ProtocolError) as caught:
        service.state("ci", None)
    said = caught.value.message
    assert caught.value.code == "UNAVAILABLE" and "unreachable" in said
    assert secret not in said and "db-host-not-for-clients" not in said and "proddb" not in said
    store.url = pg_url
    store.close()


def test_a_malformed_url_never_prints_its_password(tmp_path):
    for url in ("postgresql://mp:my%zzsecret@127.0.0.1:1/x", "postgresql://mp:my secret@127.0.0.1:1/x"):
        with pytest.raises(StorageError) as caught:
            PostgresStore(url)
        assert "secret" not in str(caught.value)
        done = serve_once(url)
        assert done.returncode == 1 and "cannot open the database" in done.stderr, done.stderr
        assert "secret" not in done.stderr + done.stdout and "Traceback" not in done.stderr


@pytest.fixture
def password_role(pg_admin_url, pg_url):
    """The role tests/pgcluster.py makes give a password over TCP, created with a fresh password and dropped
    after: (its password, a URL of `pg_url`'s database as that role). Skipped (failed in CI) where the
    cluster has no such rule (an MP_TEST_POSTGRES of the caller's own)."""
    import psycopg
    from pgcluster import PASSWORD_ROLE, ci_is_true

    password = "pw-" + secrets.token_hex(8)
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        rules = admin.execute(
            "SELECT count(*) FROM pg_hba_file_rules WHERE %s = ANY(user_name) AND auth_method <> 'trust'",
            (PASSWORD_ROLE,),
        ).fetchone()[0]
        if not rules:
            why = f"the PostgreSQL of MP_TEST_POSTGRES asks {PASSWORD_ROLE} no password (tests/pgcluster.py does)"
            if ci_is_true():
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{password}'")
    try:
        yield password, with_user(pg_url, PASSWORD_ROLE, password)
    finally:
        for where in (pg_url, pg_admin_url):  # what it owns or was granted, in each database, then the role
            with psycopg.connect(where, autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {PASSWORD_ROLE}")
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")


def test_a_wrong_password_is_one_line_that_never_shows_it(password_role):
    password, url = password_role
    wrong = url.replace(password, "wrong-pw-4711")
    done = serve_once(wrong)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "password authentication failed for user" in done.stderr, done.stderr
    assert "wrong-pw-4711" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert ":***@" in done.stderr  # the URL, named without its password


def test_a_role_that_may_not_create_tables_is_told_what_to_grant(password_role, pg_admin_url, pg_url):
    """PostgreSQL 15 and later let only a database's owner create tables in its public schema: a role that
    does not own the database is refused them, and the operator is told the two ways out, in one line."""
    import psycopg

    password, url = password_role
    done = serve_once(url)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    said = done.stderr
    assert "does not let the role mp_password create this server's tables" in said, said
    assert (
        "CREATE DATABASE mp OWNER mp_password;" in said
        and "GRANT CREATE ON SCHEMA public TO mp_password;" in said
    )
    assert password not in said and "LINE 1" not in said and "Traceback" not in said
    with psycopg.connect(pg_url, autocommit=True) as owner:  # the grant it names is enough
        owner.execute("GRANT CREATE ON SCHEMA public TO mp_password")
    store = PostgresStore(url)  # positive control: the same role and password, allowed
    assert MonitorService(store).create_monitor({"id": "ci"}, None)["monitor"]["id"] == "ci"
    store.close()


def test_a_revoked_privilege_is_a_503_that_names_it_not_an_incident(password_role, pg_url):
    """An operator's: after REVOKE INSERT ON observations, every publish was an "incident" with a traceback
    in the log (psycopg's InsufficientPrivilege was no storage failure). It is now a 503 that says the role
    lacks a privilege and that nothing was written; the control: the same call before the REVOKE."""

    _password, url = password_role
    with psycopg.connect(pg_url, autocommit=True) as owner:
        owner.execute("GRANT CREATE ON SCHEMA public TO mp_password")
    store = PostgresStore(url)
    try:
        service = MonitorService(store)
        token = service.create_monitor({"id": "rv", "types": ["com.example.x"]}, None)["owner_token"]
        assert service.publish("rv", {"type": "com.example.x"}, token)["seq"] >= 1  # control
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("REVOKE INSERT ON observations FROM mp_password")
        with pytest.raises(ProtocolError) as caught:
            service.publish("rv", {"type": "com.example.x"}, token)
        err = caught.value
        assert err.code == "UNAVAILABLE" and err.http_status == 503
        assert "privilege" in str(err) and "nothing of this request was written" in str(err), str(err)
        assert "incident" not in str(err) and "outcome" not in err.extras

    finally:
        store.close()


def test_a_dbas_session_timeouts_do_not_end_the_connections_a_server_holds_idle(pg_url):
    """An operator's: with idle_session_timeout = 2s the LISTEN connection was ended every ~2.5 s (LISTEN
    reconnecting, and missing appends, forever) and at 900 ms the leader lock changed hands each second;
    with statement_timeout = 1ms for the role, the readers' counts were never stored. The connections a
    server holds while idle (LISTEN, the leader lock, the counts) set their own; the control: a plain
    connection with the database's settings is ended, and times out."""
    import time

    name = urllib.parse.urlsplit(pg_url).path.lstrip("/")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        if admin.info.server_version < 140000:
            pytest.skip("idle_session_timeout is PostgreSQL 14's")
        admin.execute(f"ALTER DATABASE {name} SET idle_session_timeout = '1s'")
        admin.execute(f"ALTER DATABASE {name} SET statement_timeout = '1ms'")
    store = PostgresStore(pg_url)
    try:
        held = store._side_connection()
        plain = psycopg.connect(pg_url, autocommit=True)
        with pytest.raises(psycopg.errors.QueryCanceled):
            plain.execute("SELECT pg_sleep(0.05)")  # control: the database's statement_timeout
        time.sleep(1.6)
        with pytest.raises(psycopg.OperationalError):
            plain.execute("SELECT 1")  # control: ended while idle
        held.execute("SELECT pg_sleep(0.05)")  # the held one: still there, and not cut at 1 ms
        held.close()
    finally:
        store.close()


def test_a_database_with_no_connection_left_says_so_not_unreachable(pg_url):
    """An operator's: with max_connections (or the role's CONNECTION LIMIT) reached, clients were told the
    database was "unreachable". They are told it refuses more connections, and how many a server holds;
    the control: the same role with a connection to spare connects."""
    role = f"mp_limited_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        with pytest.raises(StorageError) as caught:
            PostgresStore(with_user(pg_url, role))
        said = str(caught.value)
        assert "refuses more connections" in said and "--db-connections + 3" in said, said
        assert "unreachable" not in said
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 5")
        with psycopg.connect(with_user(pg_url, role), autocommit=True) as conn:  # control
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_database_that_cannot_be_reached_is_one_line_naming_it_once(tmp_path):
    """What mp serve says when PostgreSQL does not answer: one line, the URL once, libpq's own words (its
    two lines joined), not the driver's class name."""
    url = f"postgresql://mp@127.0.0.1:{free_port()}/x"
    done = serve_once(url)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("mp serve: cannot open the database: cannot connect to PostgreSQL at ")
    assert done.stderr.count(url) == 1 and "refused" in done.stderr and "OperationalError" not in done.stderr


def test_every_server_on_a_database_seals_a_listing_with_one_key(pg_url):
    """A monitors listing's `next` that stops at a monitor the caller may not see is sealed
    (core/listing_seal.py); the key is the database's (mp_meta), so the next page may go to any server on it.
    Positive control: a memory store's key is its process's own, and differs from the database's."""
    from monitor_protocol.core import listing_seal
    from monitor_protocol.store.memory import MemoryStore

    first, second = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        assert first.listing_key is not None and len(first.listing_key) == 32
        assert second.listing_key == first.listing_key
        a, b = MonitorService(first), MonitorService(second)
        assert a.listing_key == b.listing_key == first.listing_key
        sealed = listing_seal.seal(a.listing_key, "", "p01999")
        assert listing_seal.opened(b.listing_key, sealed) == ("p01999", "", 1)
        assert MonitorService(MemoryStore()).listing_key != a.listing_key
    finally:
        first.close()
        second.close()


def _read_only(url: str) -> str:
    """`url` whose sessions start read-only, as on a standby."""
    if url.startswith(("postgresql://", "postgres://")):
        return url + ("&" if "?" in url else "?") + "options=-c%20default_transaction_read_only%3Don"
    return url + " options='-c default_transaction_read_only=on'"


def test_a_read_only_database_says_so_and_that_nothing_was_written(pg_url, tmp_path):
    """Found by an operator: on a read-only database (a standby) every write and every pull got a 503 saying
    the request may have been written, and /readyz said ready. Now the 503 says read-only and nothing
    written (no "outcome": "unknown"), plain reads work, and /readyz is 503 "read-only". The control: the
    same database, writable, publishes and is ready."""
    writable = PostgresStore(pg_url)
    service = MonitorService(writable)
    owner = service.create_monitor({"id": "ro", "visibility": "public", "types": ["com.example.x"]}, None)
    sub = service.subscribe({"monitor": "ro", "subscriber": "agent:r"}, owner["owner_token"])
    assert service.publish("ro", {"type": "com.example.x"}, owner["owner_token"])["seq"] >= 1  # control
    assert writable.read_only() is False
    writable.close()

    store = PostgresStore(_read_only(pg_url))
    try:
        assert store.read_only() is True
        ro = MonitorService(store)
        assert ro.state("ro", None)["monitor"] == "ro"  # a plain read works
        for call in (
            lambda: ro.publish("ro", {"type": "com.example.x"}, owner["owner_token"]),
            lambda: ro.pull(sub["subscription"]["id"], sub["token"], limit=1),
        ):
            with pytest.raises(ProtocolError) as caught:
                call()
            err = caught.value
            assert err.code == "UNAVAILABLE" and err.http_status == 503
            assert "read-only" in str(err) and "nothing of this request was written" in str(err), str(err)
            assert "outcome" not in err.extras
    finally:
        store.close()

    import httpx
    from serverutil import running_server

    with running_server(tmp_path, "--db", _read_only(pg_url)) as (base, _proc):
        ready = httpx.get(base + "/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["status"] == "read-only", ready.text
    with running_server(tmp_path, "--db", pg_url) as (base, _proc):
        assert httpx.get(base + "/readyz", timeout=10).json() == {"status": "ready"}  # control


def test_a_lock_held_too_long_is_a_503_that_says_nothing_was_written(pg_url):
    """Found by an operator: another session holding a lock on the log for 30 s. The server waited 10 s, as
    long as the Python client's own time limit, so clients gave up not knowing; and the 503 said "outcome
    unknown ... the connection was lost" though the database had rolled the call back. Now it waits 5 s and
    says nothing was written. The control: once the lock is gone the same publish goes through."""
    import time

    import psycopg
    from monitor_protocol.store.postgres_session import LOCK_TIMEOUT_MS

    assert LOCK_TIMEOUT_MS < 10_000  # under the client's default time limit (client/routes.py)
    store = PostgresStore(pg_url)
    service = MonitorService(store)
    try:
        owner = service.create_monitor(
            {"id": "locked", "visibility": "public", "types": ["com.example.x"]}, None
        )
        token = owner["owner_token"]
        with psycopg.connect(pg_url) as other:
            other.execute("LOCK TABLE observations IN ACCESS EXCLUSIVE MODE")  # held until this block ends
            began = time.monotonic()
            with pytest.raises(ProtocolError) as caught:
                service.publish("locked", {"type": "com.example.x"}, token)
            waited = time.monotonic() - began
            other.rollback()
        err = caught.value
        assert err.code == "UNAVAILABLE" and err.http_status == 503
        assert "nothing of this request was written" in str(err) and "outcome" not in err.extras, str(err)
        assert waited < 9.0, waited  # it said so before a client's 10 s ran out
        assert (
            service.publish("locked", {"type": "com.example.x"}, token)["seq"] == 2
        )  # control: seq 1 never was
    finally:
        store.close()


def test_the_readers_counts_fold_over_a_connection_that_died_while_idle(pg_url, caplog):
    """An operator's: after a database restart the fold of readers' counts failed once on its dead idle
    connection ("terminating connection due to administrator command"), logged, and kept them for the next.
    A fold now finds its idle connection gone before writing and opens another: written, nothing logged.
    The control: a live connection is used as it is."""
    import logging

    from monitor_protocol.store.postgres import Counts

    store = PostgresStore(pg_url)
    try:
        service = MonitorService(store)
        service.create_monitor({"id": "folds", "visibility": "public"}, None)
        counts = Counts(store._side_connection, store._peers.stop)
        live = store._side_connection()
        counts._pending = {"folds": [2, float("-inf")]}
        assert counts.fold(live) is live and counts.pending() == {}  # control
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (live.info.backend_pid,))
        counts._pending = {"folds": [3, float("-inf")]}
        with caplog.at_level(logging.WARNING, logger="monitor_protocol.store.postgres"):
            fresh = counts.fold(live)
        assert fresh is not None and fresh is not live and counts.pending() == {}
        assert not [r for r in caplog.records if "counts failed" in r.getMessage()]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            rec = admin.execute("SELECT rec FROM monitors WHERE id='folds'").fetchone()[0]
        assert json.loads(rec)["counters"]["delivered"] == 5  # both folds written
        fresh.close()
    finally:
        store.close()
