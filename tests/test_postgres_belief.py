"""A call that locks a monitor whole (a publish) takes the monitor's row from the server's memory of it and
sends it with the lock, for the database to compare under the lock (PostgresStore.get_monitor,
postgres_sql.py LOCK_AS_READ_SQL): one round trip instead of two. A row another server changed meanwhile
aborts the call before anything of it is written, and it runs again reading the row (StaleRead): nothing is
lost, nothing is done twice, seqs stay dense, and a refusal is never made from a stale row."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import StaleRead, StorageError
from monitor_protocol.doors.engines import EngineLanes
from monitor_protocol.store import postgres
from monitor_protocol.store.postgres import PostgresStore
from serverutil import with_user
from test_postgres_group import keyed, run_queued

psycopg = pytest.importorskip("psycopg")

TYPE = "com.example.x"
NEW = "com.example.new"


def cost(store: PostgresStore, call) -> tuple[int, int]:
    s0, r0 = store.statements, store.round_trips
    call()
    return store.statements - s0, store.round_trips - r0


@pytest.fixture
def two(pg: PostgresStore) -> Any:
    """Two servers on one database: (service A, service B, the owner's token)."""
    a = MonitorService(pg)
    owner = a.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    other = PostgresStore(pg.url)
    try:
        yield a, MonitorService(other), owner
    finally:
        other.close()


def body(i: int, type_: str = TYPE) -> dict[str, Any]:
    return {"type": type_, "subject": "s", "data": {"i": i}}


def test_a_publish_from_a_remembered_row_is_one_round_trip_and_its_control_two(pg):
    service = MonitorService(pg)
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    service.publish("ci", body(0), owner)
    # The lock with the row's check, the row, the observation and the NOTIFY: sent together with the commit.
    assert cost(pg, lambda: service.publish("ci", body(1), owner)) == (2, 1)
    assert cost(pg, lambda: service.publish("ci", body(2), owner)) == (2, 1)
    # positive control: without the memory, the lock and the row's read are a round trip of their own
    pg.believe_memory = False
    assert cost(pg, lambda: service.publish("ci", body(3), owner)) == (2, 2)
    pg.believe_memory = True
    assert cost(pg, lambda: service.publish("ci", body(4), owner)) == (2, 1)
    assert service.state("ci", None)["head"] == 6 and pg.stale == 0


def test_a_row_another_server_changed_is_read_again_and_nothing_is_lost_or_doubled(two, monkeypatch):
    a, b, owner = two
    a.publish("ci", body(0), owner)  # A remembers the row it wrote
    seqs = []
    for i in range(1, 11):  # the two servers in turn: each time, the other's memory is stale
        seqs.append(b.publish("ci", body(i), owner)["seq"])
        seqs.append(a.publish("ci", body(100 + i), owner)["seq"])
    assert sorted(seqs) == list(range(3, 23)) and len(set(seqs)) == 20  # dense, each once
    assert a.state("ci", None)["head"] == 22 == b.state("ci", None)["head"]
    assert a.store.stale >= 1  # the check found A's memory stale and the call ran again
    log = a.read_log("ci", 1, 50)["observations"]
    assert [int(o["id"]) for o in log] == list(range(1, 23))
    assert sorted(o["data"]["i"] for o in log[2:]) == sorted([*range(1, 11), *range(101, 111)])
    # After a stale row, the monitor's row is read with its lock for a while (two round trips) ...
    monkeypatch.setattr(postgres, "DOUBT_SECONDS", 60.0)
    a.store._doubted.clear()  # (the turns above left A doubting the row: believed again from here)
    a.publish("ci", body(49), owner)
    b.publish("ci", body(50), owner)
    stale = a.store.stale
    assert cost(a.store, lambda: a.publish("ci", body(51), owner)) == (4, 3)  # the check, then again, reading
    assert a.store.stale == stale + 1
    assert cost(a.store, lambda: a.publish("ci", body(52), owner)) == (2, 2)  # doubted: read, not believed
    # ... and believed again once that while is over
    a.store._doubted.clear()
    assert cost(a.store, lambda: a.publish("ci", body(53), owner)) == (2, 1)


def test_a_refusal_is_never_made_from_a_stale_row(two):
    a, b, owner = two
    a.configure("ci", "update", {"patch": {"visibility": "shared"}}, owner)  # A remembers it shared
    b.configure("ci", "update", {"patch": {"visibility": "public"}}, owner)
    # From its memory A would refuse a subscriber without the subscribe token; the call's next read (its
    # subscriber's row) carries the lock and the check of that memory, which finds the row changed, and the
    # call runs again on the row as it is. (A refusal made before any read: the test below.)
    a.subscribe({"monitor": "ci", "subscriber": "agent:a"}, None)
    assert a.store.stale == 1
    # positive control: the same refusal made from a current row stands
    b.configure("ci", "update", {"patch": {"visibility": "shared"}}, owner)
    a.store._doubted.clear()
    a.state("ci", owner)  # (A reads the row as it is now)
    with pytest.raises(ProtocolError, match="subscribe token"):
        a.subscribe({"monitor": "ci", "subscriber": "agent:b"}, None)


class Refused(Exception):
    """What a rule raises when it refuses, having read only the monitor."""


def test_a_call_failing_on_a_remembered_row_checks_the_row_before_its_failure_is_told(two):
    a, b, owner = two
    a.publish("ci", body(0), owner)
    store = a.store

    def refuse_from_memory() -> None:
        with store.transaction():
            store.lock_monitor("ci")
            assert store.get_monitor("ci") is not None  # from memory: nothing sent yet
            raise Refused

    b.publish("ci", body(1), owner)  # A's memory is stale
    with pytest.raises(StaleRead):  # the engine runs the call again (core/runtime.py)
        refuse_from_memory()
    assert store.stale == 1
    store._doubted.clear()
    a.state("ci", owner)
    # positive control: from a current row the failure itself is told, after the same check
    trips = store.round_trips
    with pytest.raises(Refused):
        refuse_from_memory()
    assert store.round_trips - trips == 2 and store.stale == 1  # the check, then the rollback


def test_a_logged_refusal_from_a_stale_row_is_made_again_from_the_row(two):
    a, b, owner = two
    a.publish("ci", body(0), owner)  # A remembers a monitor whose vocabulary is [TYPE]
    b.configure("ci", "update", {"patch": {"types": [TYPE, NEW]}}, owner)
    assert a.publish("ci", body(1, NEW), owner)["seq"] == 4 and a.store.stale == 1
    # positive control: a type neither row allows is refused (and logged), once the row is known current
    with pytest.raises(ProtocolError):
        a.publish("ci", body(2, "com.example.unknown"), owner)
    assert a.store.stale == 1


def test_a_group_commit_from_a_stale_row_runs_every_call_alone(two):
    a, b, owner = two
    a.publish("ci", body(0), owner)
    engine = EngineLanes(a.store, a, lanes=1)

    def publish(i: int) -> dict[str, Any]:
        return a.publish("ci", body(i), owner)

    keyed(engine, {publish: "ci"})
    try:
        b.publish("ci", body(99), owner)  # A's memory of the row is now stale
        out = run_queued(engine, [(publish, (i,)) for i in range(5)])
        assert all(ok for ok, _ in out), out
        assert sorted(v["seq"] for _, v in out) == list(range(4, 9))
        assert engine.given_up == 1 and a.store.stale == 1  # the group rolled back, its calls ran alone
    finally:
        engine.stop()
    # positive control: with the memory current, the next group commits as one (one round trip for five)
    a.store._doubted.clear()
    engine = EngineLanes(a.store, a, lanes=1)
    keyed(engine, {publish: "ci"})
    try:
        trips = a.store.round_trips
        out = run_queued(engine, [(publish, (i,)) for i in range(5, 10)])
        assert all(ok for ok, _ in out) and engine.given_up == 0 and engine.grouped == 4
        assert a.store.round_trips - trips == 1 and a.store.stale == 1
    finally:
        engine.stop()
    assert a.state("ci", None)["head"] == 13


def test_a_statement_first_prepared_behind_a_failure_is_prepared_again(pg_url):
    """A failure aborts the rest of its pipeline, a first preparation included: the statement is prepared
    again on its next use (before, its name was kept and that use failed: prepared statement does not exist)."""
    from monitor_protocol.store.postgres_wire import Wire

    conn = psycopg.connect(pg_url, autocommit=True)
    try:
        w = Wire(conn, psycopg)
        sql = "SELECT $1::int + 1"
        w.later("SELECT 1/0", [])  # fails: everything sent behind it in the transaction is skipped
        with pytest.raises(psycopg.errors.DivisionByZero):
            w.results([(sql, (1,))])
        w.rollback()
        assert w.query(sql, (41,)) == [(b"42",)]
        # positive control: a statement prepared in a round trip that succeeded is used again as prepared
        before = dict(w._prepared)
        assert w.query(sql, (1,)) == [(b"2",)] and w._prepared == before
        w.sync()
    finally:
        conn.close()


def rpc_publish(id_: int, token: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": "monitors/publish",
        "params": {"id": "ci", "type": TYPE, "subject": "s", "data": {"i": id_}, "token": token},
    }


def test_a_json_rpc_batch_from_a_stale_row_runs_each_call_again_and_tells_its_appends(two):
    import json

    from monitor_protocol.api import jsonrpc

    a, b, owner = two
    heard: list[tuple[str, int]] = []
    a.add_listener(lambda monitor, head: heard.append((monitor, head)))
    a.publish("ci", body(0), owner)
    heard.clear()
    b.publish("ci", body(1), owner)  # A's memory of the row is now stale
    reply = jsonrpc.handle(a, json.dumps([rpc_publish(i, owner) for i in range(3)]).encode(), None)
    assert reply.status == 200, reply.body
    assert sorted(r["result"]["seq"] for r in reply.body) == [4, 5, 6] and a.store.stale == 1
    assert heard == [("ci", 4), ("ci", 5), ("ci", 6)]  # each call, run alone, told once committed
    # positive control: a batch from a current row commits as one group, its appends told after its commit
    heard.clear()
    a.store._doubted.clear()
    commits = a.store.stats.commits
    reply = jsonrpc.handle(a, json.dumps([rpc_publish(i, owner) for i in range(3, 5)]).encode(), None)
    assert [r["result"]["seq"] for r in reply.body] == [7, 8] and a.store.stats.commits == commits + 1
    assert heard == [("ci", 7), ("ci", 8)] and a.store.stale == 1


def test_a_database_of_this_schema_version_without_the_check_gets_it_and_a_role_that_cannot_add_it_reads(
    pg_url,
):
    from monitor_protocol.store.postgres_sql import AS_READ_FUNCTION, READER_AS_READ_FUNCTION

    PostgresStore(pg_url).close()  # the schema, as a release before the checks created it ...
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP FUNCTION {AS_READ_FUNCTION}")
        conn.execute(f"DROP FUNCTION {READER_AS_READ_FUNCTION}")
        conn.execute("DROP INDEX leases_held")  # (an index added the same way: the sweep's held leases)
        user = "mp_limited_" + pg_url.rsplit("_", 1)[-1][:8]
        conn.execute(f"CREATE ROLE {user} LOGIN")
        for table in (
            "mp_meta",
            "monitors",
            "observations",
            "subjects",
            "subscriptions",
            "leases",
            "publish_keys",
        ):
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {user}")
        conn.execute(f"REVOKE CREATE ON SCHEMA public FROM {user}, PUBLIC")
    limited_url = with_user(pg_url, user)
    try:
        # ... opened by a role that may not create it: it opens, and reads each row with its lock
        limited = PostgresStore(limited_url)
        try:
            assert limited.believe_memory is False
            service = MonitorService(limited)
            owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)[
                "owner_token"
            ]
            service.publish("ci", body(0), owner)
            assert cost(limited, lambda: service.publish("ci", body(1), owner)) == (2, 2)
            sub = service.subscribe({"monitor": "ci", "subscriber": "agent:r", "from": "earliest"}, None)
            reader = (sub["subscription"]["id"], sub["token"])
            service.pull(*reader, limit=1)
            assert cost(limited, lambda: service.pull(*reader, limit=1, ack=2)) == (2, 2)
        finally:
            limited.close()
        # ... opened by the owner: the function alone is added, and publishes believe memory again
        store = PostgresStore(pg_url)
        try:
            assert store.believe_memory is True
            service = MonitorService(store)
            service.publish("ci", body(2), owner)
            assert cost(store, lambda: service.publish("ci", body(3), owner)) == (2, 1)
            service.pull(*reader, limit=1)
            assert cost(store, lambda: service.pull(*reader, limit=1, ack=3)) == (2, 1)
            assert store._rows("SELECT to_regclass('leases_held') IS NOT NULL")[0][0] == b"t"
        finally:
            store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {user}")
            conn.execute(f"DROP ROLE {user}")


def test_a_refusal_from_memory_whose_check_fails_is_not_told_the_failure_is(two, pg_url):
    a, b, owner = two
    a.publish("ci", body(0), owner)
    store = a.store
    b.publish("ci", body(1), owner)  # A's memory is stale, and its connection is about to go
    with pytest.raises(StorageError), store.transaction():  # (Refused, made from memory, is never told)
        store.lock_monitor("ci")
        assert store.get_monitor("ci") is not None
        # Gone during the call (a connection found gone before a call is replaced, and the call goes on).
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND application_name = 'mp serve' "
                "AND backend_type = 'client backend'"
            )
        raise Refused


def test_a_call_run_again_after_a_stale_row_reads_every_row_whatever_memory_holds(two, monkeypatch):
    a, b, owner = two
    a.publish("ci", body(0), owner)
    store = a.store
    # As if another lane remembered the stale row again at once, and no doubt were kept: only the rerun's
    # own rule (it believes nothing) ends the reruns.
    monkeypatch.setattr(store._monitor, "forget", lambda key: None)
    monkeypatch.setattr(postgres, "DOUBT_SECONDS", 0.0)
    b.publish("ci", body(1), owner)
    assert cost(store, lambda: a.publish("ci", body(2), owner)) == (
        4,
        3,
    )  # the check, then once again, reading
    assert store.stale == 1 and a.state("ci", None)["head"] == 4


def test_a_group_run_by_run_group_from_a_stale_row_runs_each_call_alone(two):
    from monitor_protocol.doors.engines import run_group

    a, b, owner = two
    a.publish("ci", body(0), owner)
    b.publish("ci", body(1), owner)  # A's memory of the row is now stale
    calls = [(a.publish, ("ci", body(i), owner)) for i in range(2, 5)]
    outcomes = run_group(a.store.batch, calls)
    assert all(ok for ok, _ in outcomes), outcomes  # (GroupConflict was every call's outcome before)
    assert sorted(v["seq"] for _, v in outcomes) == [4, 5, 6] and a.store.stale == 1
    # positive control: from a current row, one group, one commit
    a.store._doubted.clear()
    commits = a.store.stats.commits
    outcomes = run_group(a.store.batch, [(a.publish, ("ci", body(i), owner)) for i in range(5, 7)])
    assert [v["seq"] for _, v in outcomes] == [7, 8] and a.store.stats.commits == commits + 1
