"""`mp migrate --from FILE.db --to postgresql://...` (engine/monitor_protocol/cli/migrate.py).

An embedded deployment is built by running the real engine on a SQLiteStore (public, private and compacted
monitors; observations of several types and subjects, some with idempotency keys; readers with filters,
pulled and acked to various cursors; a lease), `mp migrate` runs as a subprocess, and the copy is then
driven through the engine over PostgresStore, side by side with the source reopened at the same clock:
every reader's old token pulls the same reply (cursor, rows, redelivery marks), the owner's token
publishes the next seq, the lease is held by its holder, an old idempotency key answers its original
seq, and the monitors' state matches. Then: a second run refuses and writes nothing; a copy damaged behind
the stores' back is caught by `verify`; a live source and bad arguments fail with one line, no traceback.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from enginekit import Clock, as_format_2
from monitor_protocol.cli import migrate
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.sqlite import SQLiteStore
from serverutil import bearer, mp_command, mp_env, running_server

TYPES = ["com.example.ci.run", "com.example.ci.fail", "com.example.ci.deploy"]
ODD_SUBJECT = "build-\x00nul\x01esc"  # PostgreSQL text holds no U+0000: the store encodes its columns


@dataclass
class Reader:
    monitor: str
    sub: str
    token: str
    cursor: int  # the cursor it was left at
    hwm: int  # the highest seq handed out (rows up to it come back marked redelivered)


@dataclass
class World:
    """What the source deployment holds, as its clients know it: tokens, readers, keys, the lease."""

    path: Path
    clock: Clock
    owners: dict[str, str] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)
    readers: dict[str, Reader] = field(default_factory=dict)
    keyed: dict[str, int] = field(default_factory=dict)  # idempotency key -> seq (monitor ci)
    lease_subject: str = "build-3"


def _monitor(svc: MonitorService, mid: str, visibility: str) -> str:
    body = {
        "id": mid,
        "owner": "human:you",
        "types": TYPES,
        "visibility": visibility,
        "capabilities": ["observe", "act"],
        "default_grant": ["observe", "act"] if visibility == "public" else ["observe"],
    }
    return svc.create_monitor(body, None)["owner_token"]


def _publish(svc: MonitorService, mid: str, owner: str, i: int, *, key: str | None = None) -> int:
    subject = ODD_SUBJECT if i == 7 else f"build-{i % 5}"
    body = {"type": TYPES[i % 3], "subject": subject, "data": {"n": i, "ratio": i / 7, "text": f"row {i}"}}
    return svc.publish(mid, body, owner, idempotency_key=key)["seq"]


def _reader(
    svc: MonitorService, mid: str, subscriber: str, token: str | None, **body: Any
) -> tuple[str, str]:
    r = svc.subscribe({"monitor": mid, "subscriber": subscriber, **body}, token)
    return r["subscription"]["id"], r["token"]


def build_source(path: Path) -> World:
    """A real embedded deployment, written by the engine itself on a SQLiteStore (then closed, as a stopped
    mp serve leaves it)."""
    clock = Clock(time.time())  # near the real clock, so a real mp serve on the copy agrees with it
    world = World(path, clock)
    store = SQLiteStore(str(path))
    try:
        svc = MonitorService(store, clock=clock)
        ci = world.owners["ci"] = _monitor(svc, "ci", "public")
        ops = world.owners["ops"] = _monitor(svc, "ops", "private")
        old = world.owners["old"] = _monitor(svc, "old", "public")
        for i in range(40):
            key = f"key-{i}" if i % 4 == 0 else None
            seq = _publish(svc, "ci", ci, i, key=key)
            if key:
                world.keyed[key] = seq
            clock.advance(1)
        # a publish batch, each item with its own key
        batch = [{"type": TYPES[0], "subject": "build-9", "idempotency_key": f"batch-{j}"} for j in range(3)]
        for j, res in enumerate(svc.publish_many("ci", batch, ci)["results"]):
            world.keyed[f"batch-{j}"] = res["seq"]
        for i in range(12):
            _publish(svc, "ops", ops, i)
        # "old": subject build-0 appears only in rows that compaction removes
        svc.publish("old", {"type": TYPES[0], "subject": "only-before-floor"}, old)
        for i in range(1, 20):
            _publish(svc, "old", old, i)

        # readers of ci: types only, pulled past their ack (so a re-pull is marked redelivered)
        sub, tok = _reader(
            svc, "ci", "agent:runs", None, filter={"types": [TYPES[0]]}, **{"from": "earliest"}
        )
        first = svc.pull(sub, tok, limit=4)
        svc.ack(sub, tok, {"cursor": first["next"]})
        again = svc.pull(sub, tok, limit=3)
        world.readers["runs"] = Reader("ci", sub, tok, first["next"], int(again["observations"][-1]["id"]))
        # a subject filter, never acked
        sub, tok = _reader(svc, "ci", "agent:build2", None, filter={"subjects": ["build-2"]}, **{"from": 0})
        got = svc.pull(sub, tok, limit=2)
        world.readers["build2"] = Reader("ci", sub, tok, 0, int(got["observations"][-1]["id"]))
        # a worker with the act capability, holding a lease
        sub, tok = _reader(svc, "ci", "agent:worker", None, capabilities=["observe", "act"], **{"from": 0})
        got = svc.pull(sub, tok, limit=10)
        svc.ack(sub, tok, {"cursor": got["next"]})
        svc.lease(sub, tok, "claim", {"subject": world.lease_subject, "lease_duration_seconds": 3600})
        world.readers["worker"] = Reader("ci", sub, tok, got["next"], int(got["observations"][-1]["id"]))
        # the private monitor: a reader granted by the owner's token
        sub, tok = _reader(svc, "ops", "agent:private", ops, **{"from": 0})
        got = svc.pull(sub, tok, limit=5)
        acked = int(got["observations"][2]["id"])
        svc.ack(sub, tok, {"cursor": acked})
        world.readers["private"] = Reader("ops", sub, tok, acked, int(got["observations"][-1]["id"]))
        # the compacted monitor: floor > 1, a reader from its earliest row
        compacted = svc.compact("old", 8)["compacted"][0]
        assert compacted["retention_floor"] == 9
        caps = ["observe", "act"]
        sub, tok = _reader(svc, "old", "agent:late", None, capabilities=caps, **{"from": "earliest"})
        got = svc.pull(sub, tok, limit=3)
        world.readers["late"] = Reader("old", sub, tok, 9, int(got["observations"][-1]["id"]))
        for mid in ("ci", "ops", "old"):
            world.heads[mid] = svc.state(mid, world.owners[mid])["head"]
    finally:
        store.close()
    return world


def run_migrate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mp_command("migrate", *args), env=mp_env(), capture_output=True, text=True, timeout=timeout
    )


def with_password(url: str) -> tuple[str, str | None]:
    """The URL with a password in it when the server accepts one it does not check (trust), so that the test
    can see it is never printed; else the URL as it is, and its own password if it has one."""
    import psycopg

    parts = urllib.parse.urlsplit(url)
    if parts.password:
        return url, parts.password
    user = parts.username or "mp"
    host = parts.netloc.rpartition("@")[2]
    candidate = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:hunter2-secret@{host}"))
    try:
        psycopg.connect(candidate, connect_timeout=5).close()
    except psycopg.Error:
        return url, None
    return candidate, "hunter2-secret"


def dump_target(url: str) -> dict[str, Any]:
    """Every row of every table of the target, as PostgreSQL sees it."""
    import psycopg

    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname='public'")]
        for table in sorted(tables):
            out[table] = conn.execute(
                f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} t"
            ).fetchone()
    return out


def pg_execute(url: str, sql: str, params: Any = None) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).rowcount


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_source(tmp_path / "monitor-protocol.db")


@pytest.fixture
def migrated(world: World, pg_url: str) -> tuple[World, str, subprocess.CompletedProcess[str]]:
    url, _ = with_password(pg_url)
    proc = run_migrate("--from", str(world.path), "--to", url, "--batch", "7")
    assert proc.returncode == 0, proc.stderr
    return world, pg_url, proc


def _both(world: World, pg_url: str) -> tuple[MonitorService, MonitorService, Any, Any]:
    from monitor_protocol.store.postgres import PostgresStore

    src = SQLiteStore(str(world.path))
    dst = PostgresStore(pg_url)
    return MonitorService(src, clock=world.clock), MonitorService(dst, clock=world.clock), src, dst


def _error(fn: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        fn()
    return caught.value


# ===================================================================================== the copy
def test_migrate_copies_a_deployment_that_the_engine_serves_on_postgres(tmp_path: Path, pg_url: str) -> None:
    world = build_source(tmp_path / "monitor-protocol.db")
    url, password = with_password(pg_url)
    proc = run_migrate("--from", str(world.path), "--to", url, "--batch", "7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:3]] == ["monitor ci", "monitor old", "monitor ops"]
    assert all(ln.endswith(": verified") for ln in lines[:3]), lines
    assert lines[0].startswith(f"monitor ci: {world.heads['ci']} observations (seqs 1-{world.heads['ci']}),")
    assert "3 subscriptions, 1 lease, 13 publish keys" in lines[0]
    assert lines[1].startswith(f"monitor old: {world.heads['old'] - 8} observations (seqs 9-")
    assert lines[3].startswith("copied 3 monitors: ") and lines[3].endswith("; every monitor verified")
    assert " s;" in lines[3] and len(lines) == 4
    if password:
        assert password not in proc.stdout + proc.stderr
        assert ":***@" in lines[3]

    src_svc, pg_svc, src, dst = _both(world, pg_url)
    try:
        # the copy as records: the same everywhere the stores can be read
        assert [m.to_row() for m in dst.list_monitors()] == [m.to_row() for m in src.list_monitors()]
        assert [s.to_row() for s in dst.list_subscriptions()] == [
            s.to_row() for s in src.list_subscriptions()
        ]
        assert [x.to_row() for x in dst.list_leases()] == [x.to_row() for x in src.list_leases()]
        assert dst.has_subject("ci", ODD_SUBJECT) and dst.has_subject("old", "only-before-floor")
        assert migrate.verify(src, dst) == {}

        # each monitor's state as its owner reads it
        for mid, owner in world.owners.items():
            assert pg_svc.state(mid, owner) == src_svc.state(mid, owner)
            assert pg_svc.get_monitor(mid, owner) == src_svc.get_monitor(mid, owner)
        assert pg_svc.state("old", world.owners["old"])["retention_floor"] == 9

        # every reader's old token pulls the same reply: same cursor, same rows, same redelivery marks
        for name, reader in world.readers.items():
            mine = pg_svc.pull(reader.sub, reader.token, limit=4)
            assert mine == src_svc.pull(reader.sub, reader.token, limit=4), name
            assert mine["cursor"] == reader.cursor, name
            marked = [int(o["id"]) for o in mine["observations"] if o.get("redelivered")]
            assert all(seq <= reader.hwm for seq in marked), name
        runs = world.readers["runs"]
        again = pg_svc.pull(runs.sub, runs.token, limit=2)
        assert again["redelivered"] == 2 and all(o["redelivered"] for o in again["observations"])
        # acking moves on from there, on both sides alike
        done = pg_svc.ack(runs.sub, runs.token, {"cursor": again["next"]})
        assert done == src_svc.ack(runs.sub, runs.token, {"cursor": again["next"]})
        # a stranger's token is still nobody's
        assert _error(lambda: pg_svc.pull(runs.sub, "mpr_not-a-token")).code == "UNAUTHORIZED"
        # the private monitor stays private
        assert _error(lambda: pg_svc.subscribe({"monitor": "ops", "subscriber": "x:y"}, None)).code == (
            "NOT_FOUND"
        )

        # the lease is held by its holder: it renews, another reader cannot claim it
        worker = world.readers["worker"]
        renewed = pg_svc.lease(worker.sub, worker.token, "renew", {"subject": world.lease_subject})
        assert renewed["lease"]["holder"] == f"sub:{worker.sub}"
        other, other_tok = _reader(pg_svc, "ci", "agent:rival", None, capabilities=["observe", "act"])
        claim = lambda: pg_svc.lease(other, other_tok, "claim", {"subject": world.lease_subject})  # noqa: E731
        assert _error(claim).code == "LEASE_HELD"
        # a subject seen only in compacted rows is still known: a lease may name it
        late = world.readers["late"]
        got = pg_svc.lease(late.sub, late.token, "claim", {"subject": "only-before-floor"})
        assert got["lease"]["holder"] == f"sub:{late.sub}"

        # an old idempotency key answers its original seq; the owner's token publishes the next seq
        ci = world.owners["ci"]
        for key in ("key-0", "key-36", "batch-1"):
            body = {"type": TYPES[0], "subject": "retry"}
            again = pg_svc.publish("ci", body, ci, idempotency_key=key)
            assert (again["seq"], again["idempotent"]) == (world.keyed[key], True), key
        head = pg_svc.state("ci", ci)["head"]
        assert head > world.heads["ci"]  # the lease renewal and the new subscription were logged
        fresh = pg_svc.publish("ci", {"type": TYPES[1], "subject": "after-the-move"}, ci)
        assert fresh["seq"] == head + 1
        ops = world.owners["ops"]
        assert pg_svc.publish("ops", {"type": TYPES[0]}, ops)["seq"] == world.heads["ops"] + 1
    finally:
        src.close()
        dst.close()


def test_a_second_run_refuses_and_writes_nothing(migrated: tuple[World, str, Any]) -> None:
    world, pg_url, _ = migrated
    before = dump_target(pg_url)
    proc = run_migrate("--from", str(world.path), "--to", pg_url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "already holds 3 monitors (ci, old, ops)" in proc.stderr and "has written nothing" in proc.stderr
    assert dump_target(pg_url) == before

    # what an interrupted run leaves (records, but no monitor row yet) is refused too
    assert pg_execute(pg_url, "DELETE FROM monitors") == 3
    before = dump_target(pg_url)
    proc = run_migrate("--from", str(world.path), "--to", pg_url)
    assert proc.returncode == 2
    assert "holds no monitor but already holds" in proc.stderr and "has written nothing" in proc.stderr
    assert dump_target(pg_url) == before


def test_verify_finds_what_differs_in_a_damaged_copy(migrated: tuple[World, str, Any]) -> None:
    from monitor_protocol.store.postgres import PostgresStore

    world, pg_url, _ = migrated
    src, dst = SQLiteStore(str(world.path)), PostgresStore(pg_url)
    try:
        assert migrate.verify(src, dst) == {}
        good = migrate.verify_monitor(src, dst, "ci")
        assert good.ok and good.source.digest == good.target.digest
        assert (good.source.observations, good.source.subscriptions, good.source.leases) == (
            world.heads["ci"],
            3,
            1,
        )

        # one row of the log deleted behind the store's back
        assert pg_execute(pg_url, "DELETE FROM observations WHERE monitor='ci' AND seq=17") == 1
        found = migrate.verify(src, dst)
        assert list(found) == ["ci"]
        n = world.heads["ci"]
        assert found["ci"] == [
            f"observations: {n} in the source, {n - 1} in the target",
            "the log differs first at seq 17: missing in the target",
        ]
        check = migrate.verify_monitor(src, dst, "ci")
        assert check.source.digests["observations"] != check.target.digests["observations"]
        assert check.source.digests["subscriptions"] == check.target.digests["subscriptions"]

        # a reader's cursor, a publish key, a subject and an event changed or lost
        runs = world.readers["runs"]
        pg_execute(pg_url, "UPDATE subscriptions SET cursor = cursor - 1 WHERE id = %s", (runs.sub,))
        pg_execute(pg_url, "DELETE FROM publish_keys WHERE monitor='ops' OR key='key-8'")
        pg_execute(pg_url, "DELETE FROM subjects WHERE monitor='old' AND subject='only-before-floor'")
        pg_execute(
            pg_url, "UPDATE observations SET event = replace(event, 'row 3', 'row X') WHERE monitor='ops'"
        )
        found = migrate.verify(src, dst)
        assert sorted(found) == ["ci", "old", "ops"]
        assert (
            f"subscription {runs.sub!r}: cursor is {runs.cursor} in the source, {runs.cursor - 1} in the target"
            in found["ci"]
        )
        assert "publish key 'key-8': missing in the target" in found["ci"]
        assert "subject 'only-before-floor': missing in the target" in found["old"]
        assert any(
            d.startswith("the log differs first at seq ") and "not the source's" in d for d in found["ops"]
        )
    finally:
        src.close()
        dst.close()

    # the command says the same, and fails
    proc = run_migrate("--from", str(world.path), "--to", pg_url, "--verify-only")
    assert proc.returncode == 1
    assert "monitor ci: the log differs first at seq 17: missing in the target" in proc.stderr
    assert "the target differs from the source in 3 monitors (ci, old, ops)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "monitor ci: " in proc.stdout and "DIFFERS in the target" in proc.stdout
    # an operator's: the last line said "verified 3 monitors" of a copy that differed
    assert proc.stdout.splitlines()[-1].startswith("compared 3 monitors"), proc.stdout
    # and a difference inside an object (the counters) was cut off before the key that differs
    assert migrate._record_differences(
        "monitor", {"counters": {"delivered": 1, "pulls": 2}}, {"counters": {"delivered": 3, "pulls": 2}}
    ) == ["monitor: counters.delivered is 1 in the source, 3 in the target"]


def test_copy_monitor_writes_transactions_of_bounded_size(world: World, pg_url: str) -> None:
    from monitor_protocol.store.postgres import PostgresStore

    src, dst = SQLiteStore(str(world.path)), PostgresStore(pg_url)
    try:
        fp = migrate.fingerprint(src, "ci")
        records = fp.observations + fp.subjects + fp.publish_keys + fp.subscriptions + fp.leases + 1
        migrate.copy_monitor(src, dst, "ci", batch=10)
        assert dst.stats.commits == -(-records // 10)  # ceil: every transaction but the last holds 10
        assert migrate.verify_monitor(src, dst, "ci").ok
        assert [m.id for m in dst.list_monitors()] == ["ci"]  # the other monitors were not touched
    finally:
        src.close()
        dst.close()


def test_mp_serve_on_the_copy_answers_the_old_tokens(
    migrated: tuple[World, str, Any], tmp_path: Path
) -> None:
    import httpx

    world, pg_url, _ = migrated
    with running_server(tmp_path, "--db", pg_url) as (base, _proc):
        api = base + "/mp/v0"
        for name, reader in world.readers.items():
            r = httpx.get(f"{api}/subscriptions/{reader.sub}/pull", headers=bearer(reader.token), timeout=10)
            assert r.status_code == 200, (name, r.text)
            assert r.json()["cursor"] == reader.cursor, name
        r = httpx.post(
            f"{api}/monitors/ci/observations",
            json={"type": TYPES[0], "subject": "served"},
            headers=bearer(world.owners["ci"]),
            timeout=10,
        )
        assert r.status_code in (200, 201), r.text
        assert r.json()["seq"] > world.heads["ci"]


def test_an_unfinished_copy_is_never_served(
    world: World, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an operator: mp migrate killed half way left a database that mp serve started on, serving
    the monitors copied and failing on the next one with a 503 that said to retry, for ever. The mark
    written before the first record is still there when the run does not finish: mp serve and any store
    opening refuse the database, and a second run names it. The control: the finished run removes it."""
    from monitor_protocol.store.postgres import IncompleteCopy, PostgresStore

    real = migrate.copy_monitor
    copied: list[str] = []

    def dies_on_the_second(source: Any, target: Any, monitor_id: str, **kw: Any) -> None:
        if copied:
            raise KeyboardInterrupt  # as a kill would: nothing after it runs
        copied.append(monitor_id)
        real(source, target, monitor_id, **kw)

    monkeypatch.setattr(migrate, "copy_monitor", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        migrate.migrate(str(world.path), pg_url, out=lambda line: None, err=lambda line: None)
    with pytest.raises(IncompleteCopy, match="holds an unfinished copy: mp migrate from .* began at"):
        PostgresStore(pg_url)
    served = subprocess.run(
        mp_command("serve", "--db", pg_url, "--port", "0"),
        env=mp_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 1 and "holds an unfinished copy" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr
    again = run_migrate("--from", str(world.path), "--to", pg_url)
    assert again.returncode == 2 and "holds an unfinished copy" in again.stderr, again.stderr

    # the control: a run that finishes and verifies removes the mark, and the database opens
    pg_execute(
        pg_url,
        "DROP TABLE observations, subjects, publish_keys, subscriptions, leases, monitors, mp_meta CASCADE",
    )
    monkeypatch.setattr(migrate, "copy_monitor", real)
    assert migrate.migrate(str(world.path), pg_url, out=lambda line: None, err=lambda line: None).verified
    PostgresStore(pg_url).close()

    # a reviewer's: a copy that is whole but still marked (killed after its last write) is cleared by a
    # --verify-only run that finds every monitor whole, and only then
    pg_execute(pg_url, "INSERT INTO mp_meta (key, value) VALUES ('migrating', 'from x began at y')")
    with pytest.raises(IncompleteCopy):
        PostgresStore(pg_url)
    assert run_migrate("--from", str(world.path), "--to", pg_url, "--verify-only").returncode == 0
    PostgresStore(pg_url).close()


def test_a_database_with_another_programs_tables_is_refused_before_anything_is_written(
    world: World, pg_url: str
) -> None:
    """Found by an operator: a database that already had a `monitors` table of another program got mp's
    tables created beside it, then failed with a raw SQL error over three lines. Now one line, before
    anything is created (no mp_meta after); the control: the same database without that table migrates."""
    from monitor_protocol.store.postgres import ForeignTables, PostgresStore

    pg_execute(pg_url, "CREATE TABLE monitors (id int PRIMARY KEY, name text)")
    with pytest.raises(ForeignTables, match="already has tables named monitors, another program's"):
        PostgresStore(pg_url)
    proc = run_migrate("--from", str(world.path), "--to", pg_url)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "another program's" in proc.stderr and "Traceback" not in proc.stderr
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('mp_meta') IS NULL").fetchone() == (True,)
    pg_execute(pg_url, "DROP TABLE monitors")
    assert run_migrate("--from", str(world.path), "--to", pg_url).returncode == 0  # control


# ===================================================================================== refusals
def test_a_live_source_is_refused_with_the_stores_own_message(world: World, pg_url: str) -> None:
    held = SQLiteStore(str(world.path))  # as a running mp serve holds it
    try:
        proc = run_migrate("--from", str(world.path), "--to", pg_url)
    finally:
        held.close()
    assert proc.returncode == 1
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"is already open for writing by pid {os.getpid()}" in proc.stderr
    assert "a live one would keep changing under the copy" in proc.stderr
    assert dump_target(pg_url) == {}  # the target was not even opened: not a table was created


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "status", "words"),
    [
        ("missing-source", 1, "does not exist"),
        ("not-a-url", 2, "--to must be a postgresql:// URL"),
        ("sqlite-path-as-target", 2, "--to must be a postgresql:// URL"),
        ("unreachable", 1, "Connection refused"),
        ("bad-port", 1, "cannot connect to PostgreSQL at postgresql://mp:***@127.0.0.1:notaport/db"),
        ("not-a-database", 1, "is damaged or is not a SQLite database"),
        ("empty-source", 1, "holds no Monitor Protocol database"),
        ("another-programs-database", 1, "holds no Monitor Protocol database"),
    ],
)
def test_bad_arguments_fail_in_one_line_without_a_traceback(
    tmp_path: Path, case: str, status: int, words: str
) -> None:
    pytest.importorskip("psycopg")
    source = tmp_path / "monitor-protocol.db"
    SQLiteStore(str(source)).close()
    target = f"postgresql://mp:hunter2-secret@127.0.0.1:{_closed_port()}/db"
    if case == "missing-source":
        source = tmp_path / "nowhere.db"
    elif case == "not-a-url":
        target = "mysql://mp:hunter2-secret@127.0.0.1/db"
    elif case == "sqlite-path-as-target":
        target = str(tmp_path / "other.db")
    elif case == "bad-port":
        target = "postgresql://mp:hunter2-secret@127.0.0.1:notaport/db"
    elif case == "not-a-database":
        source.write_bytes(b"this is not a database, only text" * 200)
    elif case == "empty-source":
        source = tmp_path / "empty.db"
        source.write_bytes(b"")
    elif case == "another-programs-database":
        source = tmp_path / "notes.db"
        with sqlite3.connect(source) as con:
            con.execute("CREATE TABLE notes (text TEXT)")
            con.execute("CREATE TABLE monitors (name TEXT)")  # a table of the same name is not enough
        con.close()
    before = source.read_bytes() if source.exists() else None
    proc = run_migrate("--from", str(source), "--to", target, timeout=60)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("mp migrate: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr and "hunter2-secret" not in proc.stderr
    if case == "missing-source":
        assert not source.exists()  # never created by the attempt
    else:
        assert source.read_bytes() == before  # the source is never written, whatever it holds
    if case == "sqlite-path-as-target":
        assert not Path(target).exists()


def test_shown_url_never_shows_a_password() -> None:
    assert migrate.shown_url("postgresql://mp:pw@h:5432/db") == "postgresql://mp:***@h:5432/db"
    assert migrate.shown_url("host=h password=pw dbname=d") == "host=h password=*** dbname=d"
    assert "p%40ss" not in migrate._scrub(
        "failed for postgresql://mp:p%40ss@h/db", "postgresql://mp:p%40ss@h/db"
    )
    assert migrate._scrub("a message quoting p@ss", "postgresql://mp:p%40ss@h/db") == "a message quoting ***"
    query = "postgresql://h/db?user=mp&password=s3cret&sslmode=require"
    assert migrate.shown_url(query) == "postgresql://h/db?user=mp&password=***&sslmode=require"
    assert "s3cret" not in migrate._scrub(f"{query} said s3cret", query)
    # A tester's: the role mpweak with the password weak and the database weakdb. Names that hold the
    # password are left whole (masked, "mp***" would show it); the password alone is still masked.
    weak = "postgresql://mpweak:weak@127.0.0.1:5432/weakdb"
    said = 'FATAL: database "weakdb" does not exist; role mpweak; password "weak"; weak'
    assert (
        migrate._scrub(said, weak)
        == 'FATAL: database "weakdb" does not exist; role mpweak; password "***"; ***'
    )


def _format(path: Path) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("PRAGMA user_version").fetchone()[0])
    finally:
        raw.close()


def test_a_format_2_source_is_not_upgraded_for_a_target_that_does_not_answer(
    world: World, pg_url: str
) -> None:
    """Found by an operator upgrading in place: a typo in --to failed the run, but only after the source had
    been brought to format 3, which the build that wrote it then refused. The target answers first now, and
    a run that upgrades the source says so."""
    as_format_2(world.path)
    typo = f"postgresql://mp@127.0.0.1:{_closed_port()}/typo"
    refused = run_migrate("--from", str(world.path), "--to", typo)
    assert refused.returncode == 1 and "Connection refused" in refused.stderr
    assert _format(world.path) == 2  # left in the format of the build that wrote it
    done = run_migrate("--from", str(world.path), "--to", pg_url)
    assert done.returncode == 0, done.stderr
    assert f"the source {world.path} was brought from format 2 to 3" in done.stdout
    assert _format(world.path) == 3
    again = run_migrate("--from", str(world.path), "--to", pg_url, "--verify-only")
    assert again.returncode == 0 and "brought from format" not in again.stdout  # control: said once
