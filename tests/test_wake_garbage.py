"""The garbage a wake leaves, and when the collector may run (docs/serve.md "How a request is served").

- a parked pull, and each of its re-checks, leaves no reference cycle: what it allocated is freed when the
  last reference goes, not by a full collection (its re-checks were closures naming themselves: one cycle
  per parked pull, and a full collection that landed inside the wake of 1,000 readers cost it 60-90 ms);
- the replies of the readers one append woke are written with the automatic collector held off, and it is
  on again once they have left, also when the server shuts down with a re-check still pending;
- a woken reader is answered (with a 503) even when answering the wake failed part way, and a result that
  does not fit fails only its own reader;
- a shutdown gives every hold back, also when a hook of its raises;
- holds nest, a collector the embedding program turned off stays off, and a hold that lasts (one slow
  re-check, or holds without a gap) gives the collector its turns: on every MAX_HELD_S for as long.

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


def parked_pulls(tmp_path: Path) -> tuple[RestRouter, list[Callable[[], Response]], Callable[[], Response]]:
    """A router; what parks a pull four ways (GET pull?wait, POST pull {wait}, POST pull {ack, wait}, and a
    re-check of a parked pull); and a re-check refused (its subscription retired since it parked)."""
    service = MonitorService(SQLiteStore(str(tmp_path / "g.db")))
    router = RestRouter(service, allowed_hosts={"127.0.0.1"})
    _owner, [(sid, token), (gone_sid, gone_token)] = feed(service, 2)

    def get_wait(sid: str = sid, token: str = token) -> Response:
        auth = {**HEADERS, "authorization": f"Bearer {token}"}
        return router.handle(
            Request("GET", f"/mp/v0/subscriptions/{sid}/pull", [("wait", "30"), ("limit", "5")], auth)
        )

    def post(body: bytes) -> Response:
        headers = {
            **HEADERS,
            "authorization": f"Bearer {token}",
            "content-type": "application/json",
            "content-length": str(len(body)),
        }
        return router.handle(Request("POST", f"/mp/v0/subscriptions/{sid}/pull", [], headers, body))

    def post_wait() -> Response:
        return post(b'{"wait": 30, "limit": 5}')

    cursor = service.subscription_info(sid, token)["cursor"]

    def ack_and_pull() -> Response:
        return post(b'{"wait": 30, "limit": 5, "ack": %d}' % cursor)

    def recheck() -> Response:
        first = get_wait()
        assert first.long_poll is not None and first.long_poll.rerun is not None
        again = first.long_poll.rerun()
        assert again.long_poll is not None and again.long_poll.rerun is not None
        return again.long_poll.rerun()

    parked = get_wait(gone_sid, gone_token)
    assert parked.long_poll is not None and parked.long_poll.rerun is not None
    service.retire_subscription(gone_sid, gone_token, {"reason": "gone while parked"})
    refused = parked.long_poll.rerun
    return router, [get_wait, post_wait, ack_and_pull, recheck], refused


def test_a_parked_pull_and_its_rechecks_leave_no_reference_cycle(tmp_path: Path, collector_off: None) -> None:
    _router, makers, refused = parked_pulls(tmp_path)
    for make in makers:
        parked = make()
        assert parked.long_poll is not None, f"{make.__name__}: the pull was parked (nothing to read)"
        del parked
        assert unreachable_after(lambda make=make: [make() for _ in range(20)]) == 0, make.__name__
    # a re-check the engine refuses is answered with the refusal, and leaves no cycle either
    answer = refused()
    assert answer.status == 404 and answer.long_poll is None and answer.body["code"] == "NOT_FOUND"
    assert answer.route == "/mp/v0/subscriptions/{id}/pull", "dressed as its request's reply"
    assert unreachable_after(lambda: [refused() for _ in range(20)]) == 0

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
    # control: a reply that no wake made is written with the collector on
    plain_seen: list[bool] = []
    conn, plain = HttpConnection(server), Recording(plain_seen)
    conn.connection_made(plain)  # type: ignore[arg-type]
    sid, token = subs[0]
    conn.data_received(get(f"/mp/v0/subscriptions/{sid}/pull", token))
    await until(lambda: plain.replies(), "the plain pull's reply")
    assert plain_seen == [True]

    seen: list[bool] = []
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
    seen: list[bool] = []
    readers = await park(server, subs, seen)
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "j"}, owner))
    await until(lambda: all(r.replies() for r in readers), "every woken reader's reply")
    assert seen == [False] * 3, "written while the hold taken at their wake-up was on"
    await until(lambda: app._collector_holds == 0, "the hold given back")
    assert gc.isenabled()


async def test_a_result_that_does_not_fit_fails_only_its_own_reader(door, caplog) -> None:
    """One result of the re-check that is not a (reply, mark) pair (a bug in answering the wake): the other
    readers, before and after it, get their observation, its reader a 503 naming an incident that is logged
    with its cause; none waits out its 30 s, and the collector is on again."""
    server, service, _store = door
    app = server.app
    owner, subs = feed(service, JOIN_WOKEN_MAX + 4)
    real = app._woken_job

    def fifth_unfit(woken):  # type: ignore[no-untyped-def]
        job, answer = real(woken)

        def spoilt() -> list[Any]:
            results: list[Any] = job()
            results[4] = None
            return results

        return spoilt, answer

    app._woken_job = fifth_unfit  # type: ignore[method-assign]
    readers = await park(server, subs, [])
    writer, _ = connect(server)
    writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "f"}, owner))
    await until(lambda: all(r.replies() for r in readers), "every woken reader's reply")
    statuses = [status for r in readers for status, _body in r.replies()]
    assert statuses == [200] * 4 + [503] + [200] * (len(subs) - 5), statuses
    [(_status, body)] = readers[4].replies()
    assert body["code"] == "UNAVAILABLE" and "incident" in body["error"]
    causes = [r.exc_info[0] for r in caplog.records if r.exc_info]
    assert causes == [TypeError], "the failure is logged, once, with its cause"
    assert gc.isenabled() and app._collector_holds == 0


class Interrupted(BaseException):
    """Not an Exception: what no `except Exception` around a reader's write catches."""


async def test_a_wake_whose_answering_stops_part_way_still_answers_every_reader(door) -> None:
    """Answering the wake stops at the fifth reader's write (a BaseException out of it): the readers before
    it and that reader get their observation, the readers after it a 503 each; none waits out its 30 s."""
    server, service, _store = door
    app = server.app
    owner, subs = feed(service, JOIN_WOKEN_MAX + 4)
    real = app._woken_job

    def stops_at_the_fifth(woken):  # type: ignore[no-untyped-def]
        job, answer = real(woken)

        def interrupted(_response: Response) -> None:
            raise Interrupted

        woken[4][0].reply_now = interrupted
        return job, answer

    app._woken_job = stops_at_the_fifth  # type: ignore[method-assign]
    readers = await park(server, subs, [])
    writer, _ = connect(server)
    loop = asyncio.get_running_loop()
    raised: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, ctx: raised.append(ctx.get("exception")))
    try:
        writer.data_received(post("/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "f"}, owner))
        await until(lambda: all(r.replies() for r in readers), "every woken reader's reply")
    finally:
        loop.set_exception_handler(None)
    statuses = [status for r in readers for status, _body in r.replies()]
    assert statuses == [200] * 5 + [503] * (len(subs) - 5), statuses
    assert [type(e) for e in raised] == [Interrupted], "what stopped it is not swallowed"
    assert gc.isenabled() and app._collector_holds == 0


async def test_a_shutdown_with_a_recheck_pending_turns_the_collector_back_on(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"))
    service = MonitorService(store)
    app = MonitorApp(service, RestRouter(service), store=store, engine=LoopEngine(store), sweep_interval=None)
    await app.startup()
    app._recheck_woken = lambda: None  # type: ignore[method-assign] # a re-check the loop will never run
    app._schedule_recheck(asyncio.get_running_loop())
    await asyncio.sleep(0)
    assert not gc.isenabled() and app._collector_holds == 1, "control: nothing else gives the hold back"
    await app.shutdown()
    assert gc.isenabled() and app._collector_holds == 0


async def test_a_shutdown_hook_that_raises_still_closes_the_store_and_turns_the_collector_back_on(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "h.db"))
    service = MonitorService(store)
    app = MonitorApp(service, RestRouter(service), store=store, engine=LoopEngine(store), sweep_interval=None)

    def broken(_app: MonitorApp) -> None:
        raise RuntimeError("a hook that fails")

    app.on_shutdown.append(broken)
    await app.startup()
    app._recheck_woken = lambda: None  # type: ignore[method-assign]
    app._schedule_recheck(asyncio.get_running_loop())
    with pytest.raises(RuntimeError, match="a hook that fails"):
        await app.shutdown()
    assert app.closed, "the store was closed all the same"
    assert gc.isenabled() and app._collector_holds == 0


# ------------------------------------------------------------------------------------------- the holds


class Turn:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback, self.cancelled = callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """call_later for CollectorHold, fired by hand: its turns without waiting for time to pass."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []

    def __call__(self, _delay: float, callback: Callable[[], None]) -> Turn:
        self.turns.append(Turn(callback))
        return self.turns[-1]

    @property
    def pending(self) -> list[Turn]:
        return [t for t in self.turns if not t.cancelled]

    def fire(self) -> None:
        [turn] = self.pending
        self.turns.remove(turn)
        turn.callback()


def test_holds_nest_and_the_last_release_turns_the_collector_back_on() -> None:
    timers = Timers()
    hold = CollectorHold(call_later=timers)
    try:
        hold.acquire()
        hold.acquire()
        assert not gc.isenabled() and hold.held
        hold.release()
        assert not gc.isenabled(), "one hold is still on"
        hold.release()
        assert gc.isenabled() and not hold.held
        assert timers.pending == [], "its turn is cancelled with the last release"
        hold.release()  # one release too many changes nothing
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    timers = Timers()
    hold = CollectorHold(call_later=timers)
    gc.disable()
    try:
        hold.acquire()
        for _ in range(3):  # through its turns too
            timers.fire()
            assert not gc.isenabled()
        hold.release()
        assert not gc.isenabled()
    finally:
        gc.enable()
    # control: with the collector on, the same hold and release leave it on
    hold.acquire()
    assert not gc.isenabled()
    hold.release()
    assert gc.isenabled()


def test_a_long_hold_gives_the_collector_its_turns() -> None:
    """One hold that lasts (a slow re-check), or holds that follow one another without a gap: every
    MAX_HELD_S the collector is on for MAX_HELD_S, then off again, until the last release."""
    timers = Timers()
    hold = CollectorHold(call_later=timers)
    try:
        hold.acquire()
        assert not gc.isenabled(), "control: held, it is off until its first turn"
        states = []
        for _ in range(4):
            timers.fire()
            states.append(gc.isenabled())
        assert states == [True, False, True, False]
        hold.acquire()  # holds without a gap: the turns go on, no second timer
        hold.release()
        assert len(timers.pending) == 1 and hold.held
        timers.fire()
        assert gc.isenabled()
        hold.release()
        assert gc.isenabled() and timers.pending == []
    finally:
        gc.enable()


def test_the_default_turns_run_on_the_event_loop() -> None:
    """Without a timer given, a hold's turns are call_later on the running loop, at MAX_HELD_S."""

    async def main() -> tuple[bool, bool]:
        hold = CollectorHold(max_held=0.01)
        hold.acquire()
        off = not gc.isenabled()
        for _ in range(200):  # until its first turn (a few loop turns past 10 ms)
            await asyncio.sleep(0.005)
            if gc.isenabled():
                break
        on = gc.isenabled()
        hold.release()
        return off, on

    try:
        assert asyncio.run(main()) == (True, True)
        assert gc.isenabled()
    finally:
        gc.enable()


def test_a_hold_taken_off_the_loop_is_refused_and_changes_nothing() -> None:
    hold = CollectorHold()
    with pytest.raises(RuntimeError):
        hold.acquire()  # no running loop for its turns
    assert gc.isenabled() and not hold.held
