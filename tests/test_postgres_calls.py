"""What one engine call costs PostgreSQL, counted (never timed): the statements and round trips of a publish
and of an ack+pull, held so that a regression shows as a number; readers of one monitor that do not wait for
each other (their monitor's lock shared, its row not written by a pull), what a pull counts folded into the
monitor's row later, and a reader's call that turns out to write more run again with the lock whole."""

from __future__ import annotations

import json
import threading

import pytest
from monitor_protocol.core import wire
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.postgres import PostgresStore
from waiting import eventually

psycopg = pytest.importorskip("psycopg")

TYPE = "com.example.x"


def monitor_with_readers(service: MonitorService, readers: int = 2, entries: int = 20) -> tuple[str, list]:
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    subs = [
        service.subscribe({"monitor": "ci", "subscriber": f"agent:r{i}", "from": "earliest"}, None)
        for i in range(readers)
    ]
    for i in range(entries):
        service.publish("ci", {"type": TYPE, "subject": f"s{i}", "data": {"i": i}}, owner)
    return owner, [(s["subscription"]["id"], s["token"]) for s in subs]


def cost(store: PostgresStore, call) -> tuple[int, int]:
    """(statements, round trips) of one call."""
    s0, r0 = store.statements, store.round_trips
    call()
    return store.statements - s0, store.round_trips - r0


def test_a_publish_is_two_statements_in_one_round_trip(pg):
    service = MonitorService(pg)
    owner, _ = monitor_with_readers(service, readers=0, entries=1)
    body = {"type": TYPE, "subject": "build-1", "data": {}}
    # The lock with the check of the monitor's row as this server remembers it (tests/test_postgres_belief.py);
    # the row, the observation, its subject and the NOTIFY in one more; both sent with the commit.
    assert cost(pg, lambda: service.publish("ci", body, owner)) == (2, 1)
    assert cost(pg, lambda: service.publish("ci", body, owner)) == (2, 1)  # a known subject: no more
    # positive control: the counter counts what is sent (a publish with an idempotency key reads the key too,
    # its lock and check going with that read)
    assert cost(pg, lambda: service.publish("ci", {**body, "idempotency_key": "k1"}, owner)) == (3, 2)
    # without the row in memory: the lock and the row's read in one round trip, the writes in another
    pg.believe_memory = False
    assert cost(pg, lambda: service.publish("ci", body, owner)) == (2, 2)
    assert service.state("ci", None)["head"] == 6


def test_an_ack_and_pull_from_memory_is_two_statements_in_one_round_trip_and_its_control_two(pg):
    service = MonitorService(pg)
    _owner, [(sub, token)] = monitor_with_readers(service, readers=1)
    first = service.pull(sub, token, limit=1)  # the first pull of the monitor stores its last_pull (below)
    nxt = first["next"]

    def ack_pull() -> None:
        reply = service.pull(sub, token, limit=1, ack=nxt)
        assert len(reply["observations"]) == 1 and reply["observations"][0]["id"] == str(nxt)
        replies.append(reply)

    replies: list[dict] = []
    for _ in range(3):
        # The subscription, its monitor and the rows after its cursor as this server last read or wrote them
        # (the rows read ahead by the last pull): the locks with the check of both rows, then the reader's
        # row, sent together with the commit.
        assert cost(pg, ack_pull) == (2, 1)
        nxt = replies[-1]["next"]
    # positive control: without the memory, the subscription with its monitor and the rows after its cursor
    # in one statement, then the reader's row with the commit
    pg.believe_readers = False
    assert cost(pg, ack_pull) == (2, 2)
    nxt = replies[-1]["next"]
    pg.believe_readers = True
    assert cost(pg, ack_pull) == (2, 1)
    # a pull past the rows read ahead reads the log with the locks, then writes
    assert cost(pg, lambda: service.pull(sub, token, limit=30)) == (3, 2)
    assert pg.stale == 0


def test_a_drain_served_as_stored_reads_each_row_as_its_seq_and_text(pg):
    """A pull whose reply the door only encodes (`raw`, mp serve's drain) takes its rows as records.ServedRow:
    from the rows read ahead with the subscription when they hold the page, else by one statement of two
    columns, as many statements as a pull that decodes them; what it serves is what that pull serves."""
    service = MonitorService(pg)
    _owner, [(a, a_token), (b, b_token), first] = monitor_with_readers(service, readers=3, entries=40)
    service.pull(*first, limit=1)  # the monitor's first pull stores its last_pull (a write neither has)
    kinds: list[str] = []
    real = pg.read_range

    def watched(monitor_id: str, from_seq: int, to_seq: int, **kw: bool) -> list:
        rows = real(monitor_id, from_seq, to_seq, **kw)
        kinds.extend(type(r).__name__ for r in rows)
        return rows

    pg.read_range = watched  # type: ignore[method-assign]
    replies: dict[str, list] = {"decoded": [], "raw": []}
    costs: dict[str, list] = {"decoded": [], "raw": []}
    for how, sub, token in (("decoded", a, a_token), ("raw", b, b_token)):
        kinds.clear()
        for limit in (10, 30):  # within the rows read ahead (16), then past them
            reply: dict = {}

            def pull(reply: dict = reply, sub: str = sub, token: str = token, limit: int = limit) -> None:
                reply.update(service.pull(sub, token, limit=limit, raw=how == "raw"))  # noqa: B023 (run now)

            costs[how].append(cost(pg, pull))
            replies[how].append([json.loads(wire.encode(o)) for o in reply["observations"]])
        # control: a reply that is read gets observations
        assert kinds == ["ServedRow"] * 40 if how == "raw" else kinds and "ServedRow" not in kinds
    pg.read_range = real  # type: ignore[method-assign]
    assert costs["raw"] == costs["decoded"]
    assert replies["raw"] == replies["decoded"] and [len(r) for r in replies["raw"]] == [10, 30]
    assert [o.get("redelivered") for o in replies["raw"][1]] == [True] * 10 + [None] * 20


def test_an_empty_pull_is_one_statement_and_commits_nothing(pg):
    service = MonitorService(pg)
    _owner, [(sub, token)] = monitor_with_readers(service, readers=1, entries=2)
    drained = service.pull(sub, token, limit=50)
    service.ack(sub, token, {"cursor": drained["next"]})
    commits = pg.stats.commits
    # one round trip: a read-only call's end (its Sync) is not waited for; the next call reads its answer
    assert cost(pg, lambda: service.pull(sub, token)) == (1, 1)
    assert service.pull(sub, token)["observations"] == [] and pg.stats.commits == commits


def xmin(pg_url: str) -> int:
    """The transaction that last wrote the monitor's row (PostgreSQL's xmin changes on every update)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return int(conn.execute("SELECT xmin::text FROM monitors WHERE id='ci'").fetchone()[0])


def test_an_ack_and_pull_does_not_write_the_monitors_row_and_its_count_is_folded_in_later(pg, pg_url):
    service = MonitorService(pg)
    owner, [(sub, token), (sub2, token2)] = monitor_with_readers(service, readers=2)
    nxt = service.pull(sub, token, limit=1)["next"]  # the first pull stores the monitor's last_pull
    before = xmin(pg_url)
    delivered = service.state("ci", None)["counters"]["delivered"]
    for _ in range(5):
        nxt = service.pull(sub, token, limit=1, ack=nxt)["next"]
    service.pull(sub2, token2, limit=3)
    assert xmin(pg_url) == before  # five ack+pulls and a pull: the monitor's row untouched
    # ... what they delivered reaches its counter within about a second (one fold, under the lock)
    eventually(
        lambda: service.state("ci", None)["counters"]["delivered"] == delivered + 8,
        what="the readers' deliveries folded into the monitor's counter",
    )
    assert xmin(pg_url) != before
    # positive control: a publish writes the row at once
    folded = xmin(pg_url)
    service.publish("ci", {"type": TYPE, "subject": "s", "data": {}}, owner)
    assert xmin(pg_url) != folded


def test_the_first_pull_of_a_monitor_writes_its_last_pull_at_once(pg):
    service = MonitorService(pg)
    _owner, [(sub, token)] = monitor_with_readers(service, readers=1, entries=1)
    assert service.state("ci", None)["ages"]["since_last_pull_s"] is None
    # A reader's call may not write the monitor's row: this one would (its first last_pull), so it runs
    # again with the lock whole, and every server sees at once that the monitor has been pulled.
    service.pull(sub, token)
    other = MonitorService(PostgresStore(pg.url))  # another server: its own memory, the same database
    try:
        assert other.state("ci", None)["ages"]["since_last_pull_s"] is not None
    finally:
        other.store.close()


def waiting_on_locks(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return int(
            conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0]
        )


@pytest.mark.parametrize("from_memory", [True, False])
def test_readers_of_one_monitor_do_not_wait_for_each_other_but_a_writer_waits_for_them(
    pg, pg_url, from_memory
):
    service = MonitorService(pg)
    owner, [(sub, token), (sub2, token2)] = monitor_with_readers(service, readers=2)
    service.pull(sub, token, limit=1)  # the monitor's first pull (which writes its row, see above) is done
    service.pull(sub2, token2, limit=1)
    pg.believe_readers = from_memory
    inside, release = threading.Event(), threading.Event()

    def held_reader() -> None:  # a reader's call that holds its locks until told
        with pg.transaction():
            assert pg.locked_subscription(sub, shared=True) is not None
            # from memory, its locks go with what the call sends next (with the check of the rows): sent now
            assert bool(pg._s.believed_readers) is from_memory
            pg._run([])
            inside.set()
            release.wait(30)

    holder = threading.Thread(target=held_reader)
    holder.start()
    try:
        assert inside.wait(30)
        # another reader of the same monitor, on another connection (this thread's): not held up
        assert service.pull(sub2, token2, limit=1)["observations"]
        # positive control: a publish takes the monitor's lock whole, and waits for the held reader
        done = threading.Event()

        def publish() -> None:
            service.publish("ci", {"type": TYPE, "subject": "s", "data": {}}, owner)
            done.set()

        writer = threading.Thread(target=publish)
        writer.start()
        eventually(lambda: waiting_on_locks(pg_url) == 1, what="the publish waiting for the reader's lock")
        assert not done.is_set()
    finally:
        release.set()
        holder.join(30)
    writer.join(30)
    assert done.is_set()


def test_a_readers_call_that_would_write_more_runs_again_with_the_lock_whole(pg):
    service = MonitorService(pg)
    owner, [(sub, token)] = monitor_with_readers(service, readers=1, entries=5)
    service.pull(sub, token, limit=1)
    service.compact("ci", 4)  # rows 1-3 gone: the reader, at 1, is below the floor
    renewed = service.subscribe(
        {"monitor": "ci", "subscriber": "agent:r0", "reset_policy": "earliest"}, token
    )  # a renewal with the earliest policy: its next pull relists and ends with a bookmark
    token = renewed["token"]
    head = service.state("ci", None)["head"]
    # the bookmark is an append: this pull runs as an ordinary call
    reply = service.pull(sub, token, limit=50)
    assert reply["observations"][-1]["type"].endswith(".bookmark"), reply["observations"][-1]
    assert service.state("ci", None)["head"] == head + 1  # the bookmark was written, once


NO_TRANSACTION = "there is no transaction in progress"


def warnings_heard(store: PostgresStore) -> list[str]:
    """What the database warns this thread's connection of (a WARNING also goes to the server's log)."""
    heard: list[str] = []
    conn = store._s.conn
    assert conn is not None
    conn.add_notice_handler(lambda diag: heard.append(diag.message_primary or ""))
    return heard


def test_a_refused_call_ends_its_transaction_without_a_warning_in_the_database_log(pg):
    """A refused call (a wrong token, an unknown subscription, an ack backwards) wrote nothing: its
    transaction ends with the Sync alone. A ROLLBACK there is outside a transaction block (a pipeline's
    statements are not one): PostgreSQL logs a WARNING for each, 38,000 in a tester's 22 minutes."""
    service = MonitorService(pg)
    _owner, [reader] = monitor_with_readers(service, readers=1, entries=5)
    service.pull(*reader, limit=2)
    heard = warnings_heard(pg)
    refusals = [
        lambda: service.ack(*reader, {"cursor": 1}),  # backwards, after the pull's ack below
        lambda: service.pull(reader[0], "mpr_wrong", limit=1),
        lambda: service.pull("sub-unknown", reader[1], limit=1),
    ]
    service.ack(*reader, {"cursor": 3})
    for refused in refusals:
        with pytest.raises(Exception) as caught:
            refused()
        assert getattr(caught.value, "code", None) in {"CURSOR_BACKWARDS", "UNAUTHORIZED", "NOT_FOUND"}
    assert service.subscription_info(*reader)["cursor"] == 3  # nothing of them was kept
    assert heard == []
    # control: a ROLLBACK sent as before is warned about, on this very connection
    pg._s.run([("SELECT 1", ())])
    pg._s.wire.rollback(wrote=True)
    assert NO_TRANSACTION in heard


def test_a_call_that_sent_its_write_and_then_failed_keeps_nothing_of_it(pg, monkeypatch):
    """The other side of ending quietly: a transaction whose write was sent is rolled back, whatever fails
    after it (here the store's own apply, raising once it has sent the write)."""
    service = MonitorService(pg)
    owner, [reader] = monitor_with_readers(service, readers=1, entries=3)
    heard = warnings_heard(pg)
    head, cursor = service.state("ci", None)["head"], service.subscription_info(*reader)["cursor"]
    apply = PostgresStore.apply

    uncounted = []

    def apply_then_fail(self, changes):
        apply(self, changes)
        assert self._s.writes  # the write was sent
        if uncounted:  # a write its caller did not count (a future path): the wire still knows it sent one
            self._s.writes.clear()
        raise RuntimeError("failed after the write was sent")

    monkeypatch.setattr(PostgresStore, "apply", apply_then_fail)
    with pytest.raises(RuntimeError):
        service.publish("ci", {"type": TYPE, "subject": "lost"}, owner)
    with pytest.raises(RuntimeError):
        service.ack(*reader, {"cursor": 3})
    uncounted.append(True)
    with pytest.raises(RuntimeError):
        service.publish("ci", {"type": TYPE, "subject": "lost too"}, owner)
    monkeypatch.setattr(PostgresStore, "apply", apply)
    assert service.state("ci", None)["head"] == head
    assert service.subscription_info(*reader)["cursor"] == cursor
    assert NO_TRANSACTION in heard  # rolled back with a ROLLBACK, as a transaction that wrote must be
