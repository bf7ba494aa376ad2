"""The PostgreSQL store: any number of `mp serve` processes on one database (docs/scale-out.md).

psycopg 3 (the `postgres` extra: `pip install '.[postgres]'` in a clone), imported only when this store is opened: the engine
itself stays standard-library only. The schema is the SQLite store's columnar one (store/sqlite.py), with
every text column that a filter compares in the "C" collation (code point order, as Python and SQLite
compare), a few server-side functions, and a format version in `mp_meta`; it is created (or brought to this
version) on first start, and a server refuses a schema newer than it knows. SQL: store/postgres_sql.py.

Isolation (core/store_contract.py). Every call is its own transaction at READ COMMITTED (but the publishes of
a group commit, see batch), with
`synchronous_commit = on`: a commit reported is durable, and a reply is sent only after it. The engine
locks a monitor before it reads what it will change (`lock_monitor`: a transaction-scoped advisory lock on
the monitor's id, which also exists before the monitor row does), so calls that write one monitor are
serial across every server, and what a call reads after its lock is what the last commit left. A call that
only reads and writes its own subscription (a pull, an ack: core/tx.py's reader mode) takes the monitor's
lock shared and the subscription's own lock, so readers of one monitor do not wait for each other. A record
that names its monitor only inside (a subscription looked up by id or token) is found, its monitor locked and
read again, in one server-side function. Group commit (`batch`, run by doors/engines.py EngineLanes) is for
the publishes a server has queued for one monitor: the group's first call takes the locks it needs, and a
later call asking for any other lock raises GroupConflict before anything of it is sent (the group is rolled
back and its calls run alone), so a group never waits for a lock it did not start with and two servers'
groups cannot take locks in opposite orders.

What a call sends (bench/scaleout.py counts it; tests/test_postgres_calls.py holds the count): the lock and
the reads under it in one statement, a log read when the rule reads the log, and every write of the call in
one more, in an implicit transaction ended by a Sync (store/postgres_wire.py): a publish is two statements, an
ack+pull two. Within a call, what was read under a lock is not read twice. A monitor locked whole whose row
this server remembers is not read at all: its lock goes with the call's next statement, carrying the row for
the database to compare under the lock (get_monitor, LOCK_AS_READ_SQL), so a publish is one round trip; a row
changed meanwhile aborts the transaction before any write of it runs, and the call runs again (StaleRead).

Between servers (store/postgres_link.py): appends are announced with NOTIFY `mp_append` (delivered at commit)
and heard by a LISTEN connection of each other server, which wakes its parked readers; sweeps and HTTP push
run on the holder of a session advisory lock; readers' counts are folded into the monitors' rows about once a
second.

Every driver failure that is the database's, not the request's (connection lost, server shutting down,
lock timeout, deadlock, disk full, a read-only standby) is raised as StorageError: the engine answers
503 UNAVAILABLE with Retry-After, the transaction is rolled back, and the next call reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any

from monitor_protocol import __version__
from monitor_protocol.core.lanes import lane_local
from monitor_protocol.core.records import (
    Lease,
    Monitor,
    Observation,
    PublishKey,
    Subscription,
)
from monitor_protocol.core.store_contract import (
    Changes,
    GroupConflict,
    LogQuery,
    StaleRead,
    StorageError,
    Store,
    StoreStats,
    chunked_rows,
)
from monitor_protocol.store import postgres_rows as rows_
from monitor_protocol.store.postgres_link import (
    LEADER_POLL_SECONDS,
    Counts,
    Peers,
    connect,
    driver,
    is_postgres_url,
    redacted,
    schema_refused,
    scrub,
    shared_listing_key,
    wait_for_database,
)
from monitor_protocol.store.postgres_meta import ForeignTables, IncompleteCopy, MetaRows
from monitor_protocol.store.postgres_session import Session, held_while_idle
from monitor_protocol.store.postgres_sql import (
    ACTIVE_MONITOR_IDS,
    BACKLOG_TOP_SQL,
    BACKLOG_TOTALS_SQL,
    CHANNEL,
    GET_LEASE,
    GET_MONITOR,
    GET_SUBSCRIPTION,
    LOCK_MONITOR_SQL,
    LOCK_SCHEMA,
    LOCK_SUBSCRIPTION_SQL,
    MONITOR_SQL,
    PAGE_AHEAD,
    SCHEMA,
    SCHEMA_VERSION,
    SELECT_LOG,
    SUBSCRIPTION_SQL,
    dec,
    enc,
    last_versions,
    log_where,
    numbered,
    write_statement,
)
from monitor_protocol.store.postgres_wire import Row, Wire, text
from monitor_protocol.store.sql import (
    capped_count_sql,
    storable,
)

__all__ = [
    "CHANNEL",
    "SCHEMA_VERSION",
    "PostgresStore",
    "StoreVersionError",
    "IncompleteCopy",
    "ForeignTables",
    "is_postgres_url",
    "redacted",
    "scrub",
    "wait_for_database",
]

log = logging.getLogger("monitor_protocol.store.postgres")

MAX_SEQ = 2**63 - 1
KNOWN_SUBJECTS_MAX = (
    100_000  # (monitor, subject) pairs remembered as stored: a subject seen again costs nothing
)
# After a monitor's row was found changed under this server's memory of it (another server wrote it, or the
# readers' counts were folded in), its row is read with its lock for this long before memory is trusted again:
# a monitor two servers write in turn costs at most a few wasted round trips a second, not one per call.
DOUBT_SECONDS = 0.2
READER_STALE_REPEAT = 0.5
PAGES_BYTES = 8 << 20  # the events of the rows read ahead kept for readers, in all

# The tests' names for the prefix code (store/postgres_sql.py).
_enc, _dec = enc, dec

_SCAN_ALL = f"{SELECT_LOG} WHERE monitor=$1 AND seq>=$2 AND seq<=$3 ORDER BY seq LIMIT $4"
_SERVED_RANGE = "SELECT seq, event FROM observations WHERE monitor=$1 AND seq>=$2 AND seq<=$3 ORDER BY seq"
_MAX_SEQ_SQL = "SELECT max(seq) FROM observations WHERE monitor=$1"


class StoreVersionError(RuntimeError):
    """The database holds a schema this release does not know (written by a newer one)."""


class PostgresStore(MetaRows, Store):
    """The store every engine thread of a server uses: each thread has a session of its own (its connection
    and its call, store/postgres_session.py); LISTEN, the leader lock and the readers' counts each hold a
    connection of their own, on threads of their own."""

    shared = True  # several servers write this store: the engine locks, re-reads, and allows for lag
    writes_at_commit = True  # a call's writes travel with its commit (core/store_contract.py)

    def __init__(self, url: str, *, connect_timeout: float = 5.0, migrating: bool = False) -> None:
        """`migrating`: opened by mp migrate, which may find its own unfinished copy here (anyone else is
        refused one with IncompleteCopy)."""
        self.url = url
        self.migrating = migrating
        self.connect_timeout = connect_timeout
        # When a thread's session last connected (postgres_session.py: a session waiting to try again after
        # a failed attempt tries at once if another has connected since).
        self.connected_at = 0.0
        self.psycopg = driver()
        self.stats = StoreStats()
        self._stats_lock = threading.Lock()
        self.instance = secrets.token_hex(8)  # this server's name in its own notifications
        # One session per engine lane: a thread, or a greenlet of the event loop's thread (green lanes, which
        # import greenlet before the store opens: core/lanes.py).
        self._local = lane_local()
        self._sessions: list[Session] = []
        self._sessions_lock = threading.Lock()
        # Shared by the threads: records decoded from rows (used again while a row's text is the same) and
        # the (monitor, subject) pairs stored (a subject seen again costs no row).
        self._monitor = rows_.Decoded(rows_.monitor)
        self._subscription = rows_.Decoded(rows_.subscription)
        self._known_subjects: set[tuple[str, str]] = set()
        # A publish (any call locking a monitor whole) takes the monitor's row from `_monitor`'s memory and
        # sends it with the lock for the database to check (get_monitor): one round trip instead of two.
        # False: every such call reads the row with its lock (the tests' and benchmarks' control).
        self.believe_memory = True
        self._doubted: dict[str, float] = {}  # monitor -> until when its row is read, not believed
        # A reader's call takes its subscription, its monitor and the rows after its cursor from memory too
        # (locked_subscription): the rows read ahead for each subscription, kept (the log is append-only, and
        # its rows at or above the floor, which the monitor's checked row holds, never change), and the
        # monitors a reader's check found changed (not believed for readers for a while; a publish still is).
        self.believe_readers = True
        self._pages: dict[str, tuple[int, list[Any], int]] = {}  # subscription -> (from seq, rows, bytes)
        self._pages_bytes = 0
        self._readers_doubted: dict[str, float] = {}
        self._readers_stale: dict[str, float] = {}  # monitor -> when a reader's check last failed
        self.stale = 0  # calls whose remembered row the database found changed (tests, benchmarks)
        self._peers = Peers(url, self.psycopg, self.instance, self._side_connection)
        self.counts = Counts(self._side_connection, self._peers.stop)
        self.counts.on_written = lambda monitor_id: self._monitor.forget(_key(monitor_id))
        self._s.open()
        self._open_schema()
        self.listing_key = shared_listing_key(self)
        self.stats = StoreStats()  # what the engine's calls cost, not the schema's check

    # --- sessions ---------------------------------------------------------------------------------
    @property
    def _s(self) -> Session:
        """This lane's session (created at its first call)."""
        try:
            return self._local.session  # type: ignore[no-any-return]
        except AttributeError:
            session = self._local.session = Session(self, self.psycopg, self.connect_timeout)
            with self._sessions_lock:
                self._sessions.append(session)
            return session

    def close_lane(self) -> None:
        """Close the calling lane's connection (its next call, if any, connects again): for a thread that
        opened the store and read what it needed, and serves no call (mp serve's start), so that a server
        holds the connections docs/scale-out.md counts, not one more idle until the database restarts."""
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()

    # The calling thread's connection, for tests that make the database go away under it.
    @property
    def _conn(self) -> Any:
        return self._s.conn

    @property
    def _wire(self) -> Wire | None:
        return self._s.wire

    @property
    def _retry_at(self) -> float:
        return self._s.retry_at

    @_retry_at.setter
    def _retry_at(self, value: float) -> None:
        self._s.retry_at = value

    @property
    def statements(self) -> int:
        """Statements sent on the engines' connections (every connection they had): bench/scaleout.py and
        tests/test_postgres_store.py count them per call."""
        with self._sessions_lock:
            return sum(s.statements for s in self._sessions)

    @property
    def round_trips(self) -> int:
        with self._sessions_lock:
            return sum(s.round_trips for s in self._sessions)

    def job_monitors(self) -> set[str]:
        """The monitors this thread's calls locked since the last time it asked (doors/engines.py)."""
        s = self._s
        touched, s.touched = s.touched, set()
        return touched

    def doubt(self, monitors: AbstractSet[str], *, readers: AbstractSet[str] = frozenset()) -> None:
        """These monitors' rows were not what this server remembered: forget them, and read them with their
        lock for DOUBT_SECONDS (postgres_session.py Session.if_stale). `readers`: the monitors of readers'
        checks that failed: forgotten, and doubted by readers alike when one failed less than
        READER_STALE_REPEAT before (another server writes the monitor; the readers' counts folded into its
        row about once a second are one failure now and then); a publish still believes its row."""
        now = time.monotonic()
        with self._stats_lock:
            self.stale += 1
        failed = self._readers_stale
        if len(failed) > 10_000:
            failed.clear()
        again = {m for m in readers if now - failed.get(m, -READER_STALE_REPEAT) < READER_STALE_REPEAT}
        failed.update(dict.fromkeys(readers, now))
        for doubted, which in ((self._doubted, monitors), (self._readers_doubted, again)):
            if len(doubted) > 10_000:
                doubted.clear()
            for m in which:
                doubted[m] = now + DOUBT_SECONDS
        for m in monitors | readers:
            self._monitor.forget(_key(m))

    def _side_connection(self) -> Any:  # LISTEN's, the leader lock's, the readers' counts': held while idle
        return held_while_idle(connect(self.psycopg, self.url, self.connect_timeout, autocommit=True))

    def _run(self, statements: list[tuple[str, Any]], *, prepare: bool = True) -> list[list[Row]]:
        """Statements in one round trip, each with its rows; outside a call, a transaction of their own."""
        s = self._s
        if not s.depth:
            with self.transaction():
                return s.run(statements, prepare=prepare)
        return s.run(statements, prepare=prepare)

    def _rows(self, sql: str, params: Any = (), *, prepare: bool = True) -> list[Row]:
        return self._run([(sql, params)], prepare=prepare)[0]

    def lane_locals(self) -> list[Any]:
        """What this store keeps per engine lane: its sessions (core/lanes.py; green lanes check them)."""
        return [self._local]

    def close(self) -> None:
        self._peers.stop.set()
        for thread in self._peers.threads:
            thread.join(timeout=5)
        self._peers.threads.clear()
        self.counts.join(timeout=10)  # its last fold
        with self._sessions_lock:
            for session in self._sessions:
                session.close()

    # --- the schema -------------------------------------------------------------------------------
    def _open_schema(self) -> None:
        """Create the schema once (servers starting together wait for each other on a lock), bring one of an
        earlier version to this one (version 1 had no functions), or check that the one there is not newer."""
        self._s.opening = True
        try:
            with self.transaction():
                self._rows("SELECT pg_advisory_xact_lock($1, 0)", (LOCK_SCHEMA,), prepare=False)
                present = self._rows("SELECT to_regclass('mp_meta') IS NOT NULL", prepare=False)[0][0] == b"t"
                row = None
                if present:  # read first: a read-only standby with the schema opens (and serves reads)
                    row = self._rows("SELECT value FROM mp_meta WHERE key='schema_version'", prepare=False)
                version = int(row[0][0]) if row else None
                if version is not None and version > SCHEMA_VERSION:
                    raise StoreVersionError(
                        f"The database {redacted(self.url)} holds schema version {version}, and this "
                        f"monitor-protocol {__version__} knows version {SCHEMA_VERSION}: it was written by a "
                        "newer release. Nothing will be served from it; upgrade monitor-protocol."
                    )
                if not present:
                    self.refuse_foreign_tables()
                elif version is not None:  # before anything that may fail and abort this transaction
                    self.refuse_unfinished_copy()
                if version is None or version < SCHEMA_VERSION:
                    for statement in SCHEMA:
                        self._rows(statement, prepare=False)
                    self._rows(
                        "INSERT INTO mp_meta (key, value) VALUES ('schema_version', $1), ('created_by', $2) "
                        "ON CONFLICT (key) DO UPDATE SET value=EXCLUDED.value",
                        (str(SCHEMA_VERSION), f"monitor-protocol {__version__}"),
                        prepare=False,
                    )
                    self._s.wrote = True
                elif version == SCHEMA_VERSION:
                    self._add_what_came_later()
        except self.psycopg.Error as exc:  # a role without CREATE, a standby without the schema
            conn = self._s.conn
            role = conn.info.user if conn is not None else "(the URL's user)"
            self.close()
            raise schema_refused(exc, self.url, role) from None
        except BaseException:
            self.close()
            raise
        self._s.opening = False

    # --- transactions -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        s = self._s
        if s.depth:
            yield
            return
        s.begin()
        try:
            yield
            if s.asked:  # a lock taken and nothing read after it still orders this call
                s.run([])
        except BaseException as exc:
            if s.believed_unsent() and not isinstance(exc, GroupConflict | StorageError):
                self._check_belief(exc)
            s.end()
            s.rollback()
            raise
        s.end()
        pulls, s.pulls = s.pulls, []
        written, s.written = s.written, []
        fresh, s.fresh_subjects = s.fresh_subjects, set()
        wrote = s.commit() or s.wrote
        for decoded, rows, records in written:  # what a later call will read back, already decoded
            for row, rec in zip(rows, records, strict=True):
                decoded.remember(rows_.as_text(row), rec)
        with self._stats_lock:
            if wrote:
                self.stats.commits += 1
            else:
                self.stats.read_only += 1
        if fresh:
            known = self._known_subjects
            if len(known) + len(fresh) > KNOWN_SUBJECTS_MAX:
                known.clear()
            known.update(fresh)
        if pulls:
            self.counts.add(pulls)

    def _check_belief(self, refusal: BaseException) -> None:
        """A call that failed (a rule refused the request, say) after reading a monitor from memory, with its
        lock not sent yet: its lock and check now, so that a refusal made from a row another server has
        changed is not the answer (StaleRead: the call runs again, reading the row)."""
        try:
            self._s.run([])
        except StaleRead:
            self._s.end()
            self._s.rollback()
            raise
        except BaseException as exc:  # unconfirmed: the refusal is not told, the database's failure is (503)
            self._s.end()
            self._s.rollback()
            if isinstance(exc, StorageError):
                raise
            raise StorageError(
                f"the database could not confirm the monitor's row ({type(exc).__name__})"
            ) from refusal

    # --- group commit (doors/engines.py EngineLanes) ---------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit for the publishes an engine lane finds queued for one monitor: the calls share one
        transaction, and with it the monitor's lock, the read of its row and the commit. The first call locks
        what it needs, as it would alone; once `restrict_group()` is called, a call asking for any lock the
        group does not hold raises GroupConflict before anything of it is sent, so a group never waits for a
        lock it did not start with (no deadlock with another server's group). A failure of the database during
        any call fails the whole group (StorageError here, the transaction rolled back): a door may have
        answered that call's 503 and gone on, and none of the group may be reported done. A statement the
        database refused (a unique index), met by whichever call reads next or by the commit, raises
        GroupConflict at once (the pipeline is aborted): the caller runs each call again by itself."""
        s = self._s
        if s.depth:
            yield
            return
        s.group, s.group_broken, s.group_refused = 1, False, None
        try:
            with self.transaction():
                yield
                if s.group_refused is not None:  # before any failure it caused (the pipeline aborted)
                    raise GroupConflict("the database refused a statement of this group commit")
                if s.group_broken:
                    raise StorageError("the database failed during this group commit; nothing in it was kept")
        except self.psycopg.Error as exc:  # the commit refused (a unique index): each call runs alone
            raise GroupConflict(f"the database refused this group commit: {type(exc).__name__}") from exc
        finally:
            s.group, s.group_broken, s.group_refused = 0, False, None

    def groupable(self) -> bool:
        """After a group's first call: whether later calls may join it, which takes a monitor lock held
        whole and no reader's lock (a shared monitor lock or a subscription's)."""
        s = self._s
        held = {**s.locks, **s.asked}
        return bool(held) and not any(held.values()) and not s.sub_locks

    def restrict_group(self) -> None:
        """From now on the group's calls may only use the locks it holds (see batch)."""
        self._s.group = 2

    @property
    def grouping(self) -> bool:
        """A call of a group commit is running on this thread: the engine holds its appends for the listeners
        until the commit, and leaves its lazy sweep (which locks every monitor it sweeps) to a call alone."""
        return self._s.group != 0

    def _conflict(self, what: str) -> GroupConflict:
        return GroupConflict(f"{what}: not held by this group commit")

    def lock_monitor(self, monitor_id: str, *, shared: bool = False) -> None:
        """Asked now, sent with the call's next statement (its read of what it locked): the lock is held
        before that statement runs, since the server runs a pipeline's statements in order."""
        s = self._s
        if not s.depth:
            self._rows(LOCK_MONITOR_SQL, (enc(monitor_id), shared))
            return
        if monitor_id not in s.locks and monitor_id not in s.asked:
            if s.group == 2:
                raise self._conflict(f"the lock of monitor {monitor_id!r}")
            s.asked[monitor_id] = shared

    def lock_subscription(self, sub_id: str) -> None:
        s = self._s
        if sub_id in s.sub_locks:
            return
        if s.group == 2:
            raise self._conflict(f"the lock of subscription {sub_id!r}")
        self._rows(LOCK_SUBSCRIPTION_SQL, (sub_id,))
        if s.depth:
            s.sub_locks.add(sub_id)

    def locked_subscription(
        self, key: str, *, by_token: bool = False, shared: bool = False
    ) -> Subscription | None:
        """The subscription by id or token hash, read under its monitor's lock (see Store): one statement,
        which also reads that monitor for the call's next read of it and, for a reader (`shared`), the first
        rows of the log from its cursor, for the pull that usually follows."""
        s = self._s
        if not s.depth:
            return super().locked_subscription(key, by_token=by_token, shared=shared)
        if not by_token and key in s.seen_subs and (not shared or key in s.sub_locks):
            return s.seen_subs[key]
        if s.group == 2:
            raise self._conflict("a subscription's monitor lock")
        if shared and not by_token and not s.group and not s.locks and not s.asked:
            believed = self._believed_reader(key)
            if believed is not None:
                return believed
        page = PAGE_AHEAD if shared else 0
        (res,) = s.results([(SUBSCRIPTION_SQL["token" if by_token else "id"], (key, shared, page))])
        if res is None or not res.ntuples:
            return None
        get = res.get_value
        sub = self._subscription([get(0, c) for c in range(1, 10)])
        s.locked(sub.monitor, shared)
        if shared:
            s.sub_locks.add(sub.id)
        s.seen_subs[sub.id] = sub
        has_monitor = res.ntuples > 1 and get(1, 0) == b"m"
        s.seen_monitors[sub.monitor] = (
            self._monitor([get(1, c) for c in range(1, 6)]) if has_monitor else None
        )
        if page:
            first = 2 if has_monitor else 1
            log = [rows_.PageRow(res, i) for i in range(first, res.ntuples)]
            s.page[sub.monitor] = (max(sub.cursor, 1), log, len(log) < page)
            self._keep_page(sub.id, max(sub.cursor, 1), log)
        return sub

    def _keep_page(self, sub_id: str, first: int, rows: list[Any]) -> None:
        """Keep a reader's rows read ahead, within PAGES_BYTES of events in all (the oldest given up first)."""
        size = sum(len(r[7]) for r in rows)
        with self._stats_lock:
            pages = self._pages
            old = pages.pop(sub_id, None)
            if old is not None:
                self._pages_bytes -= old[2]
            while pages and self._pages_bytes + size > PAGES_BYTES:
                self._pages_bytes -= pages.pop(next(iter(pages)))[2]
            if size <= PAGES_BYTES:
                pages[sub_id] = (first, rows, size)
                self._pages_bytes += size

    def _believed_reader(self, sub_id: str) -> Subscription | None:
        """A reader's subscription, its monitor and the rows after its cursor as this server last read or wrote
        them, for a call whose first lock it is: its locks go with the call's next statement (its write,
        usually), carrying both rows for the database to check under them (READER_AS_READ_SQL); a difference
        aborts the call before anything of it is written (StaleRead: it runs again, reading them). None when
        memory lacks one of them, or the monitor was found changed less than DOUBT_SECONDS ago."""
        s = self._s
        if not (self.believe_memory and self.believe_readers and s.believing):
            return None
        hit = self._subscription.known(_key(sub_id))
        if hit is None:
            return None
        sub_row, sub = hit
        mon = self._monitor.known(_key(sub.monitor))
        now = time.monotonic()
        if mon is None or any(now < d.get(sub.monitor, 0.0) for d in (self._doubted, self._readers_doubted)):
            return None
        rec = mon[1]
        start = max(sub.cursor, 1)
        first, rows, _size = self._pages.get(sub.id, (start, [], 0))
        last = rows[-1].seq if rows else first - 1
        if start <= rec.head and not first <= start <= last:
            return None  # its next rows are not in memory: read with its locks, in one statement
        s.asked[sub.monitor] = True
        s.believed_readers[sub.monitor] = (sub_row, mon[0])
        s.sub_locks.add(sub.id)
        s.seen_subs[sub.id] = sub
        s.seen_monitors[sub.monitor] = rec
        s.page[sub.monitor] = (first, rows, last >= rec.head)
        s.page_from_memory[sub.monitor] = None
        return sub  # type: ignore[no-any-return]

    def _from_page(self, monitor_id: str, start: int, end: int, limit: int) -> list[Any] | None:
        """A log read answered from the rows read ahead with the subscription, when they hold all of it."""
        ahead = self._s.page.get(monitor_id)
        if ahead is None or start < ahead[0]:
            return None
        _first, rows, complete = ahead
        found: list[Any] = [r for r in rows if start <= r.seq <= end][:limit]
        if len(found) == limit or complete or (rows and rows[-1].seq >= end):
            s = self._s
            if found and monitor_id in s.page_from_memory:  # the reader's check carries the last row served
                last = s.page_from_memory[monitor_id]
                if last is None or found[-1].seq > last.seq:
                    s.page_from_memory[monitor_id] = found[-1]
            return found
        return None

    # --- the one write of a call ------------------------------------------------------------------
    def apply(self, changes: Changes) -> None:
        """Every write of the call in one statement, sent now and answered with the commit (the Sync that ends
        the call): a refusal of the database (a unique index) is raised by the commit, and nothing of the
        call is written. A read after it in the same call reads its answer first."""
        s = self._s
        if not s.depth:
            with self.transaction():
                self.apply(changes)
            return
        if changes.empty():
            return
        fresh = [pair for pair in changes.subjects if pair not in self._known_subjects]
        if len(fresh) != len(changes.subjects):  # a subject stored before costs no row
            changes = Changes(**{**_fields(changes), "subjects": fresh})
        changes = last_versions(changes)
        rows = _rows_written(changes)
        if rows or changes.compactions or changes.purge_keys_before is not None:
            if s.asked:  # locks asked for and not sent: with the write when each carries its row's check
                s.lock_later() if s.only_believed_asked() else s.run([])
            sql, params, written = write_statement(changes, self.instance)
            s.writes.append(rows)  # before it is sent: a failure from here on rolls back (Session.rollback)
            s.later(sql, params)
            s.written.append((self._monitor, written["monitors"], changes.monitors))
            s.written.append((self._subscription, written["subscriptions"], changes.subscriptions))
        # What was read under the lock is what this call now wrote: read again if the call goes on. In a
        # group commit, a monitor it holds whole is known as written (the next call needs no read of it).
        s.seen_monitors.clear()
        s.seen_subs.clear()
        s.page.clear()
        if s.group:
            for m in changes.monitors:
                if s.locks.get(m.id) is False:
                    s.seen_monitors[m.id] = m
        s.fresh_subjects.update(fresh)
        s.pulls.extend(changes.pulls)

    # --- monitors ---------------------------------------------------------------------------------
    def get_monitor(self, monitor_id: str) -> Monitor | None:
        s = self._s
        if s.depth and monitor_id in s.seen_monitors:
            return s.seen_monitors[monitor_id]
        shared = s.asked.get(monitor_id)
        if shared is False and s.depth and self.believe_memory:
            found = self._believed(monitor_id)
            if found is not None:
                return found
        s.asked.pop(monitor_id, None)
        if shared is not None:  # its lock and the read under it: one statement
            rows = s.run([(MONITOR_SQL, (enc(monitor_id), shared))])[0]
            s.locked(monitor_id, shared)
        else:
            rows = self._rows(f"{GET_MONITOR} WHERE id=$1", (monitor_id,))
        found = self._monitor(rows[0]) if rows else None
        if s.depth and monitor_id in s.locks:
            s.seen_monitors[monitor_id] = found
        return found

    def _believed(self, monitor_id: str) -> Monitor | None:
        """The monitor as this server last read or wrote its row, for a call that asked for its lock whole and
        has not sent it: the lock goes with the call's next statement (its write, usually) carrying the row,
        and the database checks it under the lock (postgres_sql.py LOCK_AS_READ_SQL). A row another server
        changed meanwhile aborts the call before anything of it is written (StaleRead: it runs again, reading
        the row). None when there is no memory of the row, or it was found stale less than DOUBT_SECONDS ago."""
        hit = self._monitor.known(_key(monitor_id))
        if hit is None:
            return None
        s = self._s
        if not s.believing:
            return None
        doubted = self._doubted.get(monitor_id)
        if doubted is not None and time.monotonic() < doubted:
            return None
        s.believed[monitor_id] = hit[0]
        s.seen_monitors[monitor_id] = hit[1]
        return hit[1]  # type: ignore[no-any-return]

    def list_monitors(self) -> list[Monitor]:
        return [self._monitor(r) for r in self._rows(f"{GET_MONITOR} ORDER BY id")]

    def list_monitors_page(self, after: str, limit: int) -> list[Monitor]:
        rows = self._rows(f"{GET_MONITOR} WHERE id > $1 ORDER BY id LIMIT $2", (enc(after), limit))
        return [self._monitor(r) for r in rows]

    def list_monitors_with_readers(self) -> list[Monitor]:
        rows = self._rows(f"{GET_MONITOR} WHERE id IN ({ACTIVE_MONITOR_IDS}) ORDER BY id")
        return [self._monitor(r) for r in rows]

    # --- the log ----------------------------------------------------------------------------------
    def get_observation(self, monitor_id: str, seq: int) -> Observation | None:
        rows = self._rows(f"{SELECT_LOG} WHERE monitor=$1 AND seq=$2", (monitor_id, seq))
        return rows_.observation(monitor_id, rows[0]) if rows else None

    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        """In chunks, and for a filtered read in seq windows within the stored seqs (base.chunked_rows)."""
        to_seq = min(to_seq, MAX_SEQ)
        cond, params = log_where(query)
        windowed = cond != "TRUE"
        if windowed:
            top = self._rows(_MAX_SEQ_SQL, (monitor_id,))
            if not top or top[0][0] is None:
                return
            to_seq = min(to_seq, int(top[0][0]))
            sql = numbered(
                f"{SELECT_LOG} WHERE monitor=%s AND seq>=%s AND seq<=%s AND ({cond}) ORDER BY seq LIMIT %s"
            )

            def fetch(start: int, end: int, limit: int) -> list[Any]:
                return _seq_first(self._rows(sql, (monitor_id, start, end, *params, limit), prepare=False))

        else:

            def fetch(start: int, end: int, limit: int) -> list[Any]:
                if self._s.depth:
                    ahead = self._from_page(monitor_id, start, end, limit)
                    if ahead is not None:
                        return ahead
                return _seq_first(self._rows(_SCAN_ALL, (monitor_id, start, end, limit)))

        for r in chunked_rows(fetch, from_seq, to_seq, windowed=windowed):
            yield rows_.observation(monitor_id, r)

    def read_range(self, monitor_id: str, from_seq: int, to_seq: int, *, served: bool = False) -> list[Any]:
        """`served`: each row's seq and event alone (records.ServedRow), from the page read ahead with the
        reader's subscription when it holds them, else in one statement of two columns."""
        if not served:
            return list(self.scan(monitor_id, from_seq, to_seq))
        to_seq = min(to_seq, MAX_SEQ)
        if self._s.depth:
            ahead = self._from_page(monitor_id, from_seq, to_seq, to_seq - from_seq + 1)
            if ahead is not None:
                return [rows_.served(r.seq, r[7]) for r in ahead]
        return [
            rows_.served(int(r[0]), r[1]) for r in self._rows(_SERVED_RANGE, (monitor_id, from_seq, to_seq))
        ]

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
        cond, params = log_where(query)
        sql = numbered(capped_count_sql("observations", cond, "%s"))
        args = (monitor_id, from_seq, min(to_seq, MAX_SEQ), *params, cap)
        return int(self._rows(sql, args, prepare=not params)[0][0])

    def has_subject(self, monitor_id: str, subject: str) -> bool:
        if not storable(subject):
            return False
        pair = (monitor_id, subject)
        if pair in self._known_subjects:
            return True
        rows = self._rows(
            "SELECT 1 FROM subjects WHERE monitor=$1 AND subject=$2", (monitor_id, enc(subject))
        )
        if rows and len(self._known_subjects) < KNOWN_SUBJECTS_MAX:
            self._known_subjects.add(pair)  # subjects are never deleted: once there, always there
        return bool(rows)

    def list_subjects(self, monitor_id: str) -> list[str]:
        rows = self._rows("SELECT subject FROM subjects WHERE monitor=$1", (monitor_id,))
        return sorted(dec(text(r[0])) or "" for r in rows)  # Python's order: the decoded text, not the stored

    # --- subscriptions ----------------------------------------------------------------------------
    def _subscription_where(self, where: str, args: tuple[Any, ...]) -> Subscription | None:
        rows = self._rows(f"{GET_SUBSCRIPTION} WHERE {where}", args)
        return self._subscription(rows[0]) if rows else None

    def get_subscription(self, sub_id: str) -> Subscription | None:
        s = self._s
        if s.depth and sub_id in s.seen_subs:
            return s.seen_subs[sub_id]
        found = self._subscription_where("id=$1", (sub_id,))
        if found is not None and s.depth and found.monitor in s.locks:
            s.seen_subs[sub_id] = found
        return found

    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None:
        return self._subscription_where("monitor=$1 AND subscriber=$2", (monitor_id, subscriber))

    def find_subscription_by_token(self, token_hash: str) -> Subscription | None:
        return self._subscription_where("token_hash=$1", (token_hash,))

    def list_subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        if monitor_id is None:
            rows = self._rows(f"{GET_SUBSCRIPTION} ORDER BY id")
        else:
            rows = self._rows(f"{GET_SUBSCRIPTION} WHERE monitor=$1 ORDER BY id", (monitor_id,))
        return [self._subscription(r) for r in rows]

    def list_active_subscriptions(self) -> list[Subscription]:
        rows = self._rows(f"{GET_SUBSCRIPTION} WHERE state = 'active'")  # (sorted here: see SQLite's)
        return [self._subscription(r) for r in sorted(rows, key=lambda r: r[0])]

    def count_active_subscriptions(self, monitor_id: str) -> int:
        rows = self._rows(
            "SELECT count(*) FROM subscriptions WHERE monitor=$1 AND state = 'active'", (monitor_id,)
        )
        return int(rows[0][0])

    def backlog_summary(self, top: int) -> dict[str, Any]:
        totals, rows = self._run([(BACKLOG_TOTALS_SQL, ()), (BACKLOG_TOP_SQL, (top,))])
        monitors, active, total = (int(v) for v in totals[0])
        return {
            "monitors": monitors,
            "active": active,
            "top": [(int(n), dec(text(m)), dec(text(s))) for n, m, s in rows],
            "total": total,
        }

    # --- leases -----------------------------------------------------------------------------------
    def get_lease(self, monitor_id: str, subject: str) -> Lease | None:
        if not storable(subject):
            return None
        rows = self._rows(f"{GET_LEASE} WHERE monitor=$1 AND subject=$2", (monitor_id, enc(subject)))
        return rows_.lease(rows[0]) if rows else None

    def list_leases(self, monitor_id: str | None = None) -> list[Lease]:
        if monitor_id is None:
            rows = self._rows(f"{GET_LEASE} ORDER BY monitor, subject")
        else:
            rows = self._rows(f"{GET_LEASE} WHERE monitor=$1 ORDER BY subject", (monitor_id,))
        return [rows_.lease(r) for r in rows]

    def list_held_leases(self) -> list[Lease]:
        return [
            rows_.lease(r)
            for r in self._rows(f"{GET_LEASE} WHERE holder IS NOT NULL ORDER BY monitor, subject")
        ]

    # --- publish idempotency keys -----------------------------------------------------------------
    def get_publish_key(self, monitor_id: str, key: str) -> PublishKey | None:
        rows = self._rows("SELECT seq, at FROM publish_keys WHERE monitor=$1 AND key=$2", (monitor_id, key))
        return PublishKey(monitor_id, key, int(rows[0][0]), float(rows[0][1])) if rows else None

    def list_publish_keys(self, monitor_id: str) -> list[PublishKey]:
        rows = self._rows(
            "SELECT key, seq, at FROM publish_keys WHERE monitor=$1 ORDER BY key", (monitor_id,)
        )
        return [PublishKey(monitor_id, r[0].decode(), int(r[1]), float(r[2])) for r in rows]

    # --- between servers: appends heard, one leader, readers' counts ------------------------------
    def link_stats(self) -> dict[str, int]:
        """How this server is linked to the others, for /metrics: its LISTEN connection up (1) or not, the
        LISTENs made (the first, then one per reconnection), the notifications of other servers' appends
        heard (one per commit and monitor), and whether it holds the leader lock."""
        peers = self._peers
        return {
            "listening": int(peers.listening),
            "listen_connects": peers.listen_connects,
            "heard": peers.heard,
            "leader": int(peers.leading),
        }

    def leading(self) -> bool:
        """Whether this server holds the leader lock (sweeps and push run here)."""
        return self._peers.leading

    def start_leader_election(self, poll_seconds: float = LEADER_POLL_SECONDS) -> None:
        self._peers.start_leader_election(poll_seconds)

    def listen(self, on_append: Callable[[str, int], None], on_reconnect: Callable[[], None]) -> None:
        """Hear the other servers' appends: `on_append(monitor, head)` on a thread of its own; after every
        (re)connection `on_reconnect()`, since appends made while the connection was down were not heard."""
        self._peers.listen(on_append, on_reconnect)


def _key(monitor_id: str) -> bytes:
    """A monitor's (or a subscription's) key in the memory of rows (`postgres_rows.Decoded`): its id
    column's text."""
    return enc(monitor_id).encode()


def _seq_first(rows: list[Row]) -> list[Row]:
    """Log rows with their seq as an int (chunked_rows and the read-ahead page compare seqs)."""
    return [(int(r[0]), *r[1:]) for r in rows]


def _fields(changes: Changes) -> dict[str, Any]:
    return {name: getattr(changes, name) for name in changes.__dataclass_fields__}


def _rows_written(changes: Changes) -> int:
    """Rows the changes insert or upsert (a delete may remove nothing: the statement counts what it did)."""
    return (
        len(changes.monitors) + len(changes.observations) + len(changes.subjects) + len(changes.subscriptions)
        + len(changes.leases) + len(changes.publish_keys)
    )  # fmt: skip
