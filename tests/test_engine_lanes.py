"""EngineLanes (doors/engines.py), mp serve's engine seat on PostgreSQL: calls run side by side, each on a
connection of its own, and a reader never misses an append for it: an append that lands while a reader's
call runs, after its read and before its mark, is told again when that call ends."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.engines import EngineLanes, LastIdleFirst
from monitor_protocol.doors.parking import Waiters
from waiting import eventually

TYPE = "com.example.x"


class Store:
    """What EngineLanes asks of a store besides the engine's calls: the monitors a thread locked."""

    def job_monitors(self) -> set[str]:
        return set()


@pytest.mark.parametrize("lanes", [2, 1])
def test_calls_run_side_by_side_on_several_lanes_and_one_after_another_on_one(lanes):
    engine = EngineLanes(Store(), lanes=lanes)
    inside, release, second = threading.Event(), threading.Event(), threading.Event()

    def blocked() -> str:
        inside.set()
        release.wait(30)
        return "first"

    def other() -> str:
        second.set()
        return "second"

    async def main() -> list[str]:
        first = engine.submit(blocked)
        then = engine.submit(other)
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 30)
        if lanes == 2:
            # the second call runs while the first still waits
            await asyncio.get_running_loop().run_in_executor(None, second.wait, 30)
            assert second.is_set() and not release.is_set()
        else:
            # positive control, one lane: the second call has not run while the first waits (this short
            # sleep is the point: nothing may happen meanwhile)
            await asyncio.sleep(0.3)
            assert not second.is_set()
        release.set()
        return [await first, await then]

    try:
        assert asyncio.run(main()) == ["first", "second"]
    finally:
        release.set()
        engine.stop()


def test_posted_work_runs_again_after_the_calls_running_when_it_was_posted():
    engine = EngineLanes(Store(), lanes=2)
    ran: list[str] = []
    inside, release = threading.Event(), threading.Event()
    try:
        engine.post(ran.append, "idle")  # no call running: once
        eventually(lambda: ran == ["idle"], what="the posted work")

        def held() -> None:
            inside.set()
            release.wait(30)

        engine.post(held)
        assert inside.wait(30)
        engine.post(ran.append, "busy")  # a call is running: now, and again once it has ended
        eventually(lambda: ran == ["idle", "busy"], what="the posted work, at once")
        release.set()
        eventually(lambda: ran == ["idle", "busy", "busy"], what="the posted work, again after the call")
    finally:
        release.set()
        engine.stop()


@pytest.mark.parametrize("append_meanwhile", [True, False])
def test_an_append_between_a_readers_pull_and_its_mark_is_told_again(pg, append_meanwhile):
    service = MonitorService(pg)
    waiters = Waiters()
    waiters.attach(service)
    engine = EngineLanes(pg, service, lanes=2)
    owner = service.create_monitor({"id": "ci", "visibility": "public", "types": [TYPE]}, None)["owner_token"]
    sub = service.subscribe({"monitor": "ci", "subscriber": "agent:r", "from": "head"}, None)
    sid, token = sub["subscription"]["id"], sub["token"]
    service.ack(sid, token, {"cursor": service.pull(sid, token)["next"]})  # its own row read: caught up
    read, release = threading.Event(), threading.Event()

    def reader() -> tuple[dict, int]:
        # A door's long-poll job: the pull, then (here, after the publish below committed) the mark
        reply = service.pull(sid, token)
        read.set()
        release.wait(30)
        return reply, waiters.mark("ci")

    async def main() -> tuple[dict, int]:
        pending = engine.submit(reader)
        await asyncio.get_running_loop().run_in_executor(None, read.wait, 30)
        if append_meanwhile:  # on the other lane, while the reader sits between its pull and its mark
            await engine.call(service.publish, "ci", {"type": TYPE, "subject": "s", "data": {}}, owner)
        release.set()
        return await pending

    try:
        reply, mark = asyncio.run(main())
    finally:
        release.set()
        engine.stop()
    assert reply["observations"] == []  # the pull ran before the publish
    if append_meanwhile:
        # its mark counts the publish it did not see; the append told again moves the count past it, so a
        # reader parking with that mark is woken at once
        assert engine.retold == 1 and waiters.mark("ci") != mark
    else:  # positive control: nothing landed meanwhile, nothing is told again and the mark stays good
        assert engine.retold == 0 and waiters.mark("ci") == mark


def test_each_lane_has_its_own_connection(pg):
    service = MonitorService(pg)
    engine = EngineLanes(pg, service, lanes=3)
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    seen: set[int] = set()
    barrier = threading.Barrier(3, timeout=30)

    def backend() -> int:
        barrier.wait()  # three calls at once: each lane holds one
        service.state("ci", None)
        return pg._s.conn.pgconn.backend_pid  # the session of the thread running this call

    async def main() -> list[int]:
        return list(await asyncio.gather(*(engine.call(backend) for _ in range(3))))

    try:
        seen.update(asyncio.run(main()))
    finally:
        engine.stop()
    assert len(seen) == 3


@pytest.mark.parametrize("alone", [True, False])
def test_a_call_marked_runs_alone_waits_for_the_running_calls_and_holds_up_later_ones(alone):
    # MonitorApp.close_store is such a call: it closes every lane's connection, never under a call using one
    engine = EngineLanes(Store(), lanes=3)
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def held() -> None:
        inside.set()
        release.wait(30)
        order.append("held")

    def close() -> None:
        order.append("close")

    if alone:
        close.runs_alone = True  # type: ignore[attr-defined]

    def later() -> None:
        order.append("later")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first = engine.submit(held)
        await loop.run_in_executor(None, inside.wait, 30)
        closing = engine.submit(close)
        if alone:  # the close is on a lane, waiting for the held call: the next call waits behind it
            await loop.run_in_executor(None, lambda: eventually(lambda: engine._alone == 1, what="the close"))
            then = engine.submit(later)
            await asyncio.sleep(0.3)  # nothing may run meanwhile: the point of the test
            assert order == []
        else:  # positive control: an ordinary call runs beside the held one, and so does the next
            then = engine.submit(later)
            await loop.run_in_executor(None, lambda: eventually(lambda: len(order) == 2, what="both calls"))
        release.set()
        await first
        await closing
        await then

    try:
        asyncio.run(main())
    finally:
        release.set()
        engine.stop()
    if alone:
        assert order == ["held", "close", "later"]
    else:
        assert order[-1] == "held" and set(order[:2]) == {"close", "later"}


@pytest.mark.parametrize("another_reconnected", [True, False])
def test_a_lane_waiting_to_reconnect_tries_at_once_when_another_lane_has_reconnected(pg, another_reconnected):
    service = MonitorService(pg)
    service.create_monitor({"id": "ci", "visibility": "public"}, None)
    results: list[object] = []
    other = ThreadPoolExecutor(max_workers=1)  # one thread: one session, as a lane has

    def on_other_thread(fn) -> None:
        results.append(other.submit(fn).result(30))

    def other_call() -> object:
        try:
            service.state("ci", None)
            return "ok"
        except ProtocolError as exc:
            return exc.code

    def lost_and_waiting() -> None:  # this lane's connection was lost and its last attempt failed just now
        s = pg._s
        s.close()
        s.retry_at, s.last_failure = time.monotonic() + 60, "the database is unreachable (OperationalError)"
        s._failed_at = time.monotonic()

    on_other_thread(other_call)  # the other lane's session, connected
    on_other_thread(lost_and_waiting)
    if another_reconnected:  # this lane lost its connection too, and reconnects: the database is back
        pg._s.close()
        pg._s.last_failure = "the database is unreachable (OperationalError)"
        service.state("ci", None)
        on_other_thread(other_call)
        assert results[-1] == "ok"  # the other lane did not wait out its minute
    else:  # positive control: nobody reconnected, so the other lane still waits: a 503 at once
        on_other_thread(other_call)
        assert results[-1] == "UNAVAILABLE"
    other.shutdown()


@pytest.mark.parametrize("closed", [True, False])
def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_next_call(pg, pg_url, closed):
    """A lane seldom used keeps its connection through a database restart or past an idle timeout; its next
    call finds the connection gone before it starts, connects again, and does not fail (no 503)."""
    import select

    import psycopg

    service = MonitorService(pg)
    owner = service.create_monitor({"id": "ci", "visibility": "public"}, None)["owner_token"]
    service.publish("ci", {"type": "com.example.x", "subject": "s", "data": {}}, owner)
    pid = pg._s.conn.pgconn.backend_pid
    if closed:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        # The goodbye reaches the idle socket (waited for on the socket itself, not slept).
        assert select.select([pg._s.conn.pgconn.socket], [], [], 30)[0]
    out = service.publish("ci", {"type": "com.example.x", "subject": "s", "data": {}}, owner)
    assert out["seq"] == 3
    assert (pg._s.conn.pgconn.backend_pid != pid) is closed  # control: a live connection is kept


def test_every_engine_runs_a_call_for_another_thread_and_hands_back_its_result_or_its_error():
    """run_sync, the same on the three engine seats (one wait, doors/engines._wait_for): the call's result
    comes back to the calling thread, and its exception is raised there."""
    from monitor_protocol.doors.engines import EngineThread, LoopEngine
    from monitor_protocol.store.memory import MemoryStore

    def boom() -> None:
        raise ValueError("boom")

    def check(engine: object) -> None:
        assert engine.run_sync(lambda a, b: a + b, 2, 3) == 5  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="boom"):
            engine.run_sync(boom)  # type: ignore[attr-defined]

    thread, lanes = EngineThread(MemoryStore()), EngineLanes(MemoryStore(), lanes=2)
    try:
        check(thread)
        check(lanes)
    finally:
        thread.stop()
        lanes.stop()

    async def on_the_loop() -> None:
        engine = LoopEngine(MemoryStore())
        engine._bind()  # the loop it answers on, as the first call from the loop binds it
        with ThreadPoolExecutor(1) as side:
            await asyncio.get_running_loop().run_in_executor(side, check, engine)
        with pytest.raises(RuntimeError, match="not running"):
            LoopEngine(MemoryStore()).run_sync(boom)  # never bound to a loop: refused, not hung

    asyncio.run(on_the_loop())


def test_every_engine_tells_its_hook_the_cpu_its_calls_took_not_their_wall_time():
    """on_commit(wall, cpu, calls), the same on the three seats: `cpu` is the thread's CPU time, so a call that
    burns CPU shows it and a call that only waits (the positive control) shows its wait in `wall` alone; the
    calls of one loop turn on LoopEngine are one batch, counted as such (mp serve's /metrics sums these)."""
    from monitor_protocol.doors.engines import EngineThread, LoopEngine
    from monitor_protocol.store.memory import MemoryStore

    def burn() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    def wait() -> None:
        time.sleep(0.1)

    def record(engine: object) -> list[tuple[float, float, int]]:
        seen: list[tuple[float, float, int]] = []
        engine.on_commit = lambda wall, cpu, calls: seen.append((wall, cpu, calls))  # type: ignore[attr-defined]
        return seen

    thread, lanes = EngineThread(MemoryStore()), EngineLanes(MemoryStore(), lanes=2)
    try:
        for engine in (thread, lanes):
            seen = record(engine)
            engine.run_sync(burn)
            engine.run_sync(wait)
            (burn_wall, burn_cpu, burn_calls), (wait_wall, wait_cpu, wait_calls) = eventually(
                lambda seen=seen: seen if len(seen) == 2 else None, what="two batches told"
            )
            assert burn_cpu >= 0.04 and burn_wall >= burn_cpu * 0.9 and burn_calls == 1
            assert wait_wall >= 0.09 and wait_cpu < 0.05 and wait_calls == 1
    finally:
        thread.stop()
        lanes.stop()

    async def on_the_loop() -> list[tuple[float, float, int]]:
        engine = LoopEngine(MemoryStore())
        seen = record(engine)
        await asyncio.gather(engine.call(burn), engine.call(burn), engine.call(lambda: None))
        await engine.call(wait)
        return seen

    (group_wall, group_cpu, group_calls), (wait_wall, wait_cpu, wait_calls) = asyncio.run(on_the_loop())
    assert group_calls == 3 and group_cpu >= 0.09
    assert wait_calls == 1 and wait_wall >= 0.09 and wait_cpu < 0.05


def test_a_job_left_in_the_queue_when_the_lanes_stop_is_told_the_engine_stopped():
    """A job no lane will run (behind the stop sentinels) gets an answer instead of leaving its caller
    waiting for ever; a job queued before the stop still runs (the positive control)."""
    engine = EngineLanes(Store(), lanes=1)
    heard: list[tuple[bool, object]] = []
    done = threading.Event()

    def deliver(ok: bool, value: object) -> None:
        heard.append((ok, value))
        done.set()

    engine._queue.put((lambda: "ran", (), None, deliver))
    assert done.wait(10) and heard == [(True, "ran")]
    engine._queue.put(None)  # the lane stops here...
    engine._threads[0].join(10)
    engine._queue.put((lambda: "never", (), None, deliver))  # ...so this is behind every sentinel
    engine.stop()
    assert heard[1][0] is False and "stopped" in str(heard[1][1])


class GroupingStore(Store):
    """A store with a group commit that does nothing, for EngineLanes' own bookkeeping of groups."""

    @contextlib.contextmanager
    def batch(self):
        yield

    def groupable(self) -> bool:
        return True

    def restrict_group(self) -> None:
        pass


def keyed_lanes(lanes: int, **kw) -> tuple[EngineLanes, Callable[..., str]]:
    def pub(tag: str, gate: threading.Event | None = None) -> str:
        if gate is not None:
            gate.wait(10)
        return tag

    engine = EngineLanes(GroupingStore(), lanes=lanes, **kw)
    engine.group_key = lambda fn, args: "K" if fn is pub else None
    return engine, pub


def holding(
    engine: EngineLanes, pub: Callable[..., str]
) -> tuple[Callable[[str], str], threading.Event, threading.Event]:
    """A job of key K that holds its lane until `gate` opens (`inside` says it is running), keyed with `pub`."""
    gate, inside = threading.Event(), threading.Event()

    def first(tag: str) -> str:
        inside.set()
        gate.wait(10)
        return tag

    engine.group_key = lambda fn, args: "K" if fn in (pub, first) else None
    return first, gate, inside


def test_every_job_of_a_loop_turn_is_answered_however_the_lanes_interleave_with_the_queueing():
    """A bundle is queued only whole: a lane that takes it the moment it is queued has every job of it (with
    a switch interval of a microsecond, lanes run between the loop's puts)."""
    engine, pub = keyed_lanes(4)

    def key(fn: Callable[..., Any], args: tuple[Any, ...]) -> str | None:
        sum(range(200))  # a little Python, as a door's key takes: room for a lane to run in between
        return "K" if fn is pub else None

    engine.group_key = key
    busy = threading.Event()

    def spin() -> None:  # another thread wanting the interpreter, so that the switches happen
        while not busy.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    async def main() -> int:
        answered = 0
        for turn in range(300):
            futures = [engine.submit(pub, f"{turn}.{i}") for i in range(32)]
            done, pending = await asyncio.wait(futures, timeout=10)
            answered += len(done)
            assert not pending, f"turn {turn}: {len(pending)} of 32 never answered"
        return answered

    try:
        assert asyncio.run(main()) == 300 * 32
    finally:
        sys.setswitchinterval(before)
        busy.set()
        spinner.join(5)
        engine.stop()


@pytest.mark.parametrize("running", [True, False])
def test_a_keys_jobs_submitted_while_a_lane_runs_its_group_go_to_that_lane_and_wake_no_other(running):
    """While lane A runs key K's group, K's next jobs go straight to A's next group (_hand_over): no other lane
    takes them off the queue only to hand them over (a wake-up and the interpreter's lock for nothing). The
    control, no group of K running: the job is queued, and another lane takes it."""
    engine, pub = keyed_lanes(3)
    first, gate, inside = holding(engine, pub)
    taken: list[str] = []  # which lane took each item off the queue
    original = engine._serve

    def serve(jobs, touched):
        taken.append(threading.current_thread().name)
        return original(jobs, touched)

    engine._serve = serve  # type: ignore[method-assign]

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        if running:
            j0 = engine.submit(first, "j0")
            await loop.run_in_executor(None, inside.wait, 5)  # lane A runs K's group, held
            assert len(taken) == 1
        j1, j2 = engine.submit(pub, "j1"), engine.submit(pub, "j2")
        await asyncio.sleep(0.1)  # time for an idle lane to take them, were they queued
        if running:
            assert len(taken) == 1, taken  # no other lane took K's jobs
            assert engine._keyed["K"] and [job[1] for job in engine._keyed["K"]] == [("j1",), ("j2",)]
            gate.set()
            return list(await asyncio.wait_for(asyncio.gather(j0, j1, j2), 10))
        assert len(taken) == 1  # the control: queued, and a lane took them
        return list(await asyncio.wait_for(asyncio.gather(j1, j2), 10))

    try:
        assert asyncio.run(main()) == (["j0", "j1", "j2"] if running else ["j1", "j2"])
    finally:
        gate.set()
        engine.stop()
    assert not engine._keyed
    if running:
        assert len(set(taken)) == 1 and engine.grouped >= 1  # A ran j1 and j2 as its next group


def test_a_keys_jobs_do_not_overtake_what_waits_in_the_queue_before_them():
    """One lane runs K's group; a call of another kind waits in the queue; K's next job is queued behind it,
    not handed over ahead of it (a monitor's stream of publishes must not starve a lone lane's other
    calls): the call runs before it."""
    engine, pub = keyed_lanes(1)
    first, gate, inside = holding(engine, pub)
    order: list[str] = []

    def other() -> str:
        order.append("other")
        return "other"

    def logged(tag: str) -> str:
        order.append(tag)
        return tag

    engine.group_key = lambda fn, args: "K" if fn in (first, logged) else None

    async def main() -> list[str]:
        j0 = engine.submit(first, "j0")
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 5)
        x = engine.submit(other)
        await asyncio.sleep(0.02)
        j1 = engine.submit(logged, "j1")
        await asyncio.sleep(0.02)
        assert engine._keyed["K"] == [] and len(engine._queue) == 2  # queued behind `other`
        gate.set()
        return list(await asyncio.wait_for(asyncio.gather(j0, x, j1), 10))

    try:
        assert asyncio.run(main()) == ["j0", "other", "j1"]
    finally:
        gate.set()
        engine.stop()
    assert order == ["other", "j1"]


def test_a_jobs_handed_to_a_lane_that_then_runs_something_else_go_back_to_the_queue():
    """Lane A runs K's group and took X while gathering; lane B hands K's j1 to A meanwhile: A runs X next
    and puts j1 back in the queue, where a lane runs it. Every job is answered once."""
    engine, pub = keyed_lanes(2)
    g1, g2, inside = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []

    def first(tag: str) -> str:
        inside.set()
        g1.wait(10)
        order.append(tag)
        return tag

    engine.group_key = lambda fn, args: "K" if fn in (pub, first) else None

    def other() -> str:
        order.append("X")
        return "X"

    def blocker() -> str:
        g2.wait(10)
        order.append("Y")
        return "Y"

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        y = engine.submit(blocker)
        await asyncio.sleep(0.05)  # lane B is busy
        j0, x = engine.submit(first, "j0"), engine.submit(other)  # one turn: [j0], then X behind it
        await loop.run_in_executor(None, inside.wait, 5)  # lane A runs j0 and holds X
        j1 = engine.submit(pub, "j1")
        await asyncio.sleep(0.02)
        g2.set()
        await asyncio.sleep(0.05)  # lane B, free again, takes j1 and hands it to A
        g1.set()
        return list(await asyncio.wait_for(asyncio.gather(y, j0, x, j1), 10))

    try:
        assert asyncio.run(main()) == ["Y", "j0", "X", "j1"]
    finally:
        engine.stop()
    assert order == ["Y", "j0", "X"] and not engine._keyed  # X right after j0's group; j1 was answered


def test_stop_ends_every_lane_even_when_one_meets_a_stop_sentinel_while_gathering():
    """A lane that takes another lane's stop sentinel while gathering its group puts it back: every lane
    ends, and stop() returns."""
    engine, pub = keyed_lanes(2)
    first, gate, inside = holding(engine, pub)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        j0 = engine.submit(first, "j0")
        await loop.run_in_executor(None, inside.wait, 5)
        j1 = engine.submit(pub, "j1")  # lane B hands it to lane A, which runs K
        await asyncio.sleep(0.05)
        stopper = threading.Thread(target=engine.stop)
        stopper.start()  # B takes one sentinel and ends; the other waits in the queue for A's gathering
        await asyncio.sleep(0.05)
        gate.set()
        out = list(await asyncio.wait_for(asyncio.gather(j0, j1), 10))
        await loop.run_in_executor(None, stopper.join, 10)
        assert not stopper.is_alive(), "stop() did not return"
        return out

    assert asyncio.run(main()) == ["j0", "j1"]
    assert not any(t.is_alive() for t in engine._threads)


def test_a_failing_hook_or_key_costs_no_job_and_leaves_no_key_held():
    engine, pub = keyed_lanes(2)
    fails = {"hook": 1}

    def hook(wall: float, cpu: float, calls: int) -> None:
        if fails["hook"]:
            fails["hook"] -= 1
            raise RuntimeError("a broken metrics hook")

    engine.on_commit = hook

    async def main() -> list[str]:
        first = await asyncio.wait_for(asyncio.gather(*(engine.submit(pub, f"a{i}") for i in range(3))), 10)
        engine.group_key = lambda fn, args: 1 / 0  # a door that cannot say a key: each job by itself
        second = await asyncio.wait_for(asyncio.gather(*(engine.submit(pub, f"b{i}") for i in range(3))), 10)
        return [*first, *second]

    try:
        assert asyncio.run(main()) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    finally:
        engine.stop()
    assert fails["hook"] == 0 and not engine._keyed


def test_a_failure_in_a_lanes_own_bookkeeping_answers_the_jobs_once_and_the_lane_goes_on():
    """The key's owner runs j0, then the jobs another lane handed to it; its gate fails for that second
    group: those jobs hear the failure (they were left unanswered before), j0's answer stands, and the lanes
    go on serving."""
    engine, pub = keyed_lanes(2)
    first, gate, inside = holding(engine, pub)
    real_enter, calls = engine._enter, []

    def enter(alone: bool) -> None:
        calls.append(alone)
        if len(calls) == 2:
            raise RuntimeError("a broken gate")
        real_enter(alone)

    engine._enter = enter  # type: ignore[method-assign]

    async def main() -> tuple[list[Any], list[str]]:
        loop = asyncio.get_running_loop()
        j0 = engine.submit(first, "j0")
        await loop.run_in_executor(None, inside.wait, 5)
        handed = [engine.submit(pub, f"j{i}") for i in (1, 2)]  # the other lane hands them to the owner
        await asyncio.sleep(0.05)
        gate.set()
        got = await asyncio.wait_for(asyncio.gather(j0, *handed, return_exceptions=True), 10)
        after = await asyncio.wait_for(asyncio.gather(*(engine.submit(pub, f"b{i}") for i in range(3))), 10)
        return list(got), list(after)

    try:
        got, after = asyncio.run(main())
    finally:
        engine.stop()
    assert got[0] == "j0"
    assert all(isinstance(x, RuntimeError) and "broken gate" in str(x) for x in got[1:]), got
    assert after == ["b0", "b1", "b2"] and not engine._keyed


def _waiting(q: LastIdleFirst, n: int) -> None:
    eventually(lambda: len(q._idle) == n, what=f"{n} takers waiting")


def test_the_lanes_queue_hands_an_item_to_the_lane_that_went_idle_last_and_loses_none():
    q = LastIdleFirst()
    got: dict[str, list[Any]] = {"first": [], "second": []}

    def taker(name: str) -> None:
        while (item := q.get()) is not None:
            got[name].append(item)

    first = threading.Thread(target=taker, args=("first",))
    first.start()
    _waiting(q, 1)
    second = threading.Thread(target=taker, args=("second",))
    second.start()
    _waiting(q, 2)
    q.put(1)  # the last to wait takes it (a plain queue would wake the one asleep longest)
    eventually(lambda: got["second"] == [1], what="the item taken by the last to wait")
    _waiting(q, 2)
    q.put(2)
    eventually(lambda: got["second"] == [1, 2], what="the same taker again")
    assert got["first"] == []
    # positive control, and nothing lost: items put faster than one taker takes them reach both, each once
    _waiting(q, 2)
    for i in range(3, 2003):
        q.put(i)
    q.put(None)
    q.put(None)
    first.join(10)
    second.join(10)
    assert sorted(got["first"] + got["second"]) == list(range(1, 2003))


def test_a_taker_is_registered_idle_before_its_on_idle_runs():
    """What EngineLanes relies on to send a call's reply from `on_idle`: the next request that reply
    prompts is handed to the same lane, even while another lane has been idle longer."""
    q = LastIdleFirst()
    got: dict[str, list[Any]] = {"other": [], "lane": []}

    def taker(name: str, on_idle: Callable[[], None] | None = None) -> None:
        item = q.get(on_idle)
        while item is not None:
            got[name].append(item)
            item = q.get()

    other = threading.Thread(target=taker, args=("other",))
    other.start()
    _waiting(q, 1)
    waiting_then: list[int] = []

    def on_idle() -> None:
        waiting_then.append(len(q._idle))  # this taker already among them
        q.put("next request")
        waiting_then.append(len(q._idle))  # and it was the one chosen: the other still waits

    lane = threading.Thread(target=taker, args=("lane", on_idle))
    lane.start()
    eventually(lambda: got["lane"] == ["next request"], what="the item put from on_idle, taken by that taker")
    assert got["other"] == [] and waiting_then == [2, 1]
    # positive control: with an item already there, on_idle still runs once and the item is returned at once
    ran: list[int] = []
    q2 = LastIdleFirst()
    q2.put("ready")
    assert q2.get(lambda: ran.append(1)) == "ready" and ran == [1]
    _waiting(q, 2)
    q.put(None)
    q.put(None)
    other.join(10)
    lane.join(10)


def test_a_keys_group_is_answered_before_the_lane_runs_the_keys_next_group():
    """A lane sends its calls' replies at its next step: when that step is the same key's next group (handed
    over by another lane while the first ran), the first group's callers hear their outcome before it runs."""
    engine, pub = keyed_lanes(2)
    first, gate, inside = holding(engine, pub)
    answered = threading.Event()
    seen: list[bool] = []

    def second(tag: str) -> str:
        seen.append(answered.wait(5))  # the first group's reply reached the loop meanwhile
        return tag

    engine.group_key = lambda fn, args: "K" if fn in (first, second) else None

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        one = engine.submit(first, "g1")
        one.add_done_callback(lambda _f: answered.set())
        await loop.run_in_executor(None, inside.wait, 5)  # lane A runs K's first group
        two = engine.submit(second, "g2")
        await asyncio.sleep(0.05)  # lane B takes it and hands it to A, K's lane
        gate.set()
        return list(await asyncio.wait_for(asyncio.gather(one, two), 10))

    try:
        assert asyncio.run(main()) == ["g1", "g2"]
    finally:
        engine.stop()
    assert seen == [True]
