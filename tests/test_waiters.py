"""The one waiter registry (monitor_protocol.doors.parking) and the doors on it: no wake-up is ever lost (an append
between a reader's pull and its parking still wakes it), timeouts and shutdown drain it, and over the ASGI
app no engine call runs on the event loop while one append wakes every parked long poll in a single engine
batch. No assertion depends on timing; HANG_GUARD only stops a broken registry from hanging the suite."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from typing import Any

import pytest
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.browser import EngineHost
from monitor_protocol.doors.http.app import MonitorApp
from monitor_protocol.doors.mcp.backends import EmbeddedBackend
from monitor_protocol.doors.parking import Waiters
from monitor_protocol.store.memory import MemoryStore
from test_asgi import HANG_GUARD, RUN, Conn, call, publish, setup_feed
from waiting import eventually_async

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

# -- the registry alone ----------------------------------------------------------------------------------


class FakeService:
    """Just the listener contract of MonitorService: fn(monitor_id, head) after a committed append."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def add_listener(self, fn: Any) -> None:
        self.listeners.append(fn)

    def remove_listener(self, fn: Any) -> None:
        self.listeners.remove(fn)

    def append(self, monitor_id: str, head: int = 1) -> None:
        for fn in list(self.listeners):
            fn(monitor_id, head)

    def append_from_thread(self, monitor_id: str) -> None:
        """As the engine thread does: the listener runs off the loop."""
        worker = threading.Thread(target=self.append, args=(monitor_id,))
        worker.start()
        worker.join()


@pytest.fixture()
async def registry() -> tuple[Waiters, FakeService]:
    service = FakeService()
    waiters = Waiters()
    waiters.attach(service)
    return waiters, service


async def parked(waiters: Waiters, monitor_id: str, count: int = 1, interval: float = 0) -> None:
    """Until `count` readers are parked on the monitor (checked every loop turn, or every `interval` s when
    an engine thread must get the GIL in between)."""
    await eventually_async(
        lambda: waiters.parked_on(monitor_id) >= count,
        timeout=HANG_GUARD,
        interval=interval,
        what=f"{count} reader(s) parked on {monitor_id}",
    )


async def test_an_append_between_the_read_and_the_parking_still_wakes(registry):
    waiters, service = registry
    mark = waiters.mark("ci")  # what a pull reads right after it ran
    assert await waiters.wait("ci", mark, 0) is False  # positive control: nothing happened yet
    service.append_from_thread("ci")  # commits before the reader parks
    assert await asyncio.wait_for(waiters.wait("ci", mark, HANG_GUARD), HANG_GUARD) is True
    assert waiters.parked == 0 and waiters.monitors() == []


async def test_a_parked_reader_wakes_on_an_append_from_the_engine_thread(registry):
    waiters, service = registry
    reader = asyncio.ensure_future(waiters.wait("ci", waiters.mark("ci"), HANG_GUARD))
    await parked(waiters, "ci")
    assert waiters.parked == 1
    service.append_from_thread("other")  # another monitor's append does not wake it
    await asyncio.sleep(0.01)  # the point: for this long, nothing may wake it
    assert not reader.done()
    service.append_from_thread("ci")
    assert await asyncio.wait_for(reader, HANG_GUARD) is True
    assert waiters.parked == 0 and waiters.monitors() == []


async def test_appends_racing_the_parking_are_never_lost(registry):
    """Many rounds of an append landing on another thread at an arbitrary moment after the read: every
    wait returns True (a lost wake-up would return False after HANG_GUARD)."""
    waiters, service = registry
    for round_ in range(200):
        mark = waiters.mark("ci")
        worker = threading.Thread(target=service.append, args=("ci",))
        worker.start()  # the append races the wait below: before, during or after the parking
        if round_ % 2:
            # The point: vary where the append lands (before, during or after the parking).
            await asyncio.sleep(0)
        woke = await asyncio.wait_for(waiters.wait("ci", mark, HANG_GUARD), HANG_GUARD)
        worker.join()
        assert woke is True, round_
    assert waiters.monitors() == []


async def test_the_counts_of_monitors_nobody_waits_on_are_forgotten_and_no_wake_is_lost(
    registry, monkeypatch
):
    """One count per monitor ever appended to grew for good (a soak churning monitors saw it): past HEARD_MAX
    the counts of monitors nobody is parked on are forgotten. A mark taken before that is stale (its reader
    re-checks: True), never one that a count starting again could equal while an append went unseen; a
    reader parked across it still wakes on its monitor's next append."""
    from monitor_protocol.doors import parking

    waiters, service = registry
    monkeypatch.setattr(parking, "HEARD_MAX", 8)
    service.append("busy")
    service.append("busy")
    reader = asyncio.ensure_future(waiters.wait("busy", waiters.mark("busy"), HANG_GUARD))
    await parked(waiters, "busy")
    old = waiters.mark("quiet")  # a pull of "quiet" read before the counts were forgotten ...
    service.append("quiet")  # ... and an append to it after that pull
    for i in range(40):  # monitors come and go
        service.append(f"churned-{i}")
    assert len(waiters._heard) <= 8 and "busy" in waiters._heard
    assert await waiters.wait("quiet", old, HANG_GUARD) is True  # the append is seen (re-checked)
    fresh = waiters.mark("quiet")
    assert await waiters.wait("quiet", fresh, 0) is False  # control: a fresh mark parks (times out at once)
    assert not reader.done()
    service.append("busy")
    assert await asyncio.wait_for(reader, HANG_GUARD) is True


async def test_a_wait_times_out_and_leaves_nothing_behind(registry):
    waiters, _service = registry
    assert await waiters.wait("ci", waiters.mark("ci"), 0.01) is False
    assert waiters.parked == 0 and waiters.monitors() == []


async def test_a_stop_signal_ends_the_wait(registry):
    waiters, _service = registry
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reader = asyncio.ensure_future(waiters.wait("ci", waiters.mark("ci"), HANG_GUARD, stop=stop))
    await parked(waiters, "ci")
    stop.set_result(None)
    assert await asyncio.wait_for(reader, HANG_GUARD) is False
    assert waiters.monitors() == []


async def test_shutdown_drains_every_parked_reader_and_refuses_new_ones(registry):
    waiters, _service = registry
    readers = [asyncio.ensure_future(waiters.wait(m, 0, HANG_GUARD)) for m in ("a", "a", "b")]
    await parked(waiters, "a", 2)
    await parked(waiters, "b")
    assert waiters.parked == 3
    waiters.wake_all()
    assert await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD) == [False, False, False]
    assert waiters.parked == 0 and waiters.monitors() == []
    assert await asyncio.wait_for(waiters.wait("a", 0, HANG_GUARD), HANG_GUARD) is False  # at once


async def test_recheck_all_wakes_every_parked_reader_and_keeps_the_registry_open(registry):
    """A shared store's notification connection came back (appends may have gone unheard): every parked
    reader re-checks (True), a mark taken before it no longer parks, and, unlike shutdown, new readers
    park again and wait for the next append (no busy loop of immediate answers)."""
    waiters, service = registry
    stale = waiters.mark("a")
    readers = [asyncio.ensure_future(waiters.wait(m, waiters.mark(m), HANG_GUARD)) for m in ("a", "b")]
    await parked(waiters, "a")
    await parked(waiters, "b")
    threading.Thread(target=waiters.recheck_all).start()  # from another thread, as the engine thread calls it
    assert await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD) == [True, True]
    assert waiters.parked == 0 and not waiters.draining
    assert await asyncio.wait_for(waiters.wait("a", stale, HANG_GUARD), HANG_GUARD) is True  # at once
    fresh = asyncio.ensure_future(waiters.wait("a", waiters.mark("a"), HANG_GUARD))
    await parked(waiters, "a")
    await asyncio.sleep(0.01)  # the point: for this long, nothing may answer it
    assert not fresh.done()  # positive control: parked for real, not answered at once
    service.append_from_thread("a")
    assert await asyncio.wait_for(fresh, HANG_GUARD) is True


async def test_one_append_calls_every_parked_reader_back_in_one_loop_turn(registry):
    waiters, service = registry
    loop = asyncio.get_running_loop()
    turn = 0
    ticking = True

    def tick() -> None:  # counts loop turns
        nonlocal turn
        turn += 1
        if ticking:
            loop.call_soon(tick)

    called: list[tuple[int, bool, int]] = []
    handles = [
        waiters.park("ci", 0, HANG_GUARD, lambda woken, i=i: called.append((i, woken, turn)))
        for i in range(50)
    ]
    assert waiters.parked == 50
    loop.call_soon(tick)
    service.append_from_thread("ci")
    await eventually_async(lambda: len(called) >= 50, timeout=HANG_GUARD, interval=0, what="50 call-backs")
    ticking = False
    assert sorted(i for i, _w, _t in called) == list(range(50)) and all(w for _i, w, _t in called)
    # All inside one wake-up, so a door submitting its re-checks there submits them together.
    assert len({t for _i, _w, t in called}) == 1
    assert all(h.done for h in handles) and waiters.parked == 0 and waiters.monitors() == []


async def test_the_listener_on_the_loop_itself_wakes_directly():
    """The browser: the engine calls its listener on the loop, with no thread to hop from."""
    service = FakeService()
    waiters = Waiters()
    waiters.attach(service)
    reader = asyncio.ensure_future(waiters.wait("ci", waiters.mark("ci"), HANG_GUARD))
    await parked(waiters, "ci")
    service.append("ci")  # on the loop thread
    assert await asyncio.wait_for(reader, HANG_GUARD) is True


def test_a_registry_attached_outside_a_loop_binds_to_the_first_wait():
    service = FakeService()
    waiters = Waiters()
    waiters.attach(service)  # no loop yet (the page builds its host before awaiting anything)
    mark = waiters.mark("ci")
    service.append("ci")  # counted, although no loop is known yet

    async def scenario() -> tuple[bool, bool]:
        stale = await waiters.wait("ci", mark, HANG_GUARD)  # the count already moved: at once
        reader = asyncio.ensure_future(waiters.wait("ci", waiters.mark("ci"), HANG_GUARD))
        await parked(waiters, "ci")
        service.append_from_thread("ci")
        return stale, await asyncio.wait_for(reader, HANG_GUARD)

    assert asyncio.run(scenario()) == (True, True)


async def test_a_broken_append_hook_costs_nobody_their_wake_up(registry):
    waiters, service = registry
    seen: list[str] = []

    def hook(monitor_id: str) -> None:
        seen.append(monitor_id)
        raise RuntimeError("a broken notifier")

    waiters.on_append = hook
    readers = [asyncio.ensure_future(waiters.wait(m, 0, HANG_GUARD)) for m in ("a", "b")]
    await parked(waiters, "a")
    await parked(waiters, "b")
    service.append_from_thread("a")
    service.append_from_thread("b")
    assert await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD) == [True, True]
    assert sorted(set(seen)) == ["a", "b"]


async def test_detach_stops_listening(registry):
    waiters, service = registry
    waiters.detach()
    assert service.listeners == []
    service.append("ci")
    assert waiters.mark("ci") == 0


# -- over the ASGI app --------------------------------------------------------------------------------------


class BatchRecorder:
    """Stands in as the app's store for group commit only: records which pulls ran in which batch()."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.current: list[str] | None = None

    @contextmanager
    def batch(self):
        self.current = []
        try:
            yield
        finally:
            self.batches.append(self.current)
            self.current = None


@pytest.fixture()
async def recorded():
    service = MonitorService(MemoryStore())
    recorder = BatchRecorder()
    threads: list[str] = []
    pull = service.pull

    def recording_pull(sub_id, *args, **kwargs):
        threads.append(threading.current_thread().name)
        if recorder.current is not None:
            recorder.current.append(sub_id)
        return pull(sub_id, *args, **kwargs)

    pull_many = service.pull_many

    def recording_pull_many(asks, *args, **kwargs):
        # The readers one append woke, re-checked in one call: one transaction (one commit) of its own when
        # no group commit holds it.
        ids = [ask[0] for ask in asks]
        threads.extend(threading.current_thread().name for _ in ids)
        if recorder.current is not None:
            recorder.current.extend(ids)
        else:
            recorder.batches.append(ids)
        return pull_many(asks, *args, **kwargs)

    service.pull = recording_pull
    service.pull_many = recording_pull_many
    app = MonitorApp(service, RestRouter(service), store=recorder, sweep_interval=None)
    await app.startup()
    try:
        yield app, recorder, threads
    finally:
        await app.shutdown()


async def test_a_slow_engine_call_runs_on_the_engine_thread_and_the_loop_stays_free(recorded):
    app, _recorder, threads = recorded
    _owner, sub, reader = await setup_feed(app)
    release = threading.Event()
    entered = threading.Event()
    pull = app.service.pull

    def slow_pull(*args, **kwargs):
        entered.set()
        release.wait(HANG_GUARD)  # a filtered pull scanning for a long time
        return pull(*args, **kwargs)

    app.service.pull = slow_pull
    slow = asyncio.ensure_future(call(app, "GET", f"/mp/v0/subscriptions/{sub}/pull", token=reader))
    await eventually_async(entered.is_set, timeout=HANG_GUARD, interval=0.001, what="the slow pull runs")
    # The engine is busy: the loop still answers what needs no engine (it would hang here otherwise).
    health = await asyncio.wait_for(call(app, "GET", "/healthz"), HANG_GUARD)
    assert health.status == 200
    discover = asyncio.ensure_future(call(app, "GET", "/mp/v0/discover"))
    await asyncio.sleep(0.01)  # the point: for this long, neither may be answered
    assert not slow.done() and not discover.done()  # queued behind the slow call, never beside it
    release.set()
    assert (await asyncio.wait_for(slow, HANG_GUARD)).status == 200
    assert (await asyncio.wait_for(discover, HANG_GUARD)).status == 200
    assert threads and set(threads) == {"mp-engine"}  # every pull ran on the engine thread


async def test_fifty_parked_long_polls_wake_on_one_publish_in_one_batch(recorded):
    app, recorder, _threads = recorded
    created = await call(app, "POST", "/mp/v0/monitors", {"id": "ci", "types": [RUN], "visibility": "public"})
    owner = created.json()["owner_token"]
    feeds = []
    for i in range(60):
        sub = await call(app, "POST", "/mp/v0/subscriptions", {"monitor": "ci", "subscriber": f"agent:{i}"})
        feeds.append((sub.json()["subscription"]["id"], sub.json()["token"]))
    head = (await call(app, "GET", "/mp/v0/monitors/ci/state")).json()["head"]
    for sub_id, token in feeds:
        acked = await call(app, "POST", f"/mp/v0/subscriptions/{sub_id}/ack", {"cursor": head + 1}, token)
        assert acked.status == 200, acked.text
    polls = [
        Conn(
            "GET",
            f"/mp/v0/subscriptions/{sub_id}/pull",
            query="wait=50",
            headers={"authorization": f"Bearer {token}"},
        )
        for sub_id, token in feeds
    ]
    tasks = [asyncio.ensure_future(app(c.scope, c.receive, c.send)) for c in polls]
    await parked(app.waiters, "ci", len(polls), interval=0.001)
    assert app.metrics.parked_polls == len(polls)
    before = len(recorder.batches)
    published = await publish(app, owner, "wanted")
    await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD)
    for conn in polls:
        assert conn.status == 200
        assert [o["subject"] for o in conn.json()["observations"]] == ["wanted"]
        assert conn.json()["head"] == published["seq"]
    rechecks = [b for b in recorder.batches[before:] if b]
    assert len(rechecks) == 1 and sorted(rechecks[0]) == sorted(s for s, _t in feeds)  # one commit
    assert app.waiters.monitors() == [] and app.metrics.parked_polls == 0


async def test_a_long_poll_whose_append_does_not_match_parks_again(recorded):
    app, _recorder, pulls = recorded
    owner, sub, reader = await setup_feed(app, filter={"types": [RUN]})
    first = await call(app, "GET", f"/mp/v0/subscriptions/{sub}/pull", token=reader)
    await call(app, "POST", f"/mp/v0/subscriptions/{sub}/ack", {"cursor": first.json()["next"]}, reader)
    waiting = Conn(
        "GET",
        f"/mp/v0/subscriptions/{sub}/pull",
        query="wait=50",
        headers={"authorization": f"Bearer {reader}"},
    )
    task = asyncio.ensure_future(app(waiting.scope, waiting.receive, waiting.send))
    await parked(app.waiters, "ci", interval=0.001)
    pulled = len(pulls)
    await publish(app, owner, "ignored", "com.example.ci.other")
    await eventually_async(
        lambda: len(pulls) != pulled and app.waiters.parked_on("ci"),
        timeout=HANG_GUARD,
        interval=0.001,
        what="re-checked, then parked again",
    )
    assert not task.done()
    await publish(app, owner, "wanted")
    await asyncio.wait_for(task, HANG_GUARD)
    assert [o["subject"] for o in waiting.json()["observations"]] == ["wanted"]


# -- the other doors ------------------------------------------------------------------------------------------


async def test_the_browser_host_parks_in_the_registry():
    host = EngineHost()
    created = await host.call("POST", "/monitors", {"id": "ci", "types": [RUN]})
    owner = created.body["owner_token"]
    sub = await host.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r"}, token=owner)
    sub_id, reader = sub.body["subscription"]["id"], sub.body["token"]
    first = await host.call("GET", f"/subscriptions/{sub_id}/pull", token=reader)
    await host.call("POST", f"/subscriptions/{sub_id}/ack", {"cursor": first.body["next"]}, token=reader)
    waiting = asyncio.ensure_future(
        host.call("GET", f"/subscriptions/{sub_id}/pull", token=reader, query={"wait": 50})
    )
    await parked(host.waiters, "ci")
    await host.call("POST", "/monitors/ci/observations", {"type": RUN, "subject": "b1"}, token=owner)
    reply = await asyncio.wait_for(waiting, HANG_GUARD)
    assert [o["subject"] for o in reply.body["observations"]] == ["b1"]
    assert host.waiters.monitors() == []


async def test_the_browser_host_sees_an_append_made_while_its_write_was_awaited():
    """The page awaits IndexedDB after each call; an append landing meanwhile must still wake the poll."""
    host: EngineHost
    appended: dict[str, Any] = {}

    async def persist() -> None:
        if appended.get("armed"):
            appended["armed"] = False
            appended["reply"] = host.router.handle(appended["publish"])  # another tab's publish

    host = EngineHost(persist=persist)
    created = await host.call("POST", "/monitors", {"id": "ci", "types": [RUN]})
    owner = created.body["owner_token"]
    sub = await host.call("POST", "/subscriptions", {"monitor": "ci", "subscriber": "agent:r"}, token=owner)
    sub_id, reader = sub.body["subscription"]["id"], sub.body["token"]
    first = await host.call("GET", f"/subscriptions/{sub_id}/pull", token=reader)
    await host.call("POST", f"/subscriptions/{sub_id}/ack", {"cursor": first.body["next"]}, token=reader)
    from monitor_protocol.api.messages import Request

    appended["publish"] = Request(
        "POST",
        "/mp/v0/monitors/ci/observations",
        [],
        {"authorization": f"Bearer {owner}", "content-type": "application/json"},
        json.dumps({"type": RUN, "subject": "between"}).encode(),
    )
    appended["armed"] = True
    reply = await asyncio.wait_for(
        host.call("GET", f"/subscriptions/{sub_id}/pull", token=reader, query={"wait": 50}), HANG_GUARD
    )
    assert appended["reply"].status == 201
    assert [o["subject"] for o in reply.body["observations"]] == ["between"]


async def test_the_mcp_embedded_pull_parks_in_the_registry(tmp_path):
    backend = EmbeddedBackend(str(tmp_path / "mcp.db"), sweep_interval=0)
    changed: list[str] = []
    await backend.start(changed.append)
    try:
        created = await backend.call(
            "create_monitor", {"id": "ci", "types": [RUN], "visibility": "public"}, None
        )
        owner = created["owner_token"]
        sub = await backend.call("subscribe", {"monitor": "ci", "subscriber": "agent:m"}, None)
        sub_id, token = sub["subscription"]["id"], sub["token"]
        first = await backend.pull(sub_id, token)
        await backend.call("ack", sub_id, token, {"cursor": first["next"]})
        waiting = asyncio.ensure_future(backend.pull(sub_id, token, wait=50))
        await parked(backend.waiters, "ci", interval=0.001)
        await backend.call("publish", "ci", {"type": RUN, "subject": "m1"}, owner)
        reply = await asyncio.wait_for(waiting, HANG_GUARD)
        assert [o["subject"] for o in reply["observations"]] == ["m1"]
        assert "ci" in changed  # resource notifications ride on the same registry
        parked_again = asyncio.ensure_future(backend.pull(sub_id, token, cursor=reply["next"], wait=50))
        await parked(backend.waiters, "ci", interval=0.001)
    finally:
        await backend.close()
    assert (await asyncio.wait_for(parked_again, HANG_GUARD))["observations"] == []  # drained at close


async def test_an_append_nobody_waits_for_costs_the_loop_nothing(
    registry: tuple[Waiters, FakeService],
) -> None:
    """No reader parked on the monitor: the engine thread's append schedules no hop to the loop. The count
    still moves, so a reader that pulled before the append and parks after it is woken at once."""
    waiters, service = registry
    waiters.bind(asyncio.get_running_loop())
    hops: list[Any] = []
    loop = asyncio.get_running_loop()
    original = loop.call_soon_threadsafe

    def counting(*args: Any, **kwargs: Any) -> Any:
        hops.append(args)
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        mark = waiters.mark("quiet")
        service.append_from_thread("quiet")
        assert hops == [] and waiters.mark("quiet") == mark + 1
        assert await asyncio.wait_for(waiters.wait("quiet", mark, HANG_GUARD), HANG_GUARD) is True
        # control: with a reader parked, the append hops to the loop and wakes it
        mark = waiters.mark("quiet")
        waiting = asyncio.ensure_future(waiters.wait("quiet", mark, HANG_GUARD))
        await parked(waiters, "quiet")
        service.append_from_thread("quiet")
        assert await asyncio.wait_for(waiting, HANG_GUARD) is True and len(hops) == 1
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
