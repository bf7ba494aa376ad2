"""Stores written by the format before typed records (version 1, commit 00e022d) open after it.

tests/fixtures/v1-store.db is such a SQLite file (made by tests/fixtures/make_v1_store.py at that commit;
its tokens and the engine's snapshot are in v1-store.json). Every test copies it to tmp_path first: opening
migrates in place. The memory store (the browser's IndexedDB door) loads version 1 rows as well.

The last section (ENGINE-LEVEL) drives MonitorService over the migrated file: the fixture's tokens still
work and the engine's snapshot is what version 1 served."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus, SubscriptionState
from monitor_protocol.core.records import (
    Observation,
    PublishKey,
    lease_from_v1,
    monitor_from_v1,
    subscription_from_v1,
)
from monitor_protocol.core.store_contract import Changes
from monitor_protocol.store import migrate_v1
from monitor_protocol.store.indexeddb import decode_records, record_key
from monitor_protocol.store.memory import MemoryStore, observation_key, pair_key
from monitor_protocol.store.sqlite import SCHEMA_VERSION, SQLiteStore, StoreCorrupt, StoreVersionError

FIXTURES = Path(__file__).parent / "fixtures"
V1_DB = FIXTURES / "v1-store.db"
V1_JSON = json.loads((FIXTURES / "v1-store.json").read_text(encoding="utf-8"))


@pytest.fixture
def v1_path(tmp_path) -> Path:
    """A private copy of the fixture (the original is never opened: opening migrates)."""
    path = tmp_path / "v1-store.db"
    shutil.copyfile(V1_DB, path)
    return path


def read_v1(path: Path) -> dict[str, list[tuple]]:
    """The version 1 tables, read straight from the file."""
    db = sqlite3.connect(path)
    tables = {
        "monitors": "SELECT id, rec FROM monitors ORDER BY id",
        "observations": "SELECT monitor, seq, event FROM observations ORDER BY monitor, seq",
        "subscriptions": "SELECT id, rec FROM subscriptions ORDER BY id",
        "leases": "SELECT monitor, subject, rec FROM leases ORDER BY monitor, subject",
        "idempotency": "SELECT monitor, key, rec FROM idempotency ORDER BY monitor, key",
        "subjects": "SELECT monitor, subject FROM subjects ORDER BY monitor, subject",
    }
    out = {name: db.execute(sql).fetchall() for name, sql in tables.items()}
    db.close()
    return out


def user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def tables(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()


def assert_holds_v1(store, v1: dict[str, list[tuple]]) -> None:
    """Every record of the v1 tables is in `store`, converted."""
    assert store.list_monitors() == [monitor_from_v1(json.loads(rec)) for _, rec in v1["monitors"]]
    by_monitor: dict[str, list[Observation]] = {}
    for monitor, seq, event in v1["observations"]:
        by_monitor.setdefault(monitor, []).append(Observation.of(monitor, seq, json.loads(event)))
    for monitor, rows in by_monitor.items():
        assert list(store.scan(monitor, 1, 10**6)) == rows
        assert [o.event for o in rows] == [json.loads(e) for m, _, e in v1["observations"] if m == monitor]
    assert store.list_subscriptions() == [
        subscription_from_v1(json.loads(rec)) for _, rec in v1["subscriptions"]
    ]
    assert store.list_leases() == [lease_from_v1(json.loads(rec)) for _, _, rec in v1["leases"]]
    for monitor, key, rec in v1["idempotency"]:
        assert store.get_publish_key(monitor, key) == PublishKey(monitor, key, **json.loads(rec))
    for monitor, subject in v1["subjects"]:
        assert store.has_subject(monitor, subject)


def assert_fixture_facts(store) -> None:
    """What the fixture script did, read back field by field (not only through the converters)."""
    ci, private = store.get_monitor("ci"), store.get_monitor("private-one")
    assert (ci.head, ci.floor, ci.status, ci.counters.observations, ci.counters.delivered) == (
        59,
        6,
        MonitorStatus.ACTIVE,
        40,
        15,
    )
    assert ci.limits == {"observations_per_day": 1000} and ci.budget_used == 40 and ci.subscribe_hash
    assert private.status is MonitorStatus.PAUSED and private.head == 3 and private.owner == "human:ana"
    assert [o.seq for o in store.scan("ci", 1, 100)] == list(range(6, 60))  # compacted below 6
    assert store.get_observation("ci", 8).event["data"]["text"] == "naïve ✓"
    assert store.count("ci", 1, 100) == 54 and store.count("private-one", 1, 100) == 3
    reader_id, _ = V1_JSON["tokens"]["reader"]
    worker_id, _ = V1_JSON["tokens"]["worker"]
    reader, worker = store.get_subscription(reader_id), store.get_subscription(worker_id)
    assert (reader.cursor, reader.hwm, reader.grant, reader.subscriber) == (
        11,
        15,
        "subscribe",
        "agent:reader",
    )
    assert reader.last_ack.cursor == 11 and reader.last_ack.reply["lag"] == 33 and reader.sink_secret is None
    assert worker.grant == "owner" and worker.filter == {"types": ["com.example.ci.deploy"]}
    assert store.find_subscription_by_token(reader.token_hash) == reader
    assert store.find_subscription("ci", "agent:gone").state is SubscriptionState.RETIRED
    assert store.count_active_subscriptions("ci") == 2
    held, done, dead = (store.get_lease("ci", f"build-{i}") for i in (1, 2, 3))
    assert held.state is LeaseState.HELD and held.holder == f"sub:{worker_id}" and held.duration == 3600
    assert done.state is LeaseState.FREE and done.completed.outcome == "done" and done.completed.seq == 47
    assert dead.state is LeaseState.DEAD_LETTERED and dead.dead_letter and dead.attempts == 5
    assert [store.get_publish_key("ci", f"k-{i}").seq for i in range(36, 41)] == [37, 38, 39, 40, 41]
    assert store.get_publish_key("ci", "k-35") is None
    assert store.has_subject("ci", "build-4") and store.has_subject("private-one", "s")


# ===================================================================================== SQLite, in place
def test_a_v1_file_migrates_in_place(v1_path):
    v1 = read_v1(v1_path)
    assert user_version(v1_path) == 0
    store = SQLiteStore(str(v1_path))
    assert store.migrated == {
        "monitors": 2,
        "observations": 57,
        "subscriptions": 3,
        "leases": 3,
        "idempotency": 5,
    }
    assert_holds_v1(store, v1)
    assert_fixture_facts(store)
    assert store.stats.commits == 0  # the migration is not an engine call
    store.close()
    assert user_version(v1_path) == SCHEMA_VERSION
    assert tables(v1_path) == {
        "monitors",
        "observations",
        "subjects",
        "subscriptions",
        "leases",
        "publish_keys",
    }


def test_a_second_open_is_a_no_op(v1_path):
    v1 = read_v1(v1_path)
    SQLiteStore(str(v1_path)).close()
    digest = hashlib.sha256(v1_path.read_bytes()).hexdigest()
    again = SQLiteStore(str(v1_path))
    assert again.migrated is None
    assert_holds_v1(again, v1)
    again.close()
    assert hashlib.sha256(v1_path.read_bytes()).hexdigest() == digest  # not a byte written


def test_the_migrated_file_takes_new_writes(v1_path):
    store = SQLiteStore(str(v1_path))
    reader = store.get_subscription(V1_JSON["tokens"]["reader"][0])
    nxt = Observation.of("ci", 60, {"id": "60", "type": "com.example.ci.run", "subject": "build-9"})
    with store.transaction():
        store.apply(
            Changes(observations=[nxt], subscriptions=[reader.__class__(**{**_fields(reader), "cursor": 20})])
        )
    store.close()
    store = SQLiteStore(str(v1_path))
    assert store.get_observation("ci", 60) == nxt and store.get_subscription(reader.id).cursor == 20
    store.close()


def _fields(rec) -> dict:
    return {name: getattr(rec, name) for name in rec.__dataclass_fields__}


def test_a_newer_format_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "future.db"
    SQLiteStore(str(path)).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(
        StoreVersionError, match=rf"version {SCHEMA_VERSION + 1}.*version {SCHEMA_VERSION}"
    ) as info:
        SQLiteStore(str(path))
    assert "newer" in str(info.value) and str(path) in str(info.value)
    assert isinstance(info.value, StoreCorrupt)  # every door that refuses a damaged file refuses this one
    assert user_version(path) == SCHEMA_VERSION + 1
    SQLiteStore(str(path.with_name("other.db"))).close()  # and the lock was released: nothing held


def test_a_failed_migration_leaves_the_v1_file_as_it_was(v1_path, monkeypatch):
    before = read_v1(v1_path)

    def broken(rec):
        raise ValueError("no")

    monkeypatch.setattr(migrate_v1, "lease_from_v1", broken)  # after monitors, the log and subscriptions
    with pytest.raises(StoreVersionError, match=r"version 1 and could not be migrated.*leases record"):
        SQLiteStore(str(v1_path))
    assert user_version(v1_path) == 0 and read_v1(v1_path) == before
    assert tables(v1_path) == {
        "monitors",
        "observations",
        "subjects",
        "subscriptions",
        "leases",
        "idempotency",
    }
    monkeypatch.undo()
    store = SQLiteStore(str(v1_path))  # the lock was released, and the file still migrates
    assert_holds_v1(store, before)
    store.close()


CRASH = """
import os, sys
sys.path.insert(0, sys.argv[2])
from monitor_protocol.store import migrate_v1
from monitor_protocol.store.sqlite import SQLiteStore

def die(rec):  # the power goes out once the log and the subscriptions are copied
    os._exit(9)

migrate_v1.lease_from_v1 = die
SQLiteStore(sys.argv[1])
"""


def test_a_crash_mid_migration_leaves_the_v1_file_usable(v1_path):
    before = read_v1(v1_path)
    engine = str(Path(__file__).parent.parent / "engine")
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(v1_path), engine], capture_output=True, timeout=60
    )
    assert proc.returncode == 9, proc.stderr
    assert user_version(v1_path) == 0 and read_v1(v1_path) == before
    store = SQLiteStore(str(v1_path))  # the dead process's lock and note are no obstacle
    assert store.migrated is not None
    assert_holds_v1(store, before)
    store.close()


# ===================================================================================== memory / IndexedDB
def v1_journal(v1: dict[str, list[tuple]]) -> list[tuple[str, str, object]]:
    """The fixture's records as the version 1 MemoryStore journaled them into IndexedDB."""
    rows: list[tuple[str, str, object]] = []
    rows += [("monitors", mid, json.loads(rec)) for mid, rec in v1["monitors"]]
    rows += [("observations", observation_key(m, seq), json.loads(ev)) for m, seq, ev in v1["observations"]]
    rows += [("subjects", json.dumps([m, s]), {"monitor": m}) for m, s in v1["subjects"]]
    rows += [("subscriptions", sid, json.loads(rec)) for sid, rec in v1["subscriptions"]]
    rows += [("leases", json.dumps([m, s]), json.loads(rec)) for m, s, rec in v1["leases"]]
    rows += [("idempotency", json.dumps([m, k]), json.loads(rec)) for m, k, rec in v1["idempotency"]]
    return rows


def through_indexeddb(rows) -> list:
    """As boot.js stores them (`[table, key]` -> JSON text) and loadAll() + decode_records read them back."""
    persisted = {record_key(table, key): json.dumps(value) for table, key, value in rows}
    return decode_records(json.dumps(sorted(persisted.items())))


def test_the_memory_store_loads_v1_rows(v1_path):
    v1 = read_v1(v1_path)
    mem = MemoryStore()
    mem.load(through_indexeddb(v1_journal(v1)))
    assert_holds_v1(mem, v1)
    assert_fixture_facts(mem)
    assert mem.drain_changes() == []  # loading writes nothing back
    sqlite_store = SQLiteStore(str(v1_path))  # and both stores read the same records out of version 1
    assert mem.list_monitors() == sqlite_store.list_monitors()
    assert mem.list_subscriptions() == sqlite_store.list_subscriptions()
    assert mem.list_leases() == sqlite_store.list_leases()
    sqlite_store.close()


def test_a_v1_row_is_rewritten_in_place_when_it_changes(v1_path):
    """A browser's old record is overwritten under its own key by the new shape, and a mix loads."""
    v1 = read_v1(v1_path)
    rows = v1_journal(v1)
    mem = MemoryStore()
    mem.load(through_indexeddb(rows))
    ci = mem.get_monitor("ci")
    reader = mem.get_subscription(V1_JSON["tokens"]["reader"][0])
    mem.apply(
        Changes(
            monitors=[ci.__class__(**{**_fields(ci), "head": 60})],
            publish_keys=[PublishKey("ci", "k-40", 41, 5.0)],
        )
    )
    written = mem.drain_changes()
    assert [(t, k) for t, k, _ in written] == [("monitors", "ci"), ("idempotency", pair_key("ci", "k-40"))]
    merged = {record_key(t, k): v for t, k, v in rows}
    merged.update({record_key(t, k): v for t, k, v in written})
    assert len(merged) == len(rows)  # overwritten, not added beside
    again = MemoryStore()
    again.load(decode_records(json.dumps(sorted((k, json.dumps(v)) for k, v in merged.items()))))
    assert again.get_monitor("ci").head == 60 and again.get_publish_key("ci", "k-40").at == 5.0
    assert again.get_subscription(reader.id) == reader  # still the v1 row, converted


# ===================================================================================== ENGINE-LEVEL
# These drive MonitorService over the migrated fixture. Expected values are what the version 1 engine
# answered on this fixture at the fixture's clock.
def _service(v1_path):
    from monitor_protocol.core.service import MonitorService

    store = SQLiteStore(str(v1_path))
    return store, MonitorService(store, clock=lambda: V1_JSON["clock"])


def test_engine_level_the_snapshot_matches_after_migration(v1_path):
    store, svc = _service(v1_path)
    expected = copy.deepcopy(V1_JSON["snapshot"])
    for entry in expected["monitors"]:
        # One deliberate change: the state's counters are kept since seq 1, compacted rows included, and
        # computed_from now says so (version 1 said retention_floor..head beside counters that it was not).
        entry["state"]["computed_from"]["seq_from"] = 1
    try:
        assert svc.snapshot() == expected
        assert V1_JSON["snapshot"]["monitors"][0]["state"]["computed_from"]["seq_from"] == 6  # compacted
    finally:
        store.close()


def test_engine_level_the_fixture_tokens_still_work(v1_path):
    from monitor_protocol.core.errors import ProtocolError

    store, svc = _service(v1_path)
    tokens = V1_JSON["tokens"]
    try:
        reader_id, reader_token = tokens["reader"]
        page = svc.pull(reader_id, reader_token, limit=6)
        assert (page["cursor"], page["next"], page["head"], page["redelivered"]) == (11, 17, 59, 5)
        assert [(o["id"], o.get("redelivered", False)) for o in page["observations"]] == [
            ("11", True),
            ("12", True),
            ("13", True),
            ("14", True),
            ("15", True),
            ("16", False),
        ]
        with pytest.raises(ProtocolError) as info:
            svc.pull(reader_id, "mpr_wrong", limit=1)
        assert info.value.code == "UNAUTHORIZED"
        replay = svc.publish(
            "ci",
            {"type": "com.example.ci.run", "subject": "build-1", "actor": "agent:ci-bot"},
            tokens["ci_owner"],
            idempotency_key="k-40",
        )
        assert replay["seq"] == 41 and replay["idempotent"] is True
        worker_id, worker_token = tokens["worker"]
        claim = svc.lease(worker_id, worker_token, "claim", {"subject": "build-1"})
        assert claim["idempotent"] is True and claim["lease"]["holder"] == f"sub:{worker_id}"
        with pytest.raises(ProtocolError) as info:
            svc.lease(worker_id, worker_token, "claim", {"subject": "build-3"})
        assert info.value.code == "DEAD_LETTERED"
        with pytest.raises(ProtocolError) as info:
            svc.pull(worker_id, worker_token, limit=1)  # its cursor 0 is below the floor 6
        assert info.value.code == "CURSOR_EXPIRED"
    finally:
        store.close()


def test_mp_serve_migrates_the_file_it_is_given_says_so_and_serves_it(v1_path):
    import httpx
    from serverutil import running_server, server_log

    owner = V1_JSON["tokens"]["ci_owner"]
    head = V1_JSON["snapshot"]["monitors"][0]["monitor"]["head"]
    with running_server(v1_path.parent, "--db", str(v1_path)) as (base, proc):
        r = httpx.get(f"{base}/mp/v0/monitors/ci", headers={"authorization": f"Bearer {owner}"})
        log = server_log(proc)
    # the fixture's readers have since been retired for silence (its clock is months old): the monitor
    # and the owner's token are what must have come through
    assert r.status_code == 200 and r.json()["head"] >= head
    assert "migrated in place from the previous format" in log and "observations" in log
    with running_server(v1_path.parent, "--db", str(v1_path)) as (_base, again):  # control: once only
        assert "migrated" not in server_log(again)
