"""The SQLite store (the embedded default): WAL, synchronous=FULL so that every commit the engine reports is
on disk before the reply, one writer per database file (an exclusive flock on the file itself, docs/protocol.md
section 10), a `quick_check` at open, and every storage failure raised as `StorageError` after a rollback.
One writer per file, and which driver errors are the storage's fault: sqlite_file.py. A LogQuery as SQL:
sqlite_query.py. What the SQL stores share: sql.py.

The schema (format version 3, in `PRAGMA user_version`) is columnar: what a read selects or a filter tests
is a column, indexed where a read needs it, and the rest of a record is one JSON column (`rec`), so each
fact is stored once. What a reader's pull changes (its cursor, high-water mark, mute clock and last pull)
is columns too, so that writing a delivery encodes no JSON. The log keeps the event as served (`event`)
beside copies of its filterable attributes, and `scan`/`count` push a LogQuery into SQL. A version 2 file
is brought to version 3 at open, in one transaction; a file of another version is refused.

A transaction that writes nothing (no apply, an empty Changes, or one that changed no row) is rolled back,
not committed: it costs no fsync. `stats` counts durable commits with writes and those read-only calls."""

from __future__ import annotations

import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from monitor_protocol import __version__
from monitor_protocol.core import wire
from monitor_protocol.core.records import (
    Lease,
    Monitor,
    Observation,
    PublishKey,
    ServedRow,
    Subscription,
    stored_observation,
)
from monitor_protocol.core.store_contract import (
    Changes,
    LogQuery,
    StorageError,
    Store,
    StoreStats,
    Term,
    chunked_rows,
    serialized,
)
from monitor_protocol.store import sqlite_schema as queries
from monitor_protocol.store.sql import (
    ADDED_INDEXES,
    LEASE_COLUMNS,
    MONITOR_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    capped_count_sql,
    monitor_row,
    next_prefix,
    row_of,
    row_values,
    storable,
    upsert_sql,
)
from monitor_protocol.store.sqlite_file import (
    CORRUPT_CODES,
    StoreCorrupt,
    StoreLocked,
    StoreVersionError,
    WriterLock,
    guarded,
    is_storage_failure,
    primary_code,
    storage_error,
)
from monitor_protocol.store.sqlite_query import log_index, log_where, seekable_terms, source_of
from monitor_protocol.store.sqlite_schema import COUNT_ACTIVE_SQL, FOREIGN, FORMAT_1, SCHEMA
from monitor_protocol.store.sqlite_steps import MOVE_SUBSCRIPTION, narrow_rows, step_rows

# What callers import from here (the file's own failures live in sqlite_file.py).
__all__ = [
    "COUNT_ACTIVE_SQL",
    "SCHEMA_VERSION",
    "SQLiteStore",
    "StoreCorrupt",
    "StoreLocked",
    "StoreVersionError",
    "is_storage_failure",
]

SCHEMA_VERSION = 3
# What a reader's pull or ack changes, as columns of their own (SQLite's schema; PostgreSQL keeps its own).
SUBSCRIPTION_ROW = (*SUBSCRIPTION_COLUMNS, "last_pull")

_PUT_MONITOR = upsert_sql("monitors", MONITOR_COLUMNS, "id")
_PUT_SUBSCRIPTION = upsert_sql("subscriptions", SUBSCRIPTION_ROW, "id")
# The fields of a Subscription that live in `rec` (every field not in SUBSCRIPTION_ROW), read at once. Tuples
# compare item by item, each the same object first (a delivery's copy shares them all) and then equal.
_SUB_REST = operator.attrgetter(*(f for f in Subscription.__dataclass_fields__ if f not in SUBSCRIPTION_ROW))
_PUT_LEASE = upsert_sql("leases", LEASE_COLUMNS, "monitor, subject")

KNOWN_SUBJECTS_MAX = 100_000  # (monitor, subject) pairs remembered as stored
# Subscriptions kept decoded (~0.7 KiB each); past this the cache starts again (unbounded, readers' churn grew it)
SUBSCRIPTIONS_CACHED_MAX = 20_000
MONITORS_CACHED_MAX = 5_000  # monitors kept decoded (a few KiB each), the same way
MAX_SEQ = 2**63 - 1  # SQLite's largest integer: a to_seq beyond it means "to the end"
# A row read is a stored_observation(monitor, *row): its event is decoded when something first reads it.


class SQLiteStore(Store):
    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        self.path = path
        self.stats = StoreStats()
        self._writer = WriterLock()
        self._db: sqlite3.Connection = None  # type: ignore[assignment]  # set below; None once closed
        self._depth = 0
        self._serial = threading.RLock()  # one transaction or group commit at a time (and `serialized`)
        self._batch = False
        self._batch_broken = False
        self._batch_wrote = False
        self.batch_number = 0  # which group commit is open: the engine shares reads among a group's calls
        # Called with whether it committed when a group commit is over, outside any transaction; they must not
        # raise (the engine's signs of life a group wrote are forgotten once it commits: MonitorService).
        self.batch_end_hooks: list[Callable[[bool], None]] = []
        # Monitors and subscriptions read by id, kept between calls: this process is the file's only writer
        # (the flock), so what it committed is there. Records are immutable; what an apply put here before
        # its commit is forgotten wholesale if that work is rolled back.
        self._monitors: dict[str, Monitor] = {}
        self._subs: dict[str, Subscription] = {}
        # The indexed columns (monitor, subscriber, token_hash, state) of each subscription row as this
        # transaction's writes left them: a write that keeps them is the narrow UPDATE. Forgotten with _subs.
        self._sub_keys: dict[str, tuple[Any, ...]] = {}
        self._uncommitted = False
        self._applied = False  # the call in hand has applied its changes
        # How the call in hand is taken back if it fails: None (nothing to), "savepoint" or "restart".
        self._undo_by: str | None = None
        self._restarted = False  # a lone transaction rolled back by `_restart`, to begin again if it writes
        self._staged_monitors = False  # and among them a monitor, staged for the commit
        # Monitors this transaction changed, not yet in their table (written once, before the COMMIT).
        self._dirty: dict[str, Monitor] = {}
        self._call_dirty: dict[str, Monitor] = {}  # a call of a group: its monitors, until it ends
        # (monitor, subject) pairs the table holds, and those this transaction added: no statement for a repeat
        self._known_subjects: set[tuple[str, str]] = set()
        self._fresh_subjects: set[tuple[str, str]] = set()
        self._call_subjects: set[tuple[str, str]] = set()  # a call of a group: its subjects, until it ends
        in_memory = path in (":memory:", "")
        target = path if in_memory else os.path.realpath(path)
        if not in_memory:
            self._writer.acquire(target)
        try:
            self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
            if not in_memory:
                self._quick_check(target)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._open_schema(target)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sqlite3.Error) and is_storage_failure(exc):
                if primary_code(exc) in CORRUPT_CODES or "not a database" in str(exc).lower():
                    raise self._corrupt(target, str(exc)) from exc
                raise StorageError(f"cannot open the database {target}: {exc}") from exc
            raise

    # --- integrity at open ------------------------------------------------------------------------
    def _quick_check(self, real: str) -> None:
        try:
            rows = self._db.execute("PRAGMA quick_check(5)").fetchall()
        except sqlite3.DatabaseError as exc:
            if primary_code(exc) in CORRUPT_CODES or "not a database" in str(exc).lower():
                raise self._corrupt(real, str(exc)) from exc
            raise
        problems = [" ".join(str(r[0]).split()) for r in rows if r and r[0] != "ok"]
        if problems:
            raise self._corrupt(real, "quick_check reports: " + "; ".join(problems))

    @staticmethod
    def _corrupt(real: str, why: str) -> StoreCorrupt:
        return StoreCorrupt(
            f"The database {real} is damaged or is not a SQLite database ({why}); nothing will be served "
            "from it. Restore it from a backup, or start with another --db."
        )

    @serialized
    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None  # type: ignore[assignment]
        self._writer.release()

    # --- the format version -----------------------------------------------------------------------
    def _open_schema(self, real: str) -> None:
        """A file of this version opens as it is; an empty one gets the schema, and a version 2 file the
        change to version 3, each in one transaction."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            self._add_missing()
            return
        if version == 2:
            self._migrate_from_2(real)
            self.upgraded_from = 2
            return
        if version != 0:
            raise StoreVersionError(
                f"The database {real} is in format version {version}, and this monitor-protocol "
                f"{__version__} reads version {SCHEMA_VERSION}: "
                + ("it was written by a newer release. " if version > SCHEMA_VERSION else "")
                + "Nothing will be served from it; upgrade monitor-protocol, or start with another --db."
            )
        self._begin()
        try:
            if self._has_table("monitors"):
                columns = [r[1] for r in self._db.execute("PRAGMA table_info(monitors)").fetchall()]
                raise StoreVersionError(FORMAT_1 % real if columns == ["id", "rec"] else FOREIGN % real)
            self._create_schema()
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            self._rollback()
            raise
        self._commit()

    upgraded_from: int | None = None  # the format version this open brought to SCHEMA_VERSION, if any

    def _migrate_from_2(self, real: str) -> None:
        """Version 2 kept a subscription's last pull in `rec`; version 3 keeps it in a column of its own, so
        that a delivery's write encodes no JSON. One transaction: a failure leaves the file as it was."""
        self._begin()
        try:
            queries.upgrade_2_to_3(self._db)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException as exc:
            self._rollback()
            if isinstance(exc, Exception):  # a storage failure, or a row whose JSON rest cannot be read
                raise StoreVersionError(
                    f"The database {real} is in format version 2 and could not be brought to version "
                    f"{SCHEMA_VERSION} ({exc}); it was left as it was. Nothing will be served from it: free "
                    "what failed (disk space, permissions) and start again, or start with another --db."
                ) from exc
            raise
        self._commit()

    def _add_missing(self) -> None:
        """What was added to this format version after its release (sql.ADDED_INDEXES), when missing."""
        names = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        missing = [sql for name, sql in ADDED_INDEXES.items() if name not in names]
        if missing:
            self._begin()
            for sql in missing:
                self._db.execute(sql)
            self._commit()

    def _create_schema(self) -> None:
        for statement in SCHEMA:
            self._db.execute(statement)

    def _has_table(self, name: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
        ).fetchone()
        return row is not None

    # --- transactions -----------------------------------------------------------------------------
    # What a call writes, and when (the fewest statements the rules need): a call writes only in its one
    # `apply`, at its end; an observation is one INSERT, a subject's first use one more; the monitor's row
    # (its head and counters) is written once per transaction whatever the number of calls that changed it,
    # just before the COMMIT (`_dirty` holds its newest version until then, and reads see it). In a group
    # commit a call's statements share the group's transaction: an apply of more than one row takes a
    # savepoint of its own, so that a refused statement takes the whole apply back and the group goes on;
    # the transaction's first writer takes none (its failure begins the transaction again: `_restart`).
    def _run(self, sql: str) -> None:
        try:
            self._db.execute(sql)
        except sqlite3.Error as exc:
            if is_storage_failure(exc):
                raise storage_error(exc) from exc
            raise

    def _forget_uncommitted(self) -> None:
        """The transaction is being undone: forget every record it wrote (the caches are refilled by reads)."""
        self._dirty.clear()
        self._call_dirty.clear()
        self._fresh_subjects.clear()
        self._call_subjects.clear()
        if self._uncommitted:
            self._monitors.clear()
            self._forget_subscriptions()
            self._uncommitted = False

    def _rollback(self) -> None:
        """Roll the open transaction back, if SQLite has not already done so (it may, after FULL or IOERR)."""
        self._forget_uncommitted()
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original failure is what the caller hears about

    def _flush_monitors(self) -> None:
        """Write the monitors this transaction changed, each once, in its newest version."""
        dirty = self._dirty
        if not dirty:
            return
        db = self._db
        if len(dirty) == 1:
            (m,) = dirty.values()
            db.execute(_PUT_MONITOR, monitor_row(m))
        else:
            db.executemany(_PUT_MONITOR, map(monitor_row, dirty.values()))
        if len(self._monitors) + len(dirty) > MONITORS_CACHED_MAX:
            self._monitors.clear()
        for m in dirty.values():
            self._monitors[m.id] = m
        dirty.clear()

    def _commit(self) -> None:
        if not self._db.in_transaction:  # SQLite rolled it back after a failure the caller swallowed
            self._forget_uncommitted()
            raise StorageError("the transaction was rolled back by the database after a storage failure")
        try:
            self._flush_monitors()
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()  # a failed COMMIT leaves the database as it was
            if is_storage_failure(exc):
                raise storage_error(exc) from exc
            raise
        self._uncommitted = False
        known = self._known_subjects
        if len(known) + len(self._fresh_subjects) > KNOWN_SUBJECTS_MAX:
            known.clear()
        known.update(self._fresh_subjects)
        self._fresh_subjects.clear()

    def _finish(self, wrote: bool) -> None:
        """End a top-level transaction: commit what it wrote; a transaction that wrote nothing is rolled
        back instead, which writes nothing to the WAL and costs no fsync."""
        if wrote or self._dirty:
            self._commit()
            self.stats.commits += 1
        else:
            self._rollback()

    def _begin(self) -> None:
        if self._db is None:  # an embedder's call after close(): said, not an AttributeError
            raise RuntimeError(f"the SQLite store {self.path} is closed; open it again (SQLiteStore(path))")
        if self._db.in_transaction:  # left over from a failure whose rollback failed: start clean
            self._rollback()
        self._run("BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        # One at a time whichever thread calls: `_depth` alone would let another thread's call join this one.
        with self._serial:
            if self._depth:
                yield
                return
            if self._batch:
                if self._batch_broken or not self._db.in_transaction:
                    self._batch_broken = True
                    raise StorageError("a storage failure rolled back this group commit; retry the call")
            else:
                self._begin()
            self._applied = False
            self._undo_by = None
            self._restarted = False
            self._staged_monitors = False
            # Whether the call wrote: rows changed since it began, or a monitor staged for the commit.
            mark = self._db.total_changes
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                if not self._batch:
                    self._rollback()
                elif self._applied:
                    self._undo_call()
                raise
            self._depth = 0
            wrote = self._applied and (self._db.total_changes != mark or self._staged_monitors)
            if not wrote:
                self.stats.read_only += 1
            if self._batch:
                if self._applied:
                    self._end_call()
                self._batch_wrote = self._batch_wrote or wrote
            else:
                self._finish(wrote)

    def _end_call(self) -> None:
        """A call of a group succeeded: its savepoint goes, its monitors join the group's."""
        if self._undo_by == "savepoint":
            try:
                self._db.execute("RELEASE call")
            except sqlite3.Error as exc:
                self._batch_broken = True
                raise StorageError(f"a storage failure rolled back this group commit: {exc}") from exc
        self._undo_by = None
        self._dirty.update(self._call_dirty)
        self._call_dirty.clear()
        self._fresh_subjects.update(self._call_subjects)
        self._call_subjects.clear()

    def _undo_call(self) -> None:
        """A call of a group failed after its apply: take back what it wrote, and only that."""
        self._call_dirty.clear()
        self._call_subjects.clear()
        self._monitors.clear()  # may hold what it wrote; refilled by reads (the group's newest are in _dirty)
        self._forget_subscriptions()
        undo_by, self._undo_by = self._undo_by, None
        if undo_by == "restart":  # it was the group's first writer: nothing of the others is lost
            self._restart()
            return
        if not self._db.in_transaction:  # SQLite rolled the whole group back
            self._batch_broken = True
            return
        try:
            self._db.execute("ROLLBACK TO call")
            self._db.execute("RELEASE call")
        except sqlite3.Error:
            self._batch_broken = True
            self._rollback()

    def _restart(self) -> None:
        """Take back the transaction's first writer, the only writes it holds: roll it back. A group begins
        again at once; a lone transaction only if its call writes again (`apply`). A group that cannot begin
        again is broken (its later calls and its commit fail); this call still hears its own failure."""
        self._rollback()
        self._applied = False  # nothing of the call is left: a write after this is the first again
        if not self._batch:
            self._restarted = True
            return
        try:
            self._run("BEGIN IMMEDIATE")
        except (StorageError, sqlite3.Error):
            self._batch_broken = True

    @property
    def in_batch(self) -> bool:
        return self._batch

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: the transactions inside share one commit (one fsync). A caller may reply to none of
        them until this block has exited without error; when the commit fails (or a storage failure rolled
        the group back), it raises StorageError and nothing of the group is kept."""
        with self._serial:  # one group at a time, whichever thread calls
            if self._batch:
                yield
                return
            self._begin()
            self._batch = True
            self.batch_number += 1
            self._batch_broken = False
            self._batch_wrote = False
            committed = False
            try:
                try:
                    yield
                except BaseException:
                    self._batch = False
                    self._batch_broken = False
                    self._rollback()
                    raise
                self._batch = False
                broken, self._batch_broken = self._batch_broken, False
                if broken:
                    self._rollback()
                    raise StorageError(
                        "a storage failure rolled back this group commit; nothing in it was kept"
                    )
                self._finish(self._batch_wrote)
                committed = True
            finally:
                for hook in self.batch_end_hooks:
                    hook(committed)

    # --- the one write of a call ------------------------------------------------------------------
    @serialized
    @guarded
    def apply(self, changes: Changes) -> None:
        if not self._depth:  # outside a call: a transaction of its own
            with self.transaction():
                self.apply(changes)
            return
        if changes.empty():
            return
        if self._restarted:  # a lone call's first write was taken back (`_restart`) and it writes again
            self._restarted = False
            self._begin()
        known = self._known_subjects
        subjects = [s for s in changes.subjects if s not in known] if changes.subjects else []
        first = not self._applied and not self._dirty and not (self._batch and self._batch_wrote)
        if first:  # taken back by `_restart`: no savepoint journals its pages (~1 us per row of a batch)
            self._undo_by = "restart"
        elif self._batch and not self._applied:
            # A group's later writer takes a savepoint, kept until the call ends: a failure after its apply,
            # or a refused statement within it, takes back what it wrote and the group goes on.
            self._db.execute("SAVEPOINT call")
            self._undo_by = "savepoint"
        self._uncommitted = True
        self._applied = True
        c = changes
        rows = len(c.observations) + len(subjects) + len(c.subscriptions) + len(c.leases)
        rows += len(c.publish_keys) + len(c.compactions) + (c.purge_keys_before is not None)
        if rows <= 1:  # one statement is all or nothing by itself
            self._write(changes, subjects)
        elif first:
            try:
                self._write(changes, subjects)
            except BaseException:
                self._restart()  # and the call's own failure path has nothing left to undo
                raise
        else:
            # A savepoint of its own, so that a refused statement (a taken subscriber, a duplicate seq)
            # takes back the whole apply even if the caller goes on to commit.
            db = self._db
            db.execute("SAVEPOINT apply")
            try:
                self._write(changes, subjects)
            except BaseException:
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK TO apply")
                        db.execute("RELEASE apply")
                    except sqlite3.Error:
                        pass  # the transaction's own rollback follows; the original failure is what counts
                raise
            db.execute("RELEASE apply")
        self._staged_monitors = self._staged_monitors or bool(changes.monitors)
        in_group = self._batch
        staged = self._call_dirty if in_group else self._dirty
        for m in changes.monitors:
            staged[m.id] = m
        if len(self._subs) + len(changes.subscriptions) > SUBSCRIPTIONS_CACHED_MAX:
            self._forget_subscriptions()  # (their rows then get the upsert once, see _write_subscriptions)
        for sub in changes.subscriptions:
            self._subs[sub.id] = sub
        (self._call_subjects if in_group else self._fresh_subjects).update(subjects)

    def _write(self, changes: Changes, subjects: list[tuple[str, str]]) -> None:
        db = self._db
        observations = changes.observations
        if observations:
            encode = wire.encode_text
            rows = [
                (o.monitor, o.seq, o.type, o.subject, o.actor, o.origin, o.tier, o.horizon, encode(o.event))
                for o in observations
            ]
            if len(rows) == 1:  # the usual call: execute is cheaper than executemany of one
                db.execute(queries.PUT_OBSERVATION, rows[0])
            else:
                db.executemany(queries.PUT_OBSERVATION, rows)
        if subjects:
            db.executemany("INSERT OR IGNORE INTO subjects (monitor, subject) VALUES (?, ?)", subjects)
        if changes.subscriptions:
            self._write_subscriptions(changes.subscriptions)
        if changes.leases:
            db.executemany(_PUT_LEASE, (row_values(x.to_row(), LEASE_COLUMNS) for x in changes.leases))
        if changes.publish_keys:
            db.executemany(
                queries.PUT_PUBLISH_KEY, ((k.monitor, k.key, k.seq, k.at) for k in changes.publish_keys)
            )
        for monitor, below in changes.compactions:
            db.execute("DELETE FROM observations WHERE monitor=? AND seq<?", (monitor, below))
        if changes.purge_keys_before is not None:
            db.execute("DELETE FROM publish_keys WHERE at<?", (float(changes.purge_keys_before),))

    def _write_subscriptions(self, subs: list[Subscription]) -> None:
        """A row whose indexed columns this process wrote last, unchanged, gets a narrow UPDATE: of its own
        columns alone (sqlite_steps.step_rows, no JSON) when the rest of the record is what the row holds (a
        pull's delivery), else with `rec` too. One that turns out not to be there (rowcount 0) gets the
        upsert, so a stale memory can cost a statement, never a write. The upserts go one statement each,
        in order (the unique index checks each new identity); the narrow UPDATEs go first, each kind as one
        executemany (they touch no indexed column, so their order against the upserts changes nothing), and
        when a rowcount says a row was missing, every one of them gets the upsert too (their values again:
        nothing else changes). A subscription named twice takes the upserts, in order."""
        db, keys = self._db, self._sub_keys
        steps: list[tuple[Any, ...]] = []
        others: list[Subscription] = []
        seen: set[str] = set()
        in_order = False
        for sub in subs:
            if sub.id in seen:  # two versions in one apply: the last wins, so the upserts, all, in order
                in_order = True
                break
            seen.add(sub.id)
            # (the state as it is: a StrEnum equals its text, and `.value` costs an enum lookup per row)
            if keys.get(sub.id) == (sub.monitor, sub.subscriber, sub.token_hash, sub.state) and (
                self._rest_stored(sub)
            ):
                steps.append((sub.cursor, sub.hwm, sub.mute_since, sub.last_pull, sub.id))
            else:
                others.append(sub)
        # A row that was not there (a short rowcount): the upsert for every one (the same values again).
        upsert_all = in_order or (bool(steps) and not step_rows(self._db, steps))
        if upsert_all:
            others = list(subs)
        if not others:
            return
        rows = [row_values(sub.to_row(), SUBSCRIPTION_ROW) for sub in others]
        narrow = [] if upsert_all else [(*v[5:], v[0]) for v in rows if keys.get(v[0]) == v[1:5]]
        if narrow and narrow_rows(self._db, MOVE_SUBSCRIPTION, narrow):
            rows = [v for v in rows if keys.get(v[0]) != v[1:5]]
        for values in rows:  # the rest, or all of them again when a row was not there (same values)
            db.execute(_PUT_SUBSCRIPTION, values)
            keys[values[0]] = values[1:5]

    def _rest_stored(self, sub: Subscription) -> bool:
        """Whether the row already holds `sub`'s `rec`: the version this process last wrote or read for it
        (the cache holds nothing a rollback took back) has the same fields outside the columns. A pull's
        delivery is a copy that changes columns alone, so its fields are the very same objects."""
        old = self._subs.get(sub.id)
        return old is not None and _SUB_REST(old) == _SUB_REST(sub)

    # --- monitors ---------------------------------------------------------------------------------
    _GET_MONITOR = f"SELECT {', '.join(MONITOR_COLUMNS)}, rec FROM monitors"

    @guarded
    def get_monitor(self, monitor_id: str) -> Monitor | None:
        cached = (
            self._call_dirty.get(monitor_id) or self._dirty.get(monitor_id) or self._monitors.get(monitor_id)
        )
        if cached is not None:
            return cached
        row = self._db.execute(f"{self._GET_MONITOR} WHERE id=?", (monitor_id,)).fetchone()
        if not row:
            return None
        if len(self._monitors) >= MONITORS_CACHED_MAX:
            self._monitors.clear()
        rec = self._monitors[monitor_id] = Monitor.from_row(row_of(row, MONITOR_COLUMNS))
        return rec

    @guarded
    def list_monitors(self) -> list[Monitor]:
        return self._monitors_where("")

    @guarded
    def list_monitors_with_readers(self) -> list[Monitor]:
        return self._monitors_where(f"WHERE id IN ({queries.ACTIVE_MONITOR_IDS})")

    @guarded
    def list_monitors_page(self, after: str, limit: int) -> list[Monitor]:
        return self._monitors_where("WHERE id > ?", after, limit)

    def _monitors_where(self, where: str, after: str | None = None, limit: int = -1) -> list[Monitor]:
        args = () if after is None else (after,)  # (a limit of -1 is none)
        rows = self._db.execute(f"{self._GET_MONITOR} {where} ORDER BY id LIMIT {int(limit)}", args)
        found = [Monitor.from_row(row_of(r, MONITOR_COLUMNS)) for r in rows]
        if not self._dirty and not self._call_dirty:
            return found
        newest = {m.id: m for m in found}
        for m in (*self._dirty.values(), *self._call_dirty.values()):  # changed, not yet written
            if m.id in newest or not where or (after is not None and m.id > after):
                newest[m.id] = m
        return [newest[k] for k in sorted(newest)[: limit if limit >= 0 else None]]

    # --- the log ----------------------------------------------------------------------------------
    @guarded
    def get_observation(self, monitor_id: str, seq: int) -> Observation | None:
        row = self._db.execute(
            f"{queries.SELECT_OBSERVATION} WHERE monitor=? AND seq=?", (monitor_id, seq)
        ).fetchone()
        return stored_observation(monitor_id, *row) if row else None

    @guarded
    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        to_seq = min(to_seq, MAX_SEQ)
        plan = None if query is None else self._scan_plan(monitor_id, query)
        if plan is None:
            yield from self._scan_all(monitor_id, from_seq, to_seq)
        else:
            yield from self._scan_where(monitor_id, from_seq, to_seq, *plan)

    def _scan_plan(self, monitor_id: str, query: LogQuery) -> tuple[str, str, list[Any]] | None:
        """(FROM, WHERE condition, its parameters) for a filtered scan; None when the query selects all."""
        where = log_where(query)
        if where is None:
            return None
        if log_index(query) is not None:
            return (source_of(query), *where)
        seek = self._expand(monitor_id, query)
        if seek is None:
            return ("observations", *where)
        # The seek is the IN of the values found; the query's own condition, plain, is only tested on the
        # rows it finds (else SQLite may seek the prefix range instead, and walk all of it).
        column, values = seek
        cond, params = log_where(query, plain=True) or ("1", [])
        cond = f"({cond}) AND {column} IN ({', '.join('?' * len(values))})"
        return (f"observations INDEXED BY observations_by_{column}", cond, [*params, *values])

    # A prefix term whose values in this log are few becomes those values, so that a read seeks them.
    EXPAND_LIMIT = 32

    def _expand(self, monitor_id: str, query: LogQuery) -> tuple[str, list[str]] | None:
        """For a seekable term with prefixes (`types: ["com.example.*"]`), the distinct values of its
        column in this monitor's log that the term admits, found by one index seek each (a skip scan of
        the prefix's range). Added to the condition as `column IN (...)`, they let the scan seek that
        column's index in seq order: without them a prefix that matches nothing walks a million rows.
        None when no term has few enough values (more than EXPAND_LIMIT) to be worth it."""
        terms = [t for t in seekable_terms(query) if t.prefixes]
        for term in sorted(terms, key=lambda t: len(t.prefixes)):
            values = self._values_with_prefixes(monitor_id, term)
            if values is not None:
                return term.column, [*dict.fromkeys([v for v in term.exact if storable(v)] + values)]
        return None

    def _values_with_prefixes(self, monitor_id: str, term: Term) -> list[str] | None:
        col = term.column
        found: list[str] = []
        for prefix in term.prefixes:
            if not storable(prefix):
                continue
            upper = next_prefix(prefix)
            bound = "" if upper is None else f" AND {col} < ?"
            after: str | None = None
            while True:
                op, low = (">=", prefix) if after is None else (">", after)
                row = self._db.execute(
                    f"SELECT {col} FROM observations INDEXED BY observations_by_{col} "
                    f"WHERE monitor=? AND {col} {op} ?{bound} ORDER BY {col} LIMIT 1",
                    (monitor_id, low) if upper is None else (monitor_id, low, upper),
                ).fetchone()
                if row is None:
                    break
                after = row[0]
                found.append(row[0])
                if len(found) > self.EXPAND_LIMIT:
                    return None
        return found

    @guarded
    def read_range(self, monitor_id: str, from_seq: int, to_seq: int, *, served: bool = False) -> list[Any]:
        args = (monitor_id, from_seq, min(to_seq, MAX_SEQ))  # one statement; served: two columns a row
        if served:
            return [ServedRow(*r) for r in self._db.execute(queries.SELECT_SERVED, args).fetchall()]
        return [stored_observation(monitor_id, *r) for r in self._db.execute(queries.SELECT_RANGE, args)]

    def _scan_all(self, monitor_id: str, from_seq: int, to_seq: int) -> Iterator[Observation]:
        sql = f"{queries.SELECT_RANGE} LIMIT ?"

        def fetch(start: int, end: int, limit: int) -> list[Any]:
            return self._db.execute(sql, (monitor_id, start, end, limit)).fetchall()

        for r in chunked_rows(fetch, from_seq, to_seq, windowed=False):
            yield stored_observation(monitor_id, *r)

    def _scan_where(
        self, monitor_id: str, from_seq: int, to_seq: int, source: str, cond: str, params: list[Any]
    ) -> Iterator[Observation]:
        """A filtered read in seq windows (base.chunked_rows), within the monitor's stored seqs."""
        # Two subqueries, not `min(seq), max(seq)` in one: SQLite answers a lone min() or max() from the
        # primary key's end, but both at once by reading every row of the monitor.
        bounds = self._db.execute(
            "SELECT (SELECT min(seq) FROM observations WHERE monitor=?), "
            "(SELECT max(seq) FROM observations WHERE monitor=?)",
            (monitor_id, monitor_id),
        ).fetchone()
        if bounds[0] is None:
            return
        sql = f"{queries.SELECT_FROM} {source} WHERE monitor=? AND seq>=? AND seq<=? AND ({cond}) ORDER BY seq LIMIT ?"

        def fetch(start: int, end: int, limit: int) -> list[Any]:
            return self._db.execute(sql, (monitor_id, start, end, *params, limit)).fetchall()

        rows = chunked_rows(fetch, max(from_seq, bounds[0]), min(to_seq, bounds[1]), windowed=True)
        for r in rows:
            yield stored_observation(monitor_id, *r)

    @guarded
    def count(
        self,
        monitor_id: str,
        from_seq: int,
        to_seq: int,
        query: LogQuery | None = None,
        cap: int | None = None,
    ) -> int:
        if cap is not None and cap <= 0:
            return 0
        cond, params = log_where(query) or ("1", [])
        sql = capped_count_sql(source_of(query), cond, "?")
        args = (monitor_id, from_seq, min(to_seq, MAX_SEQ), *params, -1 if cap is None else cap)
        return int(self._db.execute(sql, args).fetchone()[0])

    # --- subjects ---------------------------------------------------------------------------------
    @guarded
    def has_subject(self, monitor_id: str, subject: str) -> bool:
        pair = (monitor_id, subject)
        if pair in self._known_subjects or pair in self._fresh_subjects or pair in self._call_subjects:
            return True
        row = self._db.execute(
            "SELECT 1 FROM subjects WHERE monitor=? AND subject=?", (monitor_id, subject)
        ).fetchone()
        return row is not None

    @guarded
    def list_subjects(self, monitor_id: str) -> list[str]:
        rows = self._db.execute(
            "SELECT subject FROM subjects WHERE monitor=? ORDER BY subject", (monitor_id,)
        )
        return [r[0] for r in rows]

    # --- subscriptions ----------------------------------------------------------------------------
    _GET_SUBSCRIPTION = f"SELECT {', '.join(SUBSCRIPTION_ROW)}, rec FROM subscriptions"

    def _subscription(self, where: str, args: tuple[Any, ...]) -> Subscription | None:
        row = self._db.execute(f"{self._GET_SUBSCRIPTION} WHERE {where}", args).fetchone()
        return Subscription.from_row(row_of(row, SUBSCRIPTION_ROW)) if row else None

    @guarded
    def get_subscription(self, sub_id: str) -> Subscription | None:
        cached = self._subs.get(sub_id)
        if cached is not None:
            return cached
        sub = self._subscription("id=?", (sub_id,))
        if sub is not None:
            if len(self._subs) >= SUBSCRIPTIONS_CACHED_MAX:
                self._forget_subscriptions()
            self._subs[sub_id] = sub
        return sub

    def _forget_subscriptions(self) -> None:
        self._subs.clear()
        self._sub_keys.clear()

    @guarded
    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None:
        return self._subscription("monitor=? AND subscriber=?", (monitor_id, subscriber))

    @guarded
    def find_subscription_by_token(self, token_hash: str) -> Subscription | None:
        return self._subscription("token_hash=?", (token_hash,))

    @guarded
    def list_subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        if monitor_id is None:
            rows = self._db.execute(f"{self._GET_SUBSCRIPTION} ORDER BY id")
        else:
            rows = self._db.execute(f"{self._GET_SUBSCRIPTION} WHERE monitor=? ORDER BY id", (monitor_id,))
        return [Subscription.from_row(row_of(r, SUBSCRIPTION_ROW)) for r in rows]

    @guarded
    def list_active_subscriptions(self) -> list[Subscription]:
        # Sorted here: `ORDER BY id` made SQLite walk the primary key through every retired reader (a soak's
        # sweep, 14 ms with 13,000 rows, 550 active), where the active ones' partial index reads only them.
        rows = self._db.execute(f"{self._GET_SUBSCRIPTION} WHERE state = 'active'").fetchall()
        rows.sort(key=lambda r: r[0])
        return [Subscription.from_row(row_of(r, SUBSCRIPTION_ROW)) for r in rows]

    @guarded
    def count_active_subscriptions(self, monitor_id: str) -> int:
        return int(self._db.execute(COUNT_ACTIVE_SQL, (monitor_id,)).fetchone()[0])

    @guarded
    def backlog_summary(self, top: int) -> dict[str, Any]:
        monitors, active, total = self._db.execute(queries.BACKLOG_TOTALS_SQL).fetchone()
        rows = [tuple(r) for r in self._db.execute(queries.BACKLOG_TOP_SQL, (top,))]
        return {"monitors": monitors, "active": active, "top": rows, "total": total}

    # --- leases -----------------------------------------------------------------------------------
    _GET_LEASE = f"SELECT {', '.join(LEASE_COLUMNS)}, rec FROM leases"

    @guarded
    def get_lease(self, monitor_id: str, subject: str) -> Lease | None:
        row = self._db.execute(
            f"{self._GET_LEASE} WHERE monitor=? AND subject=?", (monitor_id, subject)
        ).fetchone()
        return Lease.from_row(row_of(row, LEASE_COLUMNS)) if row else None

    @guarded
    def list_leases(self, monitor_id: str | None = None) -> list[Lease]:
        if monitor_id is None:
            rows = self._db.execute(f"{self._GET_LEASE} ORDER BY monitor, subject")
        else:
            rows = self._db.execute(f"{self._GET_LEASE} WHERE monitor=? ORDER BY subject", (monitor_id,))
        return [Lease.from_row(row_of(r, LEASE_COLUMNS)) for r in rows]

    @guarded
    def list_held_leases(self) -> list[Lease]:
        rows = self._db.execute(f"{self._GET_LEASE} WHERE holder IS NOT NULL ORDER BY monitor, subject")
        return [Lease.from_row(row_of(r, LEASE_COLUMNS)) for r in rows]

    # --- publish idempotency keys -----------------------------------------------------------------
    @guarded
    def get_publish_key(self, monitor_id: str, key: str) -> PublishKey | None:
        row = self._db.execute(
            "SELECT seq, at FROM publish_keys WHERE monitor=? AND key=?", (monitor_id, key)
        ).fetchone()
        return PublishKey(monitor_id, key, int(row[0]), float(row[1])) if row else None

    @guarded
    def list_publish_keys(self, monitor_id: str) -> list[PublishKey]:
        rows = self._db.execute(
            "SELECT key, seq, at FROM publish_keys WHERE monitor=? ORDER BY key", (monitor_id,)
        )
        return [PublishKey(monitor_id, r[0], int(r[1]), float(r[2])) for r in rows]
