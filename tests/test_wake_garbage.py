"""The garbage a wake leaves, and when the collector may run (docs/serve.md "How a request is served").

- a parked pull, and each of its re-checks, leaves no reference cycle: what it allocated is freed when the
  last reference goes, not by a full collection (its re-checks were closures naming themselves: one cycle
  per parked pull, and a full collection that landed inside the wake of 1,000 readers cost it 60-90 ms);
- the replies of the readers one append woke are written with the automatic collector held off, and it is
  on again once they have left, also when the server shuts down with a re-check still pending;
- holds nest, and a collector the embedding program turned off stays off.

Each with a positive control. Every test of the suite also checks, on its way out, that it left the
collector on (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_lean_path
from monitor_protocol.api.messages import Request, Response
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.collector import CollectorHold
from monitor_protocol.doors.engines import LoopEngine
from monitor_protocol.doors.http.app import JOIN_WOKEN_MAX, MonitorApp
from monitor_protocol.doors.http.protocol import HttpConnection, HttpServer
from monitor_protocol.store.sqlite import SQLiteStore
from test_lean_path import RUN, Transport, connect, feed, get, post, until

pytestmark = pytest.mark.quick

door = test_lean_path.door  # the in-process HTTP door on SQLite (LoopEngine): (server, service, store)

HEADERS = {"host": "127.0.0.1"}


@pytest.fixture()
def collector_off() -> Iterator[None]:
    """Automatic collection off for the test (what is left over is then only what gc.collect() finds)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def unreachable_after(make: Callable[[], Any]) -> int:
    """How many objects ``make()`` left that only the cycle collector can free."""
    gc.collect()
    make()
    return gc.collect()


def parked_pulls(tmp_path: Path) -> tuple[RestRouter, list[Callable[[], Response]]]:
    """A router, and what parks a pull three ways: GET pull?wait, POST pull {wait}, and a re-check."""
    service = MonitorService(SQLiteStore(str(tmp_path / "g.db")))
    router = RestRouter(service, allowed_hosts={"127.0.0.1"})
    _owner, [(sid, token)] = feed(service, 1)
    auth = {**HEADERS, "authorization": f"Bearer {token}"}
    path = f"/mp/v0/subscriptions/{sid}/pull"

    def get_wait() -> Response:
        return router.handle(Request("GET", path, [("wait", "30"), ("limit", "5")], auth))

    def post_wait() -> Response:
        body = b'{"wait": 30, "limit": 5}'
        headers = {**auth, "content-type": "application/json", "content-length": str(len(body))}
        return router.handle(Request("POST", path, [], headers, body))

    def recheck() -> Response:
        first = get_wait()
        assert first.long_poll is not None and first.long_poll.rerun is not None
        again = first.long_poll.rerun()
        assert again.long_poll is not None and again.long_poll.rerun is not None
        return again.long_poll.rerun()

    return router, [get_wait, post_wait, recheck]


def test_a_parked_pull_and_its_rechecks_leave_no_reference_cycle(tmp_path: Path, collector_off: None) -> None:
    _router, makers = parked_pulls(tmp_path)
    for make in makers:
        parked = make()
        assert parked.long_poll is not None, "the pull was parked (nothing to read)"
        del parked
        assert unreachable_after(lambda make=make: [make() for _ in range(20)]) == 0, make.__name__

    # control: a re-check written as a closure that names itself (the shape this replaced) is found
    def cyclic() -> None:
        def again() -> Callable[[], Any]:
            return again

        again()

    assert unreachable_after(lambda: [cyclic() for _ in range(20)]) >= 20


# ------------------------------------------------------------------------------------- the collector held


class Recording(Transport):
    """A transport that notes whether the collector was on when each reply was written."""

    def __init__(self, seen: list[bool]) -> None:
        super().__init__()
        self.seen = seen

    def write(self, data: bytes) -> None:
        self.seen.append(gc.isenabled())
        super().write(data)


async def park(server: HttpServer, subs: list[tuple[str, str]], seen: list[bool]) -> list[Recording]:
    readers = []
    for sid, token in subs:
        conn, transport = HttpConnection(server), Recording(seen)
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull?wait=30", token))
        readers.append(transport)
    await until(lambda: server.app.waiters.parked_on("ci") == len(subs), "every poll to park")
    return readers


async def test_woken_readers_replies_are_written_with_the_collector_held(door) -> None:
    server, service, _store = door
    app = server.app
    owner, subs = feed(service, JOIN_WOKEN_MAX + 8)  # more than join the append's own group
    seen: list[bool] = []
    # control: a reply that no wake made is written with the collector on
    conn, plain = connect(server)
    sid, token = subs[0]
    conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull", token))
    await until(lambda: plain.replies(), "the plain pull's reply")
    assert gc.isenabled()

    readers = await park(server, subs, seen)
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "w"}, owner))
    await until(lambda: all(r.replies() for r in readers), "every woken reader's reply")
    assert seen == [False] * len(subs), "every woken reader's reply was written with the collector held"
    assert gc.isenabled() and app._collector_holds == 0, "and it is on again once they have left"
    for reader in readers:
        [(status, body)] = reader.replies()
        assert status == 200 and [o["subject"] for o in body["observations"]] == ["w"]


async def test_a_few_woken_readers_joined_to_the_append_leave_the_collector_on(door) -> None:
    """Readers few enough to join the append's own group (JOIN_WOKEN_MAX) are answered with its commit; the
    hold taken at their wake-up is given back either way."""
    server, service, _store = door
    app = server.app
    owner, subs = feed(service, 3)
    readers = await park(server, subs, [])
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "j"}, owner))
    await until(lambda: all(r.replies() for r in readers), "every woken reader's reply")
    await until(lambda: app._collector_holds == 0, "the hold given back")
    assert gc.isenabled()


async def test_a_shutdown_with_a_recheck_pending_turns_the_collector_back_on(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"))
    service = MonitorService(store)
    app = MonitorApp(service, RestRouter(service), store=store, engine=LoopEngine(store), sweep_interval=None)
    await app.startup()
    app._schedule_recheck(asyncio.get_running_loop())  # a wake whose re-check has not run yet
    assert not gc.isenabled() and app._collector_holds == 1
    await app.shutdown()
    assert gc.isenabled() and app._collector_holds == 0


# ------------------------------------------------------------------------------------------- the holds


def test_holds_nest_and_the_last_release_turns_the_collector_back_on() -> None:
    hold = CollectorHold()
    try:
        hold.acquire()
        hold.acquire()
        assert not gc.isenabled() and hold.held
        hold.release()
        assert not gc.isenabled(), "one hold is still on"
        hold.release()
        assert gc.isenabled() and not hold.held
        hold.release()  # one release too many changes nothing
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    hold = CollectorHold()
    gc.disable()
    try:
        hold.acquire()
        hold.release()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # control: with the collector on, the same hold and release leave it on
    hold.acquire()
    hold.release()
    assert gc.isenabled()
