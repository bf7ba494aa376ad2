"""One engine thread's side of the PostgreSQL store: its connection (store/postgres_wire.py), reconnected after
an outage at most every RECONNECT_SECONDS, and the state of the call it runs: the locks it holds or has asked
for, what it read under them, the writes it sent. A store serves several engine threads (doors/engines.py
EngineLanes), each with a session of its own; a call never leaves its thread."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from monitor_protocol.core.records import Monitor, Subscription
from monitor_protocol.core.store_contract import GroupConflict, StaleRead, StorageError
from monitor_protocol.store import postgres_wire
from monitor_protocol.store.postgres_link import (
    RECONNECT_SECONDS,
    answered,
    connect,
    on_failure,
    privilege_refusal,
    read_only_refusal,
    redacted,
    scrub,
    storage_failure,
)
from monitor_protocol.store.postgres_sql import (
    LOCK_AS_READ_SQL,
    LOCK_MONITOR_SQL,
    READER_AS_READ_SQL,
    STALE_SQLSTATE,
    enc,
)
from monitor_protocol.store.postgres_wire import (
    Row,
    Wire,
    can_connect,
    rows_of,
    sqlstate,
    text,
)

log = logging.getLogger("monitor_protocol.store.postgres")

# A call waiting longer for a monitor's lock gets 503 (nothing written), retry: well under the clients' own
# time limit (the Python client's default is 10 s), so that they hear it rather than give up not knowing.
LOCK_TIMEOUT_MS = 5_000
STATEMENT_TIMEOUT_MS = 30_000
# Connections this session dropped whose server side may live on (see Session.lost), kept to end them.
LOST_KEPT = 8
# A side connection's transaction (the readers' counts folded, under a monitor's lock) left open by a
# connection lost behind a proxy that keeps the database's side alive: the database ends it.
IDLE_IN_TRANSACTION_MS = 15_000


def side_settings(server_version: int) -> list[str]:
    """The session settings of a connection this server holds open while it is idle (LISTEN, the leader's
    advisory lock, the readers' counts): the lanes' timeouts, whatever the role or database sets, and no
    idle_session_timeout (PostgreSQL 14 and later): ended every few seconds, LISTEN would miss appends
    between reconnections and the leader lock would change hands. A lane's connection keeps the DBA's: one
    ended while idle is opened again when next used."""
    settings = [
        f"SET lock_timeout TO {LOCK_TIMEOUT_MS}",
        f"SET statement_timeout TO {STATEMENT_TIMEOUT_MS}",
        f"SET idle_in_transaction_session_timeout TO {IDLE_IN_TRANSACTION_MS}",
    ]
    if server_version >= 140000:
        settings.append("SET idle_session_timeout TO 0")
    return settings


def held_while_idle(conn: Any) -> Any:
    """`conn` with side_settings (closed, and the failure raised, when one is refused)."""
    with on_failure(conn.close):
        for setting in side_settings(conn.info.server_version):
            conn.execute(setting)
    return conn


class Session:
    """A connection and the call running on it. `statements` and `round_trips` count over every connection
    the session had."""

    def __init__(self, where: Any, psycopg: Any, connect_timeout: float) -> None:
        self._where = where  # the store: its `url` (which may change: tests move the database)
        self.psycopg = psycopg
        self.connect_timeout = connect_timeout
        self.conn: Any = None  # the psycopg connection under `wire`
        self.backend: tuple[int, str] | None = None  # its server process, and when that began (its text)
        self.lost: list[tuple[int, str]] = []  # the same of connections dropped since
        self.wire: Wire | None = None
        self.retry_at = 0.0
        self.last_failure = ""
        # When this session last failed to connect: once another thread's session has connected since, the
        # database is back, and this one's wait (retry_at) is over.
        self._failed_at = 0.0
        self._statements_before = 0
        self._round_trips_before = 0
        # The call: its depth (transactions nest into the outer one), its locks (monitor -> taken shared),
        # the locks asked for and not sent yet (they go with the next statement), what was read under them
        # (valid to the end of the call), the rows of the log read ahead, and what it sent to write.
        self.depth = 0
        self.wrote = False
        self.locks: dict[str, bool] = {}
        self.asked: dict[str, bool] = {}
        # Monitors locked whole whose row the call took from the store's memory (PostgresStore.get_monitor):
        # the row as remembered, sent with the lock for the database to compare (LOCK_AS_READ_SQL); and the
        # monitors whose lock went with such a check in this call.
        self.believed: dict[str, Row] = {}
        self.guarded: set[str] = set()
        # A reader's call that took its subscription and its monitor from memory (PostgresStore.
        # locked_subscription): monitor -> (the subscription's row, the monitor's row), checked with the
        # locks (READER_AS_READ_SQL); and the monitors of such checks sent in this call.
        self.believed_readers: dict[str, tuple[Row, Row]] = {}
        self.guarded_readers: set[str] = set()
        # Whether this call may believe remembered rows: not the call run again after a StaleRead (so that
        # reruns end, whatever another lane remembers meanwhile).
        self.believing = True
        self._rerun = False
        self.sub_locks: set[str] = set()
        self.seen_monitors: dict[str, Monitor | None] = {}
        self.seen_subs: dict[str, Subscription] = {}
        self.page: dict[str, tuple[int, list[Any], bool]] = {}  # monitor -> (from seq, rows, to the end)
        # Monitors whose `page` is the store's memory (a reader's call from memory), with the last row served
        # from it (None: none yet): checked with the reader's row, and not used once that check is sent.
        self.page_from_memory: dict[str, Any] = {}
        self.pulls: list[tuple[str, int, float | None]] = []
        self.writes: list[int] = []  # write statements sent (rows each), answered with the commit
        self.written: list[tuple[Any, list[tuple[Any, ...]], list[Any]]] = []
        self.fresh_subjects: set[tuple[str, str]] = set()
        # Monitors this thread locked since `job_monitors` was last taken (doors/engines.py EngineLanes).
        self.touched: set[str] = set()
        # A group commit (PostgresStore.batch): 0 none, 1 its first call running, 2 a later call (which may
        # take no lock the group does not hold); and whether a call of it met a failure of the database.
        self.group = 0
        self.group_broken = False
        self.group_refused: BaseException | None = None  # the database refused a statement of the group
        # Creating the schema: a privilege refused is then the driver's error (what to grant, postgres_link's
        # schema_refused), not the storage failure it is for a request once the server serves. In a group
        # commit it is the group's conflict: each call runs again alone, and only those it refuses fail.
        self.opening = False

    # --- the connection ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._where.url  # type: ignore[no-any-return]

    @property
    def statements(self) -> int:
        return self._statements_before + (self.wire.statements if self.wire is not None else 0)

    @property
    def round_trips(self) -> int:
        return self._round_trips_before + (self.wire.round_trips if self.wire is not None else 0)

    def open(self) -> None:
        """Connect now (a store's first connection: a failure is its caller's to report, not logged)."""
        self._connect()

    def _connect(self) -> None:
        conn = connect(self.psycopg, self.url, self.connect_timeout, autocommit=True)
        try:
            conn.execute("SET synchronous_commit TO on")  # a reply only after the commit is durable
            conn.execute(f"SET lock_timeout TO {LOCK_TIMEOUT_MS}")
            conn.execute(f"SET statement_timeout TO {STATEMENT_TIMEOUT_MS}")
            # a float's text exact (shortest): a reader's row remembered from a read is compared as a number
            conn.execute("SET extra_float_digits TO 3")
            # who this session is, exactly, to end it if it is lost and lives on (_end_lost)
            backend = conn.execute(
                "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
        except self.psycopg.Error as exc:
            conn.close()
            log.warning("cannot configure the PostgreSQL session: %s", scrub(str(exc), self.url))
            raise StorageError(
                "the database refused this server's session settings (the server's log says why)"
            ) from None
        if self.lost:
            self._end_lost(conn)
        if self.wire is not None:  # what the old connection counted stays counted
            self._statements_before += self.wire.statements
            self._round_trips_before += self.wire.round_trips
        self.backend = (int(backend[0]), str(backend[1])) if backend else None
        self.conn = conn
        self.wire = Wire(conn, self.psycopg, reachable=self._reachable)
        self._where.connected_at = time.monotonic()

    def _drop(self) -> None:
        """Close the connection (broken, or found closed), remembering its server side as possibly alive."""
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            if self.backend is not None:
                self.lost = [*self.lost[-(LOST_KEPT - 1) :], self.backend]
        self.conn = None
        self.backend = None

    def _end_lost(self, conn: Any) -> None:
        """End the server sides of connections this session dropped, if they live on: one lost mid-call behind
        a proxy that keeps the database's side open (its client's end never reached the database) would hold
        its call's locks, a monitor's, until the database restarts. Only that very session: its process id
        and the moment it began, as the database recorded them (a process id used again is another's)."""
        lost, self.lost = self.lost, []
        for pid, began in lost:
            try:
                ended = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s "
                    "AND backend_start = %s::timestamptz AND pid <> pg_backend_pid()",
                    (pid, began),
                ).fetchall()
            except self.psycopg.Error as exc:  # not allowed (pg_signal_backend), or the query failed: logged
                log.warning("cannot end the session of a lost connection: %s", scrub(str(exc), self.url))
                continue
            if ended:
                log.warning("ended the database's side of a connection this server had lost (it lived on)")

    def _reachable(self) -> bool:
        """Whether a new connection to the database can be made now (a call has heard nothing for a while)."""
        conninfo = self.psycopg.conninfo.make_conninfo(self.url, application_name="mp serve (probe)")
        reached = can_connect(self.psycopg.pq, conninfo, self.connect_timeout)
        if not reached:
            log.warning(
                "PostgreSQL has not answered a call for %.0f s and no new connection could be made in %.0f s: "
                "the call's connection is taken as lost",
                postgres_wire.SILENCE_SECONDS,
                self.connect_timeout,
            )
        return reached

    def ready(self) -> Wire:
        conn = self.conn
        # Found before the call, not by it: a new connection now, and the call does not fail (a lane seldom
        # used keeps its connection through an outage, or past an idle timeout, until it is used).
        gone = conn is not None and self.wire is not None and self.wire.closed_while_idle()
        if gone:
            log.info("the connection to PostgreSQL was closed while idle; connecting again")
        if conn is None or self.wire is None or gone or self.wire.broken:
            self._drop()
            # While the database is away, one attempt per RECONNECT_SECONDS: the calls in between get their
            # 503 at once instead of each waiting out a connection timeout on the engine thread.
            now = time.monotonic()
            back = 0 < self._failed_at < self._where.connected_at  # another connected since this one failed
            if now < self.retry_at and not back:
                raise StorageError(self.last_failure)
            try:
                self._connect()
            except StorageError as exc:
                if not self.last_failure:  # once per outage, not once per retry
                    log.warning("%s; retrying every %.1f s", exc.detail or exc, RECONNECT_SECONDS)
                self.retry_at, self.last_failure = now + RECONNECT_SECONDS, str(exc)
                self._failed_at = now
                raise
            if self.last_failure:
                log.warning("reconnected to PostgreSQL at %s", redacted(self.url))
                self.last_failure = ""
        assert self.wire is not None
        return self.wire

    def fail(self, exc: BaseException) -> StorageError:
        """A driver failure as StorageError; the transaction is gone, and a broken connection is dropped."""
        if self.group:
            self.group_broken = True  # a door may answer this call's 503 and go on: the group must not commit
        if self.wire is not None and self.wire.broken:
            self._drop()
        said = f"{type(exc).__name__}: {exc}"
        if privilege_refusal(exc):  # its first line: the LINE and caret lines quote SQL, of no use here
            said = said.split("\n", 1)[0] + " (grant it to this server's role)"
        log.warning("PostgreSQL: %s", scrub(said, self.url))
        if read_only_refusal(exc):
            return StorageError(
                "the database is read-only (a standby, or default_transaction_read_only is on) and accepts "
                "no writes; a pull records what it hands out, so pulls and acks fail too"
            )
        if privilege_refusal(exc):
            return StorageError(
                "the database refuses this server's role a privilege it needs (the server's log names what: "
                "grant it, docs/scale-out.md); nothing of this request was written"
            )
        return StorageError(f"the database failed: {type(exc).__name__}; the server's log says why")

    def in_call(self) -> Wire:
        """The connection of the open call; never a new one mid-call (its locks and reads were on the old)."""
        w = self.wire
        if w is None or self.conn is None or self.conn.closed:
            self.group_broken = bool(self.group)
            raise StorageError("the connection to PostgreSQL was lost during this call")
        return w

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None

    # --- statements -------------------------------------------------------------------------------
    def results(self, statements: list[tuple[str, Any]], *, prepare: bool = True) -> list[Any]:
        """Statements in one round trip inside the call, each one's result itself (PGresult, or None without
        rows): the caller reads only the values it needs. The locks asked for go first. A failure of the
        database is StorageError; the request's own (a unique index) is raised as the driver's error."""
        w = self.in_call()
        skip = len(self.asked)
        if skip:
            statements = self._take_asked() + statements
        try:
            return w.results(statements, prepare=prepare)[skip:]
        except self.psycopg.Error as exc:
            if storage_failure(self.psycopg, exc) or (
                privilege_refusal(exc) and not (self.opening or self.group)
            ):
                raise self.fail(exc) from exc
            self.if_stale(exc)
            if self.group:  # the group's transaction is aborted: none of it may go on; each call runs alone
                self.group_refused = exc
                raise GroupConflict(
                    f"the database refused a statement of this group: {type(exc).__name__}"
                ) from exc
            raise

    def run(self, statements: list[tuple[str, Any]], *, prepare: bool = True) -> list[list[Row]]:
        return [rows_of(res) for res in self.results(statements, prepare=prepare)]

    def _take_asked(self) -> list[tuple[str, Any]]:
        """The locks asked for, as statements to send first (taken from now on): a monitor whose row the
        call believed from memory is locked with that row's check."""
        asked, self.asked = self.asked, {}
        out: list[tuple[str, Any]] = []
        for m, shared in asked.items():
            row = self.believed.get(m)
            reader = self.believed_readers.get(m)
            if reader is not None:
                sub, mon = reader
                last = self.page_from_memory.pop(m, None)
                served = (0, None) if last is None else (last.seq, text(last[7]))
                out.append((READER_AS_READ_SQL, (*map(text, sub), *map(text, mon[1:]), *served)))
                self.guarded_readers.add(m)
                self.page.pop(m, None)  # checked as far as it was used: read from the database from now on
            elif row is None:
                out.append((LOCK_MONITOR_SQL, (enc(m), shared)))
            else:
                out.append(
                    (LOCK_AS_READ_SQL, (enc(m), text(row[1]), text(row[2]), text(row[3]), text(row[4])))
                )
                self.guarded.add(m)
        self.locks.update(asked)
        self.touched.update(asked)
        return out

    def believed_unsent(self) -> bool:
        return any(m in self.believed or m in self.believed_readers for m in self.asked)

    def only_believed_asked(self) -> bool:
        return all(m in self.believed or m in self.believed_readers for m in self.asked)

    def lock_later(self) -> None:
        """Send the locks asked for, each with its row's check, without waiting for their answer: they run
        before the write sent behind them, and a check that fails aborts it (read with the commit)."""
        for sql, params in self._take_asked():
            self.later(sql, list(params))

    def if_stale(self, exc: BaseException) -> None:
        """A row believed from memory was not the database's: forget it (the call runs again reading it; a
        group's calls run again alone) and raise StaleRead, or GroupConflict in a group."""
        if sqlstate(exc) != STALE_SQLSTATE:
            return
        guarded = self.guarded | self.guarded_readers
        what = f"a monitor changed since this server last read it: {', '.join(sorted(guarded))}"
        self._where.doubt(self.guarded, readers=self.guarded_readers)
        self.guarded, self.guarded_readers = set(), set()
        if self.group:  # not StaleRead: the engine must not run a call again inside the aborted group
            self.group_refused = exc
            raise GroupConflict(what)
        self._rerun = True  # the next call on this thread is that call again: it reads every row
        raise StaleRead(what)

    def later(self, sql: str, params: list[Any]) -> None:
        """A write statement, sent now and answered with the commit."""
        try:
            self.in_call().later(sql, params)
        except self.psycopg.Error as exc:
            raise self.fail(exc) from exc

    def locked(self, monitor_id: str, shared: bool) -> None:
        self.locks.setdefault(monitor_id, shared)
        self.touched.add(monitor_id)

    # --- the end of a call ------------------------------------------------------------------------
    def begin(self) -> None:
        self.ready()
        self.depth = 1
        self.wrote = False
        self.believing, self._rerun = not self._rerun, False

    def end(self) -> None:
        """Forget what the call read and asked for (its commit or rollback follows)."""
        self.depth = 0
        self.asked.clear()
        self.believed.clear()
        self.believed_readers.clear()
        self.locks.clear()
        self.sub_locks.clear()
        self.seen_monitors.clear()
        self.seen_subs.clear()
        self.page.clear()
        self.page_from_memory.clear()

    def commit(self) -> bool:
        """The Sync that ends the call's implicit transaction: its commit (a read-only one writes no WAL), with
        the answers to its writes. Whether it wrote anything."""
        w = self.wire
        writes, self.writes = self.writes, []
        if w is None or not w.in_tx:
            return False
        try:
            answers = w.sync(wait=bool(writes))  # a read-only call's end is not waited for
        except self.psycopg.Error as exc:
            if storage_failure(self.psycopg, exc) or (
                privilege_refusal(exc) and not (self.opening or self.group)
            ):
                # The commit may or may not have reached the database before the connection went: the
                # caller hears 503 saying so, and retries (a publish with its idempotency key is answered once).
                failure = self.fail(exc)
                # a refusal the database answered (read-only, a lock timeout, a deadlock) aborted the whole
                # transaction: nothing was written; only a connection lost without an answer leaves it open
                failure.outcome_unknown = bool(writes) and not read_only_refusal(exc) and not answered(exc)
                raise failure from exc
            self.if_stale(exc)
            raise  # the request's own fault (a unique index): nothing of the call was written
        finally:
            self.guarded, self.guarded_readers = set(), set()
        deleted = sum(int(a.get_value(0, 0)) for a in answers if a is not None and a.ntuples)
        return any(writes) or deleted > 0

    def rollback(self) -> None:
        # What may have been written: a write of the call's (sent after it is counted in `writes`), one made
        # outside the calls' path (`wrote`), or anything while the schema is made (opening).
        wrote = bool(self.writes) or self.wrote or self.opening
        self.guarded, self.guarded_readers = set(), set()
        self.fresh_subjects.clear()
        self.writes = []
        self.written = []
        self.pulls = []
        w = self.wire
        if w is None:
            return
        try:
            w.rollback(wrote=wrote)
        except Exception as exc:  # the connection itself failed: dropped, the next call reconnects
            self.fail(exc)
