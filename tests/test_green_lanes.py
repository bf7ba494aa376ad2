"""GreenLanes (doors/green_lanes.py), mp serve's engine seat on PostgreSQL with --db-lanes green: EngineLanes whose lanes are
greenlets on the event loop's thread. A call waiting on the database gives the thread back to the loop, so it
holds up neither the loop nor a call on another lane; each lane keeps its own connection; a call that runs
alone waits for the running ones; stopping answers what is still queued."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

greenlet = pytest.importorskip("greenlet")

from monitor_protocol.core.lanes import LaneLocal  # noqa: E402
from monitor_protocol.core.service import MonitorService  # noqa: E402
from monitor_protocol.doors.green_lanes import GreenLanes  # noqa: E402

TYPE = "com.example.x"
OBS = {"type": TYPE, "subject": "s", "data": {}}


def held(pg_url: str, *monitors: str) -> Any:
    """Another connection holding these monitors' locks (the store's own lock function) in an open
    transaction, as another server's call would: a call locking one of them waits until it commits."""
    import psycopg

    conn = psycopg.connect(pg_url, autocommit=False)
    for monitor in monitors:
        conn.execute("SELECT mp2_lock(%s, false)", (monitor,))
    return conn


def monitors(service: MonitorService, *ids: str) -> dict[str, str]:
    return {
        m: service.create_monitor({"id": m, "visibility": "public", "types": [TYPE]}, None)["owner_token"]
        for m in ids
    }


@pytest.mark.parametrize("lanes", [2, 1])
def test_a_call_waiting_on_the_database_holds_up_neither_the_loop_nor_a_call_on_another_lane(
    pg, pg_url, lanes
):
    service = MonitorService(pg)
    owners = monitors(service, "ma", "mb")
    engine = GreenLanes(pg, service, lanes=lanes)
    holder = held(pg_url, "ma")
    release = threading.Timer(1.0, holder.commit)  # from another thread: a blocked loop could not do it
    ended: list[str] = []

    def where(monitor: str) -> tuple[int, int]:
        service.publish(monitor, dict(OBS), owners[monitor])
        ended.append(monitor)
        return threading.get_ident(), pg._s.conn.pgconn.backend_pid

    async def main() -> tuple[int, tuple[int, int], tuple[int, int]]:
        a = engine.submit(where, "ma")  # waits for the holder's lock
        b = engine.submit(where, "mb")
        release.start()
        ticks = 0
        while not a.done():  # the loop's own turns while a waits on the database
            await asyncio.sleep(0.02)
            ticks += 1
        return ticks, await asyncio.wait_for(a, 30), await asyncio.wait_for(b, 30)

    try:
        ticks, (a_thread, a_pid), (b_thread, b_pid) = asyncio.run(main())
    finally:
        release.cancel()
        holder.close()
        engine.stop()
    assert ticks >= 10  # about 50 in its second; a call blocking its thread would leave none
    assert a_thread == b_thread == threading.get_ident()  # on the loop's own thread: no hop
    assert pg.get_monitor("ma").head == 2 and pg.get_monitor("mb").head == 2  # seq 1: the monitor's creation
    if lanes == 2:  # b ran on the other lane, on a connection of its own, while a waited
        assert ended == ["mb", "ma"] and a_pid != b_pid
    else:  # positive control: one lane, so b waited behind a, on the same connection
        assert ended == ["ma", "mb"] and a_pid == b_pid


def test_each_green_lane_has_its_own_connection_and_they_wait_side_by_side(pg, pg_url):
    service = MonitorService(pg)
    owners = monitors(service, "ma", "mb", "mc")
    engine = GreenLanes(pg, service, lanes=3)
    holder = held(pg_url, "ma", "mb", "mc")

    def publish(monitor: str) -> int:
        service.publish(monitor, dict(OBS), owners[monitor])
        return pg._s.conn.pgconn.backend_pid

    async def main() -> list[int]:
        calls = [engine.submit(publish, m) for m in owners]
        await asyncio.sleep(0.3)
        assert not any(c.done() for c in calls)  # all three wait on the holder's locks, none on another
        await asyncio.get_running_loop().run_in_executor(None, holder.commit)
        return list(await asyncio.wait_for(asyncio.gather(*calls), 30))

    try:
        pids = asyncio.run(main())
    finally:
        holder.close()
        engine.stop()
    assert len(set(pids)) == 3


@pytest.mark.parametrize("running", [True, False])
def test_a_call_that_runs_alone_waits_for_the_call_waiting_on_the_database(pg, pg_url, running):
    service = MonitorService(pg)
    owners = monitors(service, "ma")
    engine = GreenLanes(pg, service, lanes=2)
    holder = held(pg_url, "ma")
    order: list[str] = []

    def alone() -> str:
        order.append("alone")
        return "alone"

    alone.runs_alone = True  # type: ignore[attr-defined]

    def publish() -> str:
        service.publish("ma", dict(OBS), owners["ma"])
        order.append("publish")
        return "publish"

    async def main() -> None:
        first = engine.submit(publish) if running else None
        await asyncio.sleep(0.1)
        lone = engine.submit(alone)
        await asyncio.sleep(0.2)
        assert lone.done() is (not running)  # it waits for the running call only when there is one
        await asyncio.get_running_loop().run_in_executor(None, holder.commit)
        await asyncio.wait_for(lone, 30)
        if first is not None:
            await asyncio.wait_for(first, 30)

    try:
        asyncio.run(main())
    finally:
        holder.close()
        engine.stop()
    assert order == (["publish", "alone"] if running else ["alone"])


def test_stopping_answers_the_queued_calls_and_the_running_one_still_commits(pg, pg_url):
    service = MonitorService(pg)
    owners = monitors(service, "ma")
    engine = GreenLanes(pg, service, lanes=1)
    holder = held(pg_url, "ma")

    async def main() -> tuple[Any, BaseException | None]:
        running = engine.submit(service.publish, "ma", dict(OBS), owners["ma"])
        await asyncio.sleep(0.1)
        queued = engine.submit(service.publish, "ma", dict(OBS), owners["ma"])
        await asyncio.sleep(0.1)
        engine.stop()
        stopped = await asyncio.wait_for(asyncio.gather(queued, return_exceptions=True), 30)
        await asyncio.get_running_loop().run_in_executor(None, holder.commit)
        return await asyncio.wait_for(running, 30), stopped[0]

    try:
        done, refused = asyncio.run(main())
    finally:
        holder.close()
    assert done["seq"] == 2  # seq 1: the monitor's creation
    assert isinstance(refused, RuntimeError) and "stopped" in str(refused)
    assert pg.get_monitor("ma").head == 2 and pg.get_observation("ma", 3) is None


def test_lane_local_keeps_apart_greenlets_and_threads():
    local = LaneLocal()
    local.value = "main"
    seen: dict[str, Any] = {}

    def in_greenlet() -> None:
        seen["greenlet before"] = getattr(local, "value", None)
        local.value = "greenlet"
        seen["greenlet after"] = local.value

    def in_thread() -> None:
        seen["thread"] = getattr(local, "value", None)
        local.value = "thread"

    greenlet.greenlet(in_greenlet).switch()
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert seen == {"greenlet before": None, "greenlet after": "greenlet", "thread": None}
    assert local.value == "main"  # positive control: what this lane set is still its own


FRESH_PROCESS = """
import sys, threading
from monitor_protocol.cli.serve import _db_lanes
from monitor_protocol.core.lanes import LaneLocal, lane_local
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.memory import MemoryStore
import monitor_protocol.store.postgres  # noqa: F401 - opening it must not import greenlet either

seen = {"threads lanes": _db_lanes("threads"), "greenlet imported": "greenlet" in sys.modules}
before = lane_local()
service = MonitorService(MemoryStore())
before.value = "this thread's"
seen["before is threading.local"] = type(before) is threading.local
seen["green lanes"] = _db_lanes("green")  # imports greenlet, as mp serve does before opening the store
import greenlet
from monitor_protocol.doors.green_lanes import GreenLanes

seen["after is LaneLocal"] = isinstance(lane_local(), LaneLocal)
seen["before keeps its key"] = before.value
seen["in a greenlet, before"] = greenlet.greenlet(lambda: getattr(before, "value", None)).switch()
try:
    GreenLanes(MemoryStore(), service, lanes=1)
except RuntimeError as exc:
    seen["refused"] = str(exc)
GreenLanes(MemoryStore(), MonitorService(MemoryStore()), lanes=1)  # control: made after the import
seen["control made"] = True
print(repr(seen))
"""


def test_lane_locals_are_decided_when_made_and_green_lanes_refuse_state_made_per_thread():
    """Thread lanes never import greenlet and keep threading.local (a key that cannot change under a session);
    green lanes import it before the store and the service are made, and refuse a service made before."""
    import ast
    import subprocess
    import sys

    from serverutil import mp_env

    out = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS], env=mp_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert seen["threads lanes"] == "threads" and seen["greenlet imported"] is False
    assert seen["before is threading.local"] and seen["green lanes"] == "green"
    assert seen["after is LaneLocal"] and seen["before keeps its key"] == "this thread's"
    assert (
        seen["in a greenlet, before"] == "this thread's"
    )  # per thread: the greenlets of one thread share it
    assert "MonitorService was made before greenlet was imported" in seen["refused"]
    assert seen["control made"] is True


OPENED_STORE = """
import sys, threading
from monitor_protocol.store.postgres import PostgresStore

store = PostgresStore(sys.argv[1])  # as mp serve opens it for thread lanes: greenlet not imported before
seen = {
    "per thread": type(store.lane_locals()[0]) is threading.local,
    "greenlet imported": "greenlet" in sys.modules,
}
import greenlet  # noqa: F401
from monitor_protocol.doors.green_lanes import GreenLanes

try:
    GreenLanes(store, None, lanes=1)
except RuntimeError as exc:
    seen["refused"] = str(exc)
store.close()
print(repr(seen))
"""


def test_a_postgres_store_opened_for_thread_lanes_keeps_threading_local_and_green_lanes_refuse_it(pg_url):
    import ast
    import subprocess
    import sys

    from serverutil import mp_env

    out = subprocess.run(
        [sys.executable, "-c", OPENED_STORE, pg_url], env=mp_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert seen["per thread"] is True and seen["greenlet imported"] is False
    assert "PostgresStore was made before greenlet was imported" in seen["refused"]
