"""Lone publishes merged into one engine call (docs/serve.md "How a request is served"): the publishes one loop
turn (LoopEngine) or one lane's group (EngineLanes) holds run as one call, MonitorService.publish_each, and
every request is answered as it would be alone. Each with a positive control:

- doors/merging.merged: only neighbours merge, order is kept, each caller hears its own outcome (and a
  failure of the whole);
- publish_each gives what the same publishes one by one give: outcomes, the log, refusals logged, the
  monitor's counters, idempotency keys (a hypothesis property over mixed entries);
- the HTTP door: sixteen publishes of one loop turn are one engine call and one commit; a mix of good and
  bad requests gets, request by request, the replies it gets with merging off.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.engines import LoopEngine
from monitor_protocol.doors.http.app import MonitorApp
from monitor_protocol.doors.http.protocol import HttpConnection, HttpServer
from monitor_protocol.doors.merging import merged
from monitor_protocol.store.memory import MemoryStore
from monitor_protocol.store.sqlite import SQLiteStore
from test_lean_path import Transport as LeanTransport

pytestmark = pytest.mark.quick

RUN = "com.example.ci.run"
HANG_GUARD = 10.0


# ---------------------------------------------------------------------------------------------- merged
def test_only_neighbours_that_merge_gives_one_function_merge_and_order_is_kept() -> None:
    def many(calls: list[tuple[Any, ...]]) -> list[tuple[bool, Any]]:
        return [(True, ("many", args[0])) for args in calls]

    def other(calls: list[tuple[Any, ...]]) -> list[tuple[bool, Any]]:
        return [(True, ("other", args[0])) for args in calls]

    heard: list[tuple[int, bool, Any]] = []

    def job(fn: Any, n: int) -> tuple[Any, ...]:
        return (fn, (n,), "loop", lambda ok, value, n=n: heard.append((n, ok, value)))

    def merge(fn: Any, args: tuple[Any, ...]) -> Any:
        return {"p": many, "q": other}.get(fn)

    jobs = [job("p", 0), job("p", 1), job("x", 2), job("p", 3), job("q", 4), job("q", 5), job("p", 6)]
    out = merged(jobs, merge)
    # p p | x | p | q q | p: two runs merge, the lone ones stay as they were (the same tuples)
    assert [j[0] for j in out] == [many, "x", "p", other, "p"]
    assert out[1] is jobs[2] and out[2] is jobs[3] and out[4] is jobs[6]
    assert out[0][1] == ([(0,), (1,)],) and out[0][2] == "loop"  # what sits between args and deliver is kept
    for fn, args, _loop, deliver in out:
        deliver(True, fn(*args)) if callable(fn) else deliver(True, ("alone", args[0]))
    assert sorted(heard) == [
        (0, True, ("many", 0)), (1, True, ("many", 1)), (2, True, ("alone", 2)), (3, True, ("alone", 3)),
        (4, True, ("other", 4)), (5, True, ("other", 5)), (6, True, ("alone", 6)),
    ]  # fmt: skip
    # control: without a merge, or one that merges nothing, the jobs are the same list
    assert merged(jobs, None) is jobs and merged(jobs, lambda fn, args: None) == jobs


def test_a_merged_jobs_failure_reaches_each_caller_and_a_broken_caller_costs_the_others_nothing() -> None:
    heard: list[tuple[int, bool, Any]] = []

    def deliver(n: int) -> Any:
        def told(ok: bool, value: Any) -> None:
            if n == 0:
                raise RuntimeError("a broken reply")
            heard.append((n, ok, value))

        return told

    jobs = [("p", (n,), deliver(n)) for n in range(3)]
    [(_fn, _args, fanned)] = merged(jobs, lambda fn, args: print)
    boom = RuntimeError("the store went away")
    fanned(False, boom)
    assert heard == [(1, False, boom), (2, False, boom)]
    heard.clear()
    fanned(True, [(True, "a"), (False, boom), (True, "c")])
    assert heard == [(1, False, boom), (2, True, "c")]
    # a merge that raises leaves its job to run by itself
    assert merged(jobs, lambda fn, args: 1 / 0) == jobs


# ---------------------------------------------------------------------------------------------- the rules
MONITORS = ("ci", "nightly")
Entry = tuple[int, int, int, int | None, bool]  # monitor, token kind, body kind, key, answered=false


def _setup(store: Any) -> tuple[MonitorService, dict[str, str]]:
    now = [1_800_000_000.0]
    service = MonitorService(store, clock=lambda: now[0])
    owners = {}
    for name in MONITORS:
        spec = (
            {"id": name, "types": [RUN], "limits": {"observations_per_day": 6}} if name == "nightly" else None
        )
        owners[name] = service.create_monitor(spec or {"id": name, "types": [RUN]}, None)["owner_token"]
    return service, owners


def _entry(owners: dict[str, str], e: Entry) -> tuple[str, Any, str | None, str | None]:
    monitor, token, body, key, quiet = e
    name = MONITORS[monitor] if monitor < 2 else "nowhere"
    tok = [owners.get(name, "x"), "not-the-owner", None][token]
    obs: Any = [
        {"type": RUN, "subject": f"s{monitor}"},
        {"type": "com.example.other"},  # not in the monitor's types: refused and logged
        {"type": RUN, "tier": "confirmed"},  # a ceiling a machine cannot reach: refused and logged
        ["not", "an", "object"],
        {"type": RUN, "idempotency_key": ""},  # a key that is no key: refused and logged
    ][body]
    if quiet and isinstance(obs, dict):
        obs["data"] = {"answered": False, "reason": "timeout"}
    return name, obs, tok, None if key is None else f"k{key}"


def _said(outcome: tuple[bool, Any]) -> Any:
    ok, value = outcome
    if not ok:
        return ("refused", value.code, value.status)
    obs = value["observation"]
    return ("ok", value["seq"], value.get("idempotent"), obs["type"], obs.get("subject"))


def _books(service: MonitorService, owners: dict[str, str]) -> Any:
    """Each monitor's state and whole log (the clock stands still: every time and id is the same)."""
    return [(service.state(name, owners[name]), service.read_log(name, 1, 200)) for name in MONITORS]


entries = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 0, 1, 1, 2]),
        st.sampled_from([0, 0, 0, 0, 1, 2]),
        st.sampled_from([0, 0, 0, 0, 1, 2, 3, 4]),
        st.sampled_from([None, None, 1, 2]),
        st.booleans(),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries)
def test_publish_each_gives_what_the_same_publishes_one_by_one_give(batch: list[Entry]) -> None:
    one_by_one, owners = _setup(MemoryStore())
    together, owners2 = _setup(MemoryStore())
    assert owners.keys() == owners2.keys()
    alone: list[tuple[bool, Any]] = []
    for e in batch:
        name, body, token, key = _entry(owners, e)
        try:
            alone.append((True, one_by_one.publish(name, body, token, idempotency_key=key)))
        except ProtocolError as err:
            alone.append((False, err))
    merged_out = together.publish_each([_entry(owners2, e) for e in batch])
    assert [_said(o) for o in merged_out] == [_said(o) for o in alone]
    assert _books(together, owners2) == _books(one_by_one, owners)


def test_publish_each_is_one_transaction_and_one_write_of_each_monitor(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "each.db"))
    service, owners = _setup(store)
    written: list[str] = []
    real = store.apply

    def apply(changes: Any) -> Any:
        written.extend(m.id for m in changes.monitors)
        return real(changes)

    store.apply = apply  # type: ignore[method-assign]
    commits = store.stats.commits
    out = service.publish_each(
        [("ci", {"type": RUN, "subject": f"b{i}"}, owners["ci"], None) for i in range(10)]
    )
    assert [v["seq"] for _ok, v in out] == list(range(2, 12))
    assert store.stats.commits - commits == 1 and written == ["ci"]
    # control: the same ten one by one are ten transactions, each writing the monitor
    written.clear()
    for i in range(10):
        service.publish("ci", {"type": RUN, "subject": f"c{i}"}, owners["ci"])
    assert store.stats.commits - commits == 11 and written == ["ci"] * 10


# ---------------------------------------------------------------------------------------------- the door
class Transport(LeanTransport):
    """The lean path tests' transport, its replies read with their headers."""

    def replies(self) -> list[tuple[int, dict[str, str], Any]]:
        data = b"".join(self.out)
        found = []
        while data:
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            length = int(headers["content-length"])
            found.append(
                (int(lines[0].split(" ")[1]), headers, json.loads(rest[:length]) if length else None)
            )
            data = rest[length:]
        return found


def request(method: str, path: str, body: bytes | None, token: str | None, extra: str = "") -> bytes:
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    data = body or b""
    return (
        f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}{extra}content-type: application/json\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


async def serve(
    tmp_path: Path, name: str, merge: bool
) -> tuple[HttpServer, MonitorApp, SQLiteStore, dict[str, str]]:
    store = SQLiteStore(str(tmp_path / name))
    service, owners = _setup(store)
    router = RestRouter(service, allowed_origins=["https://docs.example"])
    app = MonitorApp(service, router, store=store, engine=LoopEngine(store), sweep_interval=None)
    if not merge:
        app.engine.merge = None
    await app.startup()
    return HttpServer(app, header_timeout=10, body_timeout=30, keep_alive=65), app, store, owners


async def one_turn(server: HttpServer, requests: list[bytes]) -> list[tuple[int, dict[str, str], Any]]:
    """Each request on a connection of its own, all fed in one loop turn; each connection's one reply."""
    transports = []
    for raw in requests:
        conn, transport = HttpConnection(server), Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(raw)
        transports.append(transport)
    async with asyncio.timeout(HANG_GUARD):
        while not all(t.out for t in transports):
            await asyncio.sleep(0.001)
    replies = [t.replies() for t in transports]
    assert all(len(r) == 1 for r in replies)
    return [r[0] for r in replies]


def _count(service: MonitorService, name: str) -> list[int]:
    calls = [0]
    real = getattr(service, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(service, name, counted)
    return calls


@pytest.mark.parametrize("merge", [True, False])
async def test_sixteen_publishes_of_one_loop_turn_are_one_engine_call_and_one_commit(
    tmp_path: Path, merge: bool
) -> None:
    server, app, store, owners = await serve(tmp_path, "turn.db", merge)
    try:
        each, lone = _count(app.service, "publish_each"), _count(app.service, "publish")
        commits = store.stats.commits
        body = json.dumps({"type": RUN, "subject": "b"}).encode()
        path = "/mp/v0/monitors/ci/observations"
        replies = await one_turn(server, [request("POST", path, body, owners["ci"]) for _ in range(16)])
        assert [(status, reply["seq"]) for status, _h, reply in replies] == [(201, s) for s in range(2, 18)]
        assert store.stats.commits - commits == 1  # one group commit either way
        # merged: one engine call for the sixteen; control (merging off): sixteen calls
        assert (each[0], lone[0]) == ((1, 0) if merge else (0, 16))
    finally:
        await app.shutdown()


async def test_a_turn_of_good_and_bad_requests_is_answered_as_with_merging_off(tmp_path: Path) -> None:
    """Request by request, the same status, body (less its times and event ids) and headers."""
    path, other = "/mp/v0/monitors/ci/observations", "/mp/v0/monitors/nightly/observations"

    def turn(owners: dict[str, str]) -> list[bytes]:
        ci, nightly = owners["ci"], owners["nightly"]
        obs = json.dumps({"type": RUN, "subject": "ok"}).encode()
        keyed = json.dumps({"type": RUN, "idempotency_key": "k1"}).encode()
        return [
            request("POST", path, obs, ci),
            request("POST", path, obs, "not-the-owner"),  # 401, nothing logged
            request(
                "POST", path, json.dumps({"type": "com.example.other"}).encode(), ci
            ),  # 400 UNKNOWN_VOCABULARY, logged
            request("POST", path, keyed, ci),
            request("POST", path, keyed, ci),  # the same key again: the first reply, 200
            request("POST", path, obs, ci, "idempotency-key: k2\r\n"),  # the key as a header
            request("POST", path, b"{not json", ci),  # 400, logged: handled alone
            request("POST", path, json.dumps([{"type": RUN}]).encode(), ci),  # a batch: 207, alone
            request("GET", "/mp/v0/monitors/ci", None, ci),  # not a publish: between the runs
            request("POST", other, obs, nightly),
            request("POST", "/mp/v0/monitors/nowhere/observations", obs, ci),  # 404
            request("POST", path, obs, ci, "origin: https://docs.example\r\n"),  # CORS headers kept
            request("POST", path, obs, ci, "origin: https://evil.example\r\n"),  # refused Origin: alone
            request("POST", path + "/", obs, ci),  # the same route with a trailing slash
        ]

    answers = []
    for merge in (True, False):
        server, app, _store, owners = await serve(tmp_path, f"mix-{merge}.db", merge)
        try:
            each = _count(app.service, "publish_each")
            got = await one_turn(server, turn(owners))
            state = app.service.state("ci", owners["ci"])
            answers.append((_plain(got), state["head"], state["counters"]))
            # merged: two calls, the lone publishes before the bad body and those after the GET (less the
            # refused Origin, answered alone); the trailing slash is not the door's publish key: alone too
            assert each[0] == (2 if merge else 0)
        finally:
            await app.shutdown()
    assert answers[0] == answers[1]
    statuses = [status for status, _h, _b in answers[0][0]]
    assert statuses == [201, 401, 400, 201, 200, 201, 400, 207, 200, 201, 404, 201, 403, 201], statuses


def _plain(replies: list[tuple[int, dict[str, str], Any]]) -> Any:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: strip(v)
                for k, v in value.items()
                if k not in ("id", "time", "recorded", "observed_at", "incident", "token_hint")
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    keep = ("content-type", "access-control-allow-origin", "retry-after", "location")
    return [(s, {k: v for k, v in h.items() if k in keep}, strip(b)) for s, h, b in replies]


# ---------------------------------------------------------------------------------------------- PostgreSQL
@pytest.mark.parametrize("merge", [True, False])
def test_a_lanes_group_of_publishes_on_postgresql_is_one_engine_call(pg: Any, merge: bool) -> None:
    """EngineLanes gathers the publishes queued for one monitor on one lane; with the door's merge they run
    as one call (one transaction, the monitor's lock and row once), each request its own reply. The control
    (merging off) runs them as a group commit of separate calls."""
    import threading

    from monitor_protocol.api.messages import Request
    from monitor_protocol.doors.engines import EngineLanes

    service, owners = _setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    app = MonitorApp(
        service, RestRouter(service, allowed_hosts=None), store=pg, engine=engine, sweep_interval=None
    )
    if not merge:
        engine.merge = None
    each, lone = _count(service, "publish_each"), _count(service, "publish")
    body = json.dumps({"type": RUN, "subject": "b"}).encode()
    headers = {
        "host": "127.0.0.1",
        "authorization": f"Bearer {owners['ci']}",
        "content-type": "application/json",
    }
    publish = Request("POST", "/mp/v0/monitors/ci/observations", [], headers, body)
    bad = Request(
        "POST", "/mp/v0/monitors/ci/observations", [], {**headers, "authorization": "Bearer x"}, body
    )
    gate = threading.Event()

    async def main() -> list[Any]:
        blocker = engine.submit(gate.wait, 30)
        await asyncio.sleep(0.05)  # the lane holds the blocker: the publishes queue behind it, together
        futures = [engine.submit(app.handle_job, r) for r in [publish] * 3 + [bad] + [publish] * 4]
        await asyncio.sleep(0.05)
        gate.set()
        await blocker
        return [await f for f in futures]

    try:
        commits = pg.stats.commits
        out = asyncio.run(main())
    finally:
        engine.stop()
    statuses = [(response.status, (response.body or {}).get("seq")) for response, _mark in out]
    assert statuses == [(201, 2), (201, 3), (201, 4), (401, None), (201, 5), (201, 6), (201, 7), (201, 8)]
    assert pg.stats.commits - commits == 1
    assert (each[0], lone[0]) == ((1, 0) if merge else (0, 8))  # the refused one is a call too


async def test_the_metrics_count_each_merged_publish_as_a_call_of_its_commit(tmp_path: Path) -> None:
    """`mp_engine_calls_total` over the commits still says how many requests shared each commit."""
    server, app, _store, owners = await serve(tmp_path, "metrics.db", True)
    try:
        calls, commits = app.metrics.engine_calls, app.metrics.commit_count
        body = json.dumps({"type": RUN}).encode()
        await one_turn(server, [request("POST", "/mp/v0/monitors/ci/observations", body, owners["ci"])] * 5)
        assert (app.metrics.engine_calls - calls, app.metrics.commit_count - commits) == (5, 1)
    finally:
        await app.shutdown()
