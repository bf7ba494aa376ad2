"""Group commit on PostgreSQL (doors/engines.py EngineLanes with PostgresStore.batch): publishes queued together
for one monitor run in one transaction, taking its lock and reading its row once and committing once; a call
of the group that asks for a lock the group does not hold rolls the group back and every call runs alone; a
commit the database refuses for one call runs them all alone; a failure of the database during any call
fails the whole group. Nothing is ever reported done that was not committed, and nothing is done twice."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from monitor_protocol.api.messages import Request
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import Observation
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import Changes
from monitor_protocol.doors.engines import EngineLanes
from monitor_protocol.store.postgres import PostgresStore

psycopg = pytest.importorskip("psycopg")

TYPE = "com.example.x"


def setup(store: PostgresStore) -> tuple[MonitorService, dict[str, str]]:
    service = MonitorService(store)
    owners = {
        m: service.create_monitor({"id": m, "visibility": "public", "types": [TYPE]}, None)["owner_token"]
        for m in ("m1", "m2")
    }
    return service, owners


def run_queued(engine: EngineLanes, jobs: list[tuple[Any, tuple[Any, ...]]]) -> list[tuple[bool, Any]]:
    """Submit `jobs` while the one lane is held busy, so that they wait in the queue together; then let it go
    and collect each job's (ok, value)."""
    gate = threading.Event()

    async def main() -> list[tuple[bool, Any]]:
        blocker = engine.submit(gate.wait, 30)
        await asyncio.sleep(0.05)  # the lane has taken the blocker: what follows queues behind it
        futures = [engine.submit(fn, *args) for fn, args in jobs]
        await asyncio.sleep(0.05)  # every job has left the loop for the queue
        gate.set()
        await blocker
        out: list[tuple[bool, Any]] = []
        for future in futures:
            try:
                out.append((True, await future))
            except BaseException as exc:  # noqa: BLE001 - the outcome is what is checked
                out.append((False, exc))
        return out

    return asyncio.run(main())


def keyed(engine: EngineLanes, key_of: dict[Any, str]) -> None:
    """Group the jobs whose function is in `key_of` by the key given there (the HTTP door keys publishes)."""
    engine.group_key = lambda fn, args: key_of.get(fn)


def publisher(service: MonitorService, monitor: str, owner: str):
    def publish(i: int) -> dict[str, Any]:
        return service.publish(monitor, {"type": TYPE, "subject": f"s{i % 3}", "data": {"i": i}}, owner)

    return publish


def test_publishes_queued_for_one_monitor_share_one_commit_and_each_gets_its_own_seq(pg):
    service, owners = setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    publish = publisher(service, "m1", owners["m1"])
    keyed(engine, {publish: "m1"})
    try:
        commits, trips = pg.stats.commits, pg.round_trips
        out = run_queued(engine, [(publish, (i,)) for i in range(10)])
        assert all(ok for ok, _ in out), out
        assert sorted(v["seq"] for _, v in out) == list(range(2, 12))  # dense, each once (1: configured)
        assert engine.grouped == 9
        # One commit for the ten (the blocker wrote nothing), and far fewer round trips than ten alone (2 each):
        # the lock and the row once, the writes pipelined, the commit once.
        assert pg.stats.commits - commits == 1
        assert pg.round_trips - trips <= 4
    finally:
        engine.stop()
    assert service.state("m1", None)["head"] == 11
    assert [o["data"]["i"] for o in service.read_log("m1", 2, 20)["observations"]] == list(range(10))
    # positive control: without a key nothing groups, and each publish commits by itself
    engine = EngineLanes(pg, service, lanes=1)
    try:
        commits = pg.stats.commits
        out = run_queued(engine, [(publish, (i,)) for i in range(3)])
        assert all(ok for ok, _ in out) and engine.grouped == 0 and pg.stats.commits - commits == 3
    finally:
        engine.stop()


def test_a_call_that_asks_for_another_lock_rolls_the_group_back_and_every_call_runs_alone(pg):
    service, owners = setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    to_m1 = publisher(service, "m1", owners["m1"])
    to_m2 = publisher(service, "m2", owners["m2"])  # keyed as m1: it needs m2's lock, which the group lacks
    keyed(engine, {to_m1: "m1", to_m2: "m1"})
    try:
        out = run_queued(engine, [(to_m1, (0,)), (to_m1, (1,)), (to_m2, (2,)), (to_m1, (3,))])
    finally:
        engine.stop()
    assert all(ok for ok, _ in out), out
    assert engine.grouped == 0 and engine.given_up == 1  # the group was rolled back, not just left short
    # Each call once: nothing of the rolled-back group stayed, nothing was done twice.
    assert service.state("m1", None)["head"] == 4 and service.state("m2", None)["head"] == 2
    assert [v["seq"] for _, v in out] == [2, 3, 2, 4]


@pytest.mark.parametrize("where", [1, 3], ids=["then-two-more", "last"])
def test_a_statement_refused_for_one_call_runs_every_call_of_the_group_alone(pg, where):
    """The refusal reaches whichever call reads next (the pipeline's answers come in order) or the commit:
    either way the group stops there, is rolled back, and each call runs once, alone."""
    service, owners = setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    publish = publisher(service, "m1", owners["m1"])

    def duplicate_seq() -> None:
        # seq 1 again (the monitor's configured row): PostgreSQL refuses it only at the commit
        def write(tx: Any) -> None:
            tx.monitor("m1")
            pg.apply(Changes(observations=[Observation.of("m1", 1, {"id": "1", "type": TYPE})]))

        service._call(write)

    keyed(engine, {publish: "m1", duplicate_seq: "m1"})
    jobs: list[tuple[Any, tuple[Any, ...]]] = [(publish, (i,)) for i in range(3)]
    jobs.insert(where, (duplicate_seq, ()))
    try:
        out = run_queued(engine, jobs)
    finally:
        engine.stop()
    refused = out.pop(where)
    assert not refused[0] and isinstance(refused[1], psycopg.IntegrityError), refused  # as it fails alone
    assert all(ok for ok, _ in out), out
    assert sorted(v["seq"] for _, v in out) == [2, 3, 4]  # the three publishes, once each
    assert service.state("m1", None)["head"] == 4
    assert engine.grouped == 0 and engine.given_up == 1


@pytest.mark.parametrize("where", [1, 3], ids=["then-two-more", "last"])
def test_a_privilege_refused_for_one_call_runs_every_call_of_the_group_alone(pg, pg_url, where):
    """A reviewer's: a privilege refused (42501: a REVOKE that only some calls meet) became a storage failure
    that failed the whole group, so publishes that succeed alone got 503 too. In a group it is the group's
    conflict: each call runs again alone, and only the one refused fails, with its 503 saying why."""
    import secrets

    role = f"mp_norights_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} NOLOGIN")
    service, owners = setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    publish = publisher(service, "m1", owners["m1"])

    def refused() -> Any:
        # the call becomes a role without rights on the tables (for its transaction), then reads the log
        def read(tx: Any) -> Any:
            tx.monitor("m1")
            pg._run(
                [("SELECT set_config('role', $1, true)", (role,)), ("SELECT count(*) FROM observations", ())]
            )

        return service._call(read)

    keyed(engine, {publish: "m1", refused: "m1"})
    jobs: list[tuple[Any, tuple[Any, ...]]] = [(publish, (i,)) for i in range(3)]
    jobs.insert(where, (refused, ()))
    try:
        out = run_queued(engine, jobs)
    finally:
        engine.stop()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {role}")
    failed = out.pop(where)
    assert not failed[0] and isinstance(failed[1], ProtocolError), failed
    assert failed[1].code == "UNAVAILABLE" and "privilege" in str(failed[1]), failed
    assert all(ok for ok, _ in out), out  # the publishes: each alone, each committed
    assert sorted(v["seq"] for _, v in out) == [2, 3, 4] and service.state("m1", None)["head"] == 4
    assert engine.grouped == 0 and engine.given_up == 1


FAILURES = {
    # the transaction aborted under the call (the wire also refuses to commit it)
    "statement timeout": [
        ("SELECT set_config('statement_timeout', '1', true)", ()),
        ("SELECT pg_sleep(0.2)", ()),
    ],
    # the connection gone: nothing is left to commit, and the group must not take that for a commit
    "connection lost": [("SELECT pg_terminate_backend(pg_backend_pid())", ())],
}


@pytest.mark.parametrize("where", [1, 2], ids=["middle", "last"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_database_failure_in_one_call_fails_the_whole_group_and_nothing_of_it_is_kept(pg, failure, where):
    service, owners = setup(pg)
    engine = EngineLanes(pg, service, lanes=1)
    publish = publisher(service, "m1", owners["m1"])

    def fails_in_the_database() -> Any:
        # The call holds the group's lock (m1) and the database fails under it: the door answers this call's
        # 503 and goes on, but the group's transaction is gone and none of it may be reported done.
        def read(tx: Any) -> Any:
            tx.monitor("m1")
            return pg._run(FAILURES[failure], prepare=False)

        try:
            return service._call(read)
        except ProtocolError as err:
            return f"answered {err.status}"  # a door that answers and goes on

    keyed(engine, {publish: "m1", fails_in_the_database: "m1"})
    jobs: list[tuple[Any, tuple[Any, ...]]] = [(publish, (0,)), (publish, (1,))]
    jobs.insert(where, (fails_in_the_database, ()))
    try:
        out = run_queued(engine, jobs)
        assert [ok for ok, _ in out] == [False, False, False], out
        for _, err in out:
            assert isinstance(err, ProtocolError) and err.code == "UNAVAILABLE" and err.status == 503
        assert service.state("m1", None)["head"] == 1  # nothing of the group was kept
    finally:
        engine.stop()
    # positive control: the same publishes without the failing call are kept, in one commit
    engine = EngineLanes(pg, service, lanes=1)
    keyed(engine, {publish: "m1"})
    try:
        commits = pg.stats.commits
        out = run_queued(engine, [(publish, (0,)), (publish, (1,))])
        assert all(ok for ok, _ in out) and service.state("m1", None)["head"] == 3
        assert pg.stats.commits - commits == 1
    finally:
        engine.stop()


def test_the_http_door_keys_only_a_rest_publish_by_its_monitor(tmp_path):
    from monitor_protocol.api.rest import RestRouter
    from monitor_protocol.doors.http.app import MonitorApp
    from monitor_protocol.store.memory import MemoryStore

    store = MemoryStore()
    service = MonitorService(store)
    engine = EngineLanes(store, service, lanes=1)
    app = MonitorApp(service, RestRouter(service, allowed_hosts=None), store=store, engine=engine)
    try:
        assert engine.group_key == app._group_key

        def key(method: str, path: str, fn: Any = None) -> str | None:
            return app._group_key(fn or app.handle_job, (Request(method, path),))

        assert key("POST", "/mp/v0/monitors/ci/observations") == "ci"
        assert key("GET", "/mp/v0/monitors/ci/observations") is None
        assert key("POST", "/mp/v0/monitors/ci/state") is None
        assert key("POST", "/mp/v0/monitors//observations") is None
        assert key("POST", "/mp/v0/monitors/a/b/observations") is None
        assert key("POST", "/mp/v0/subscriptions/s/pull") is None
        assert key("POST", "/mp/v0/monitors/ci/observations", fn=print) is None  # not the door's own job
    finally:
        engine.stop()


def test_a_groups_appends_are_told_only_once_committed_and_it_runs_no_lazy_sweep(pg, pg_url):
    """A listener (a parked reader's wake, a feed source's next step) hears a grouped publish only once
    another connection can read it; a group rolled back tells nothing; and the lazy sweep, which locks every
    monitor it sweeps, never runs inside a group (it would wait for locks the group did not start with)."""
    service, owners = setup(pg)
    other = PostgresStore(pg_url)  # a second server's view: what is committed
    heard: list[tuple[str, int, int]] = []
    service.add_listener(lambda m, head: heard.append((m, head, other.get_monitor(m).head)))
    swept: list[bool] = []
    real_sweep = service.sweep
    service.sweep = lambda now=None: swept.append(pg.grouping) or real_sweep(now)  # type: ignore[method-assign]
    service.sweeps_here = lambda: True  # type: ignore[method-assign]  # as on the leader
    engine = EngineLanes(pg, service, lanes=1)
    publish = publisher(service, "m1", owners["m1"])
    keyed(engine, {publish: "m1"})
    try:
        service._deadline_known = False  # a sweep is due: the next call alone would run it
        out = run_queued(engine, [(publish, (i,)) for i in range(4)])
    finally:
        engine.stop()
        other.close()
    assert all(ok for ok, _ in out) and engine.grouped == 3
    assert [h for _m, h, _ in heard] == [2, 3, 4, 5]
    assert all(committed >= head for _m, head, committed in heard), heard  # each told once readable
    assert True not in swept  # no sweep inside the group
    # positive control: the sweep that was due runs in a call of its own
    service.publish("m1", {"type": TYPE}, owners["m1"])
    assert swept and swept[-1] is False


def test_one_loop_turns_publishes_to_one_monitor_go_to_one_lane_as_one_group_of_at_most_max_group(pg):
    """With several lanes idle, the publishes one loop turn submits for a monitor travel as one bundle, so
    one lane takes them together (not one each, queueing on the monitor's lock); a bundle holds at most
    max_group calls, and each of its groups commits once."""
    service, owners = setup(pg)
    publish = publisher(service, "m1", owners["m1"])

    def submit_together(engine: EngineLanes, n: int) -> list[Any]:
        async def main() -> list[Any]:
            return await asyncio.gather(*(engine.submit(publish, i) for i in range(n)))

        return asyncio.run(main())

    for max_group, n, groups in ((32, 12, 1), (5, 12, 3)):
        engine = EngineLanes(pg, service, lanes=4, max_group=max_group)
        keyed(engine, {publish: "m1"})
        try:
            commits = pg.stats.commits
            out = submit_together(engine, n)
        finally:
            engine.stop()
        assert len({r["seq"] for r in out}) == n
        assert pg.stats.commits - commits == groups and engine.grouped == n - groups


def test_publishes_for_a_monitor_whose_group_is_running_are_handed_to_that_lane(pg):
    """Other lanes do not start groups of their own on a monitor a lane is running a group for (they would
    only queue on its lock): they hand the jobs over, and that lane runs them as its next group."""
    service, owners = setup(pg)
    publish = publisher(service, "m1", owners["m1"])
    inside, gate = threading.Event(), threading.Event()

    def holds_the_lock() -> None:  # a call of m1 that holds m1's lock until the gate opens
        def hold(tx: Any) -> None:
            tx.monitor("m1")
            inside.set()
            gate.wait(30)

        service._call(hold)

    engine = EngineLanes(pg, service, lanes=4)
    keyed(engine, {publish: "m1", holds_the_lock: "m1"})

    async def main() -> list[Any]:
        first = engine.submit(holds_the_lock)
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 30)
        later = []
        for i in range(6):  # one loop turn each: six separate items for the idle lanes to take
            later.append(engine.submit(publish, i))
            await asyncio.sleep(0.02)
        commits = pg.stats.commits
        gate.set()
        await first
        out = await asyncio.gather(*later)
        return [pg.stats.commits - commits, out]

    try:
        commits, out = asyncio.run(main())
    finally:
        engine.stop()
    assert sorted(r["seq"] for r in out) == list(range(2, 8))
    assert commits == 1 and engine.grouped == 5  # the six in one group, on the lane that held m1


def test_a_job_taken_while_gathering_runs_right_after_the_group_not_after_every_later_publish(pg):
    """With one lane, a reader's call that waits behind a monitor's group runs as soon as that group ends;
    the publishes for the monitor that keep coming go back into the queue behind it."""
    service, owners = setup(pg)
    publish = publisher(service, "m1", owners["m1"])
    inside, gate = threading.Event(), threading.Event()
    order: list[str] = []

    def holds_the_lock() -> None:
        def hold(tx: Any) -> None:
            tx.monitor("m1")
            inside.set()
            gate.wait(30)

        service._call(hold)
        order.append("held")

    def other() -> None:
        order.append("other")

    def logged(i: int) -> dict[str, Any]:
        out = publish(i)
        order.append(f"p{i}")
        return out

    engine = EngineLanes(pg, service, lanes=1)
    keyed(engine, {logged: "m1", holds_the_lock: "m1"})

    async def main() -> None:
        first = engine.submit(holds_the_lock)
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 30)
        jobs = [engine.submit(logged, 0)]
        await asyncio.sleep(0.02)
        jobs.append(engine.submit(other))
        await asyncio.sleep(0.02)
        jobs += [engine.submit(logged, i) for i in (1, 2)]
        await asyncio.sleep(0.02)
        gate.set()
        await first
        await asyncio.gather(*jobs)

    try:
        asyncio.run(main())
    finally:
        engine.stop()
    # p0 (queued first) starts the next group; `other`, taken while gathering it, runs right after; then p1, p2.
    assert order == ["held", "p0", "other", "p1", "p2"], order
