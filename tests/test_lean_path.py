"""The lean request path (docs/serve.md "The request path"): what each piece promises, in-process, each with a
positive control.

- the HTTP door (doors/http/protocol.py) on httptools' callbacks: pipelined requests answered in order, two
  long polls in a row on one keep-alive connection, a woken reader's reply its own;
- the engine on the loop (LoopEngine): the calls of one loop turn share one group commit, and nobody hears an
  outcome before it;
- the wake done once: the readers one append woke are re-checked in one engine call that reads the page they
  share once (MonitorService.pull_many), a refusal costing the others nothing;
- SQLite writes no more than the rules need: a monitor's row once per transaction, a subject already stored
  no statement, one row without a savepoint;
- the sweep timer sweeps only when a deadline is due;
- wire.loads gives the same answer with orjson as the strict parser as with its own rules.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from monitor_protocol.api.messages import Request
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import StorageError
from monitor_protocol.doors.engines import LoopEngine
from monitor_protocol.doors.http import app as app_module
from monitor_protocol.doors.http.app import MonitorApp
from monitor_protocol.doors.http.protocol import HttpConnection, HttpServer
from monitor_protocol.store import sqlite_steps
from monitor_protocol.store.sqlite import SQLiteStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

RUN = "com.example.ci.run"
HANG_GUARD = 10.0


class Transport:
    """What the connection writes, and whether it closed it."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def replies(self) -> list[tuple[int, dict[str, Any]]]:
        """The replies written so far, as (status, JSON body)."""
        data = b"".join(self.out)
        found = []
        while data:
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next(int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length:"))
            found.append((int(lines[0].split(" ")[1]), json.loads(rest[:length]) if length else None))
            data = rest[length:]
        return found


class CountingStore(SQLiteStore):
    """A SQLite store that counts the log reads the engine makes."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.scans = 0

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        self.scans += 1
        return super().scan(*args, **kwargs)

    def read_range(self, *args: Any, **kwargs: Any) -> Any:  # (an unfiltered page, or a few rows read whole)
        self.scans += 1
        return super().read_range(*args, **kwargs)


class CountingConnection:
    """A store's SQLite connection, counting the statements that write subscriptions: (how it was sent, its
    verb, the rows it names: the ids of an `IN (...)`, one for any other `execute`, every row of an
    executemany)."""

    def __init__(self, db: Any) -> None:
        self.db, self.calls = db, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if "subscriptions" in sql and sql.startswith(("INSERT", "UPDATE")):
            rows = len(args[0]) - 4 if " IN (" in sql else 1  # (the four values set, then the ids)
            self.calls.append(("execute", sql.split(" ")[0], rows))
        return self.db.execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> Any:
        rows = list(rows)
        if "subscriptions" in sql and sql.startswith(("INSERT", "UPDATE")):
            self.calls.append(("executemany", sql.split(" ")[0], len(rows)))
        return self.db.executemany(sql, rows)


def woken_statements(
    service: MonitorService, store: SQLiteStore, owner: str, who: list[tuple[str, str]]
) -> list[tuple[Any, ...]]:
    """A publish, then `who` woken in one pull_many on a counted connection (each then acks what it got):
    the statements that wrote their subscriptions (CountingConnection's)."""
    service.publish("ci", {"type": RUN, "subject": "x"}, owner)
    real, counting = store._db, CountingConnection(store._db)
    store._db = counting  # type: ignore[assignment]
    try:
        replies = service.pull_many([(sid, token, None, None, None) for sid, token in who])
    finally:
        store._db = real
    for (sid, token), reply in zip(who, replies, strict=True):
        service.ack(sid, token, {"cursor": reply["next"]})  # type: ignore[index]
    return counting.calls


@pytest.fixture()
async def door(tmp_path: Path):
    store = CountingStore(str(tmp_path / "lean.db"))
    service = MonitorService(store)
    app = MonitorApp(service, RestRouter(service), store=store, engine=LoopEngine(store), sweep_interval=None)
    await app.startup()
    server = HttpServer(app, header_timeout=10, body_timeout=30, keep_alive=65)
    yield server, service, store
    await app.shutdown()


def connect(server: HttpServer) -> tuple[HttpConnection, Transport]:
    conn, transport = HttpConnection(server), Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def get(path: str, token: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {token}\r\n\r\n".encode()


def post(path: str, body: Any, token: str | None = None) -> bytes:
    data = json.dumps(body).encode()
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}content-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def until(predicate: Any, what: str) -> None:
    async with asyncio.timeout(HANG_GUARD):
        while not predicate():
            await asyncio.sleep(0.001)


def feed(service: MonitorService, readers: int) -> tuple[str, list[tuple[str, str]]]:
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [RUN]}, None)["owner_token"]
    subs = []
    for i in range(readers):
        made = service.subscribe(
            {"monitor": "ci", "subscriber": f"agent:r{i}", "filter": {"types": [RUN]}}, None
        )
        subs.append((made["subscription"]["id"], made["token"]))
    for sid, token in subs:  # every reader at the head
        while True:
            page = service.pull(sid, token, limit=200)
            service.ack(sid, token, {"cursor": page["next"]})
            if not page.get("scan_capped"):
                break
    return owner, subs


# ---------------------------------------------------------------------------------------------- the door


async def test_pipelined_requests_are_answered_in_order(door) -> None:
    server, service, _store = door
    owner, _subs = feed(service, 0)
    conn, transport = connect(server)
    conn.data_received(
        post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "one"}, owner)
        + get("/mp/v0/monitors/ci/state", owner)
        + post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "two"}, owner)
    )
    await until(lambda: len(transport.replies()) == 3, "three replies")
    (s1, b1), (s2, b2), (s3, b3) = transport.replies()
    assert (s1, s2, s3) == (201, 200, 201)
    assert b1["observation"]["subject"] == "one" and b3["observation"]["subject"] == "two"
    assert b2["head"] == b1["seq"]  # the state was read after the first publish, before the second
    assert b3["seq"] == b1["seq"] + 1


async def test_two_long_polls_in_a_row_on_one_connection_both_answer(door) -> None:
    """The second long poll of a keep-alive connection is not taken for a client that left (the first
    one's end must not end the connection's own signal)."""
    server, service, _store = door
    owner, [(sid, token)] = feed(service, 1)
    reader, transport = connect(server)
    writer, _ = connect(server)
    for subject in ("first", "second"):
        before = len(transport.replies())
        reader.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token))
        await until(lambda: server.app.waiters.parked_on("ci") == 1, "the poll to park")
        writer.data_received(
            post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": subject}, owner)
        )
        await until(lambda b=before: len(transport.replies()) == b + 1, "the poll's reply")
        status, body = transport.replies()[-1]
        assert status == 200 and [o["subject"] for o in body["observations"]] == [subject]
        service.ack(sid, token, {"cursor": body["next"]})
        assert not transport.closing


async def test_readers_woken_together_are_rechecked_in_one_call_that_reads_once(door) -> None:
    server, service, store = door
    owner, subs = feed(service, 40)
    odd_one = service.subscribe(
        {"monitor": "ci", "subscriber": "agent:odd", "filter": {"types": [RUN], "subjects": ["build-9"]}},
        None,
    )
    odd = (odd_one["subscription"]["id"], odd_one["token"])
    service.ack(odd[0], odd[1], {"cursor": service.pull(odd[0], odd[1])["next"]})
    readers = [connect(server) for _ in range(len(subs) + 1)]
    for (conn, _t), (sid, token) in zip(readers, [*subs, odd], strict=True):
        conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30&limit=10", token))
    await until(lambda: server.app.waiters.parked_on("ci") == len(readers), "every poll to park")
    calls: list[int] = []
    original = service.pull_many
    service.pull_many = lambda asks, **kw: calls.append(len(asks)) or original(asks, **kw)  # type: ignore[method-assign]
    scans = store.scans
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "build-9"}, owner))
    await until(lambda: all(t.replies() for _c, t in readers), "every reader's reply")
    assert calls == [len(readers)]  # one engine call for every reader the append woke
    assert store.scans - scans == 2  # one page for the 40 alike, one for the reader of another filter
    for (_conn, transport), (sid, _token) in zip(readers, [*subs, odd], strict=True):
        status, body = transport.replies()[-1]
        assert status == 200 and body["subscription"] == sid  # each reply its own reader's
        assert [o["subject"] for o in body["observations"]] == ["build-9"]


async def test_readers_of_several_monitors_are_rechecked_in_the_order_of_their_monitors(door) -> None:
    """The re-check locks each reader's monitor as it comes to it: in the order of the monitors' ids, so that
    two servers of one PostgreSQL database re-checking readers of the same monitors never lock them in
    opposite orders (a soak saw that deadlock, each side's readers answered 503)."""
    server, service, _store = door
    owners, subs, monitor_of, readers = {}, [], {}, []
    for mid in ("zz", "mm", "aa"):
        made = service.create_monitor({"id": mid, "visibility": "public", "types": [RUN]}, None)
        owners[mid] = made["owner_token"]
        for i in range(2):
            made = service.subscribe(
                {"monitor": mid, "subscriber": f"agent:{mid}{i}", "filter": {"types": [RUN]}}, None
            )
            subs.append((made["subscription"]["id"], made["token"]))
            monitor_of[subs[-1][0]] = mid
    for sid, token in subs:  # every reader at its head, then parked
        service.ack(sid, token, {"cursor": service.pull(sid, token, limit=200)["next"]})
        conn, transport = connect(server)
        conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token))
        readers.append(transport)
    await until(lambda: sum(server.app.waiters.parked_on(m) for m in owners) == 6, "every poll to park")
    asked: list[list[str]] = []
    original = service.pull_many
    service.pull_many = lambda asks, **kw: (
        asked.append([monitor_of[a[0]] for a in asks]) or original(asks, **kw)
    )  # type: ignore[method-assign]
    writers = [connect(server) for _ in owners]
    for (conn, _t), mid in zip(writers, ("zz", "mm", "aa"), strict=True):  # woken zz first, aa last
        conn.data_received(post(f"/mp/v0/monitors/{mid}/observations", {"type": RUN}, owners[mid]))
    await until(lambda: all(t.replies() for t in readers), "every reader's reply")
    assert asked and sorted(m for call in asked for m in call) == ["aa", "aa", "mm", "mm", "zz", "zz"]
    for call in asked:
        assert call == sorted(call), asked
    assert len(asked) == 1 or any(len(set(call)) > 1 for call in asked), asked  # several monitors in a call
    for transport in readers:
        status, body = transport.replies()[-1]
        assert status == 200 and len(body["observations"]) == 1


async def park_all(server: HttpServer, subs: list[tuple[str, str]]) -> list[tuple[HttpConnection, Transport]]:
    readers = [connect(server) for _ in subs]
    for (conn, _t), (sid, token) in zip(readers, subs, strict=True):
        conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30&limit=10", token))
    await until(lambda: server.app.waiters.parked_on("ci") == len(subs), "every poll to park")
    return readers


async def test_the_long_polls_an_append_wakes_are_rechecked_in_its_own_commit(door, monkeypatch) -> None:
    """A publish that wakes a few parked long polls re-checks them inside its own group commit: one fsync for
    the append and their deliveries (each reader's high-water mark durable with it), every reply after it.
    Control: more readers than app.JOIN_WOKEN_MAX take a group of their own, after it."""
    server, service, store = door
    owner, subs = feed(service, 3)
    readers = await park_all(server, subs)
    commits = store.stats.commits
    writer, publisher = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "joined"}, owner))
    await until(lambda: all(t.replies() for _c, t in readers) and publisher.replies(), "every reply")
    assert store.stats.commits - commits == 1  # the append and the three deliveries, one commit
    for (_conn, transport), (sid, _token) in zip(readers, subs, strict=True):
        status, body = transport.replies()[-1]
        assert status == 200 and [o["subject"] for o in body["observations"]] == ["joined"]
        assert store.get_subscription(sid).hwm == body["next"] - 1  # delivered, and committed
    assert publisher.replies()[-1][0] == 201
    # control: a fan-out larger than the joiner takes re-checks its readers in a commit of its own
    for (sid, token), (_conn, transport) in zip(subs, readers, strict=True):
        service.ack(sid, token, {"cursor": transport.replies()[-1][1]["next"]})
    monkeypatch.setattr(app_module, "JOIN_WOKEN_MAX", 2)
    readers = await park_all(server, subs)
    commits = store.stats.commits
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "alone"}, owner))
    await until(lambda: all(t.replies() for _c, t in readers), "every reply")
    assert store.stats.commits - commits == 2


async def test_readers_joined_to_a_commit_that_fails_are_rechecked_on_their_own(door, monkeypatch) -> None:
    """When the group a woken re-check joined fails (here its commit), the publisher hears the failure but
    the readers do not: they are re-checked in a group of their own, find the append rolled back, and wait
    on; the next append reaches them. Without that they would be answered with the group's 503."""
    server, service, store = door
    owner, subs = feed(service, 2)
    readers = await park_all(server, subs)
    commit, failed = store._commit, []

    def failing_once() -> None:
        if not failed:
            failed.append(True)
            store._rollback()
            raise StorageError("the disk is full (a test)")
        commit()

    monkeypatch.setattr(store, "_commit", failing_once)
    writer, publisher = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "lost"}, owner))
    await until(lambda: publisher.replies(), "the publisher's reply")
    assert publisher.replies()[-1][0] == 503 and failed == [True]
    await until(lambda: server.app.waiters.parked_on("ci") == 2, "the readers to wait again")
    assert [t.replies() for _c, t in readers] == [[], []]  # nobody was told the group's failure
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "kept"}, owner))
    await until(lambda: all(t.replies() for _c, t in readers), "every reply")
    for _conn, transport in readers:
        status, body = transport.replies()[-1]
        assert status == 200 and [o["subject"] for o in body["observations"]] == ["kept"]


async def test_woken_readers_replies_are_written_from_the_engines_answer(door) -> None:
    """The readers one append woke get their replies in the engine's answer callback, before any of their
    waits winds down (each would take its own chain of task steps: 30 of the 100 ms 1,000 readers took)."""
    server, service, _store = door
    owner, subs = feed(service, 5)
    held_at_write: list[int] = []

    class Watching(Transport):
        def write(self, data: bytes) -> None:
            held_at_write.append(server.app.metrics.parked_polls)  # the long polls still held
            super().write(data)

    readers = []
    for sid, token in subs:
        conn, transport = HttpConnection(server), Watching()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30&limit=10", token))
        readers.append(transport)
    await until(lambda: server.app.waiters.parked_on("ci") == len(subs), "every poll to park")
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "b-1"}, owner))
    await until(lambda: all(t.replies() for t in readers), "every reader's reply")
    assert held_at_write == [len(subs)] * len(subs)  # every reply written while all five still waited
    await until(lambda: server.app.metrics.parked_polls == 0, "the waits to wind down")
    for transport, (sid, _token) in zip(readers, subs, strict=True):
        [(status, body)] = transport.replies()  # one reply each, not a second from the wait's end
        assert status == 200 and body["subscription"] == sid
        assert [o["subject"] for o in body["observations"]] == ["b-1"]
    # control: a reader whose re-check still finds nothing for it (another subject) is not answered now;
    # it waits on, and its reply comes through the wait when its own observation arrives
    odd = service.subscribe(
        {"monitor": "ci", "subscriber": "agent:odd", "filter": {"types": [RUN], "subjects": ["mine"]}}, None
    )
    sid, token = odd["subscription"]["id"], odd["token"]
    service.ack(sid, token, {"cursor": service.pull(sid, token)["next"]})
    conn, transport = connect(server)
    conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token))
    await until(lambda: server.app.waiters.parked_on("ci") == 1, "the odd poll to park")
    rechecks: list[int] = []
    original = service.pull_many
    service.pull_many = lambda asks, **kw: rechecks.append(len(asks)) or original(asks, **kw)  # type: ignore[method-assign]
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "other"}, owner))
    await until(
        lambda: rechecks == [1] and server.app.waiters.parked_on("ci") == 1, "the re-check, parked again"
    )
    assert transport.replies() == [] and server.app.metrics.parked_polls == 1
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "mine"}, owner))
    await until(lambda: transport.replies(), "the odd reader's reply")
    [(status, body)] = transport.replies()
    assert status == 200 and [o["subject"] for o in body["observations"]] == ["mine"]


async def test_a_request_pipelined_behind_a_woken_long_poll_is_answered_after_it(door) -> None:
    """The woken poll's reply, written from the engine's answer, frees its connection for the request
    pipelined behind it: both are answered, in order, on a connection that stays open."""
    server, service, _store = door
    owner, [(sid, token)] = feed(service, 1)
    conn, transport = connect(server)
    conn.data_received(
        get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token) + get("/mp/v0/monitors/ci/state", owner)
    )
    await until(lambda: server.app.waiters.parked_on("ci") == 1, "the poll to park")
    assert transport.replies() == []  # the state waits its turn behind the poll
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "p-1"}, owner))
    await until(lambda: len(transport.replies()) == 2, "both replies")
    await until(lambda: server.app.metrics.parked_polls == 0, "the wait to wind down")
    (s1, b1), (s2, b2) = transport.replies()
    assert s1 == 200 and [o["subject"] for o in b1["observations"]] == ["p-1"]
    assert s2 == 200 and b2["head"] == int(b1["observations"][0]["id"])  # read after the publish
    assert len(transport.replies()) == 2 and not transport.closing  # nothing written twice, still open


async def test_a_woken_polls_task_ending_late_leaves_the_next_request_its_connection(door) -> None:
    """The poll answered from the engine's answer still has a task winding down; if that task is cancelled
    then (a shutdown's sweep, say), the connection now serving the request pipelined behind it stays open."""
    server, service, _store = door
    owner, [(sid, token)] = feed(service, 1)
    tasks: list[asyncio.Task[Any]] = []

    class Cancelling(Transport):
        def write(self, data: bytes) -> None:
            super().write(data)
            for task in tasks:  # the first poll's task, cancelled as its reply is written
                assert not task.done()
                task.cancel()
            tasks.clear()

    conn, transport = HttpConnection(server), Cancelling()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(
        get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token) + get("/mp/v0/monitors/ci/state", owner)
    )
    await until(lambda: server.app.waiters.parked_on("ci") == 1, "the first poll to park")
    tasks.extend(t for t in asyncio.all_tasks() if "_long_poll" in repr(t.get_coro()))
    assert len(tasks) == 1
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "c-1"}, owner))
    await until(lambda: len(transport.replies()) == 2, "both replies")
    await asyncio.sleep(0.01)  # the cancelled task's end has run
    (s1, b1), (s2, b2) = transport.replies()
    assert (s1, s2) == (200, 200) and [o["subject"] for o in b1["observations"]] == ["c-1"]
    assert not transport.closing  # before the fix, the late cancel closed the connection of the second


async def test_a_refused_reader_costs_the_others_nothing(door) -> None:
    _server, service, _store = door
    owner, subs = feed(service, 3)
    service.publish("ci", {"type": RUN, "subject": "x"}, owner)
    asks = [(sid, token, None, None, None) for sid, token in subs]
    asks[1] = (subs[1][0], "not-the-token", None, None, None)
    results = service.pull_many(asks)
    assert isinstance(results[1], ProtocolError) and results[1].code == "UNAUTHORIZED"
    for i in (0, 2):
        assert [o["subject"] for o in results[i]["observations"]] == ["x"]  # type: ignore[index]
    # control: the refused reader, with its token, gets the same
    assert [o["subject"] for o in service.pull(subs[1][0], subs[1][1])["observations"]] == ["x"]


def test_the_woken_readers_count_on_their_monitor_as_their_pulls_one_by_one_would(tmp_path: Path) -> None:
    """pull_many writes the monitor's delivered count once per call: the same count, and the same last
    pull, as the readers' pulls made one by one (the control, on a second database fed alike)."""

    def run(many: bool) -> dict[str, Any]:
        clock = [1_000_000.0]
        service = MonitorService(SQLiteStore(str(tmp_path / f"count-{many}.db")), clock=lambda: clock[0])
        owner, subs = feed(service, 4)
        before = service.state("ci", None)["counters"]["delivered"]
        for round_ in range(2):  # nothing acked: the second round redelivers round 0's row, not counted again
            clock[0] += 10
            service.publish("ci", {"type": RUN, "subject": f"r{round_}"}, owner)
            asks = [(sid, token, None, None, None) for sid, token in subs[:3]]
            if many:
                service.pull_many(asks)
            else:
                for sid, token, *_ in asks:
                    service.pull(sid, token)
        stored = service.store.get_monitor("ci")
        assert stored is not None
        return {"delivered": stored.counters.delivered - before, "last_pull": stored.last_pull}

    many = run(True)
    one_by_one = run(False)
    assert many == one_by_one
    assert many["delivered"] == 3 + 3  # round 0: one new row each; round 1: one more new row each
    assert many["last_pull"] == 1_000_020.0  # the second round's pulls


# What a reader can be, before an append wakes it: where it acked to, whether it pulled past that without
# acking (its high-water mark), its filter, the limit its parked request asked, and whether the token it
# sends is its own. Readers with the same of all these share one reply in pull_many (delivery._Alike).
READER = st.tuples(
    st.integers(0, 3),  # rows acked of the 3 already published
    st.booleans(),  # pulled once more without acking (the hwm runs ahead of the cursor)
    st.sampled_from(["all", "types", "subject"]),
    st.sampled_from([None, 1, "2", 10]),
    st.booleans(),  # sends a wrong token
)
FILTERS = {"all": {}, "types": {"types": [RUN]}, "subject": {"subjects": ["b1", "woken"]}}


@settings(max_examples=30, deadline=None)
@given(readers=st.lists(READER, min_size=1, max_size=8))
def test_woken_readers_in_one_call_are_told_and_recorded_as_their_pulls_one_by_one(
    tmp_path_factory: pytest.TempPathFactory, readers: list[tuple[int, bool, str, Any, bool]]
) -> None:
    """pull_many hands readers in the same place the reply the first of them got (their own id in it) and
    records each one's delivery itself: every reply, every stored subscription and the monitor's row are
    the same as the same pulls made one by one on a copy of the database (the control), readers alike or
    not, refused or not."""
    import shutil

    tmp = tmp_path_factory.mktemp("alike")
    clock = [1_000_000.0]
    store = SQLiteStore(str(tmp / "a.db"), synchronous="OFF")
    service = MonitorService(store, clock=lambda: clock[0])
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [RUN]}, None)["owner_token"]
    seqs = [service.publish("ci", {"type": RUN, "subject": s}, owner)["seq"] for s in ("b0", "b1", "b2")]
    asks = []
    for i, (acked, ahead, flt, limit, wrong) in enumerate(readers):
        made = service.subscribe({"monitor": "ci", "subscriber": f"agent:r{i}", "filter": FILTERS[flt]}, None)
        sid, token = made["subscription"]["id"], made["token"]
        if acked:
            service.ack(sid, token, {"cursor": seqs[acked - 1] + 1})
        if ahead:
            service.pull(sid, token, limit=1)
        asks.append((sid, "mpr_not-this-readers-token" if wrong else token, None, limit, None))
    store.close()
    shutil.copy(tmp / "a.db", tmp / "b.db")

    same: list[int] = []

    def woken(name: str, many: bool) -> tuple[list[Any], list[Any], Any]:
        clock[0] = 1_000_100.0
        copy = MonitorService(SQLiteStore(str(tmp / name), synchronous="OFF"), clock=lambda: clock[0])
        copy.publish("ci", {"type": RUN, "subject": "woken"}, owner)
        if many:
            replies = copy.pull_many(asks, same=same)
        else:
            replies = []
            for sid, token, cursor, limit, inline in asks:
                try:
                    replies.append(copy.pull(sid, token, cursor=cursor, limit=limit, filter=inline))
                except ProtocolError as err:
                    replies.append(err)
        told = [(r.code, r.message) if isinstance(r, ProtocolError) else r for r in replies]
        subs = [copy.store.get_subscription(sid).to_row() for sid, *_ in asks]  # type: ignore[union-attr]
        monitor = copy.store.get_monitor("ci")
        copy.store.close()
        return told, subs, monitor

    many = woken("a.db", True)
    one_by_one = woken("b.db", False)
    assert many == one_by_one
    for (sid, *_), told in zip(asks, many[0], strict=True):
        if isinstance(told, dict):
            assert told["subscription"] == sid  # each reader's reply names its own subscription
    # `same` names, for each reply, an earlier one it equals but for its id (what a door may encode once)
    assert len(same) == len(asks)
    told = many[0]
    for i, first in enumerate(same):
        if first >= 0:
            assert first < i and same[first] == -1 and isinstance(told[i], dict)
            assert {**told[i], "subscription": told[first]["subscription"]} == told[first]
    # control: a reader that differs from an earlier one only in its id is always named alike
    alike = [i for i, r in enumerate(readers) if not r[4]]
    for i in alike:
        if any(readers[j] == readers[i] for j in alike if j < i):
            assert same[i] >= 0


def test_readers_woken_in_one_place_write_their_rows_in_shared_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers in one place are given the same cursor, high-water mark and times: their narrow UPDATEs go as
    one statement per STEP_CHUNK of them (here 4, so 10 readers take 3: 4, 4 and 2 rows), every row written.
    A row gone behind the store's back: the rowcounts say so and every reader's row is upserted. Control:
    readers each in a place of their own keep one executemany."""
    monkeypatch.setattr(sqlite_steps, "STEP_CHUNK", 4)
    store = SQLiteStore(str(tmp_path / "place.db"))
    service = MonitorService(store)
    owner, subs = feed(service, 10)

    def woken(who: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
        return woken_statements(service, store, owner, who)

    def hwms(who: list[tuple[str, str]]) -> list[int]:
        get = "SELECT hwm FROM subscriptions WHERE id=?"
        return [int(store._db.execute(get, (sid,)).fetchone()[0]) for sid, _ in who]

    assert woken(subs) == [("execute", "UPDATE", 4), ("execute", "UPDATE", 4), ("execute", "UPDATE", 2)]
    assert hwms(subs) == [service.state("ci", None)["head"]] * 10
    store._db.execute("DELETE FROM subscriptions WHERE id=?", (subs[4][0],))
    sent = woken(subs)
    assert sent == [("execute", "UPDATE", n) for n in (4, 4, 2)] + [("execute", "INSERT", 1)] * 10
    assert hwms(subs) == [service.state("ci", None)["head"]] * 10
    # control: three readers each in a place of its own (acked to different seqs) write as before
    mixed = subs[:3]
    for back, (sid, token) in enumerate(mixed):
        service.seek(sid, token, {"cursor": service.state("ci", None)["head"] - back, "reason": "test"})
    assert woken(mixed) == [("executemany", "UPDATE", 3)]
    assert hwms(mixed) == [service.state("ci", None)["head"]] * 3


TEXT_ID = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
SERVER_ID = st.from_regex(r"sub-[0-9a-f]{4,16}", fullmatch=True)
HEADERS = st.dictionaries(
    st.sampled_from(["access-control-allow-origin", "vary", "content-type", "x-extra"]),
    st.sampled_from(["*", "origin", "application/json", "https://example.com"]),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@example(  # the same headers in another order: other bytes, so made alone (found in review)
    ids=("sub-01dc", "sub-02dc"),
    headers=({"vary": "origin", "x-extra": "*"}, {"x-extra": "*", "vary": "origin"}),
    statuses=(200, 200),
    close=False,
    observations=[],
)
@given(
    ids=st.tuples(st.one_of(SERVER_ID, TEXT_ID), st.one_of(SERVER_ID, TEXT_ID)),
    headers=st.tuples(HEADERS, HEADERS),
    statuses=st.sampled_from([(200, 200), (200, 207)]),
    close=st.booleans(),
    observations=st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3), max_size=3),
)
def test_a_reply_written_from_the_one_it_is_like_has_the_bytes_it_would_have_alone(
    ids: tuple[str, str],
    headers: tuple[dict[str, str], dict[str, str]],
    statuses: tuple[int, int],
    close: bool,
    observations: list[dict[str, str]],
) -> None:
    """A woken reader's reply made from the encoded reply of the reader it is like (pull_many's `same`):
    its own id and length in the other one's head and body, byte for byte what encode_response makes of it
    alone, whatever the ids (lengths, escapes, any text), the headers (the same, or not: then it is made
    alone), the status and the connection's close. Positive control: with the same status and headers the
    leader keeps what was encoded for its place."""
    from monitor_protocol.api.messages import Response
    from monitor_protocol.doors.http.reply_bytes import encode_response

    body = {"subscription": ids[0], "monitor": "ci", "next": 4, "observations": observations}
    leader = Response(statuses[0], body, dict(headers[0]), route="/mp/v0/subscriptions/{id}/pull")
    mine = {**body, "subscription": ids[1]}
    follower = Response(statuses[1], mine, dict(headers[1]), route=leader.route, like=leader)
    alone = Response(statuses[1], mine, dict(headers[1]), route=leader.route)
    assert encode_response(follower, close=close) == encode_response(alone, close=close)
    shared = statuses[0] == statuses[1] and list(headers[0].items()) == list(headers[1].items())
    assert (leader.encoded is not None) == shared
    if shared:
        assert leader.encoded[2] is not None  # the place's head and body kept, and used
        assert encode_response(follower, close=close) == encode_response(alone, close=close)  # reused


def test_woken_readers_in_one_place_share_the_first_ones_page_and_reply(tmp_path: Path) -> None:
    """Readers in the same place are answered from the first one's pull: one page read, every reply the
    same but for the reader's id, and each reader's own delivery written. Control: a reader elsewhere
    (another cursor) gets its own pull."""
    store = CountingStore(str(tmp_path / "place.db"))
    service = MonitorService(store)
    owner, subs = feed(service, 6)
    service.publish("ci", {"type": RUN, "subject": "early"}, owner)
    behind = subs[-1]  # the control: it has not acked "early"
    for sid, token in subs[:-1]:
        service.ack(sid, token, {"cursor": service.pull(sid, token)["next"]})
    service.publish("ci", {"type": RUN, "subject": "woken"}, owner)
    scans = store.scans
    replies = service.pull_many([(sid, token, None, 10, None) for sid, token in subs])
    assert store.scans - scans == 2  # one page for the five alike, one for the reader behind them
    first = replies[0]
    assert isinstance(first, dict)
    for (sid, _token), reply in zip(subs[:-1], replies[:-1], strict=True):
        assert isinstance(reply, dict)
        assert {**reply, "subscription": first["subscription"]} == first and reply["subscription"] == sid
        assert [o["subject"] for o in reply["observations"]] == ["woken"]
        assert service.store.get_subscription(sid).hwm == reply["next"] - 1  # its own delivery, written
        # built once: the first reader's observation objects, not a copy made again per reader
        assert all(a is b for a, b in zip(reply["observations"], first["observations"], strict=True))
    control = replies[-1]
    assert isinstance(control, dict) and control["subscription"] == behind[0]
    assert [o["subject"] for o in control["observations"]] == ["early", "woken"]
    assert control["observations"][-1] is not first["observations"][-1]  # its own pull built its own


def test_the_router_matches_a_request_against_its_own_methods_routes_as_a_scan_of_all_would() -> None:
    """`_candidates(path, method)` gives, for every route's path and every method, the route a scan of the
    whole table in order would take; a method a path does not have is refused naming the ones it has.
    Control: the table has paths with two methods (GET and POST), so the method decides there."""
    import re as regex_module

    from monitor_protocol.api import rest

    table = rest.route_table()
    paths = {
        regex_module.sub(r"\{\w+\}", "x-1", rest._LABELS[rx])[len(rest.PREFIX) :] for _m, rx, _f in table
    }
    two = [p for p in paths if len({m for m, rx, _f in table if rx.match(p)}) > 1]
    assert two  # the control: the method decides for these paths
    for path in paths:
        for method in ("GET", "POST", "PUT", "DELETE"):
            scan = next(((rx, f) for m, rx, f in table if m == method and rx.match(path)), None)
            mine = next(((rx, f) for _m, rx, f in rest._candidates(path, method) if rx.match(path)), None)
            assert mine == scan, (method, path)
    service = MonitorService(SQLiteStore(":memory:"))
    router = RestRouter(service)
    for path in two:
        reply = router.handle(Request("PUT", rest.PREFIX + path, [], {"host": "127.0.0.1"}, b""))
        assert reply.status == 404 and reply.body["code"] == "NOT_FOUND"
        assert reply.body["error"] == f"PUT is not a method of {rest.PREFIX + path}; use GET or POST."


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["monitors", "observations", "ci", "x-1", "", "state", "subscriptions", "%2F", "a.b"]
        ),
        max_size=4,
    ),
    st.booleans(),
)
@example(["monitors", "ci", "observations"], False)
@example(["monitors", "ci", "observations"], True)
@example(["monitors", "observations", "observations"], False)
def test_a_lone_publish_is_recognised_where_the_router_would_route_a_publish(
    parts: list[str], slash: bool
) -> None:
    """`lone_publish` (the group's fast way in, remembered per path) takes a POST only where the whole
    router takes the publish route, with the same monitor id, asked once or again, and takes every such
    path written without a trailing slash. Control: the paths of the publish route itself are taken."""
    from monitor_protocol.api import rest

    raw_path = rest.PREFIX + "/" + "/".join(parts) + ("/" if slash else "")
    path = raw_path[len(rest.PREFIX) :].rstrip("/") or "/"
    scan = next(
        ((rx, m) for meth, rx, _f in rest.route_table() if meth == "POST" for m in [rx.match(path)] if m),
        None,
    )
    expected = scan[1]["id"] if scan and rest._LABELS[scan[0]] == rest._PUBLISH_LABEL else None
    service = MonitorService(SQLiteStore(":memory:"))
    router = RestRouter(service)
    req = Request(
        "POST", raw_path, [], {"host": "127.0.0.1", "authorization": "Bearer t"}, b'{"type": "a.b"}'
    )
    for _again in range(2):
        parts_of = router.lone_publish(req)
        # taken only as the router would take it (None: `handle` answers the request whole, as it is)
        assert parts_of is None or (expected is not None and parts_of[0] == expected), raw_path
        if expected is not None and not raw_path.endswith("/"):  # an empty last part ends it with one too
            assert parts_of is not None and parts_of[0] == expected, raw_path
    if parts == ["monitors", "ci", "observations"]:
        assert expected == "ci"  # control: the publish route is taken
    assert router.lone_publish(Request("GET", raw_path, [], req.headers, req.body)) is None


# ---------------------------------------------------------------------------------------------- the engine


async def test_the_calls_of_one_loop_turn_share_one_commit(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "group.db"))
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "types": [RUN]}, None)["owner_token"]
    engine = LoopEngine(store)
    heard: list[tuple[int, int]] = []
    commits = store.stats.commits
    for i in range(16):
        engine.submit_to(
            service.publish,
            ("ci", {"type": RUN, "subject": f"b{i}"}, owner),
            lambda ok, value: heard.append((store.stats.commits - commits, value["seq"])),
        )
    assert heard == []  # nothing is heard before the group's commit
    await until(lambda: len(heard) == 16, "every outcome")
    assert {c for c, _ in heard} == {1}  # one commit for the sixteen, before anyone heard back
    assert sorted(seq for _, seq in heard) == list(range(2, 18))
    # control: calls of two turns commit twice
    engine.submit_to(service.state, ("ci", owner), lambda ok, value: heard.append((0, 0)))
    await asyncio.sleep(0)
    engine.submit_to(service.publish, ("ci", {"type": RUN}, owner), lambda ok, value: heard.append((0, 0)))
    await until(lambda: len(heard) == 18, "two more")
    assert store.stats.commits - commits == 2  # the read committed nothing; the publish did


async def test_closing_the_store_never_runs_inside_a_group_commit(tmp_path: Path) -> None:
    """Shutdown closes the store through the engine; calls submitted in the same loop turn must still commit
    (before the close, as their own group) and the close must not be followed by a group commit on a closed
    store. Control: the publishes submitted before the close are in the database when it is opened again."""
    path = str(tmp_path / "close.db")
    store = SQLiteStore(path)
    service = MonitorService(store)
    app = MonitorApp(service, RestRouter(service), store=store, engine=LoopEngine(store), sweep_interval=None)
    owner = service.create_monitor({"id": "ci", "types": [RUN]}, None)["owner_token"]
    heard: list[bool] = []
    for i in range(3):
        app.engine.submit_to(
            service.publish, ("ci", {"type": RUN, "subject": f"b{i}"}, owner), lambda ok, _v: heard.append(ok)
        )
    closing = app.engine.submit(app.close_store)  # queued now, in the same turn as the publishes
    late: list[bool] = []
    app.engine.submit_to(service.publish, ("ci", {"type": RUN}, owner), lambda ok, _v: late.append(ok))
    await closing  # the close itself succeeded
    assert heard == [True, True, True]
    assert late == [False]  # after the close nothing is written, and the caller hears so
    again = MonitorService(SQLiteStore(path))
    assert [o.get("subject") for o in again.read_log("ci", 1, 100)["observations"]][-3:] == ["b0", "b1", "b2"]


def test_sqlite_writes_a_monitor_once_per_transaction_and_a_known_subject_not_again(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "writes.db"))
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "types": [RUN]}, None)["owner_token"]
    service.publish("ci", {"type": RUN, "subject": "b1"}, owner)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    with store.batch():
        for _ in range(8):
            service.publish("ci", {"type": RUN, "subject": "b1"}, owner)
    store._db.set_trace_callback(None)
    writes = [s.split("(")[0].strip() for s in statements if s.startswith(("INSERT", "UPDATE"))]
    assert writes.count("INSERT INTO observations") == 8
    assert writes.count("INSERT INTO monitors") == 1  # the head and counters, once, at the commit
    assert not [s for s in writes if "subjects" in s]  # b1 is stored already
    assert store.get_monitor("ci").head == 10 and service.state("ci", owner)["counters"]["observations"] == 9
    # control: a new subject is one statement more
    statements.clear()
    store._db.set_trace_callback(statements.append)
    service.publish("ci", {"type": RUN, "subject": "b2"}, owner)
    store._db.set_trace_callback(None)
    assert any("INTO subjects" in s for s in statements)


def test_a_readers_usual_write_leaves_the_indexed_columns_alone(tmp_path: Path) -> None:
    """An ack+pull updates cursor, hwm and record only; a row not there (behind the store's back) is
    written whole again, never lost; a retire (an indexed column) is the upsert."""
    store = SQLiteStore(str(tmp_path / "reader.db"))
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "types": [RUN], "visibility": "public"}, None)["owner_token"]
    for _ in range(3):
        service.publish("ci", {"type": RUN}, owner)
    sub = service.subscribe({"monitor": "ci", "subscriber": "agent:r"}, None)
    sid, token = sub["subscription"]["id"], sub["token"]
    nxt = service.pull(sid, token, limit=1)["next"]
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    nxt = service.pull(sid, token, limit=1, ack=nxt)["next"]
    store._db.set_trace_callback(None)
    writes = [s for s in statements if "subscriptions" in s and s.startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 1 and writes[0].startswith("UPDATE subscriptions SET cursor=")
    # a row gone behind the store's back: the narrow UPDATE finds nothing, and the upsert writes it whole
    store._db.execute("DELETE FROM subscriptions WHERE id=?", (sid,))
    service.pull(sid, token, limit=1, ack=nxt)
    assert store._db.execute("SELECT cursor FROM subscriptions WHERE id=?", (sid,)).fetchone() == (nxt,)
    # control: a change of an indexed column (retire: state) is the upsert
    statements.clear()
    store._db.set_trace_callback(statements.append)
    service.retire_subscription(sid, token, {"reason": "done"})
    store._db.set_trace_callback(None)
    assert any(s.startswith("INSERT INTO subscriptions") for s in statements)


def test_the_readers_one_append_woke_write_their_rows_in_one_statement(tmp_path: Path) -> None:
    """pull_many's narrow UPDATEs go as one executemany (counted at the connection: one call, not one per
    reader); a row gone behind the store's back makes every one of them an upsert, and every reader's cursor
    and high-water mark is there after the commit."""
    store = SQLiteStore(str(tmp_path / "many.db"))
    service = MonitorService(store)
    owner, subs = feed(service, 3)

    def woken() -> list[tuple[Any, ...]]:
        return woken_statements(service, store, owner, subs)

    def hwm(sid: str) -> int:
        return int(store._db.execute("SELECT hwm FROM subscriptions WHERE id=?", (sid,)).fetchone()[0])

    assert woken() == [("executemany", "UPDATE", 3)]  # one call for the three readers, no upsert
    head = service.state("ci", None)["head"]
    assert [hwm(sid) for sid, _ in subs] == [head] * 3
    # a row gone behind the store's back: the rowcount says so, and every reader's row is upserted whole
    store._db.execute("DELETE FROM subscriptions WHERE id=?", (subs[1][0],))
    assert woken() == [("executemany", "UPDATE", 3)] + [("execute", "INSERT", 1)] * 3
    head = service.state("ci", None)["head"]
    assert [hwm(sid) for sid, _ in subs] == [head] * 3
    # control: one reader alone is one narrow UPDATE of its own, as before
    service.publish("ci", {"type": RUN, "subject": "y"}, owner)
    real, counting = store._db, CountingConnection(store._db)
    store._db = counting  # type: ignore[assignment]
    try:
        service.pull(subs[0][0], subs[0][1])
    finally:
        store._db = real
    assert counting.calls == [("execute", "UPDATE", 1)]


def test_the_sweep_timer_sweeps_only_when_a_deadline_is_due(tmp_path: Path) -> None:
    now = [1_000.0]
    store = SQLiteStore(str(tmp_path / "sweep.db"))
    service = MonitorService(store, clock=lambda: now[0], retire_after_mute_seconds=60)
    owner = service.create_monitor({"id": "ci", "types": [RUN]}, None)["owner_token"]
    service.subscribe({"monitor": "ci", "subscriber": "agent:quiet"}, owner)
    swept: list[float] = []
    original = service.sweep
    service.sweep = lambda now_=None: swept.append(now[0]) or original(now_)  # type: ignore[method-assign]
    service.sweep_due()  # the first tick learns the deadlines
    swept.clear()
    now[0] += 30
    assert service.sweep_due() == 0 and swept == []  # nothing due: nothing read
    now[0] += 31 + 1
    assert service.sweep_due() == 1 and swept  # the quiet reader's mute window ran out: retired


def test_a_mute_window_shortened_brings_the_sweep_forward(tmp_path: Path) -> None:
    """A monitor whose retire_after_mute_seconds is lowered moves its readers' deadlines earlier than the
    sweep timer knew: the next tick sweeps by the new window. Control: left alone, the old window holds."""
    now = [1_000.0]
    store = SQLiteStore(str(tmp_path / "window.db"))
    service = MonitorService(store, clock=lambda: now[0], retire_after_mute_seconds=None)
    owner = service.create_monitor({"id": "ci", "types": [RUN], "retire_after_mute_seconds": 600}, None)[
        "owner_token"
    ]
    kept_owner = service.create_monitor(
        {"id": "kept", "types": [RUN], "retire_after_mute_seconds": 600}, None
    )["owner_token"]
    service.subscribe({"monitor": "ci", "subscriber": "agent:quiet"}, owner)
    kept = service.subscribe({"monitor": "kept", "subscriber": "agent:quiet"}, kept_owner)
    service.sweep_due()  # the first tick learns the deadlines: 600 s away
    now[0] += 30
    assert service.sweep_due() == 0  # control: nothing is due under the old window
    service.configure("ci", "update", {"patch": {"retire_after_mute_seconds": 10}}, owner)
    now[0] += 1
    assert service.sweep_due() == 1  # the shortened window ran out 21 s ago: its reader retires now
    info = service.subscription_info(kept["subscription"]["id"], kept["token"])
    assert info["active"] is True  # the other monitor's window did not change


# ---------------------------------------------------------------------------------------------- the wire


JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
).map(lambda v: json.dumps(v).encode())
ODD_TEXTS = [
    b"NaN", b"[Infinity]", b'"\\ud800"', b'{"a": "\\udc00"}', b"9007199254740993", b"18446744073709551616",
    b"-9223372036854775809", b"1e400", b'{"a":1,"a":2}', b'"\xed\xa0\x80"', b"[1,]", b"\xef\xbb\xbf{}",
    b"[" * 40 + b"]" * 40, b"123abc", b"", b"  {}  ",
    b"[" * 32 + b"]" * 32, b"[" * 33 + b"]" * 33, b'{"a":' * 32 + b"1" + b"}" * 32, b'{"a":' * 33 + b"1" + b"}" * 33,
    b'{"a": "' + b"[" * 40 + b'"}', b"[" + b",".join([b"[" * 31 + b"]" * 31] * 50) + b"]",
    b"[" + b",".join([b"[" * 30 + b"]" * 30] * 50) + b"]", b"[" * 2000 + b"]" * 2000,
]  # fmt: skip
NESTED = st.recursive(
    st.integers(0, 9),
    lambda inner: st.lists(inner, min_size=1, max_size=2) | st.dictionaries(st.just("k"), inner, min_size=1),
    max_leaves=40,
).map(lambda v: json.dumps(v).encode())


def outcome(raw: bytes) -> Any:
    try:
        value = wire.loads(raw)
    except ProtocolError as err:
        return ("refused", err.code, err.message)
    return ("value", json.dumps(value, sort_keys=True, default=repr), _floats(value))


def _floats(value: Any) -> Any:
    return [value] if isinstance(value, float) and math.isfinite(value) else []


def both(raw: bytes) -> tuple[Any, Any]:
    import orjson

    previous = wire.codec()
    try:
        wire.use_codec(wire.STDLIB_CODEC)
        alone = outcome(raw)
        wire.use_codec(wire.Codec("orjson", orjson.dumps, orjson.loads, parse=orjson.loads))
        fast = outcome(raw)
    finally:
        wire.use_codec(previous)
    return alone, fast


@settings(max_examples=300, deadline=None)
@given(JSON_TEXT)
def test_orjson_as_the_parser_answers_as_the_wires_own_rules(raw: bytes) -> None:
    alone, fast = both(raw)
    assert fast == alone


@settings(max_examples=200, deadline=None)
@given(st.integers(25, 40).flatmap(lambda d: st.tuples(st.just(d), NESTED)))
def test_the_depth_limit_is_judged_alike_with_orjson(case: tuple[int, bytes]) -> None:
    """Bodies nested around the limit (32 levels), some deep inside a batch: both parsers agree."""
    depth, inner = case
    raw = b"[" * depth + inner + b"]" * depth
    alone, fast = both(raw)
    assert fast == alone
    assert (alone[0] == "refused") == (depth + _levels(json.loads(inner)) > 32)  # the limit, exactly


def _levels(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_levels, value.values()))
    if isinstance(value, list):
        return 1 + max(map(_levels, value))
    return 0


@pytest.mark.parametrize("raw", ODD_TEXTS)
def test_the_wires_refusals_are_the_same_with_orjson(raw: bytes) -> None:
    alone, fast = both(raw)
    assert fast == alone
    if raw in (b"NaN", b"9007199254740993", b"[" * 40 + b"]" * 40, b"[" * 33 + b"]" * 33):
        assert alone[0] == "refused"  # control: these are refused, by both
    if raw in (b"[" * 32 + b"]" * 32, b'{"a": "' + b"[" * 40 + b'"}'):
        assert alone[0] == "value"  # control: exactly the limit, and brackets in a string, pass


def test_a_groups_bodies_parsed_before_the_engine_runs_are_not_walked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A door parses a group's lone publishes before the engine checks them (RestRouter.handle_publishes):
    every small body (4 KiB at most) `loads` returned among the last ones is known checked; anything else is
    walked."""
    walked: list[Any] = []
    problem = wire.problem
    monkeypatch.setattr(wire, "problem", lambda value: walked.append(value) or problem(value))
    monkeypatch.setattr(wire, "_vetted_small", {})  # what earlier tests parsed does not count here
    bodies = [wire.loads(b'{"type": "com.example.ci.run", "data": {"n": %d}}' % i) for i in range(16)]
    for body in bodies:
        assert wire.check(body) is body
    assert walked == []
    # controls: an equal value `loads` did not return is walked, and so is a large body once another came
    # after it (only the last value is remembered whatever its size)
    twin = {"type": "com.example.ci.run", "data": {"n": 0}}
    wire.check(twin)
    assert walked == [twin]
    large = wire.loads(b'{"data": "' + b"x" * (5 * 1024) + b'"}')
    wire.check(large)
    assert len(walked) == 1
    wire.loads(b"{}")
    wire.check(large)
    assert walked[-1] is large
    # bounded: at most 64 small values are held
    for i in range(200):
        wire.loads(b'{"n": %d}' % i)
    assert len(wire._vetted_small) <= 64


def test_only_plausible_publish_paths_are_remembered() -> None:
    """The publish route per path is remembered for a publisher's repeated requests, but a path that is not
    a publish's, or is longer than any id allows (a request line may be 64 KiB), is worked out and not kept:
    a client cannot pin memory with paths. Control: a publish path is kept, and answers the same again."""
    from monitor_protocol.api import rest

    rest._PUBLISH_TARGETS.clear()
    long_id = "x" * 60_000
    assert rest._publish_target(f"/mp/v0/monitors/{long_id}/observations") == long_id
    assert rest._publish_target("/mp/v0/monitors/ci/state") is None
    assert rest._PUBLISH_TARGETS == {}
    assert rest._publish_target("/mp/v0/monitors/ci/observations") == "ci"
    assert rest._PUBLISH_TARGETS == {"/mp/v0/monitors/ci/observations": "ci"}
    assert rest._publish_target("/mp/v0/monitors/ci/observations") == "ci"
