"""The SQLite file itself: one writer per database file, and which driver errors are the storage's fault.

One writer: the lock is `flock(LOCK_EX | LOCK_NB)` on the database file itself (its realpath, opened O_RDWR),
so a hard link, a symbolic link or another spelling of the path is the same lock. flock is independent of the
POSIX locks SQLite takes (Linux), and the kernel drops it when the process dies. Beside the realpath the
holder writes a note `<realpath>.writer` (JSON: pid, host, since, path, inode) that a refused opener reads to
name it; the note is removed on release."""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from monitor_protocol.core.store_contract import StorageError

NOTE_SUFFIX = ".writer"

# Primary result codes that mean the storage failed, not the caller: BUSY, LOCKED, NOMEM, READONLY, IOERR,
# CORRUPT, FULL, CANTOPEN, PROTOCOL, NOLFS, NOTADB and PERM. CONSTRAINT (IntegrityError), ERROR (bad SQL),
# MISUSE, RANGE and TOOBIG are bugs and stay the driver's own exceptions.
_STORAGE_CODES = frozenset({3, 5, 6, 7, 8, 10, 11, 13, 14, 15, 22, 26})
CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
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
    """A second writer tried to open a database file that another store holds (however the path is spelled).
    `held` says who holds it, without the advice (a command that opens the file its own way gives its own)."""

    def __init__(self, held: str, advice: str) -> None:
        super().__init__(f"{held} {advice}")
        self.held, self.advice = held, advice

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.held, self.advice))


class StoreCorrupt(RuntimeError):
    """The database failed SQLite's `quick_check` at open, or the file is not a SQLite database: nothing is
    served from it. The message names the file and says what to do."""


def primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_storage_failure(exc: BaseException) -> bool:
    """True for a driver error that is the storage's fault (disk full, I/O, read-only, corrupt, busy...)."""
    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, sqlite3.IntegrityError):
        return False
    code = primary_code(exc)
    if code is not None:
        return code in _STORAGE_CODES
    text = str(exc).lower()
    return any(word in text for word in _STORAGE_WORDS)


def storage_error(exc: sqlite3.Error) -> StorageError:
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return StorageError(f"storage failure ({name}): {exc}")


F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """Raise the driver's storage failures as StorageError (a generator is guarded while it is read)."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from fn(*args, **kwargs)
            except sqlite3.Error as exc:
                if is_storage_failure(exc):
                    raise storage_error(exc) from exc
                raise

        return gen  # type: ignore[return-value]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as exc:
            if is_storage_failure(exc):
                raise storage_error(exc) from exc
            raise

    return call  # type: ignore[return-value]


# Database files this process holds, by (st_dev, st_ino) -> the holder's note. A second open in the same
# process is refused from here, without opening the file: closing ANY descriptor of a file drops every
# POSIX lock this process holds on it, SQLite's own locks of the first store included.
_HELD: dict[tuple[int, int], dict[str, Any]] = {}
_HELD_LOCK = threading.Lock()


# What this process is ("mp serve", "mp mcp"), written in its note so that a refused opener can say which
# program holds the file; set by the command that opens it (None: an embedder's process).
HOLDER_NAME: str | None = None


def _holder_text(note: dict[str, Any]) -> str:
    program = note.get("program")
    who = f"{program} (pid {note.get('pid')})" if isinstance(program, str) else f"pid {note.get('pid')}"
    return f"{who} on {note.get('host')} since {note.get('since')}"


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


class StoreVersionError(StoreCorrupt):
    """The file's format version is not one this store reads or migrates (a newer one, most likely), or a
    version 2 file failed to migrate (and was left as it was). A StoreCorrupt, so that every door that
    refuses a damaged file at open refuses this one too, with this message."""


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
        f"The database {real} is already open for writing by {holder}.",
        "Stop that process, or open another database file (mp serve --db, SQLiteStore(path)).",
    )


class WriterLock:
    """This process's hold on one database file, as its only writer."""

    def __init__(self) -> None:
        self._lock_fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._note_path: str | None = None

    def acquire(self, real: str) -> None:
        import fcntl  # POSIX only; the browser never opens a SQLite store

        note_path = real + NOTE_SUFFIX
        with _HELD_LOCK:
            try:
                st = os.stat(real)
                held = _HELD.get((st.st_dev, st.st_ino))
            except FileNotFoundError:
                held = None
            if held is not None:
                raise _locked(real, held)
            fd = os.open(
                real, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )  # private: the log and push secrets (SQLite gives -wal and -shm its mode)
            st = os.fstat(fd)
            inode = (st.st_dev, st.st_ino)
            held = _HELD.get(inode)
            if held is not None:  # created or linked meanwhile under this name
                os.close(fd)
                raise _locked(real, held)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # no SQLite connection of this process is on this file (see _HELD)
                raise _locked(real, _read_note(note_path, inode)) from None
            note = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "path": real,
                "inode": list(inode),
                "program": HOLDER_NAME,
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

    def release(self) -> None:
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
