"""The SQLite store (the embedded default): WAL, synchronous=FULL so that every commit the engine reports is
on disk before the reply, and one writer per file, enforced with an exclusive lock file."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .base import Record, Store

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
CREATE TABLE IF NOT EXISTS leases (
    monitor TEXT NOT NULL, subject TEXT NOT NULL, rec TEXT NOT NULL, PRIMARY KEY (monitor, subject)
) WITHOUT ROWID;
"""

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class StoreLocked(RuntimeError):
    """A second writer tried to open a database file that another process holds."""


class SQLiteStore(Store):
    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        self.path = path
        self._lock_fd: int | None = None
        if path != ":memory:":
            self._acquire_lock(path)
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA foreign_keys=OFF")
            self._db.executescript(SCHEMA)
        except BaseException:
            self._release_lock()
            raise
        self._depth = 0
        self._batch = False

    # --- one writer per file ----------------------------------------------------------------------
    def _acquire_lock(self, path: str) -> None:
        import fcntl  # POSIX only; the browser never opens a SQLite store

        lock_path = os.path.abspath(path) + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StoreLocked(
                f"The database {os.path.abspath(path)} is already open for writing by {holder}. "
                "Stop that process, or start this one with another --db."
            ) from None
        os.ftruncate(fd, 0)
        note = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        os.pwrite(fd, note.encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def close(self) -> None:
        if getattr(self, "_db", None) is not None:
            self._db.close()
            self._db = None  # type: ignore[assignment]
        self._release_lock()

    # --- transactions -----------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            yield
            return
        name = "call"
        if self._batch:
            self._db.execute(f"SAVEPOINT {name}")
        else:
            self._db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            if self._batch:
                self._db.execute(f"ROLLBACK TO {name}")
                self._db.execute(f"RELEASE {name}")
            else:
                self._db.execute("ROLLBACK")
            raise
        self._depth = 0
        if self._batch:
            self._db.execute(f"RELEASE {name}")
        else:
            self._db.execute("COMMIT")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: the transactions inside become savepoints of one commit (one fsync). A caller
        may reply to none of them until this block has exited without error."""
        if self._batch:
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._batch = True
        try:
            yield
        except BaseException:
            self._batch = False
            self._db.execute("ROLLBACK")
            raise
        self._batch = False
        self._db.execute("COMMIT")

    # --- helpers ----------------------------------------------------------------------------------
    def _one(self, sql: str, args: tuple[Any, ...]) -> Record | None:
        row = self._db.execute(sql, args).fetchone()
        return json.loads(row[0]) if row else None

    # --- monitors ---------------------------------------------------------------------------------
    def get_monitor(self, monitor_id: str) -> Record | None:
        return self._one("SELECT rec FROM monitors WHERE id=?", (monitor_id,))

    def put_monitor(self, rec: Record) -> None:
        self._db.execute("INSERT OR REPLACE INTO monitors (id, rec) VALUES (?, ?)", (rec["id"], _dumps(rec)))

    def list_monitors(self) -> list[Record]:
        return [json.loads(r[0]) for r in self._db.execute("SELECT rec FROM monitors ORDER BY id")]

    # --- the log ----------------------------------------------------------------------------------
    def append(self, monitor_id: str, seq: int, event: Record) -> None:
        self._db.execute(
            "INSERT INTO observations (monitor, seq, event) VALUES (?, ?, ?)",
            (monitor_id, seq, _dumps(event)),
        )

    def get_observation(self, monitor_id: str, seq: int) -> Record | None:
        return self._one("SELECT event FROM observations WHERE monitor=? AND seq=?", (monitor_id, seq))

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

    def delete_below(self, monitor_id: str, seq: int) -> int:
        cur = self._db.execute("DELETE FROM observations WHERE monitor=? AND seq<?", (monitor_id, seq))
        return cur.rowcount

    # --- subjects ---------------------------------------------------------------------------------
    def has_subject(self, monitor_id: str, subject: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM subjects WHERE monitor=? AND subject=?", (monitor_id, subject)
        ).fetchone()
        return row is not None

    def add_subject(self, monitor_id: str, subject: str) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO subjects (monitor, subject) VALUES (?, ?)", (monitor_id, subject)
        )

    # --- subscriptions ----------------------------------------------------------------------------
    def get_subscription(self, sub_id: str) -> Record | None:
        return self._one("SELECT rec FROM subscriptions WHERE id=?", (sub_id,))

    def put_subscription(self, rec: Record) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO subscriptions (id, monitor, subscriber, token_hash, rec) VALUES (?, ?, ?, ?, ?)",
            (rec["id"], rec["monitor"], rec["subscriber"], rec["token_hash"], _dumps(rec)),
        )

    def find_subscription(self, monitor_id: str, subscriber: str) -> Record | None:
        return self._one(
            "SELECT rec FROM subscriptions WHERE monitor=? AND subscriber=?", (monitor_id, subscriber)
        )

    def find_subscription_by_token(self, token_hash: str) -> Record | None:
        return self._one("SELECT rec FROM subscriptions WHERE token_hash=?", (token_hash,))

    def list_subscriptions(self, monitor_id: str | None = None) -> list[Record]:
        if monitor_id is None:
            rows = self._db.execute("SELECT rec FROM subscriptions ORDER BY id")
        else:
            rows = self._db.execute(
                "SELECT rec FROM subscriptions WHERE monitor=? ORDER BY id", (monitor_id,)
            )
        return [json.loads(r[0]) for r in rows]

    # --- leases -----------------------------------------------------------------------------------
    def get_lease(self, monitor_id: str, subject: str) -> Record | None:
        return self._one("SELECT rec FROM leases WHERE monitor=? AND subject=?", (monitor_id, subject))

    def put_lease(self, rec: Record) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO leases (monitor, subject, rec) VALUES (?, ?, ?)",
            (rec["monitor"], rec["subject"], _dumps(rec)),
        )

    def list_leases(self, monitor_id: str | None = None) -> list[Record]:
        if monitor_id is None:
            rows = self._db.execute("SELECT rec FROM leases ORDER BY monitor, subject")
        else:
            rows = self._db.execute("SELECT rec FROM leases WHERE monitor=? ORDER BY subject", (monitor_id,))
        return [json.loads(r[0]) for r in rows]
