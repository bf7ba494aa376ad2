"""The SQLite store under storage failure, second writers and damaged files (docs/protocol.md section 10):
StorageError with a rollback (a real SQLITE_FULL through `PRAGMA max_page_count`), one writer per database
FILE however the path is spelled, StoreCorrupt for a file that fails quick_check or is not a database, and
a read cache that never serves a record whose write was rolled back. Every write is one engine call: a
`transaction()` and its one `apply(Changes)` of typed records."""

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
from monitor_protocol.core.lifecycles import SubscriptionState
from monitor_protocol.core.records import Monitor, Observation, Subscription
from monitor_protocol.core.store_contract import Changes, LogQuery, StorageError, Term
from monitor_protocol.store.sqlite import (
    COUNT_ACTIVE_SQL,
    SQLiteStore,
    StoreCorrupt,
    StoreLocked,
)
from monitor_protocol.store.sqlite_file import NOTE_SUFFIX

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

BIG = "x" * 3000  # about one page per observation (or per subscription filter)


# --- records and calls ----------------------------------------------------------------------------
def monitor(mid: str = "m1", **kw) -> Monitor:
    return Monitor(id=mid, owner="agent:owner", owner_hash="oh", created=100.0, updated=100.0, name=mid, **kw)


def obs(monitor_id: str, seq: int, data: str = "") -> Observation:
    event = {"id": str(seq), "source": f"monitor:{monitor_id}", "type": "com.example.x", "data": data}
    return Observation.of(monitor_id, seq, event)


def sub(
    sid: str, monitor_id: str = "m1", subscriber: str = "agent:a", token_hash: str = "h", **kw
) -> Subscription:
    return Subscription(sid, monitor_id, subscriber, token_hash, created=100.0, mute_since=100.0, **kw)


def put(store: SQLiteStore, **changes) -> None:
    """One engine call that writes: a transaction and its one apply."""
    with store.transaction():
        store.apply(Changes(**changes))


def _pages(store: SQLiteStore) -> int:
    return store._db.execute("PRAGMA page_count").fetchone()[0]


def _limit_pages(store: SQLiteStore, extra: int) -> None:
    store._db.execute(f"PRAGMA max_page_count={_pages(store) + extra}")


def _unlimit(store: SQLiteStore) -> None:
    store._db.execute("PRAGMA max_page_count=1073741823")


def _seqs(store: SQLiteStore, monitor_id: str = "m1") -> list[int]:
    return [o.seq for o in store.scan(monitor_id, 1, 10**6)]


def _file_counts(path) -> tuple[int, int, int]:
    """(monitors, observations, subscriptions) as a separate reader of the file sees them."""
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return tuple(
            reader.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("monitors", "observations", "subscriptions")
        )
    finally:
        reader.close()


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(str(tmp_path / "safety.db"))
    put(s, monitors=[monitor("m1", head=1)], observations=[obs("m1", 1)])
    yield s
    s.close()


# --- StorageError and rollback ------------------------------------------------------------------------
def _big_subscriptions(n: int) -> list[Subscription]:
    return [
        sub(f"s{i}", subscriber=f"agent:{i}", token_hash=f"h{i}", filter={"data": BIG}) for i in range(2, n)
    ]


# Where the disk fills within the one apply: in the log (after the monitor was written), or in the
# subscriptions (after the monitor, part of the log and subscription s1 were written).
FILLS = {
    "log": {
        "monitors": [monitor("m1", head=199)],
        "observations": [obs("m1", seq, BIG) for seq in range(2, 200)],
        "subscriptions": [sub("s1")],
    },
    "subscriptions": {
        "monitors": [monitor("m1", head=9)],
        "observations": [obs("m1", seq) for seq in range(2, 10)],
        "subscriptions": [sub("s1"), *_big_subscriptions(200)],
    },
}
# (A monitor's row is written at the commit, once per transaction: the fill strikes before it.)
WRITTEN_FIRST = {
    "log": ("observations",),
    "subscriptions": ("observations", "subscriptions"),
}


@pytest.mark.parametrize("where", list(FILLS))
def test_disk_full_raises_storage_error_and_keeps_nothing(store, tmp_path, where):
    _limit_pages(store, 3)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    with pytest.raises(StorageError, match="full") as info, store.transaction():
        store.apply(Changes(**FILLS[where]))
    store._db.set_trace_callback(None)
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert info.value.__cause__.sqlite_errorname == "SQLITE_FULL"
    for table in WRITTEN_FIRST[where]:  # the failure came after these rows were written, not before
        assert any(q.startswith(f"INSERT INTO {table} ") for q in statements), table
    # nothing of the failed transaction is visible, to this store or to a reader of the file
    assert store.get_monitor("m1") == monitor("m1", head=1)
    assert _seqs(store) == [1] and store.get_subscription("s1") is None
    assert store.list_subscriptions() == [] and not store._db.in_transaction
    assert _file_counts(tmp_path / "safety.db") == (1, 1, 0)
    # the same store keeps serving once there is room again
    _unlimit(store)
    put(store, observations=[obs("m1", seq, BIG) for seq in range(2, 40)])
    assert _seqs(store) == list(range(1, 40))


def test_disk_full_in_a_group_commit_keeps_nothing_of_the_group(store):
    _limit_pages(store, 4)
    failures = []
    with pytest.raises(StorageError), store.batch():
        put(store, observations=[obs("m1", 2)])  # small: fits
        for seq in range(3, 200):
            try:
                put(store, observations=[obs("m1", seq, BIG)])
            except StorageError as exc:
                failures.append(exc)
                break
        # the group is gone: a later call in it is refused rather than written outside the group
        with pytest.raises(StorageError):
            put(store, observations=[obs("m1", 500)])
    assert len(failures) == 1
    assert _seqs(store) == [1] and not store._db.in_transaction
    _unlimit(store)
    with store.batch():
        for seq in (2, 3):
            put(store, observations=[obs("m1", seq, BIG)])
    assert _seqs(store) == [1, 2, 3]


class FailingStatement:
    """The store's connection, except that one statement fails once, while armed, as SQLite would fail it
    (by default COMMIT on a full disk). Every statement run through it is recorded."""

    def __init__(
        self,
        db: sqlite3.Connection,
        statement: str = "COMMIT",
        error: tuple[str, int, str] = ("database or disk is full", 13, "SQLITE_FULL"),
        *,
        armed: bool = True,
    ) -> None:
        self._real = db
        self.statement = statement
        self.error = error
        self.armed = armed
        self.statements: list[str] = []

    def execute(self, sql: str, *args):
        self.statements.append(sql)
        if self.armed and sql == self.statement:
            self.armed = False
            message, code, name = self.error
            exc = sqlite3.OperationalError(message)
            exc.sqlite_errorcode = code
            exc.sqlite_errorname = name
            raise exc
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@pytest.mark.parametrize("group", [False, True], ids=["transaction", "batch"])
def test_a_failed_commit_rolls_back_and_the_store_stays_usable(store, group):
    real = store._db
    store._db = FailingStatement(real)
    try:
        with pytest.raises(StorageError, match="SQLITE_FULL"):
            if group:
                with store.batch():
                    for seq in (2, 3):
                        put(store, observations=[obs("m1", seq)])
            else:
                put(store, observations=[obs("m1", 2)], monitors=[monitor("m1", head=2)])
        assert not real.in_transaction  # rolled back, not left open
        assert _seqs(store) == [1] and store.get_monitor("m1") == monitor("m1", head=1)
        put(store, observations=[obs("m1", 2)])
        assert _seqs(store) == [1, 2]
    finally:
        store._db = real


def test_a_read_only_database_is_a_storage_error(store):
    store._db.execute("PRAGMA query_only=1")
    with pytest.raises(StorageError, match="READONLY"):
        put(store, monitors=[monitor("m1", head=2)])
    store._db.execute("PRAGMA query_only=0")
    put(store, monitors=[monitor("m1", head=3)])
    assert store.get_monitor("m1").head == 3


def test_bugs_are_not_storage_errors(store):
    with pytest.raises(sqlite3.IntegrityError):
        put(store, observations=[obs("m1", 1)])  # duplicate seq: a bug, not the disk
    put(store, subscriptions=[sub("s1", subscriber="agent:a")])
    with pytest.raises(sqlite3.IntegrityError):  # another id for a taken (monitor, subscriber)
        put(store, subscriptions=[sub("s2", subscriber="agent:a")])
    assert store.get_subscription("s1") is not None and store.get_subscription("s2") is None
    injected = LogQuery((((Term("event); DROP TABLE observations; --", ("x",)),),),))
    with pytest.raises(ValueError, match="indexed log column"):
        list(store.scan("m1", 1, 9, injected))  # a column name is checked, never spliced into SQL
    assert os.path.exists(store.path) and store.count("m1", 1, 9) == 1


def test_count_active_subscriptions_reads_the_partial_index(store):
    plan = store._db.execute("EXPLAIN QUERY PLAN " + COUNT_ACTIVE_SQL, ("m1",)).fetchall()
    assert any("subscriptions_active" in row[-1] for row in plan), plan
    put(
        store,
        subscriptions=[
            sub(
                f"s{i}",
                subscriber=f"agent:{i}",
                token_hash=f"h{i}",
                state=SubscriptionState.ACTIVE if i % 3 > 0 else SubscriptionState.RETIRED,
            )
            for i in range(300)
        ],
    )
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    assert store.count_active_subscriptions("m1") == 200
    store._db.set_trace_callback(None)
    assert statements == [COUNT_ACTIVE_SQL.replace("?", "'m1'")]  # the count is that query, nothing else


def test_the_sweeps_read_of_active_readers_reads_only_them(store):
    """A soak's: the sweep's `... WHERE state = 'active' ORDER BY id` walked the primary key through every
    retired reader (14 ms with 13,000 rows of which 550 active, every second a mute retirement was due)."""
    put(
        store,
        subscriptions=[
            sub(
                f"s{i:03d}",
                subscriber=f"agent:{i}",
                token_hash=f"h{i}",
                state=SubscriptionState.ACTIVE if i % 50 == 7 else SubscriptionState.RETIRED,
            )
            for i in range(300, 0, -1)
        ],
    )
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    active = store.list_active_subscriptions()
    store._db.set_trace_callback(None)
    assert [s.id for s in active] == sorted(f"s{i:03d}" for i in range(1, 301) if i % 50 == 7)
    (sql,) = statements
    plan = store._db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
    assert any("subscriptions_active" in row[-1] for row in plan), plan
    # control: the ordered form walks the primary key
    ordered = store._db.execute("EXPLAIN QUERY PLAN " + sql + " ORDER BY id").fetchall()
    assert not any("subscriptions_active" in row[-1] for row in ordered), ordered


def test_the_sweeps_read_of_held_leases_reads_only_them_and_an_older_file_gets_its_index(tmp_path):
    """A soak's: free leases (every subject once leased) were walked by every sweep. An index of the held
    ones, added to format version 3 after its release, is created when a file of that version lacks it."""
    path = str(tmp_path / "leases.db")
    store = SQLiteStore(path)
    store._db.execute("DROP INDEX leases_held")  # as a file written before the index was added
    store.close()
    store = SQLiteStore(path)
    try:
        names = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "leases_held" in names
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        assert store.list_held_leases() == []
        store._db.set_trace_callback(None)
        (sql,) = statements
        plan = store._db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
        assert any("leases_held" in row[-1] for row in plan), plan
    finally:
        store.close()


# --- the read cache holds committed records only ------------------------------------------------------
# Each rolls back a call (or a group) that wrote `m2` and `s2`; every one raises and keeps nothing.
def _error_after_apply(store, m2, s2):
    with pytest.raises(RuntimeError), store.transaction():
        store.apply(Changes(monitors=[m2], subscriptions=[s2]))
        # the call reads its own write (from the cache) before it fails
        assert store.get_monitor("m1") == m2 and store.get_subscription("s1") == s2
        raise RuntimeError("the rule failed after its apply")


def _disk_full_in_apply(store, m2, s2):
    _limit_pages(store, 3)
    try:
        with pytest.raises(StorageError, match="full"), store.transaction():
            store.apply(Changes(monitors=[m2], subscriptions=[s2, *_big_subscriptions(200)]))
    finally:
        _unlimit(store)


def _failing_commit(store, m2, s2, *, group: bool):
    real = store._db
    store._db = FailingStatement(real)
    try:
        with pytest.raises(StorageError, match="SQLITE_FULL"):
            if group:
                with store.batch():
                    put(store, monitors=[m2])
                    put(store, subscriptions=[s2])
            else:
                with store.transaction():
                    store.apply(Changes(monitors=[m2], subscriptions=[s2]))
                    assert store.get_monitor("m1") == m2 and store.get_subscription("s1") == s2
    finally:
        store._db = real


def _disk_full_later_in_the_group(store, m2, s2):
    _limit_pages(store, 4)
    try:
        with pytest.raises(StorageError), store.batch():
            put(store, monitors=[m2], subscriptions=[s2])
            assert store.get_monitor("m1") == m2 and store.get_subscription("s1") == s2
            with pytest.raises(StorageError):
                for seq in range(2, 200):
                    put(store, observations=[obs("m1", seq, BIG)])
    finally:
        _unlimit(store)


def _read_after_a_failed_call_in_the_group(store, m2, s2):
    real = store._db
    store._db = FailingStatement(real)
    try:
        with pytest.raises(StorageError, match="SQLITE_FULL"), store.batch():
            put(store, monitors=[m2], subscriptions=[s2])
            with pytest.raises(RuntimeError), store.transaction():  # rolled back alone, the group goes on
                store.apply(Changes(observations=[obs("m1", 2)]))
                raise RuntimeError
            with store.transaction():  # a later call of the group reads what the first one wrote
                assert store.get_monitor("m1") == m2 and store.get_subscription("s1") == s2
    finally:
        store._db = real


ROLLBACKS = {
    "exception after apply": _error_after_apply,
    "disk full in apply": _disk_full_in_apply,
    "commit fails": lambda store, m2, s2: _failing_commit(store, m2, s2, group=False),
    "group commit fails": lambda store, m2, s2: _failing_commit(store, m2, s2, group=True),
    "disk full later in the group": _disk_full_later_in_the_group,
    "group commit fails after a read": _read_after_a_failed_call_in_the_group,
}


@pytest.mark.parametrize(
    "how",
    ROLLBACKS,
)
def test_a_rolled_back_write_never_stays_in_the_read_cache(store, tmp_path, how):
    put(store, subscriptions=[sub("s1", cursor=1)])
    m1, s1 = store.get_monitor("m1"), store.get_subscription("s1")  # both now in the cache
    assert (m1, s1) == (monitor("m1", head=1), sub("s1", cursor=1))
    m2, s2 = monitor("m1", head=2, version=2), sub("s1", cursor=2, hwm=2)
    ROLLBACKS[how](store, m2, s2)
    assert not store._db.in_transaction
    # the committed versions, from the cache as from the file
    assert store.get_monitor("m1") == m1 and store.get_subscription("s1") == s1
    assert store.list_monitors() == [m1] and store.list_subscriptions() == [s1]
    assert _seqs(store) == [1] and _file_counts(tmp_path / "safety.db") == (1, 1, 1)
    # control: the same write, committed, is what the reads return (and what a reopened store reads)
    put(store, monitors=[m2], subscriptions=[s2])
    assert store.get_monitor("m1") == m2 and store.get_subscription("s1") == s2
    store.close()
    again = SQLiteStore(str(tmp_path / "safety.db"))
    try:
        assert again.get_monitor("m1") == m2 and again.get_subscription("s1") == s2
    finally:
        again.close()


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
    put(first, monitors=[monitor("m1")])  # the refusals left the first store working
    first.close()
    assert not (tmp_path / ("a.db" + NOTE_SUFFIX)).exists()  # the note goes with the lock
    for name in names.values():  # control: once the first closes, every spelling opens
        again = SQLiteStore(name)
        assert again.get_monitor("m1") == monitor("m1")
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
            assert (
                "Stop that process, or open another database file (mp serve --db, SQLiteStore(path))."
                in message
            ), how
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
    put(a, monitors=[monitor("m1")])
    assert a.get_monitor("m1") == monitor("m1") and b.get_monitor("m1") is None
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
    put(s, monitors=[monitor("m1")], observations=[obs("m1", seq, "y" * 500) for seq in range(1, 400)])
    if how == "freelist":
        put(s, compactions=[("m1", 200)])  # leaves free pages
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
        put(s, monitors=[monitor("m1")])
        s.close()
        again = SQLiteStore(str(tmp_path / name))
        assert again.get_monitor("m1") == monitor("m1")
        again.close()


# --- the first writer of a transaction takes no savepoint ---------------------------------------
def _traced(store: SQLiteStore) -> list[str]:
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    return seen


def _savepoints(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK TO"))]


@pytest.mark.parametrize("group", [False, True], ids=["transaction", "group"])
def test_the_first_writer_takes_no_savepoint_and_a_later_one_does(store, group):
    """A transaction's first write is taken back by beginning the transaction again, not by a savepoint
    (whose journal costs ~1 us per row of a batch); a call writing after others in a group takes one."""
    seen = _traced(store)
    with store.batch() if group else store.transaction():
        if group:
            put(store, observations=[obs("m1", 2), obs("m1", 3)], monitors=[monitor("m1", head=3)])
        else:
            store.apply(Changes(observations=[obs("m1", 2), obs("m1", 3)], monitors=[monitor("m1", head=3)]))
        first = _savepoints(seen)
        if group:  # control: the group's second writer
            put(store, observations=[obs("m1", 4), obs("m1", 5)], monitors=[monitor("m1", head=5)])
    store._db.set_trace_callback(None)
    assert first == []
    assert _savepoints(seen) == (
        ["SAVEPOINT call", "SAVEPOINT apply", "RELEASE apply", "RELEASE call"] if group else []
    )
    assert [o.seq for o in store.scan("m1", 1, 10)] == ([1, 2, 3, 4, 5] if group else [1, 2, 3])


@pytest.mark.parametrize("how", ["refused statement", "failure after apply"])
def test_a_groups_first_writer_that_fails_is_taken_back_and_the_group_goes_on(store, how):
    with store.batch():
        with pytest.raises((sqlite3.IntegrityError, RuntimeError)), store.transaction():
            # seq 1 is taken: the second row is refused after the first was written
            rows = (
                [obs("m1", 2), obs("m1", 1)] if how == "refused statement" else [obs("m1", 2), obs("m1", 3)]
            )
            store.apply(
                Changes(observations=rows, monitors=[monitor("m1", head=9)], subjects=[("m1", "gone")])
            )
            raise RuntimeError("the call fails after its apply")
        assert store.get_monitor("m1").head == 1 and not store.has_subject("m1", "gone")
        put(store, observations=[obs("m1", 2)], monitors=[monitor("m1", head=2)])  # the group goes on
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1, 2]
    assert store.get_monitor("m1").head == 2 and not store.has_subject("m1", "gone")
    assert not store._db.in_transaction


def test_a_first_writer_refused_while_the_call_goes_on_leaves_nothing_of_it(store):
    """The caller catches the refusal and writes again in the same transaction: only the second write is kept."""
    with store.transaction():
        with pytest.raises(sqlite3.IntegrityError):
            store.apply(Changes(observations=[obs("m1", 2), obs("m1", 1)], monitors=[monitor("m1", head=9)]))
        store.apply(Changes(observations=[obs("m1", 2), obs("m1", 3)], monitors=[monitor("m1", head=3)]))
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1, 2, 3] and store.get_monitor("m1").head == 3


def test_a_groups_first_writer_that_writes_again_after_a_refusal_and_then_fails_leaves_nothing(store):
    with store.batch():
        with pytest.raises(RuntimeError), store.transaction():
            with pytest.raises(sqlite3.IntegrityError):
                store.apply(Changes(observations=[obs("m1", 2), obs("m1", 1)]))
            store.apply(Changes(observations=[obs("m1", 7), obs("m1", 8)]))  # the first writer again
            raise RuntimeError("the call fails after writing again")
        put(
            store, observations=[obs("m1", 2)], monitors=[monitor("m1", head=2)]
        )  # control: the group goes on
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1, 2]


def busy_begin(db: sqlite3.Connection) -> FailingStatement:
    """The store's connection, except that BEGIN IMMEDIATE fails once, busy, after it is armed."""
    return FailingStatement(db, "BEGIN IMMEDIATE", ("database is locked", 5, "SQLITE_BUSY"), armed=False)


def test_a_group_that_cannot_begin_again_fails_whole_and_the_writer_hears_its_own_refusal(store):
    real = store._db
    store._db = conn = busy_begin(real)
    try:
        with pytest.raises(StorageError, match="nothing in it was kept"), store.batch():
            conn.armed = True
            with pytest.raises(sqlite3.IntegrityError):  # a bug's signal stays one: not a 503
                put(store, observations=[obs("m1", 2), obs("m1", 1)])
            with pytest.raises(StorageError, match="retry the call"):  # no transaction to write in
                put(store, observations=[obs("m1", 2)])
    finally:
        store._db = real
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1] and not real.in_transaction
    put(store, observations=[obs("m1", 2)])  # control: the store is usable
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1, 2]


def test_a_lone_first_writer_refused_begins_again_only_if_its_call_writes_again(store):
    real = store._db
    store._db = conn = busy_begin(real)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            put(store, observations=[obs("m1", 2), obs("m1", 1)])
        assert "BEGIN IMMEDIATE" not in conn.statements[1:]  # rolled back, and not begun for nothing
    finally:
        store._db = real
    assert [o.seq for o in store.scan("m1", 1, 10)] == [1] and not real.in_transaction


def test_a_new_database_and_its_wal_are_readable_by_their_owner_only(tmp_path):
    """A private monitor's log and a push subscription's secret are in the file: created 0600, whatever the
    umask, and SQLite gives the WAL the database's mode. An existing file keeps the mode its operator chose."""
    import stat

    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.sqlite import SQLiteStore

    old = os.umask(0o022)
    try:
        path = tmp_path / "new.db"
        store = SQLiteStore(str(path))
        MonitorService(store).create_monitor({"id": "ci", "visibility": "private"}, None)
        for name in ("new.db", "new.db-wal"):
            assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name
        store.close()
        chosen = tmp_path / "shared.db"
        chosen.touch(mode=0o640)
        os.chmod(chosen, 0o640)
        SQLiteStore(str(chosen)).close()
        assert stat.S_IMODE(os.stat(chosen).st_mode) == 0o640  # positive control: not changed
    finally:
        os.umask(old)


def test_the_subscription_cache_is_bounded_and_what_it_forgot_is_read_again(tmp_path, monkeypatch):
    """A churn of readers (subscribe, pull, retire, each with a new name) kept every retired subscription in
    the read cache for the process's life (a soak: ~0.7 KiB each, about 40 MB an hour at 10 a second). Past
    SUBSCRIPTIONS_CACHED_MAX the cache starts again; what it forgot is read from the file, and the writes
    after it (an ack, a re-subscribe that reactivates) land as if it had never been forgotten."""
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "SUBSCRIPTIONS_CACHED_MAX", 8)
    store = SQLiteStore(str(tmp_path / "churn.db"))
    service = MonitorService(store)
    owner = service.create_monitor({"id": "ci", "visibility": "public"}, None)["owner_token"]
    service.publish("ci", {"type": "com.example.x", "subject": "s", "data": {}}, owner)
    readers = []
    most = 0
    for i in range(30):
        made = service.subscribe({"monitor": "ci", "subscriber": f"agent:r{i}"}, None)
        sid, token = made["subscription"]["id"], made["token"]
        acked = service.pull(sid, token)["next"]
        service.ack(sid, token, {"cursor": acked})
        service.retire_subscription(sid, token, {})
        readers.append((sid, acked))
        most = max(most, len(store._subs), len(store._sub_keys))
    assert most <= 8  # positive control of the bound: 30 subscriptions went through it
    # the first reader was forgotten long ago: subscribing again reactivates the stored one, cursor kept
    again = service.subscribe({"monitor": "ci", "subscriber": "agent:r0"}, owner)
    assert again["subscription"]["id"] == readers[0][0] and again["subscription"]["active"] is True
    assert again["subscription"]["cursor"] == readers[0][1]  # its ack was kept
    store.close()
    reopened = SQLiteStore(str(tmp_path / "churn.db"))
    try:
        for i, (sid, acked) in enumerate(readers):
            stored = reopened.get_subscription(sid)
            assert stored is not None and stored.cursor == acked
            assert stored.state == (SubscriptionState.ACTIVE if i == 0 else SubscriptionState.RETIRED)
    finally:
        reopened.close()


def test_the_monitor_cache_is_bounded_too(tmp_path, monkeypatch):
    """Monitors made at will (a public server lets anyone register one) were kept decoded for the process's
    life, every one read or written. Past MONITORS_CACHED_MAX the cache starts again from the file."""
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "MONITORS_CACHED_MAX", 5)
    store = SQLiteStore(str(tmp_path / "many.db"))
    service = MonitorService(store)
    owners = {}
    most = 0
    for i in range(20):
        owners[f"m{i}"] = service.create_monitor({"id": f"m{i}", "visibility": "public"}, None)["owner_token"]
        service.publish(f"m{i}", {"type": "com.example.x", "subject": "s", "data": {}}, owners[f"m{i}"])
        most = max(most, len(store._monitors))
    assert most <= 5  # positive control of the bound: 20 monitors went through it
    for mid, owner in owners.items():  # each read again from the file as written: its head moves on
        assert service.publish(mid, {"type": "com.example.x", "subject": "s", "data": {}}, owner)["seq"] == 3
    store.close()


def test_store_locked_survives_pickling() -> None:
    """It crosses process boundaries in a multiprocessing embedder: its two parts come back whole."""
    import pickle

    from monitor_protocol.store.sqlite import StoreLocked

    again = pickle.loads(pickle.dumps(StoreLocked("The database x is held.", "Stop that process.")))
    assert (again.held, str(again)) == (
        "The database x is held.",
        "The database x is held. Stop that process.",
    )
