"""The SQLite store (the embedded default): WAL, synchronous=FULL so that every commit the engine reports is
on disk before the reply, one writer per database file (an exclusive flock on the file itself, PROTOCOL.md
section 10), a `quick_check` at open, and every storage failure raised as `StorageError` after a rollback.

One writer: the lock is `flock(LOCK_EX | LOCK_NB)` on the database file itself (its realpath, opened O_RDWR),
so a hard link, a symbolic link or another spelling of the path is the same lock. flock is independent of
the POSIX locks SQLite takes (Linux), and the kernel drops it when the process dies. Beside the realpath
the holder writes a note `<realpath>.writer` (JSON: pid, host, since, path, inode) that a refused opener
reads to name it; the note is removed on close()."""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .base import Record, StorageError, Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS monitors (id TEXT PRIMARY KEY, rec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS observations (
    monitor TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, PRIMARY KEY (monitor, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subjects (monitor TEXT NOT NULL, subject TEXT NOT NULL, PRIMARY KEY (monitor, subject))
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    id TEXT PRIMARY KEY, monitor TEXT NOT NULL, subscriber TEXT NOT NULL, token_hash TEXT NOT NULL, rec TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_by_name ON subscriptions (monitor, subscriber);
CREATE INDEX IF NOT EXISTS subscriptions_by_token ON subscriptions (token_hash);
CREATE INDEX IF NOT EXISTS subscriptions_active ON subscriptions (monitor) WHERE json_extract(rec, '$.active');
CREATE TABLE IF NOT EXISTS leases (
    monitor TEXT NOT NULL, subject TEXT NOT NULL, rec TEXT NOT NULL, PRIMARY KEY (monitor, subject)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency (
    monitor TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, rec TEXT NOT NULL, PRIMARY KEY (monitor, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_by_at ON idempotency (at);
"""

# The active-subscription count is answered from the partial index alone (no row is read).
_COUNT_ACTIVE = "SELECT count(*) FROM subscriptions WHERE monitor=? AND json_extract(rec, '$.active')"

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

NOTE_SUFFIX = ".writer"

# Primary result codes that mean the storage failed, not the caller: BUSY, LOCKED, NOMEM, READONLY, IOERR,
# CORRUPT, FULL, CANTOPEN, PROTOCOL, NOLFS, NOTADB and PERM. CONSTRAINT (IntegrityError), ERROR (bad SQL),
# MISUSE, RANGE and TOOBIG are bugs and stay the driver's own exceptions.
_STORAGE_CODES = frozenset({3, 5, 6, 7, 8, 10, 11, 13, 14, 15, 22, 26})
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_STORAGE_WORDS = (
    "disk",
    "full",
    "i/o",
    "readonly",
    "read-only",
    "unable to open",
    "malformed",
    "not a database",
    "locked",
    "out of memory",
)


class StoreLocked(RuntimeError):
    """A second writer tried to open a database file that another store holds (however the path is spelled)."""


class StoreCorrupt(RuntimeError):
    """The database failed SQLite's `quick_check` at open, or the file is not a SQLite database: nothing is
    served from it. The message names the file and says what to do."""


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_storage_failure(exc: BaseException) -> bool:
    """True for a driver error that is the storage's fault (disk full, I/O, read-only, corrupt, busy...)."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, sqlite3.IntegrityError):
        return False
    code = _primary_code(exc)
    if code is not None:
        return code in _STORAGE_CODES
    text = str(exc).lower()
    return any(word in text for word in _STORAGE_WORDS)


def _storage_error(exc: sqlite3.Error) -> StorageError:
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return StorageError(f"storage failure ({name}): {exc}")


F = TypeVar("F", bound=Callable[..., Any])


def _guarded(fn: F) -> F:
    """Raise the driver's storage failures as StorageError (a generator is guarded while it is read)."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from fn(*args, **kwargs)
            except sqlite3.Error as exc:
                if is_storage_failure(exc):
                    raise _storage_error(exc) from exc
                raise

        return gen  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as exc:
            if is_storage_failure(exc):
                raise _storage_error(exc) from exc
            raise

    return call  # type: ignore[return-value]


# Database files this process holds, by (st_dev, st_ino) -> the holder's note. A second open in the same
# process is refused from here, without opening the file: closing ANY descriptor of a file drops every
# POSIX lock this process holds on it, SQLite's own locks of the first store included.
_HELD: dict[tuple[int, int], dict[str, Any]] = {}
_HELD_LOCK = threading.Lock()


def _holder_text(note: dict[str, Any]) -> str:
    return f"pid {note.get('pid')} on {note.get('host')} since {note.get('since')}"


def _read_note(note_path: str, inode: tuple[int, int]) -> dict[str, Any] | None:
    """The holder's note, if it is there and is the current holder's (same file, a live pid on this host)."""
    try:
        with open(note_path, encoding="utf-8") as f:
            note = json.loads(f.read(4096))
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict) or list(note.get("inode") or ()) != list(inode):
        return None
    if note.get("host") == socket.gethostname() and isinstance(note.get("pid"), int):
        try:
            os.kill(note["pid"], 0)
        except ProcessLookupError:
            return None  # a stale note: that process is gone
        except OSError:
            pass  # alive, owned by someone else
    return note


class SQLiteStore(Store):
    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._note_path: str | None = None
        self._db: sqlite3.Connection = None  # type: ignore[assignment]  # set below; None once closed
        self._depth = 0
        self._batch = False
        self._batch_broken = False
        in_memory = path in (":memory:", "")
        target = path if in_memory else os.path.realpath(path)
        if not in_memory:
            self._acquire_lock(target)
        try:
            self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
            if not in_memory:
                self._quick_check(target)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._db.executescript(SCHEMA)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sqlite3.Error) and is_storage_failure(exc):
                if _primary_code(exc) in _CORRUPT_CODES or "not a database" in str(exc).lower():
                    raise self._corrupt(target, str(exc)) from exc
                raise StorageError(f"cannot open the database {target}: {exc}") from exc
            raise

    # --- one writer per file ----------------------------------------------------------------------
    def _acquire_lock(self, real: str) -> None:
        import fcntl  # POSIX only; the browser never opens a SQLite store

        note_path = real + NOTE_SUFFIX
        with _HELD_LOCK:
            try:
                st = os.stat(real)
                held = _HELD.get((st.st_dev, st.st_ino))
            except FileNotFoundError:
                held = None
            if held is not None:
                raise self._locked(real, held)
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            st = os.fstat(fd)
            inode = (st.st_dev, st.st_ino)
            held = _HELD.get(inode)
            if held is not None:  # created or linked meanwhile under this name
                os.close(fd)
                raise self._locked(real, held)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # no SQLite connection of this process is on this file (see _HELD)
                raise self._locked(real, _read_note(note_path, inode)) from None
            note = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "path": real,
                "inode": list(inode),
            }
            _HELD[inode] = note
            self._lock_fd, self._inode = fd, inode
        try:
            tmp = f"{note_path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(note) + "\n")
            os.replace(tmp, note_path)
            self._note_path = note_path
        except OSError:
            pass  # the note only names the holder; the lock is what counts

    @staticmethod
    def _locked(real: str, note: dict[str, Any] | None) -> StoreLocked:
        if note is not None:
            holder = _holder_text(note)
            if note.get("path") and note["path"] != real:
                holder += f", through the name {note['path']}"
        else:
            holder = (
                f"another process (no current note at {real}{NOTE_SUFFIX}: it may have opened this same "
                "file under another name, such as a hard link)"
            )
        return StoreLocked(
            f"The database {real} is already open for writing by {holder}. "
            "Stop that process, or start this one with another --db."
        )

    def _release_lock(self) -> None:
        if self._lock_fd is None:
            return
        if self._note_path is not None:
            try:
                os.unlink(self._note_path)
            except OSError:
                pass
            self._note_path = None
        with _HELD_LOCK:
            if self._inode is not None:
                _HELD.pop(self._inode, None)
                self._inode = None
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # --- integrity at open ------------------------------------------------------------------------
    def _quick_check(self, real: str) -> None:
        try:
            rows = self._db.execute("PRAGMA quick_check(5)").fetchall()
        except sqlite3.DatabaseError as exc:
            if _primary_code(exc) in _CORRUPT_CODES or "not a database" in str(exc).lower():
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

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None  # type: ignore[assignment]
        self._release_lock()

    # --- transactions -----------------------------------------------------------------------------
    def _run(self, sql: str) -> None:
        try:
            self._db.execute(sql)
        except sqlite3.Error as exc:
            if is_storage_failure(exc):
                raise _storage_error(exc) from exc
            raise

    def _rollback(self) -> None:
        """Roll the open transaction back, if SQLite has not already done so (it may, after FULL or IOERR)."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original failure is what the caller hears about

    def _commit(self) -> None:
        if not self._db.in_transaction:  # SQLite rolled it back after a failure the caller swallowed
            raise StorageError("the transaction was rolled back by the database after a storage failure")
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()  # a failed COMMIT leaves the database as it was
            if is_storage_failure(exc):
                raise _storage_error(exc) from exc
            raise

    def _begin(self) -> None:
        if self._db.in_transaction:  # left over from a failure whose rollback failed: start clean
            self._rollback()
        self._run("BEGIN IMMEDIATE")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            yield
            return
        if self._batch:
            if self._batch_broken or not self._db.in_transaction:
                self._batch_broken = True
                raise StorageError("a storage failure rolled back this group commit; retry the call")
            self._run("SAVEPOINT call")
        else:
            self._begin()
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            if self._batch:
                self._abort_savepoint()
            else:
                self._rollback()
            raise
        self._depth = 0
        if self._batch:
            try:
                self._db.execute("RELEASE call")
            except sqlite3.Error as exc:
                self._batch_broken = True
                raise StorageError(f"a storage failure rolled back this group commit: {exc}") from exc
        else:
            self._commit()

    def _abort_savepoint(self) -> None:
        if not self._db.in_transaction:  # SQLite rolled the whole group back
            self._batch_broken = True
            return
        try:
            self._db.execute("ROLLBACK TO call")
            self._db.execute("RELEASE call")
        except sqlite3.Error:
            self._batch_broken = True
            self._rollback()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: the transactions inside become savepoints of one commit (one fsync). A caller
        may reply to none of them until this block has exited without error; when the commit fails (or a
        storage failure rolled the group back), it raises StorageError and nothing of the group is kept."""
        if self._batch:
            yield
            return
        self._begin()
        self._batch = True
        self._batch_broken = False
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
            raise StorageError("a storage failure rolled back this group commit; nothing in it was kept")
        self._commit()

    # --- helpers ----------------------------------------------------------------------------------
    def _one(self, sql: str, args: tuple[Any, ...]) -> Record | None:
        row = self._db.execute(sql, args).fetchone()
        return json.loads(row[0]) if row else None

    # --- monitors ---------------------------------------------------------------------------------
    @_guarded
    def get_monitor(self, monitor_id: str) -> Record | None:
        return self._one("SELECT rec FROM monitors WHERE id=?", (monitor_id,))

    @_guarded
    def put_monitor(self, rec: Record) -> None:
        self._db.execute("INSERT OR REPLACE INTO monitors (id, rec) VALUES (?, ?)", (rec["id"], _dumps(rec)))

    @_guarded
    def list_monitors(self) -> list[Record]:
        return [json.loads(r[0]) for r in self._db.execute("SELECT rec FROM monitors ORDER BY id")]

    # --- the log ----------------------------------------------------------------------------------
    @_guarded
    def append(self, monitor_id: str, seq: int, event: Record) -> None:
        self._db.execute(
            "INSERT INTO observations (monitor, seq, event) VALUES (?, ?, ?)",
            (monitor_id, seq, _dumps(event)),
        )

    @_guarded
    def get_observation(self, monitor_id: str, seq: int) -> Record | None:
        return self._one("SELECT event FROM observations WHERE monitor=? AND seq=?", (monitor_id, seq))

    @_guarded
    def scan(self, monitor_id: str, from_seq: int, to_seq: int) -> Iterator[Record]:
        # Chunks grow 8, 16, ... 256 rows: a pull of one reads a few rows, a drain reads in bulk, and a
        # reader stopping early (limit reached) never loads the rest of the log.
        start = from_seq
        chunk = 8
        while start <= to_seq:
            rows = self._db.execute(
                "SELECT seq, event FROM observations WHERE monitor=? AND seq>=? AND seq<=? ORDER BY seq LIMIT ?",
                (monitor_id, start, to_seq, chunk),
            ).fetchall()
            if not rows:
                return
            for _, event in rows:
                yield json.loads(event)
            start = rows[-1][0] + 1
            chunk = min(chunk * 2, 256)

    @_guarded
    def delete_below(self, monitor_id: str, seq: int) -> int:
        cur = self._db.execute("DELETE FROM observations WHERE monitor=? AND seq<?", (monitor_id, seq))
        return cur.rowcount

    # --- subjects ---------------------------------------------------------------------------------
    @_guarded
    def has_subject(self, monitor_id: str, subject: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM subjects WHERE monitor=? AND subject=?", (monitor_id, subject)
        ).fetchone()
        return row is not None

    @_guarded
    def add_subject(self, monitor_id: str, subject: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO subjects (monitor, subject) VALUES (?, ?)", (monitor_id, subject)
        )

    # --- subscriptions ----------------------------------------------------------------------------
    @_guarded
    def get_subscription(self, sub_id: str) -> Record | None:
        return self._one("SELECT rec FROM subscriptions WHERE id=?", (sub_id,))

    @_guarded
    def put_subscription(self, rec: Record) -> None:
        # An upsert on the id: a (monitor, subscriber) that belongs to ANOTHER subscription violates the
        # unique index and raises IntegrityError (INSERT OR REPLACE would silently delete that other row).
        self._db.execute(
            "INSERT INTO subscriptions (id, monitor, subscriber, token_hash, rec) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET monitor=excluded.monitor, subscriber=excluded.subscriber, "
            "token_hash=excluded.token_hash, rec=excluded.rec",
            (rec["id"], rec["monitor"], rec["subscriber"], rec["token_hash"], _dumps(rec)),
        )

    @_guarded
    def find_subscription(self, monitor_id: str, subscriber: str) -> Record | None:
        return self._one(
            "SELECT rec FROM subscriptions WHERE monitor=? AND subscriber=?", (monitor_id, subscriber)
        )

    @_guarded
    def count_active_subscriptions(self, monitor_id: str) -> int:
        return int(self._db.execute(_COUNT_ACTIVE, (monitor_id,)).fetchone()[0])

    @_guarded
    def find_subscription_by_token(self, token_hash: str) -> Record | None:
        return self._one("SELECT rec FROM subscriptions WHERE token_hash=?", (token_hash,))

    @_guarded
    def list_subscriptions(self, monitor_id: str | None = None) -> list[Record]:
        if monitor_id is None:
            rows = self._db.execute("SELECT rec FROM subscriptions ORDER BY id")
        else:
            rows = self._db.execute(
                "SELECT rec FROM subscriptions WHERE monitor=? ORDER BY id", (monitor_id,)
            )
        return [json.loads(r[0]) for r in rows]

    # --- leases -----------------------------------------------------------------------------------
    @_guarded
    def get_lease(self, monitor_id: str, subject: str) -> Record | None:
        return self._one("SELECT rec FROM leases WHERE monitor=? AND subject=?", (monitor_id, subject))

    @_guarded
    def put_lease(self, rec: Record) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO leases (monitor, subject, rec) VALUES (?, ?, ?)",
            (rec["monitor"], rec["subject"], _dumps(rec)),
        )

    @_guarded
    def list_leases(self, monitor_id: str | None = None) -> list[Record]:
        if monitor_id is None:
            rows = self._db.execute("SELECT rec FROM leases ORDER BY monitor, subject")
        else:
            rows = self._db.execute("SELECT rec FROM leases WHERE monitor=? ORDER BY subject", (monitor_id,))
        return [json.loads(r[0]) for r in rows]

    # --- publish idempotency keys -----------------------------------------------------------------
    @_guarded
    def get_idempotency(self, monitor_id: str, key: str) -> Record | None:
        return self._one("SELECT rec FROM idempotency WHERE monitor=? AND key=?", (monitor_id, key))

    @_guarded
    def put_idempotency(self, monitor_id: str, key: str, rec: Record) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO idempotency (monitor, key, at, rec) VALUES (?, ?, ?, ?)",
            (monitor_id, key, float(rec["at"]), _dumps(rec)),
        )

    @_guarded
    def purge_idempotency(self, before: float) -> int:
        return self._db.execute("DELETE FROM idempotency WHERE at<?", (float(before),)).rowcount
