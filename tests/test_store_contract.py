"""The store contract, one module for every store: memory, SQLite, and memory restored from its own change
journal exactly as the browser's IndexedDB door encodes, persists and loads it back."""

from __future__ import annotations

import json
import sqlite3

import pytest
from monitor_protocol.store.indexeddb import decode_records, encode_changes, record_key
from monitor_protocol.store.memory import TABLES, MemoryStore
from monitor_protocol.store.sqlite import SQLiteStore, StoreLocked

# A subscription taken by another id: SQLite's unique index raises IntegrityError, the memory store ValueError.
NameTaken = (ValueError, sqlite3.IntegrityError)


class JournalReplayStore(MemoryStore):
    """A MemoryStore whose every read comes from a fresh store loaded from the persisted journal, so the
    contract holds for the IndexedDB door's drain_changes()/load() round trip too. `persisted` plays boot.js
    `MP.idb`: `apply()` stores each change under record_key(table, key) as JSON text, `loadAll()` returns
    `[[recordKey, valueJson], ...]`, which decode_records turns back into load()'s input."""

    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[str, str] = {}

    def reload(self) -> MemoryStore:
        for table, key, value in json.loads(encode_changes(self.drain_changes())):
            assert table in TABLES, table
            if value is None:
                self.persisted.pop(record_key(table, key), None)
            else:
                self.persisted[record_key(table, key)] = json.dumps(value)
        fresh = MemoryStore()
        fresh.load(decode_records(json.dumps(sorted(self.persisted.items()))))
        return fresh


def _sub(
    sid: str, monitor: str = "m1", subscriber: str = "agent:a", token_hash: str = "h1", active: bool = True
) -> dict:
    return {
        "id": sid,
        "monitor": monitor,
        "subscriber": subscriber,
        "token_hash": token_hash,
        "cursor": 0,
        "active": active,
    }


def _event(monitor: str, seq: int) -> dict:
    return {"id": str(seq), "source": f"monitor:{monitor}", "type": "com.example.x", "subject": f"s{seq}"}


@pytest.fixture(params=["memory", "sqlite", "journal"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteStore(str(tmp_path / "contract.db"))
    elif request.param == "journal":
        s = JournalReplayStore()
    else:
        s = MemoryStore()
    yield s
    s.close()


def view(store):
    """What a reader sees after the write: for the journal store, the state rebuilt from persistence."""
    return store.reload() if isinstance(store, JournalReplayStore) else store


def test_commit_makes_every_write_visible(store):
    with store.transaction():
        store.put_monitor({"id": "m1", "n": 1})
        for seq in (1, 2, 3):
            store.append("m1", seq, _event("m1", seq))
        store.add_subject("m1", "s1")
        store.put_subscription(_sub("sub-1"))
        store.put_lease({"monitor": "m1", "subject": "s1", "holder": "sub:sub-1"})
    v = view(store)
    assert v.get_monitor("m1") == {"id": "m1", "n": 1}
    assert [e["id"] for e in v.scan("m1", 1, 3)] == ["1", "2", "3"]
    assert v.has_subject("m1", "s1") and not v.has_subject("m1", "s2")
    assert v.get_subscription("sub-1")["subscriber"] == "agent:a"
    assert v.get_lease("m1", "s1")["holder"] == "sub:sub-1"


def test_rollback_leaves_nothing_behind(store):
    with store.transaction():
        store.put_monitor({"id": "m1", "n": 1})
        store.put_subscription(_sub("sub-1"))
    with pytest.raises(RuntimeError), store.transaction():
        store.put_monitor({"id": "m1", "n": 2})
        store.append("m1", 1, _event("m1", 1))
        store.add_subject("m1", "s1")
        store.put_subscription(_sub("sub-1", token_hash="h2"))
        store.put_subscription(_sub("sub-2", subscriber="agent:b", token_hash="h3"))
        store.put_lease({"monitor": "m1", "subject": "s1", "holder": None})
        raise RuntimeError("abort")
    v = view(store)
    assert v.get_monitor("m1") == {"id": "m1", "n": 1}
    assert list(v.scan("m1", 1, 10)) == [] and not v.has_subject("m1", "s1")
    assert v.find_subscription_by_token("h1")["id"] == "sub-1"
    assert v.find_subscription_by_token("h2") is None and v.get_subscription("sub-2") is None
    assert v.get_lease("m1", "s1") is None


def test_scan_is_ordered_bounded_and_per_monitor(store):
    with store.transaction():
        for seq in range(1, 301):
            store.append("m1", seq, _event("m1", seq))
        store.append("m2", 1, _event("m2", 1))
    v = view(store)
    assert [int(e["id"]) for e in v.scan("m1", 250, 260)] == list(range(250, 261))
    assert len(list(v.scan("m1", 1, 300))) == 300
    assert [e["source"] for e in v.scan("m2", 1, 5)] == ["monitor:m2"]
    assert v.get_observation("m1", 7)["subject"] == "s7" and v.get_observation("m1", 301) is None


def test_duplicate_seq_is_refused(store):
    with store.transaction():
        store.append("m1", 1, _event("m1", 1))
    with pytest.raises((ValueError, sqlite3.IntegrityError)), store.transaction():
        store.append("m1", 1, _event("m1", 1))
    assert [e["id"] for e in view(store).scan("m1", 1, 5)] == ["1"]


def test_delete_below_compacts(store):
    with store.transaction():
        for seq in range(1, 11):
            store.append("m1", seq, _event("m1", seq))
    with store.transaction():
        assert store.delete_below("m1", 6) == 5
    assert [int(e["id"]) for e in view(store).scan("m1", 1, 10)] == [6, 7, 8, 9, 10]


def test_subscription_indexes_follow_rekeying(store):
    with store.transaction():
        store.put_subscription(_sub("sub-1", token_hash="old"))
    with store.transaction():
        store.put_subscription(_sub("sub-1", token_hash="new"))
    v = view(store)
    assert v.find_subscription_by_token("old") is None
    assert v.find_subscription_by_token("new")["id"] == "sub-1"
    assert v.find_subscription("m1", "agent:a")["id"] == "sub-1"
    assert v.find_subscription("m1", "agent:b") is None
    assert [s["id"] for s in v.list_subscriptions("m1")] == ["sub-1"] and v.list_subscriptions("m2") == []


def test_leases_are_scoped_per_monitor(store):
    with store.transaction():
        store.put_lease({"monitor": "m1", "subject": "job", "holder": "sub:a"})
        store.put_lease({"monitor": "m2", "subject": "job", "holder": "sub:b"})
    v = view(store)
    assert v.get_lease("m1", "job")["holder"] == "sub:a" and v.get_lease("m2", "job")["holder"] == "sub:b"
    assert [x["monitor"] for x in v.list_leases("m2")] == ["m2"] and len(v.list_leases()) == 2


def test_returned_records_are_copies(store):
    with store.transaction():
        store.put_monitor({"id": "m1", "tags": ["a"]})
    rec = store.get_monitor("m1")
    rec["tags"].append("b")
    assert store.get_monitor("m1") == {"id": "m1", "tags": ["a"]}


def test_put_subscription_never_replaces_another(store):
    with store.transaction():
        store.put_subscription(_sub("sub-1", subscriber="agent:a", token_hash="h1"))
        store.put_subscription(_sub("sub-2", subscriber="agent:b", token_hash="h2"))
    # a new id under a name that another subscription holds
    with pytest.raises(NameTaken), store.transaction():
        store.put_subscription(_sub("sub-3", subscriber="agent:a", token_hash="h3"))
    # an existing id renamed onto a name that another subscription holds
    with pytest.raises(NameTaken), store.transaction():
        store.put_subscription(_sub("sub-2", subscriber="agent:a", token_hash="h2"))
    v = view(store)
    assert [s["id"] for s in v.list_subscriptions("m1")] == ["sub-1", "sub-2"]
    assert v.find_subscription("m1", "agent:a")["id"] == "sub-1"
    assert v.find_subscription("m1", "agent:b")["id"] == "sub-2"
    assert v.get_subscription("sub-3") is None and v.find_subscription_by_token("h3") is None
    # the same name on another monitor, and an update of a subscription under its own name, are fine
    with store.transaction():
        store.put_subscription(_sub("sub-4", monitor="m2", subscriber="agent:a", token_hash="h4"))
        store.put_subscription(_sub("sub-1", subscriber="agent:a", token_hash="h1b"))
        store.put_subscription(_sub("sub-2", subscriber="agent:c", token_hash="h2"))
    v = view(store)
    assert v.find_subscription("m2", "agent:a")["id"] == "sub-4"
    assert v.find_subscription_by_token("h1b")["id"] == "sub-1" and v.find_subscription_by_token("h1") is None
    assert (
        v.find_subscription("m1", "agent:c")["id"] == "sub-2" and v.find_subscription("m1", "agent:b") is None
    )


def test_count_active_subscriptions(store):
    assert store.count_active_subscriptions("m1") == 0
    with store.transaction():
        for i in range(5):
            store.put_subscription(
                _sub(f"sub-{i}", subscriber=f"agent:{i}", token_hash=f"h{i}", active=i != 3)
            )
        store.put_subscription(_sub("other", monitor="m2", subscriber="agent:0", token_hash="hx"))
    assert view(store).count_active_subscriptions("m1") == 4
    with store.transaction():
        store.put_subscription(_sub("sub-0", subscriber="agent:0", token_hash="h0", active=False))
        store.put_subscription(_sub("sub-3", subscriber="agent:3", token_hash="h3", active=True))
        store.put_subscription(_sub("sub-4", subscriber="agent:4", token_hash="h4", active=False))
    with pytest.raises(RuntimeError), store.transaction():
        store.put_subscription(_sub("sub-1", subscriber="agent:1", token_hash="h1", active=False))
        store.put_subscription(_sub("sub-9", subscriber="agent:9", token_hash="h9"))
        raise RuntimeError("abort")
    v = view(store)
    assert v.count_active_subscriptions("m1") == 3
    assert v.count_active_subscriptions("m1") == sum(1 for s in v.list_subscriptions("m1") if s["active"])
    assert v.count_active_subscriptions("m2") == 1 and v.count_active_subscriptions("nope") == 0


def test_idempotency_keys_are_kept_per_monitor(store):
    assert store.get_idempotency("m1", "k1") is None
    with store.transaction():
        store.put_idempotency("m1", "k1", {"seq": 12, "at": 1764000000.5})
        store.put_idempotency("m2", "k1", {"seq": 3, "at": 1764000001.0})
        store.put_idempotency("m1", 'odd "key"/[1]', {"seq": 13, "at": 1764000002.0})
    v = view(store)
    assert v.get_idempotency("m1", "k1") == {"seq": 12, "at": 1764000000.5}
    assert v.get_idempotency("m2", "k1") == {"seq": 3, "at": 1764000001.0}
    assert v.get_idempotency("m1", 'odd "key"/[1]')["seq"] == 13
    assert v.get_idempotency("m1", "k2") is None and v.get_idempotency("m3", "k1") is None
    rec = store.get_idempotency("m1", "k1")
    rec["seq"] = 99
    assert store.get_idempotency("m1", "k1")["seq"] == 12  # a copy


def test_idempotency_rollback_and_purge(store):
    with store.transaction():
        store.put_idempotency("m1", "old", {"seq": 1, "at": 100.0})
        store.put_idempotency("m1", "edge", {"seq": 2, "at": 200.0})
        store.put_idempotency("m2", "new", {"seq": 1, "at": 300.0})
    with pytest.raises(RuntimeError), store.transaction():
        store.put_idempotency("m1", "old", {"seq": 7, "at": 999.0})
        store.put_idempotency("m1", "lost", {"seq": 8, "at": 999.0})
        assert store.purge_idempotency(1000.0) == 4
        raise RuntimeError("abort")
    v = view(store)
    assert (
        v.get_idempotency("m1", "old") == {"seq": 1, "at": 100.0} and v.get_idempotency("m1", "lost") is None
    )
    assert v.get_idempotency("m2", "new")["seq"] == 1
    with store.transaction():
        assert store.purge_idempotency(200.0) == 1  # strictly before: "edge" (at 200.0) stays
    v = view(store)
    assert v.get_idempotency("m1", "old") is None
    assert v.get_idempotency("m1", "edge")["seq"] == 2 and v.get_idempotency("m2", "new")["seq"] == 1
    with store.transaction():
        assert store.purge_idempotency(1e12) == 2
        assert store.purge_idempotency(1e12) == 0
    v = view(store)
    assert v.get_idempotency("m1", "edge") is None and v.get_idempotency("m2", "new") is None


def test_sqlite_commit_survives_reopen_and_rollback_does_not(tmp_path):
    path = str(tmp_path / "durable.db")
    s = SQLiteStore(path)
    with s.transaction():
        s.put_monitor({"id": "kept"})
    with pytest.raises(RuntimeError), s.transaction():
        s.put_monitor({"id": "lost"})
        raise RuntimeError
    s.close()
    again = SQLiteStore(path)
    assert [m["id"] for m in again.list_monitors()] == ["kept"]
    again.close()


def test_sqlite_one_writer_per_file(tmp_path):
    path = str(tmp_path / "locked.db")
    first = SQLiteStore(path)
    with pytest.raises(StoreLocked, match=r"pid \d+"):
        SQLiteStore(path)
    first.close()
    SQLiteStore(path).close()  # control: once the first closes, the file opens


def test_sqlite_group_commit_batches_transactions(tmp_path):
    s = SQLiteStore(str(tmp_path / "batch.db"))
    with s.batch():
        for i in range(1, 4):
            with s.transaction():
                s.append("m1", i, _event("m1", i))
        with pytest.raises(RuntimeError), s.transaction():
            s.append("m1", 4, _event("m1", 4))
            raise RuntimeError  # one failed call inside a batch rolls back alone
    assert [int(e["id"]) for e in s.scan("m1", 1, 10)] == [1, 2, 3]
    s.close()
