"""The ASGI door in-process: one engine thread with group commit, body cap, long-poll and SSE wake-ups and
disconnects, the lifespan, and the no-500 guarantee. Driven through raw ASGI messages, no sockets."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager
from typing import Any

import pytest
from monitor_protocol.api.messages import Request, error_response
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.errors import ProtocolError, internal_failure, storage_unavailable
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.engines import EngineThread
from monitor_protocol.doors.http import sse
from monitor_protocol.doors.http.app import MonitorApp
from monitor_protocol.store.memory import MemoryStore
from waiting import eventually, eventually_async

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

HANG_GUARD = 30  # only stops a broken door from hanging the suite; no assertion depends on it
RUN = "com.example.ci.run"
OTHER = "com.example.ci.other"


class Conn:
    """One HTTP exchange: feeds request chunks to the app, then blocks like a live socket until disconnect."""

    def __init__(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        headers: dict[str, str] | None = None,
        chunks: list[bytes] | None = None,
    ) -> None:
        hdrs = {"host": "127.0.0.1:8130", **{k.lower(): v for k, v in (headers or {}).items()}}
        self.scope = {
            "type": "http",
            "method": method,
            "path": path,
            "query_string": query.encode(),
            "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()],
        }
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        parts = chunks if chunks is not None else [b""]
        for i, chunk in enumerate(parts):
            self.inbox.put_nowait({"type": "http.request", "body": chunk, "more_body": i < len(parts) - 1})
        self.sent: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        self.changed.set()

    def disconnect(self) -> None:
        self.inbox.put_nowait({"type": "http.disconnect"})

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def headers(self) -> dict[str, str]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return {k.decode(): v.decode() for k, v in start["headers"]}

    @property
    def text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()

    def json(self) -> Any:
        return json.loads(self.text)

    async def wait_for(self, predicate) -> None:
        while not predicate(self):
            self.changed.clear()
            await self.changed.wait()


async def parked(app, monitor_id: str, count: int = 1) -> None:
    """Until `count` readers are parked on the monitor in the app's registry (checked every loop turn)."""
    await eventually_async(
        lambda: app.waiters.parked_on(monitor_id) >= count,
        timeout=HANG_GUARD,
        interval=0,
        what=f"{count} reader(s) parked on {monitor_id}",
    )


async def call(
    app,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = None,
    query: str = "",
    headers: dict[str, str] | None = None,
) -> Conn:
    hdrs = dict(headers or {})
    if token:
        hdrs["authorization"] = f"Bearer {token}"
    conn = Conn(
        method,
        path,
        query=query,
        headers=hdrs,
        chunks=[json.dumps(body).encode()] if body is not None else None,
    )
    await asyncio.wait_for(app(conn.scope, conn.receive, conn.send), HANG_GUARD)
    return conn


@pytest.fixture()
async def served():
    store = MemoryStore()
    service = MonitorService(store)
    router = RestRouter(service)
    app = MonitorApp(service, router, sweep_interval=None, heartbeat_seconds=0.01)
    await app.startup()
    try:
        yield app
    finally:
        await app.shutdown()


async def setup_feed(app, **sub_fields) -> tuple[str, str, str]:
    created = await call(
        app, "POST", "/mp/v0/monitors", {"id": "ci", "types": [RUN, OTHER], "visibility": "public"}
    )
    assert created.status == 201, created.text
    owner = created.json()["owner_token"]
    sub = await call(
        app, "POST", "/mp/v0/subscriptions", {"monitor": "ci", "subscriber": "agent:r", **sub_fields}
    )
    assert sub.status == 201, sub.text
    return owner, sub.json()["subscription"]["id"], sub.json()["token"]


async def publish(app, owner: str, subject: str, type_: str = RUN) -> dict:
    conn = await call(
        app, "POST", "/mp/v0/monitors/ci/observations", {"type": type_, "subject": subject}, owner
    )
    assert conn.status == 201, conn.text
    return conn.json()


# -- the engine thread ---------------------------------------------------------------------------------


async def test_the_engine_is_entered_by_one_thread_at_a_time(served):
    inside = 0
    most = 0
    guard = threading.Lock()
    handle = served.router.handle

    def recording(request):
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        try:
            threading.Event().wait(0.001)  # widen the window a second entrant would need
            return handle(request)
        finally:
            with guard:
                inside -= 1

    served.router.handle = recording
    owner, _sub, _reader = await setup_feed(served)
    replies = await asyncio.gather(*(publish(served, owner, f"b-{i}") for i in range(25)))
    side = threading.Thread(target=lambda: served.engine.run_sync(served.service.discover))
    side.start()  # a call from another thread (push, MCP) joins the same one-at-a-time rule
    more = await asyncio.gather(*(publish(served, owner, f"c-{i}") for i in range(25)))
    side.join()
    seqs = [r["seq"] for r in replies + more]
    assert len(seqs) == len(set(seqs)) == 50
    assert most == 1


class RecordingBatchStore:
    """A stand-in store whose batch() records when it opens and commits."""

    def __init__(self, fail_commit: bool = False) -> None:
        self.events: list[str] = []
        self.fail_commit = fail_commit

    @contextmanager
    def batch(self):
        self.events.append("begin")
        yield
        if self.fail_commit:
            raise OSError("disk full")
        self.events.append("commit")


def block(engine: EngineThread, gate: threading.Event) -> threading.Thread:
    """Occupy the engine thread until `gate` opens; return once it is really busy."""
    busy = threading.Event()

    def hold() -> None:
        busy.set()
        gate.wait()

    blocker = threading.Thread(target=engine.run_sync, args=(hold,))
    blocker.start()
    busy.wait()
    return blocker


def test_queued_calls_share_one_group_commit_and_hear_back_after_it():
    store = RecordingBatchStore()
    engine = EngineThread(store)
    gate = threading.Event()
    try:
        blocker = block(engine, gate)
        results: list[Any] = [None] * 5
        callers = []
        for i in range(5):

            def job(i=i):
                store.events.append(f"job{i}")
                return i * 10

            def caller(i=i, job=job):
                results[i] = engine.run_sync(job)
                store.events.append(f"reply{i}")

            callers.append(threading.Thread(target=caller))
        for t in callers:
            t.start()
        eventually(  # the five calls are queued behind the blocked one
            lambda: engine._queue.qsize() >= 5, timeout=HANG_GUARD, interval=0.001, what="five calls queued"
        )
        gate.set()
        blocker.join()
        for t in callers:
            t.join()
    finally:
        engine.stop()
    assert results == [0, 10, 20, 30, 40]
    assert store.events[0] == "begin" and store.events[6] == "commit"
    assert sorted(store.events[1:6]) == [f"job{i}" for i in range(5)]
    assert sorted(store.events[7:]) == [f"reply{i}" for i in range(5)]


async def test_calls_made_in_one_loop_iteration_travel_and_commit_together():
    store = RecordingBatchStore()
    engine = EngineThread(store)
    try:

        def job(i):
            store.events.append(f"job{i}")
            return i

        results = await asyncio.gather(*(engine.call(job, i) for i in range(4)))
    finally:
        engine.stop()
    assert results == [0, 1, 2, 3]
    assert store.events == ["begin", "job0", "job1", "job2", "job3", "commit"]  # one group commit


async def test_every_engine_call_runs_on_the_engine_thread_never_on_the_loop():
    store = RecordingBatchStore()
    engine = EngineThread(store)
    gate = threading.Event()
    try:
        idle = await engine.call(lambda: threading.current_thread().name)
        assert (
            idle == "mp-engine" != threading.current_thread().name
        )  # even an idle engine is not entered here
        blocker = block(engine, gate)  # the engine thread is inside a call: never enter the engine twice
        pending = asyncio.ensure_future(engine.call(lambda: threading.current_thread().name))
        await asyncio.sleep(0.05)  # the point: for this long, it must not run
        assert not pending.done()  # it waits its turn instead of running beside the busy call
        gate.set()
        assert await pending == "mp-engine"
        blocker.join()
    finally:
        gate.set()
        engine.stop()


def test_a_failed_group_commit_reports_no_success():
    store = RecordingBatchStore(fail_commit=True)
    engine = EngineThread(store)
    gate = threading.Event()
    outcomes: list[Any] = []
    try:
        blocker = block(engine, gate)

        def caller():
            try:
                outcomes.append(engine.run_sync(lambda: "applied"))
            except OSError as exc:
                outcomes.append(exc)

        callers = [threading.Thread(target=caller) for _ in range(3)]
        for t in callers:
            t.start()
        eventually(
            lambda: engine._queue.qsize() >= 3, timeout=HANG_GUARD, interval=0.001, what="three calls queued"
        )
        gate.set()
        blocker.join()
        for t in callers:
            t.join()
    finally:
        engine.stop()
    assert len(outcomes) == 3 and all(isinstance(o, OSError) for o in outcomes)


# -- body cap --------------------------------------------------------------------------------------------


async def test_body_cap_refuses_before_reading_the_rest():
    service = MonitorService(MemoryStore())
    app = MonitorApp(service, RestRouter(service), sweep_interval=None, max_body=10)
    conn = Conn("POST", "/mp/v0/monitors", chunks=[b"12345", b"67890", b"x", b"never-read"])
    await asyncio.wait_for(app(conn.scope, conn.receive, conn.send), HANG_GUARD)
    assert conn.status == 413 and conn.json()["code"] == "TOO_LARGE" and conn.json()["max_body"] == 10
    # Refused at the 11th byte; the rest is drained and dropped (never buffered) so the 413 survives the
    # close instead of being destroyed by a connection reset.
    assert conn.inbox.qsize() == 0

    declared = Conn(
        "POST",
        "/mp/v0/monitors",
        headers={"content-length": "11", "expect": "100-continue"},
        chunks=[b"x" * 11],
    )
    await asyncio.wait_for(app(declared.scope, declared.receive, declared.send), HANG_GUARD)
    assert declared.status == 413
    assert declared.inbox.qsize() == 1  # refused on the header alone: not one body byte was read
    app.engine.stop()


# -- long poll -----------------------------------------------------------------------------------------


async def test_long_poll_skips_non_matching_appends_and_returns_the_match(served):
    owner, sub, reader = await setup_feed(served, filter={"types": [RUN]})
    first = await call(served, "GET", f"/mp/v0/subscriptions/{sub}/pull", token=reader)
    await call(served, "POST", f"/mp/v0/subscriptions/{sub}/ack", {"cursor": first.json()["next"]}, reader)

    waiting = Conn(
        "GET",
        f"/mp/v0/subscriptions/{sub}/pull",
        query="wait=50",
        headers={"authorization": f"Bearer {reader}"},
    )
    task = asyncio.ensure_future(served(waiting.scope, waiting.receive, waiting.send))
    await parked(served, "ci")  # the pull is parked on its monitor
    await publish(served, owner, "ignored", OTHER)
    await publish(served, owner, "wanted", RUN)
    await asyncio.wait_for(task, HANG_GUARD)
    assert waiting.status == 200
    assert [o["subject"] for o in waiting.json()["observations"]] == ["wanted"]
    assert served.waiters.monitors() == []


async def test_long_poll_ends_quietly_when_the_client_leaves(served):
    _owner, sub, reader = await setup_feed(served, filter={"types": [RUN]})
    waiting = Conn(
        "GET",
        f"/mp/v0/subscriptions/{sub}/pull",
        query="wait=50",
        headers={"authorization": f"Bearer {reader}"},
    )
    task = asyncio.ensure_future(served(waiting.scope, waiting.receive, waiting.send))
    await parked(served, "ci")
    waiting.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)
    assert waiting.sent == []  # nobody to answer
    assert served.waiters.monitors() == []


# -- SSE -------------------------------------------------------------------------------------------------


async def test_sse_heartbeats_follows_appends_and_stops_on_disconnect(served):
    owner, sub, reader = await setup_feed(served)
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
    assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
    assert stream.text.startswith("retry: 3000\n\n")
    heartbeat = next(block for block in stream.text.split("\n\n") if block.startswith("event: heartbeat"))
    assert json.loads(heartbeat.split("data: ", 1)[1])["cursor"] == 3  # seq 1 created, seq 2 subscribed

    published = await publish(served, owner, "live")
    marker = f"id: {published['seq']}\nevent: observation\n"
    await asyncio.wait_for(stream.wait_for(lambda c: marker in c.text), HANG_GUARD)
    stream.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)
    assert stream.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert served.waiters.monitors() == []
    # Streaming committed nothing.
    info = await call(served, "GET", f"/mp/v0/subscriptions/{sub}", token=reader)
    assert info.json()["cursor"] == 0


async def test_sse_a_heartbeat_whose_token_check_is_refused_ends_the_stream_with_an_error_event(
    served, caplog, monkeypatch
):
    """Found by a tester: the heartbeat's check of the reader's token (MonitorService.touch) raised its refusal
    out of the stream, so a token renewed while the stream idled was logged as a server failure (an incident
    and a traceback) and the stream ended without a word, after one more heartbeat. Now the stream ends with
    the refusal as an `error` event. The touch is refused here without an append, which would wake the
    stream's replay first (whose 401 was already an `error` event)."""
    owner, sub, reader = await setup_feed(served)
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)

    def refused(*_args, **_kwargs):
        raise ProtocolError(
            "UNAUTHORIZED", "This needs the subscription's reader token.", needs="reader_token"
        )

    monkeypatch.setattr(served.service, "touch", refused)
    beats = stream.text.count("event: heartbeat")
    await asyncio.wait_for(task, HANG_GUARD)  # it ends by itself, at the next heartbeat
    ((_, error),) = _events(stream.text, "error")
    assert error["code"] == "UNAUTHORIZED", error
    assert stream.text.count("event: heartbeat") == beats  # none sent once the token was refused
    assert "unexpected failure" not in caplog.text and "incident" not in caplog.text
    assert stream.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_sse_a_last_event_id_past_the_head_goes_on_from_the_head(served):
    """Found by a tester: Last-Event-ID (or ?cursor=) past the head was kept, and the stream stayed silent
    until the log reached it (a client's id from a log since restored from a backup misses everything new).
    It goes on from head + 1, as a pull's `next` does; the control: an id inside the log resumes after it."""
    owner, sub, reader = await setup_feed(served)
    first = await publish(served, owner, "one")
    for headers in ({"last-event-id": "5000"}, {}):
        query = "cursor=5000" if not headers else ""
        stream = Conn(
            "GET",
            f"/mp/v0/subscriptions/{sub}/stream",
            query=query,
            headers={"authorization": f"Bearer {reader}", **headers},
        )
        task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
        await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
        live = await publish(served, owner, "live")
        await asyncio.wait_for(stream.wait_for(lambda c, s=live["seq"]: f"id: {s}\n" in c.text), HANG_GUARD)
        stream.disconnect()
        await asyncio.wait_for(task, HANG_GUARD)
        assert [int(i) for i, _ in _events(stream.text, "observation")] == [live["seq"]]
    control = Conn(
        "GET",
        f"/mp/v0/subscriptions/{sub}/stream",
        headers={"authorization": f"Bearer {reader}", "last-event-id": str(first["seq"] - 1)},
    )
    task = asyncio.ensure_future(served(control.scope, control.receive, control.send))
    await asyncio.wait_for(control.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
    control.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)
    assert [int(i) for i, _ in _events(control.text, "observation")][0] == first["seq"]


def _events(text: str, kind: str) -> list[tuple[str | None, dict]]:
    """The stream's events of one kind: (id or None, data)."""
    found = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if lines.get("event") == kind:
            found.append((lines.get("id"), json.loads(lines["data"])))
    return found


@pytest.mark.parametrize("policy", ["latest", "earliest"])
async def test_sse_below_the_floor_follows_the_reset_policy_and_says_so(served, policy):
    """Found after a tester's report: a stream whose cursor compaction passed ended at once, for every
    reset policy. With earliest or latest it goes on from the floor or past the head, first saying so in a
    `reset` event (a pull's `reset` fields) whose id makes a reconnect resume there; it still commits
    nothing. The control: reset_policy none ends the stream with CURSOR_EXPIRED, as before."""
    owner, sub, reader = await setup_feed(served, reset_policy=policy)
    for i in range(5):
        await publish(served, owner, f"old-{i}")
    compacted = await served.engine.call(served.service.compact, "ci", 5)
    floor = compacted["compacted"][0]["retention_floor"]
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
    assert stream.status == 200
    ((event_id, reset),) = _events(stream.text, "reset")
    head = (
        await call(served, "GET", f"/mp/v0/subscriptions/{sub}/pull", token=reader, query="cursor=999999")
    ).json()["head"]
    moved_to = floor if policy == "earliest" else head + 1
    assert reset == {"reset_policy": policy, "requested": 1, "retention_floor": floor, "cursor": moved_to}
    assert event_id == str(moved_to - 1)
    seqs = [int(i) for i, _ in _events(stream.text, "observation")]
    assert seqs == ([] if policy == "latest" else list(range(floor, head + 1)))
    live = await publish(served, owner, "live")
    await asyncio.wait_for(stream.wait_for(lambda c: f"id: {live['seq']}\n" in c.text), HANG_GUARD)
    stream.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)
    info = await call(served, "GET", f"/mp/v0/subscriptions/{sub}", token=reader)
    assert info.json()["cursor"] == 0  # the stream moved itself, not the subscription


async def test_sse_below_the_floor_with_reset_policy_none_is_refused(served):
    owner, sub, reader = await setup_feed(served, reset_policy="none")
    for i in range(5):
        await publish(served, owner, f"old-{i}")
    await served.engine.call(served.service.compact, "ci", 5)
    refused = await call(served, "GET", f"/mp/v0/subscriptions/{sub}/stream", token=reader)
    assert refused.status == 410 and refused.json()["code"] == "CURSOR_EXPIRED"


async def test_sse_an_explicit_cursor_below_the_floor_is_refused_whatever_the_policy(served):
    """Found by a reviewer: `?cursor=N` is a replay from N, and a pull's replay below the floor is refused
    whatever the reset policy; the stream moved it. Now refused too; the committed cursor (the control) and
    a reconnect's Last-Event-ID follow the policy."""
    owner, sub, reader = await setup_feed(served, reset_policy="latest")
    for i in range(5):
        await publish(served, owner, f"old-{i}")
    await served.engine.call(served.service.compact, "ci", 5)
    refused = await call(served, "GET", f"/mp/v0/subscriptions/{sub}/stream", token=reader, query="cursor=2")
    assert refused.status == 410 and refused.json()["code"] == "CURSOR_EXPIRED"
    for headers in ({}, {"last-event-id": "1"}):
        stream = Conn(
            "GET",
            f"/mp/v0/subscriptions/{sub}/stream",
            headers={"authorization": f"Bearer {reader}", **headers},
        )
        task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
        await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
        assert stream.status == 200 and len(_events(stream.text, "reset")) == 1, (headers, stream.text)
        stream.disconnect()
        await asyncio.wait_for(task, HANG_GUARD)


async def test_sse_a_compaction_between_the_start_and_its_reset_moves_it_again(served):
    """Found by a reviewer: the start moved the stream once; a compaction between that and the next replay
    ended it with 410, and an EventSource does not reconnect after a refusal. It moves again."""
    owner, sub, reader = await setup_feed(served, reset_policy="earliest")
    for i in range(8):
        await publish(served, owner, f"old-{i}")
    await served.engine.call(served.service.compact, "ci", 3)
    handle_marked = served.handle_marked
    compacted: dict = {}

    async def compacting(request):
        if ("cursor", "4") in request.query and not compacted:  # the first move: compaction passes it again
            compacted.update(await served.engine.call(served.service.compact, "ci", 7))
        return await handle_marked(request)

    served.handle_marked = compacting
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
    assert compacted, "the compaction between the two tries did not happen: this test shows nothing"
    assert stream.status == 200
    ((_id, reset),) = _events(stream.text, "reset")
    assert reset["cursor"] == compacted["compacted"][0]["retention_floor"] == 8
    assert reset["requested"] == 1  # where the stream was asked to start, not where the first move put it
    stream.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)


async def test_sse_passed_by_compaction_mid_stream_resets_between_pages(served, monkeypatch):
    """Compaction between two pages of a stream that is catching up: the next page's replay is refused, and
    the stream moves on as its reset policy says instead of ending."""
    owner, sub, reader = await setup_feed(served, reset_policy="earliest")
    for i in range(6):
        await publish(served, owner, f"old-{i}")
    monkeypatch.setattr(sse, "SSE_PAGE", 2)
    handle_marked = served.handle_marked
    compacted: dict = {}

    async def compacting(request):
        if ("cursor", "3") in request.query and not compacted:  # the first page went out: compaction
            compacted.update(await served.engine.call(served.service.compact, "ci", 6))  # passes the stream
        return await handle_marked(request)

    served.handle_marked = compacting
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "event: heartbeat" in c.text), HANG_GUARD)
    ((_id, reset),) = _events(stream.text, "reset")
    floor = compacted["compacted"][0]["retention_floor"]
    assert reset == {"reset_policy": "earliest", "requested": 3, "retention_floor": floor, "cursor": floor}
    seqs = [int(i) for i, _ in _events(stream.text, "observation")]
    assert seqs[:3] == [1, 2, floor] and "event: error" not in stream.text
    stream.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)


# -- lifespan and failures ----------------------------------------------------------------------------------


class ClosingStore(MemoryStore):
    closed_on: str | None = None

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


async def test_lifespan_runs_hooks_tasks_sweeps_and_closes_the_store():
    store = ClosingStore()
    service = MonitorService(store)
    swept = asyncio.Event()
    task_ran = asyncio.Event()
    calls: list[str] = []
    sweep = service.sweep
    loop = asyncio.get_running_loop()

    def counting_sweep(now=None):
        loop.call_soon_threadsafe(swept.set)
        return sweep(now)

    service.sweep = counting_sweep

    async def push_delivery(app):
        task_ran.set()
        await asyncio.Event().wait()  # runs until shutdown cancels it

    app = MonitorApp(
        service,
        RestRouter(service),
        sweep_interval=0.001,
        background_tasks=[push_delivery],
        on_startup=[lambda a: calls.append("startup")],
        on_shutdown=[lambda a: calls.append("shutdown")],
    )
    inbox: asyncio.Queue = asyncio.Queue()
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    inbox.put_nowait({"type": "lifespan.startup"})
    runner = asyncio.ensure_future(app({"type": "lifespan"}, inbox.get, send))
    await asyncio.wait_for(asyncio.gather(swept.wait(), task_ran.wait()), HANG_GUARD)
    inbox.put_nowait({"type": "lifespan.shutdown"})
    await asyncio.wait_for(runner, HANG_GUARD)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert calls == ["startup", "shutdown"]
    assert store.closed_on is not None  # closed once, by whichever thread held the engine


class BrokenRouter:
    def handle(self, request):
        raise RuntimeError("a bug in the engine")


async def test_an_unexpected_exception_is_a_protocol_error_not_a_500():
    service = MonitorService(MemoryStore())
    app = MonitorApp(service, BrokenRouter(), sweep_interval=None)
    conn = await call(app, "GET", "/mp/v0/discover")
    # A bug is not bad input (docs/protocol.md section 10): 503 UNAVAILABLE with Retry-After, never 400 or 500.
    assert conn.status == 503
    assert conn.headers["retry-after"] == "1"
    assert conn.headers["content-type"] == "application/json"
    body = conn.json()
    assert body["code"] == "UNAVAILABLE" and body["done"] == [] and body["incident"] in body["error"]
    app.engine.stop()


class StorageFailingRouter:
    def handle(self, request):
        raise storage_unavailable("disk I/O error")


async def test_a_refusal_escaping_the_router_carries_its_headers():
    service = MonitorService(MemoryStore())
    app = MonitorApp(service, StorageFailingRouter(), sweep_interval=None)
    conn = await call(app, "POST", "/mp/v0/monitors", {"id": "x"})
    assert conn.status == 503 and conn.headers["retry-after"] == "1"
    assert conn.json()["code"] == "UNAVAILABLE" and conn.json()["storage"] is True
    app.engine.stop()


def test_error_response_adds_the_refusals_headers():
    assert error_response(storage_unavailable("full")).headers == {"retry-after": "1"}
    assert error_response(internal_failure("abc"), {"vary": "Origin"}).headers == {
        "retry-after": "1",
        "vary": "Origin",
    }
    assert error_response(ProtocolError("INVALID", "no")).headers == {}  # control: nothing to add


@pytest.mark.parametrize("failure", ["bug", "storage"])
async def test_an_engine_failure_inside_a_request_is_503_with_retry_after(served, monkeypatch, failure):
    """Through the real router and service: the engine raising mid-request never looks like bad input."""
    owner, _sub, _reader = await setup_feed(served)

    def broken_publish(*args, **kwargs):
        if failure == "storage":
            raise storage_unavailable("disk full")
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(served.service, "publish", broken_publish)
    conn = await call(served, "POST", "/mp/v0/monitors/ci/observations", {"type": RUN, "subject": "x"}, owner)
    assert conn.status == 503, conn.text
    assert conn.headers["retry-after"] == "1"
    assert conn.headers["content-type"] == "application/json"
    body = conn.json()
    assert body["code"] == "UNAVAILABLE" and body["done"] == [] and body["error"]
    monkeypatch.undo()
    ok = await call(served, "GET", "/mp/v0/discover")  # positive control: the door still serves
    assert ok.status == 200 and "retry-after" not in ok.headers


async def test_an_append_between_the_read_and_the_parking_still_wakes(served):
    owner, sub, reader = await setup_feed(served)
    pull = Request(
        "GET", f"/mp/v0/subscriptions/{sub}/pull", [("cursor", "99")], {"authorization": f"Bearer {reader}"}
    )
    _reply, mark = await served.handle_marked(pull)
    # positive control: nothing happened since the read, so a wait would park (here: times out at once)
    assert await served.waiters.wait("ci", mark, 0) is False
    await publish(served, owner, "slipped-in")  # lands after the read, before the waiter parks
    assert await asyncio.wait_for(served.waiters.wait("ci", mark, HANG_GUARD), HANG_GUARD) is True
    assert served.waiters.monitors() == []


async def test_body_cap_refusal_keeps_the_origin_policy_and_cors():
    service = MonitorService(MemoryStore())
    router = RestRouter(service, allowed_origins=("http://good.example",))
    app = MonitorApp(service, router, sweep_interval=None, max_body=4)
    foreign = Conn("POST", "/mp/v0/monitors", headers={"origin": "http://evil.example"}, chunks=[b"123456"])
    await asyncio.wait_for(app(foreign.scope, foreign.receive, foreign.send), HANG_GUARD)
    assert foreign.status == 403 and foreign.json()["code"] == "ORIGIN_REFUSED"
    allowed = Conn("POST", "/mp/v0/monitors", headers={"origin": "http://good.example"}, chunks=[b"123456"])
    await asyncio.wait_for(app(allowed.scope, allowed.receive, allowed.send), HANG_GUARD)
    assert allowed.status == 413 and allowed.json()["code"] == "TOO_LARGE"
    assert allowed.headers["access-control-allow-origin"] == "http://good.example"
    app.engine.stop()


async def test_shutdown_answers_parked_long_polls_and_ends_streams(served):
    _owner, sub, reader = await setup_feed(served, filter={"types": [RUN]})
    auth = {"authorization": f"Bearer {reader}"}
    waiting = Conn("GET", f"/mp/v0/subscriptions/{sub}/pull", query="wait=50", headers=auth)
    poll = asyncio.ensure_future(served(waiting.scope, waiting.receive, waiting.send))
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers=auth)
    follow = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(stream.wait_for(lambda c: "retry: 3000" in c.text), HANG_GUARD)
    await parked(served, "ci", 2)  # both are parked on the monitor
    served.begin_shutdown()
    await asyncio.wait_for(asyncio.gather(poll, follow), HANG_GUARD)
    assert waiting.status == 200 and waiting.json()["observations"] == []
    assert stream.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert served.waiters.monitors() == []


@pytest.mark.parametrize("walks", [True, False], ids=["walks-in-vain", "control-pages-with-rows"])
async def test_sse_a_stream_walking_the_log_in_vain_waits_between_walks(served, monkeypatch, walks):
    """Found by a tester: a stream whose filter no single index answers walked a long log span after span,
    back to back, and five of them held every other request 0.6-0.75 s for 15 s. After a walk that found
    nothing the stream waits as long as the walk took; the control: pages with rows follow at once."""
    from monitor_protocol.core.rules import ledger, page_bytes, pages

    owner, sub, reader = await setup_feed(served, filter={"origins": ["webhook"]} if walks else {})
    for i in range(15):
        await publish(served, owner, f"row-{i}")
    monkeypatch.setattr(page_bytes, "SCAN_SPAN", 3)  # a long log, as this log is to a span of 3
    monkeypatch.setattr(pages, "FEW_ROWS", 0)
    monkeypatch.setattr(ledger, "FEW_ROWS", 0)
    monkeypatch.setattr(sse, "SSE_PAGE", 3)
    handle_marked = served.handle_marked
    pages: list[int] = []
    pauses: list[float] = []

    async def slow_walk(request):
        await asyncio.sleep(0.03)  # a heavy walk, as a 4 KiB filter over 8,192 rows costs
        pages.append(1)
        return await handle_marked(request)

    async def counted(seconds: float) -> None:
        pauses.append(seconds)
        await asyncio.sleep(0)

    served.handle_marked = slow_walk
    monkeypatch.setattr(sse, "pause", counted)
    stream = Conn("GET", f"/mp/v0/subscriptions/{sub}/stream", headers={"authorization": f"Bearer {reader}"})
    task = asyncio.ensure_future(served(stream.scope, stream.receive, stream.send))
    await asyncio.wait_for(eventually_async(lambda: len(pages) >= 5), HANG_GUARD)
    stream.disconnect()
    await asyncio.wait_for(task, HANG_GUARD)
    if walks:  # each walk the stream made (its first page came with its start) is followed by its wait
        assert len(pauses) >= 2 and all(p >= 0.03 for p in pauses), pauses
    else:
        assert pauses == []
