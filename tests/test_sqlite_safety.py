"""The SQLite store under storage failure, second writers and damaged files (PROTOCOL.md section 10):
StorageError with a rollback (a real SQLITE_FULL through `PRAGMA max_page_count`), one writer per database
FILE however the path is spelled, and StoreCorrupt for a file that fails quick_check or is not a database."""

from __future__ import annotations

import fcntl
import json
import os
import random
import sqlite3
import struct
import subprocess
import sys
import textwrap

import pytest
from monitor_protocol.store.base import StorageError
from monitor_protocol.store.sqlite import NOTE_SUFFIX, SQLiteStore, StoreCorrupt, StoreLocked

BIG = "x" * 3000  # about one page per observation


def _event(monitor: str, seq: int, data: str = "") -> dict:
    return {"id": str(seq), "source": f"monitor:{monitor}", "type": "com.example.x", "data": data}


def _pages(store: SQLiteStore) -> int:
    return store._db.execute("PRAGMA page_count").fetchone()[0]


def _limit_pages(store: SQLiteStore, extra: int) -> None:
    store._db.execute(f"PRAGMA max_page_count={_pages(store) + extra}")


def _unlimit(store: SQLiteStore) -> None:
    store._db.execute("PRAGMA max_page_count=1073741823")


def _seqs(store: SQLiteStore, monitor: str = "m1") -> list[int]:
    return [int(e["id"]) for e in store.scan(monitor, 1, 10**6)]


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(str(tmp_path / "safety.db"))
    with s.transaction():
        s.put_monitor({"id": "m1", "n": 1})
        s.append("m1", 1, _event("m1", 1))
    yield s
    s.close()


# --- StorageError and rollback ------------------------------------------------------------------------
def test_disk_full_raises_storage_error_and_keeps_nothing(store, tmp_path):
    _limit_pages(store, 3)
    with pytest.raises(StorageError, match="full") as info, store.transaction():
        store.put_monitor({"id": "m1", "n": 2})
        store.put_subscription(
            {"id": "s1", "monitor": "m1", "subscriber": "a", "token_hash": "h", "active": True}
        )
        for seq in range(2, 200):
            store.append("m1", seq, _event("m1", seq, BIG))
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert info.value.__cause__.sqlite_errorname == "SQLITE_FULL"
    # nothing of the failed transaction is visible, to this store or to a reader of the file
    assert store.get_monitor("m1") == {"id": "m1", "n": 1}
    assert _seqs(store) == [1] and store.get_subscription("s1") is None
    reader = sqlite3.connect(f"file:{tmp_path / 'safety.db'}?mode=ro", uri=True)
    assert reader.execute("SELECT count(*) FROM observations").fetchone()[0] == 1
    reader.close()
    # the same store keeps serving once there is room again
    _unlimit(store)
    with store.transaction():
        for seq in range(2, 40):
            store.append("m1", seq, _event("m1", seq, BIG))
    assert _seqs(store) == list(range(1, 40))


def test_disk_full_in_a_group_commit_keeps_nothing_of_the_group(store):
    _limit_pages(store, 4)
    failures = []
    with pytest.raises(StorageError), store.batch():
        with store.transaction():
            store.append("m1", 2, _event("m1", 2))  # small: fits
        for seq in range(3, 200):
            try:
                with store.transaction():
                    store.append("m1", seq, _event("m1", seq, BIG))
            except StorageError as exc:
                failures.append(exc)
                break
        # the group is gone: a later call in it is refused rather than written outside the group
        with pytest.raises(StorageError), store.transaction():
            store.append("m1", 500, _event("m1", 500))
    assert len(failures) == 1
    assert _seqs(store) == [1] and not store._db.in_transaction
    _unlimit(store)
    with store.batch():
        for seq in (2, 3):
            with store.transaction():
                store.append("m1", seq, _event("m1", seq, BIG))
    assert _seqs(store) == [1, 2, 3]


class FailingCommit:
    """The store's connection, except that COMMIT fails once as a full disk would."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._real = db
        self.armed = True

    def execute(self, sql: str, *args):
        if self.armed and sql == "COMMIT":
            self.armed = False
            exc = sqlite3.OperationalError("database or disk is full")
            exc.sqlite_errorcode = 13
            exc.sqlite_errorname = "SQLITE_FULL"
            raise exc
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@pytest.mark.parametrize("group", [False, True], ids=["transaction", "batch"])
def test_a_failed_commit_rolls_back_and_the_store_stays_usable(store, group):
    real = store._db
    store._db = FailingCommit(real)
    try:
        with pytest.raises(StorageError, match="SQLITE_FULL"):
            if group:
                with store.batch():
                    for seq in (2, 3):
                        with store.transaction():
                            store.append("m1", seq, _event("m1", seq))
            else:
                with store.transaction():
                    store.append("m1", 2, _event("m1", 2))
                    store.put_monitor({"id": "m1", "n": 2})
        assert not real.in_transaction  # rolled back, not left open
        assert _seqs(store) == [1] and store.get_monitor("m1") == {"id": "m1", "n": 1}
        with store.transaction():
            store.append("m1", 2, _event("m1", 2))
        assert _seqs(store) == [1, 2]
    finally:
        store._db = real


def test_a_read_only_database_is_a_storage_error(store):
    store._db.execute("PRAGMA query_only=1")
    with pytest.raises(StorageError, match="READONLY"), store.transaction():
        store.put_monitor({"id": "m1", "n": 2})
    store._db.execute("PRAGMA query_only=0")
    with store.transaction():
        store.put_monitor({"id": "m1", "n": 3})
    assert store.get_monitor("m1")["n"] == 3


def test_bugs_are_not_storage_errors(store):
    with pytest.raises(sqlite3.IntegrityError), store.transaction():
        store.append("m1", 1, _event("m1", 1))  # duplicate seq: a bug, not the disk
    with store.transaction():
        store.put_subscription(
            {"id": "s1", "monitor": "m1", "subscriber": "a", "token_hash": "h", "active": True}
        )
    with pytest.raises(sqlite3.IntegrityError), store.transaction():
        store.put_subscription(
            {"id": "s2", "monitor": "m1", "subscriber": "a", "token_hash": "h", "active": True}
        )
    assert store.get_subscription("s1") is not None and store.get_subscription("s2") is None


def test_count_active_subscriptions_reads_the_partial_index(store):
    plan = store._db.execute(
        "EXPLAIN QUERY PLAN SELECT count(*) FROM subscriptions WHERE monitor=? AND json_extract(rec, '$.active')",
        ("m1",),
    ).fetchall()
    assert any("subscriptions_active" in row[-1] for row in plan), plan
    with store.transaction():
        for i in range(300):
            store.put_subscription(
                {
                    "id": f"s{i}",
                    "monitor": "m1",
                    "subscriber": f"a{i}",
                    "token_hash": f"h{i}",
                    "active": i % 3 > 0,
                }
            )
    assert store.count_active_subscriptions("m1") == 200


# --- one writer per database file ---------------------------------------------------------------------
def _spellings(tmp_path, monkeypatch) -> dict[str, str]:
    (tmp_path / "x").mkdir()
    db = tmp_path / "a.db"
    os.link(db, tmp_path / "hard.db")
    os.symlink(db, tmp_path / "soft.db")
    monkeypatch.chdir(tmp_path)
    return {"hard link": "hard.db", "symlink": "soft.db", "relative": "a.db", "dotdot": "./x/../a.db"}


def test_one_writer_however_the_path_is_spelled(tmp_path, monkeypatch):
    first = SQLiteStore(str(tmp_path / "a.db"))
    names = _spellings(tmp_path, monkeypatch)
    for how, name in names.items():
        with pytest.raises(StoreLocked, match=rf"pid {os.getpid()} on .* since ") as info:
            SQLiteStore(name)
        assert str(tmp_path) in str(info.value), how
    # the lock is on the database file itself: any descriptor of it sees the flock
    fd = os.open(tmp_path / "hard.db", os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    note = json.loads((tmp_path / ("a.db" + NOTE_SUFFIX)).read_text())
    assert note["pid"] == os.getpid() and note["path"] == str((tmp_path / "a.db").resolve())
    with first.transaction():  # the refusals left the first store working
        first.put_monitor({"id": "m1"})
    first.close()
    assert not (tmp_path / ("a.db" + NOTE_SUFFIX)).exists()  # the note goes with the lock
    for name in names.values():  # control: once the first closes, every spelling opens
        again = SQLiteStore(name)
        assert again.get_monitor("m1") == {"id": "m1"}
        again.close()


HOLDER = textwrap.dedent(
    """
    import sys
    from monitor_protocol.store.sqlite import SQLiteStore
    store = SQLiteStore(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.read()
    store.close()
    """
)


def test_one_writer_across_processes(tmp_path, monkeypatch):
    SQLiteStore(str(tmp_path / "a.db")).close()
    names = _spellings(tmp_path, monkeypatch)
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "a.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        for how, name in names.items():
            with pytest.raises(StoreLocked) as info:
                SQLiteStore(name)
            message = str(info.value)
            assert "Stop that process, or start this one with another --db." in message, how
            if how == "hard link":  # another name of the same file: no note beside this name
                assert "hard link" in message
            else:
                assert f"pid {child.pid} on " in message, (how, message)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    for name in names.values():
        SQLiteStore(name).close()


def test_memory_databases_need_no_lock():
    a, b = SQLiteStore(":memory:"), SQLiteStore(":memory:")
    with a.transaction():
        a.put_monitor({"id": "m1"})
    assert b.get_monitor("m1") is None
    a.close()
    b.close()


# --- damaged files ------------------------------------------------------------------------------------
def _lock_is_free(path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(os.urandom(3 * 4096))
    with pytest.raises(StoreCorrupt) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert str(path) in message and "not a SQLite database" in message
    assert "Restore it from a backup, or start with another --db." in message
    assert _lock_is_free(path) and not (tmp_path / ("garbage.db" + NOTE_SUFFIX)).exists()
    with pytest.raises(StoreCorrupt):  # and again: nothing was repaired or served meanwhile
        SQLiteStore(str(path))


def _damage(path, how: str) -> None:
    header = path.read_bytes()[:100]
    page = struct.unpack(">H", header[16:18])[0]
    pages = path.stat().st_size // page
    assert pages > 20
    with open(path, "r+b") as f:
        if how == "pages":  # overwrite pages in the middle, leaving the header page intact
            f.seek((pages // 2) * page)
            f.write(b"\x0d" + random.Random(7).randbytes(4 * page - 1))
        else:  # a structurally valid file whose free-page count lies: quick_check reports it as a row
            assert struct.unpack(">I", header[36:40])[0] > 3
            f.seek(36)
            f.write(struct.pack(">I", 3))


@pytest.mark.parametrize("how", ["pages", "freelist"])
def test_a_database_that_fails_quick_check_is_refused(tmp_path, how):
    path = tmp_path / "damaged.db"
    s = SQLiteStore(str(path))
    with s.transaction():
        s.put_monitor({"id": "m1"})
        for seq in range(1, 400):
            s.append("m1", seq, _event("m1", seq, "y" * 500))
    if how == "freelist":
        with s.transaction():
            s.delete_below("m1", 200)  # leaves free pages
    s.close()  # the last connection checkpoints: every page is in the main file
    _damage(path, how)
    with pytest.raises(StoreCorrupt) as info:
        SQLiteStore(str(path))
    message = str(info.value)
    assert str(path) in message and "nothing will be served" in message
    assert "Restore it from a backup, or start with another --db." in message
    assert ("quick_check reports: " in message) == (how == "freelist"), message
    assert "\n" not in message
    assert _lock_is_free(path)


def test_fresh_and_empty_files_open(tmp_path):
    (tmp_path / "empty.db").write_bytes(b"")
    for name in ("empty.db", "new.db"):
        s = SQLiteStore(str(tmp_path / name))
        with s.transaction():
            s.put_monitor({"id": "m1"})
        s.close()
        again = SQLiteStore(str(tmp_path / name))
        assert again.get_monitor("m1") == {"id": "m1"}
        again.close()
