"""A reader's call (a pull, an ack+pull) takes its subscription, its monitor and the rows after its cursor from
the server's memory, and sends its locks with a check of both rows, its write and the commit together
(PostgresStore.locked_subscription, postgres_sql.py READER_AS_READ_SQL): one round trip instead of two.
Whatever another server changed meanwhile (the monitor's head, the subscription's cursor, token or state)
fails the check before anything of the call is written, and the call runs again reading the rows: a reply
is never made from a stale row, a replaced token never works, nothing is delivered twice or skipped."""

from __future__ import annotations

from typing import Any

import pytest
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store import postgres
from monitor_protocol.store.postgres import PostgresStore

psycopg = pytest.importorskip("psycopg")

TYPE = "com.example.x"


def cost(store: PostgresStore, call) -> tuple[int, int]:
    s0, r0 = store.statements, store.round_trips
    call()
    return store.statements - s0, store.round_trips - r0


def body(i: int) -> dict[str, Any]:
    return {"type": TYPE, "subject": "s", "data": {"i": i}}


@pytest.fixture
def two(pg: PostgresStore) -> Any:
    """Two servers on one database, a monitor of 40 entries and one reader, whose first pull server A made
    (A remembers the reader, the monitor and the rows after its cursor): (A, B, owner token, reader)."""
    a = MonitorService(pg)
    owner = a.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    a.publish_many("ci", [body(i) for i in range(40)], owner)
    sub = a.subscribe({"monitor": "ci", "subscriber": "agent:r", "from": "earliest"}, None)
    reader = (sub["subscription"]["id"], sub["token"])
    a.pull(*reader, limit=1)
    other = PostgresStore(pg.url)
    try:
        yield a, MonitorService(other), owner, reader
    finally:
        other.close()


def ack_pull(service: MonitorService, reader: tuple[str, str], ack: int) -> dict[str, Any]:
    return service.pull(*reader, limit=1, ack=ack)


def test_a_pull_from_memory_is_one_round_trip_and_tells_the_head_another_server_moved(two):
    a, b, owner, reader = two
    replies: list[dict[str, Any]] = []
    head = a.state("ci", None)["head"]
    assert cost(a.store, lambda: replies.append(ack_pull(a, reader, 2))) == (2, 1)
    assert [o["id"] for o in replies[-1]["observations"]] == ["2"] and replies[-1]["head"] == head
    for i in range(3):
        b.publish("ci", body(100 + i), owner)  # A's memory of the monitor's row is now stale
    # the check finds the row changed: the call runs again, reading it, and tells the head as it is
    assert cost(a.store, lambda: replies.append(ack_pull(a, reader, 3))) == (4, 3)
    assert replies[-1]["head"] == head + 3 and replies[-1]["lag"] == head + 1 and a.store.stale == 1
    assert [o["id"] for o in replies[-1]["observations"]] == ["3"]
    # one failure does not keep the readers from memory: the next call is one round trip again
    assert cost(a.store, lambda: replies.append(ack_pull(a, reader, 4))) == (2, 1)
    assert a.store.stale == 1 and b.subscription_info(reader[0], reader[1])["cursor"] == 4


def test_an_ack_made_on_another_server_is_never_undone_from_memory(two):
    a, b, _owner, reader = two
    ack_pull(a, reader, 2)  # A remembers the cursor at 2
    b.ack(*reader, {"cursor": 10})
    # from memory A would move the cursor from 2 to 3; the check finds the subscription changed, and the
    # ack, made again from the row as it is, goes backwards: refused, nothing written
    with pytest.raises(ProtocolError) as refused:
        ack_pull(a, reader, 3)
    assert refused.value.code == "CURSOR_BACKWARDS" and a.store.stale == 1
    assert b.subscription_info(*reader)["cursor"] == 10
    # positive control: an ack at the cursor as it is goes on, and the page starts there
    assert [o["id"] for o in ack_pull(a, reader, 11)["observations"]] == ["11"]


def test_a_token_replaced_on_another_server_never_works_from_memory(two):
    a, b, _owner, reader = two
    ack_pull(a, reader, 2)  # A remembers the subscription with its first token's hash
    renewed = b.subscribe({"monitor": "ci", "subscriber": "agent:r"}, reader[1])
    assert renewed["token"] != reader[1]
    with pytest.raises(ProtocolError) as refused:  # control: B refuses the old token
        ack_pull(b, reader, 2)
    assert refused.value.code == "UNAUTHORIZED"
    with pytest.raises(ProtocolError) as refused:  # A too, though its memory would take it
        ack_pull(a, reader, 3)
    assert refused.value.code == "UNAUTHORIZED" and a.store.stale == 1
    assert b.subscription_info(reader[0], renewed["token"])["cursor"] == 2
    assert ack_pull(a, (reader[0], renewed["token"]), 3)["observations"][0]["id"] == "3"


def test_a_refusal_from_memory_is_checked_before_it_is_told(two):
    a, b, _owner, reader = two
    ack_pull(a, reader, 2)  # A remembers the subscription with its first token's hash
    renewed = b.subscribe({"monitor": "ci", "subscriber": "agent:r"}, reader[1])
    # from memory A would refuse the new token; the check finds the subscription changed, and the call, made
    # again from the row as it is, takes it
    assert ack_pull(a, (reader[0], renewed["token"]), 3)["observations"][0]["id"] == "3"
    assert a.store.stale == 1
    # positive control: a token neither row knows is refused, after the check found memory current
    trips = a.store.round_trips
    with pytest.raises(ProtocolError) as refused:
        ack_pull(a, (reader[0], "mpr_" + "0" * 40), 4)
    assert refused.value.code == "UNAUTHORIZED" and a.store.stale == 1
    assert a.store.round_trips - trips == 2  # the check, then the rollback


def test_a_subscription_retired_on_another_server_is_not_pulled_from_memory(two):
    a, b, _owner, reader = two
    ack_pull(a, reader, 2)
    b.retire_subscription(*reader, {"reason": "done here"})
    with pytest.raises(ProtocolError) as refused:
        ack_pull(a, reader, 3)
    assert refused.value.code == "NOT_FOUND" and refused.value.extras.get("retired") is True
    assert a.store.stale == 1


def test_readers_whose_check_fails_again_soon_read_with_their_locks_for_a_while(two, monkeypatch):
    a, b, owner, reader = two
    monkeypatch.setattr(postgres, "DOUBT_SECONDS", 60.0)
    nxt = ack_pull(a, reader, 2)["next"]
    b.publish("ci", body(1), owner)
    nxt = ack_pull(a, reader, nxt)["next"]  # the first failure: run again, memory still believed after
    b.publish("ci", body(2), owner)
    nxt = ack_pull(a, reader, nxt)["next"]  # a second one soon after: another server writes this monitor
    assert a.store.stale == 2
    replies: list[dict[str, Any]] = []
    # read with the locks (two round trips), and nothing found stale any more
    assert cost(a.store, lambda: replies.append(ack_pull(a, reader, nxt))) == (2, 2)
    assert a.store.stale == 2 and replies[-1]["head"] == b.state("ci", None)["head"]
    # a publish still believes its row (a reader's failures are not the writers')
    assert "ci" not in a.store._doubted
    # positive control: once that while is over, readers believe memory again
    a.store._readers_doubted.clear()
    nxt = replies[-1]["next"]
    assert cost(a.store, lambda: replies.append(ack_pull(a, reader, nxt))) == (2, 1)


def test_rows_another_server_compacted_are_never_served_from_memory(two):
    a, b, _owner, reader = two
    ack_pull(a, reader, 2)  # A remembers rows 2-17, read ahead
    b.compact("ci", 10)  # on B: rows up to 10 gone
    # from memory A would hand out row 3; made again from the monitor's row, the cursor is below its floor
    with pytest.raises(ProtocolError) as refused:
        ack_pull(a, reader, 3)
    assert refused.value.code == "CURSOR_EXPIRED" and refused.value.extras["retention_floor"] == 11
    assert a.store.stale == 1


def test_a_row_replaced_under_its_seq_is_never_served_from_memory(two, pg_url):
    """A reviewer's: the rows read ahead are kept across calls, and the check covered only the subscription's
    and the monitor's rows; a log whose history was replaced under the same seqs (a failover that lost
    commits, a restore) was served from memory. The check now also compares the last row served from it."""
    a, _b, _owner, reader = two
    ack_pull(a, reader, 2)  # A remembers rows 2-17
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            'UPDATE observations SET event = replace(event, \'"subject":"s"\', \'"subject":"r"\') '
            "WHERE monitor = 'ci' AND seq = 3"
        )
    reply = ack_pull(a, reader, 3)
    assert reply["observations"][0]["subject"] == "r" and a.store.stale == 1
    # control: rows as remembered are served from memory, one round trip
    assert cost(a.store, lambda: ack_pull(a, reader, 4)) == (2, 1) and a.store.stale == 1


def test_a_database_that_rounds_floats_still_lets_readers_use_memory(pg, pg_url):
    """A reviewer's: with extra_float_digits = 0 (a DBA's, or PostgreSQL 11's default) a subscription's
    mute clock read back was rounded, and every check from memory failed. The server's sessions set their
    own."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {pg_url.rsplit('/', 1)[1]} SET extra_float_digits = 0")
    store = PostgresStore(pg_url)
    try:
        service = MonitorService(store)
        owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)[
            "owner_token"
        ]
        service.publish_many("ci", [body(i) for i in range(20)], owner)
        sub = service.subscribe({"monitor": "ci", "subscriber": "agent:r", "from": "earliest"}, None)
        reader = (sub["subscription"]["id"], sub["token"])
        service.ack(*reader, {"cursor": service.pull(*reader, limit=50)["next"]})  # caught up
        store._subscription.forget(reader[0].encode())
        service.pull(*reader, limit=1)  # empty: the subscription remembered as read back, not as written
        for _ in range(5):  # empty pulls from memory: the check and nothing written, one round trip each
            assert cost(store, lambda: service.pull(*reader, limit=1)) == (1, 1)
        assert store.stale == 0
    finally:
        store.close()


def test_the_rows_kept_for_readers_stay_within_their_bytes(two, monkeypatch):
    a, _b, owner, _reader = two
    store = a.store
    monkeypatch.setattr(postgres, "PAGES_BYTES", 20_000)
    readers = []
    for i in range(8):
        sub = a.subscribe({"monitor": "ci", "subscriber": f"agent:k{i}", "from": "earliest"}, None)
        readers.append((sub["subscription"]["id"], sub["token"]))
        a.pull(*readers[-1], limit=1)
    assert store._pages_bytes == sum(size for _, _, size in store._pages.values()) <= 20_000
    assert readers[-1][0] in store._pages and readers[0][0] not in store._pages  # the oldest given up
