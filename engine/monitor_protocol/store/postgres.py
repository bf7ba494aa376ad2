"""The PostgreSQL store: any number of `mp serve` processes on one database (docs/scale-out.md).

psycopg 3 (`pip install 'monitor-protocol[postgres]'`), imported only when this store is opened: the engine
itself stays standard-library only. The schema is the SQLite store's columnar one (store/sqlite.py), with
every text column that a filter compares in the "C" collation (code point order, as Python and SQLite
compare) and a format version in `mp_meta`; it is created on first start, and a server refuses a schema
newer than it knows.

Isolation (core/store_contract.py). Every call is its own transaction at READ COMMITTED, with
`synchronous_commit = on`: a commit reported is durable, and a reply is sent only after it. The engine
locks a monitor before it reads what it will change (`lock_monitor`: a transaction-scoped advisory lock on
the monitor's id, which also exists before the monitor row does), so calls that write one monitor are
serial across every server, and what a call reads after its lock is what the last commit left. The lock
travels in one pipeline with the read that follows it, and a call's writes in one more (bench/scaleout.py
counts the statements of a publish and of an ack+pull). A record
that names its monitor only inside (a subscription looked up by id or token) is read, its monitor locked,
and read again (tx.py). There is no group commit across calls: two servers batching calls on several
monitors could take those locks in opposite orders; PostgreSQL groups concurrent commits in its WAL
itself.

Between servers:
* appends are announced with NOTIFY `mp_append` (delivered at commit) and heard by a LISTEN connection of
  each other server (`listen`), which wakes its parked readers; a notification missed while that connection
  was down can only delay a reader: on reconnecting every parked reader re-checks;
* sweeps (mute, lease expiry) and HTTP push run on one server at a time, the holder of a session advisory
  lock (`leading`): when it dies its session ends, and another server takes the lock within a second.

Every driver failure that is the database's, not the request's (connection lost, server shutting down,
lock timeout, deadlock, disk full, a read-only standby) is raised as StorageError: the engine answers
503 UNAVAILABLE with Retry-After, the transaction is rolled back, and the next call reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from monitor_protocol import __version__
from monitor_protocol.core import wire
from monitor_protocol.core.records import Lease, Monitor, Observation, PublishKey, Subscription
from monitor_protocol.core.store_contract import (
    LOG_COLUMNS,
    Changes,
    LogQuery,
    StorageError,
    Store,
    StoreStats,
    Term,
    chunked_rows,
)
from monitor_protocol.store.sql import (
    LEASE_COLUMNS,
    MONITOR_COLUMNS,
    OBSERVATION_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    capped_count_sql,
    next_prefix,
    row_of,
    row_values,
    storable,
    upsert_sql,
)

log = logging.getLogger("monitor_protocol.store.postgres")

SCHEMA_VERSION = 1
CHANNEL = "mp_append"
# Advisory lock classes (the first key of the two-key form): one per monitor id, one for the leader, one for
# the schema's creation.
LOCK_MONITOR, LOCK_LEADER, LOCK_SCHEMA = 0x4D50, 0x4D51, 0x4D52
LOCK_TIMEOUT_MS = 10_000  # a call waiting longer for a monitor's lock gets 503, retry
STATEMENT_TIMEOUT_MS = 30_000
LEADER_POLL_SECONDS = 1.0
RECONNECT_SECONDS = 0.5
KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT = 5, 2, 3
TCP_USER_TIMEOUT_MS = 15_000  # unacknowledged data for this long: the connection is dead
LISTEN_PING_SECONDS = 5.0
MAX_SEQ = 2**63 - 1

T = 'TEXT COLLATE "C"'
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS mp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS monitors (
        id {T} PRIMARY KEY, status TEXT NOT NULL, head BIGINT NOT NULL, floor BIGINT NOT NULL, rec TEXT NOT NULL
    )""",
    f"""CREATE TABLE IF NOT EXISTS observations (
        monitor {T} NOT NULL, seq BIGINT NOT NULL, type {T} NOT NULL, subject {T}, actor {T} NOT NULL,
        origin {T} NOT NULL, tier {T} NOT NULL, horizon {T} NOT NULL, event TEXT NOT NULL,
        PRIMARY KEY (monitor, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS observations_by_type ON observations (monitor, type, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_subject ON observations (monitor, subject, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_actor ON observations (monitor, actor, seq)",
    f"CREATE TABLE IF NOT EXISTS subjects (monitor {T} NOT NULL, subject {T} NOT NULL, PRIMARY KEY (monitor, subject))",
    f"""CREATE TABLE IF NOT EXISTS subscriptions (
        id {T} PRIMARY KEY, monitor {T} NOT NULL, subscriber {T} NOT NULL, token_hash TEXT NOT NULL,
        state TEXT NOT NULL, cursor BIGINT NOT NULL, hwm BIGINT NOT NULL, mute_since DOUBLE PRECISION NOT NULL,
        rec TEXT NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_by_name ON subscriptions (monitor, subscriber)",
    "CREATE INDEX IF NOT EXISTS subscriptions_by_token ON subscriptions (token_hash)",
    "CREATE INDEX IF NOT EXISTS subscriptions_active ON subscriptions (monitor) WHERE state = 'active'",
    f"""CREATE TABLE IF NOT EXISTS leases (
        monitor {T} NOT NULL, subject {T} NOT NULL, state TEXT NOT NULL, holder {T},
        renewed DOUBLE PRECISION NOT NULL, duration BIGINT NOT NULL, rec TEXT NOT NULL,
        PRIMARY KEY (monitor, subject)
    )""",
    f"""CREATE TABLE IF NOT EXISTS publish_keys (
        monitor {T} NOT NULL, key {T} NOT NULL, seq BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (monitor, key)
    )""",
    "CREATE INDEX IF NOT EXISTS publish_keys_by_at ON publish_keys (at)",
)


_PUT_MONITOR = upsert_sql("monitors", MONITOR_COLUMNS, "id", "%s")
_PUT_SUBSCRIPTION = upsert_sql("subscriptions", SUBSCRIPTION_COLUMNS, "id", "%s")
_PUT_LEASE = upsert_sql("leases", LEASE_COLUMNS, "monitor, subject", "%s")
_PUT_OBSERVATION = (
    f"INSERT INTO observations (monitor, {', '.join(OBSERVATION_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * (1 + len(OBSERVATION_COLUMNS)))})"
)
_PUT_PUBLISH_KEY = (
    "INSERT INTO publish_keys (monitor, key, seq, at) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (monitor, key) DO UPDATE SET seq=EXCLUDED.seq, at=EXCLUDED.at"
)
_SELECT = f"SELECT {', '.join(OBSERVATION_COLUMNS)} FROM observations"
_GET_MONITOR = f"SELECT {', '.join(MONITOR_COLUMNS)}, rec FROM monitors"
_GET_SUBSCRIPTION = f"SELECT {', '.join(SUBSCRIPTION_COLUMNS)}, rec FROM subscriptions"
_GET_LEASE = f"SELECT {', '.join(LEASE_COLUMNS)}, rec FROM leases"


# ===================================================================================== text PostgreSQL holds
# PostgreSQL text cannot hold U+0000, which a subject may contain. Column copies are written in a prefix code
# that keeps code point order and prefixes (U+0001 is an escape: U+0000 -> 01 01, U+0001 -> 01 02), so that
# equality, ranges and prefix ranges on the encoded text mean what they mean on the original. The event
# itself is JSON, where U+0000 is spelled \u0000.
def _enc(value: str | None) -> str | None:
    if value is None or ("\x00" not in value and "\x01" not in value):
        return value
    return value.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")


_ESCAPED = re.compile("\x01([\x01\x02])")


def _dec(value: str | None) -> str | None:
    if value is None or "\x01" not in value:
        return value
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "\x01" else "\x01", value)


def _observation(monitor: str, r: tuple[Any, ...]) -> Observation:
    return Observation(
        monitor, r[0], _dec(r[1]), _dec(r[2]), _dec(r[3]), _dec(r[4]), _dec(r[5]), _dec(r[6]),
        wire.decode_trusted(r[7]),
    )  # fmt: skip


def _term_sql(term: Term, params: list[Any]) -> str:
    if term.column not in LOG_COLUMNS:  # a column name goes into SQL text: only the known ones
        raise ValueError(f"not an indexed log column: {term.column!r}")
    col = term.column
    parts: list[str] = []
    exact = [_enc(v) for v in term.exact if storable(v)]
    if exact:
        parts.append(f"{col} = ANY(%s)")
        params.append(exact)
    for prefix in term.prefixes:
        if not storable(prefix):
            continue
        low = _enc(prefix) or ""
        upper = next_prefix(low)
        if upper is None:
            parts.append(f"{col} >= %s")
            params.append(low)
        else:
            parts.append(f"({col} >= %s AND {col} < %s)")
            params.extend((low, upper))
    return " OR ".join(parts) if parts else "FALSE"


def log_where(query: LogQuery | None) -> tuple[str, list[Any]]:
    """The query as a condition on the log's columns (store/sqlite.py log_where, in PostgreSQL's terms)."""
    if query is None or query.selects_all:
        return "TRUE", []
    params: list[Any] = []
    clauses: list[str] = []
    for clause in query.clauses:
        if any(not alt for alt in clause):
            continue
        alts = [" AND ".join(f"({_term_sql(t, params)})" for t in alt) for alt in clause]
        clauses.append(" OR ".join(f"({a})" for a in alts) if alts else "FALSE")
    return (" AND ".join(f"({c})" for c in clauses) or "TRUE"), params


_PASSWORD_IN_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:([^@/]*)@")
_PASSWORD_IN_QUERY = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
_PASSWORD_IN_CONNINFO = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redacted(url: str) -> str:
    """The URL (or key=value conninfo) without its password, for logs and the startup banner."""
    if "://" in url:
        url = re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
        return _PASSWORD_IN_QUERY.sub(r"\1***", url)
    return _PASSWORD_IN_CONNINFO.sub(r"\1***", url)


def scrub(text: str, url: str) -> str:
    """`text` with the URL's password removed wherever it appears: libpq's messages may quote it (a
    malformed URL is quoted whole, a bad percent-escape or a space inside the password by itself)."""
    import urllib.parse

    text = text.replace(url, redacted(url))
    found = _PASSWORD_IN_URL.match(url)
    secrets = [found.group(1), urllib.parse.unquote(found.group(1))] if found else []
    if "://" in url and "?" in url:
        query = urllib.parse.parse_qs(url.partition("?")[2].partition("#")[0])
        secrets += query.get("password", [])
    elif "://" not in url:
        secrets += [m.group(2).strip("'") for m in _PASSWORD_IN_CONNINFO.finditer(url)]
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_postgres_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


class StoreVersionError(RuntimeError):
    """The database holds a schema this release does not know (written by a newer one)."""


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise RuntimeError(
            "a postgresql:// database needs psycopg 3: pip install 'monitor-protocol[postgres]'"
        ) from exc
    return psycopg


def _storage_failure(psycopg: Any, exc: BaseException) -> bool:
    """The database failed, not the request: connection, timeouts, deadlock, resources, a read-only standby."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.InternalError)


class PostgresStore(Store):
    """One connection, used by the engine thread only (the engine is single-threaded per server); LISTEN and
    the leader lock each hold a connection of their own, on threads of their own."""

    shared = True  # several servers write this store: the engine locks, re-reads, and allows for lag

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.psycopg = _driver()
        self.stats = StoreStats()
        self.instance = secrets.token_hex(8)  # this server's name in its own notifications
        self._conn: Any = None
        self._retry_at = 0.0
        self._queued = []  # statements sent with the next one (lock_monitor)
        self._last_failure = ""
        self._depth = 0
        self._wrote = False
        self._leader = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connect()
        self._open_schema()
        self.stats = StoreStats()  # what the engine's calls cost, not the schema's check

    # --- connections ------------------------------------------------------------------------------
    def _new_connection(self, *, autocommit: bool) -> Any:
        try:
            conn = self.psycopg.connect(
                self.url,
                autocommit=autocommit,
                connect_timeout=max(1, int(self.connect_timeout)),
                application_name="mp serve",
                # A peer that vanished (host lost, partition) is noticed in seconds, not hours: every
                # connection here waits on the other side (LISTEN, the leader's session, a commit).
                keepalives=1,
                keepalives_idle=KEEPALIVE_IDLE_SECONDS,
                keepalives_interval=KEEPALIVE_INTERVAL_SECONDS,
                keepalives_count=KEEPALIVE_COUNT,
                tcp_user_timeout=TCP_USER_TIMEOUT_MS,
            )
        except Exception as exc:  # psycopg.Error, or a malformed URL libpq could not even parse
            # What a client hears stays generic. Where the database is and what libpq said is the operator's
            # `detail` (mp serve prints it at start and logs it when a reconnection fails; mp migrate prints it).
            failure = StorageError(f"the database is unreachable ({type(exc).__name__}, see the server log)")
            failure.detail = f"cannot connect to PostgreSQL at {redacted(self.url)}: " + scrub(
                f"{type(exc).__name__}: {exc}", self.url
            )
            raise failure from None
        return conn

    def _connect(self) -> None:
        conn = self._new_connection(autocommit=True)
        try:
            conn.execute("SET synchronous_commit TO on")  # a reply only after the commit is durable
            conn.execute(f"SET lock_timeout TO {LOCK_TIMEOUT_MS}")
            conn.execute(f"SET statement_timeout TO {STATEMENT_TIMEOUT_MS}")
            conn.execute("SET idle_in_transaction_session_timeout TO 60000")
            conn.autocommit = False
        except self.psycopg.Error as exc:
            conn.close()
            log.warning("cannot configure the PostgreSQL session: %s", scrub(str(exc), self.url))
            raise StorageError(
                "the database refused this server's session settings (see the server log)"
            ) from None
        self._conn = conn

    def _ready(self) -> Any:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            self._conn = None
            # While the database is away, one attempt per RECONNECT_SECONDS: the calls in between get their
            # 503 at once instead of each waiting out a connection timeout on the engine thread.
            now = time.monotonic()
            if now < self._retry_at:
                raise StorageError(self._last_failure)
            try:
                self._connect()
            except StorageError as exc:
                if not self._last_failure:  # once per outage, not once per retry
                    log.warning("%s; retrying every %.1f s", exc.detail or exc, RECONNECT_SECONDS)
                self._retry_at, self._last_failure = now + RECONNECT_SECONDS, str(exc)
                raise
            if self._last_failure:
                log.warning("reconnected to PostgreSQL at %s", redacted(self.url))
                self._last_failure = ""
        return self._conn

    def _fail(self, exc: BaseException) -> StorageError:
        """A driver failure as StorageError; the transaction is gone, and a broken connection is dropped."""
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken):
            with contextlib.suppress(Exception):
                conn.close()
            self._conn = None
        log.warning("PostgreSQL: %s", scrub(f"{type(exc).__name__}: {exc}", self.url))
        return StorageError(f"the database failed: {type(exc).__name__}, see the server log")

    def _in_call(self) -> Any:
        """The connection of the open call; never a new one mid-call (its locks and writes were on the old)."""
        conn = self._conn
        if conn is None or conn.closed:
            raise StorageError("the connection to PostgreSQL was lost during this call")
        return conn

    def _exec(self, sql: str, params: Any = None) -> Any:
        """Execute; the rows are fetched with the reply (psycopg's client-side cursor). A read outside a
        call gets its own snapshot, ended at once, so no session is ever left idle in a transaction.
        Statements queued by `lock_monitor` go first, in one pipeline with this one: one round trip for the
        lock and the read after it (which, at READ COMMITTED, takes its snapshot once the lock is held)."""
        conn = self._in_call() if self._depth else self._ready()
        if isinstance(params, tuple) and any(isinstance(v, str) and "\x00" in v for v in params):
            # A lookup by an id with U+0000 (a request may spell one): PostgreSQL text cannot hold it, so
            # no stored row has it. Its escaped spelling matches nothing either, and is storable text.
            params = tuple(_enc(v) if isinstance(v, str) else v for v in params)
        try:
            if self._queued:
                queued, self._queued = self._queued, []
                with conn.pipeline():
                    for before in queued:
                        conn.execute(*before)
                    cur = conn.execute(sql, params)
            else:
                cur = conn.execute(sql, params)
        except self.psycopg.Error as exc:
            if not self._depth:
                self._rollback()
            if _storage_failure(self.psycopg, exc):
                raise self._fail(exc) from exc
            raise
        if not self._depth:
            self._end_read()
        return cur

    def _end_read(self) -> None:
        """End a transaction that wrote nothing. COMMIT, not ROLLBACK: a read-only commit flushes no WAL,
        and psycopg keeps its prepared statements (after a rollback it deallocates them all)."""
        try:
            self._in_call().commit()
        except (StorageError, self.psycopg.Error) as exc:
            if isinstance(exc, self.psycopg.Error):
                self._fail(exc)
            self._rollback()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    # --- the schema -------------------------------------------------------------------------------
    def _open_schema(self) -> None:
        """Create the schema once (servers starting together wait for each other on a lock), or check that
        the one there is this release's."""
        try:
            with self.transaction():
                self._exec("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_SCHEMA,))
                present = self._exec("SELECT to_regclass('mp_meta') IS NOT NULL").fetchone()[0]
                row = None
                if present:  # read first: a read-only standby with the schema opens (and serves reads)
                    row = self._exec("SELECT value FROM mp_meta WHERE key='schema_version'").fetchone()
                version = int(row[0]) if row else None
                if version is None:
                    for statement in SCHEMA:
                        self._exec(statement)
                    self._exec(
                        "INSERT INTO mp_meta (key, value) VALUES ('schema_version', %s), ('created_by', %s)",
                        (str(SCHEMA_VERSION), f"monitor-protocol {__version__}"),
                    )
                    self._wrote = True
                elif version > SCHEMA_VERSION:
                    raise StoreVersionError(
                        f"The database {redacted(self.url)} holds schema version {version}, and this "
                        f"monitor-protocol {__version__} knows version {SCHEMA_VERSION}: it was written by a "
                        "newer release. Nothing will be served from it; upgrade monitor-protocol."
                    )
        except BaseException:
            self.close()
            raise

    # --- transactions -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._ready()
        self._depth = 1
        self._wrote = False
        self._queued: list[tuple[str, Any]] = []
        try:
            yield
            self._flush_queued()  # a lock taken and nothing read after it still orders this call
        except BaseException:
            self._depth = 0
            self._queued = []
            self._rollback()
            raise
        self._depth = 0
        if not self._wrote:
            self.stats.read_only += 1
            self._end_read()
            return
        try:
            self._conn.commit()
        except self.psycopg.Error as exc:
            # The commit may or may not have reached the database before the connection went: the caller
            # hears 503 saying so, and retries (a publish with its idempotency key is then answered once).
            failure = self._fail(exc)
            failure.outcome_unknown = True
            raise failure from exc
        self.stats.commits += 1

    def _rollback(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.rollback()
        except self.psycopg.Error as exc:
            self._fail(exc)

    def lock_monitor(self, monitor_id: str) -> None:
        """Queued, and sent with the call's next statement (its read of what it locked): the lock is held
        before that statement runs, since the server runs a pipeline's statements in order."""
        # One 64-bit key per monitor (a key space of its own: the two-key locks below never meet it).
        lock = ("SELECT pg_advisory_xact_lock(hashtextextended(%s, %s))", (_enc(monitor_id), LOCK_MONITOR))
        if self._depth:
            self._queued.append(lock)
        else:
            self._exec(*lock)

    def _flush_queued(self) -> None:
        if self._queued:
            self._exec("SELECT 1")

    # --- the one write of a call ------------------------------------------------------------------
    def apply(self, changes: Changes) -> None:
        if not self._depth:
            with self.transaction():
                self.apply(changes)
            return
        if changes.empty():
            return
        try:
            conn = self._in_call()
            with conn.pipeline():  # every write of the call in one round trip
                queued, self._queued = self._queued, []
                for before in queued:
                    conn.execute(*before)
                wrote, deletes = self._write(conn, changes)
            wrote = wrote or any(cur.rowcount > 0 for cur in deletes)
        except self.psycopg.Error as exc:
            if _storage_failure(self.psycopg, exc):
                raise self._fail(exc) from exc
            raise
        self._wrote = self._wrote or wrote

    @staticmethod
    def _put(conn: Any, sql: str, rows: list[Any]) -> None:
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        elif rows:
            conn.cursor().executemany(sql, rows)

    def _write(self, conn: Any, changes: Changes) -> tuple[bool, list[Any]]:
        """Queue the changes' statements in the open pipeline: whether an upsert or insert writes, and the
        cursors of the deletes (a delete that finds nothing writes nothing: read their rowcount after the
        pipeline's sync)."""
        wrote = bool(
            changes.monitors or changes.observations or changes.subjects or changes.subscriptions
            or changes.leases or changes.publish_keys
        )  # fmt: skip
        if changes.monitors:
            self._put(conn, _PUT_MONITOR, [row_values(m.to_row(), MONITOR_COLUMNS) for m in changes.monitors])
        if changes.observations:
            self._put(
                conn,
                _PUT_OBSERVATION,
                [
                    (
                        o.monitor,
                        o.seq,
                        _enc(o.type),
                        _enc(o.subject),
                        _enc(o.actor),
                        _enc(o.origin),
                        _enc(o.tier),
                        _enc(o.horizon),
                        wire.encode_text(o.event),
                    )  # fmt: skip
                    for o in changes.observations
                ],
            )
            heads: dict[str, int] = {}
            for o in changes.observations:
                heads[o.monitor] = max(o.seq, heads.get(o.monitor, 0))
            for monitor_id, head in heads.items():  # delivered to the other servers at the commit
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{self.instance}\t{head}\t{monitor_id}"))
        if changes.subjects:
            self._put(
                conn,
                "INSERT INTO subjects (monitor, subject) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(m, _enc(s)) for m, s in changes.subjects],
            )
        if changes.subscriptions:
            self._put(
                conn,
                _PUT_SUBSCRIPTION,
                [row_values(s.to_row(), SUBSCRIPTION_COLUMNS) for s in changes.subscriptions],
            )
        if changes.leases:
            rows = []
            for x in changes.leases:
                values = list(row_values(x.to_row(), LEASE_COLUMNS))
                values[1], values[3] = _enc(values[1]), _enc(values[3])
                rows.append(tuple(values))
            self._put(conn, _PUT_LEASE, rows)
        if changes.publish_keys:
            self._put(conn, _PUT_PUBLISH_KEY, [(k.monitor, k.key, k.seq, k.at) for k in changes.publish_keys])
        deletes = [
            conn.execute("DELETE FROM observations WHERE monitor=%s AND seq<%s", (monitor, below))
            for monitor, below in changes.compactions
        ]
        if changes.purge_keys_before is not None:
            deletes.append(
                conn.execute("DELETE FROM publish_keys WHERE at<%s", (float(changes.purge_keys_before),))
            )
        return wrote, deletes

    # --- monitors ---------------------------------------------------------------------------------
    def get_monitor(self, monitor_id: str) -> Monitor | None:
        row = self._exec(f"{_GET_MONITOR} WHERE id=%s", (monitor_id,)).fetchone()
        return Monitor.from_row(row_of(row, MONITOR_COLUMNS)) if row else None

    def list_monitors(self) -> list[Monitor]:
        rows = self._exec(f"{_GET_MONITOR} ORDER BY id").fetchall()
        return [Monitor.from_row(row_of(r, MONITOR_COLUMNS)) for r in rows]

    # --- the log ----------------------------------------------------------------------------------
    def get_observation(self, monitor_id: str, seq: int) -> Observation | None:
        row = self._exec(f"{_SELECT} WHERE monitor=%s AND seq=%s", (monitor_id, seq)).fetchone()
        return _observation(monitor_id, row) if row else None

    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        """In chunks, and for a filtered read in seq windows within the stored seqs (base.chunked_rows)."""
        to_seq = min(to_seq, MAX_SEQ)
        cond, params = log_where(query)
        windowed = cond != "TRUE"
        sql = f"{_SELECT} WHERE monitor=%s AND seq>=%s AND seq<=%s AND ({cond}) ORDER BY seq LIMIT %s"
        if windowed:
            top = self._exec("SELECT max(seq) FROM observations WHERE monitor=%s", (monitor_id,)).fetchone()
            if top is None or top[0] is None:
                return
            to_seq = min(to_seq, int(top[0]))

        def fetch(start: int, end: int, limit: int) -> list[Any]:
            return self._exec(sql, (monitor_id, start, end, *params, limit)).fetchall()

        for r in chunked_rows(fetch, from_seq, to_seq, windowed=windowed):
            yield _observation(monitor_id, r)

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
        sql = capped_count_sql("observations", cond, "%s")
        row = self._exec(sql, (monitor_id, from_seq, min(to_seq, MAX_SEQ), *params, cap)).fetchone()
        return int(row[0])

    def has_subject(self, monitor_id: str, subject: str) -> bool:
        if not storable(subject):
            return False
        row = self._exec(
            "SELECT 1 FROM subjects WHERE monitor=%s AND subject=%s", (monitor_id, _enc(subject))
        ).fetchone()
        return row is not None

    def list_subjects(self, monitor_id: str) -> list[str]:
        rows = self._exec("SELECT subject FROM subjects WHERE monitor=%s", (monitor_id,)).fetchall()
        return sorted(_dec(r[0]) or "" for r in rows)  # Python's order: the decoded text, not the stored

    # --- subscriptions ----------------------------------------------------------------------------
    def _subscription(self, where: str, args: tuple[Any, ...]) -> Subscription | None:
        row = self._exec(f"{_GET_SUBSCRIPTION} WHERE {where}", args).fetchone()
        return Subscription.from_row(row_of(row, SUBSCRIPTION_COLUMNS)) if row else None

    def get_subscription(self, sub_id: str) -> Subscription | None:
        return self._subscription("id=%s", (sub_id,))

    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None:
        return self._subscription("monitor=%s AND subscriber=%s", (monitor_id, subscriber))

    def find_subscription_by_token(self, token_hash: str) -> Subscription | None:
        return self._subscription("token_hash=%s", (token_hash,))

    def list_subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        if monitor_id is None:
            rows = self._exec(f"{_GET_SUBSCRIPTION} ORDER BY id").fetchall()
        else:
            rows = self._exec(f"{_GET_SUBSCRIPTION} WHERE monitor=%s ORDER BY id", (monitor_id,)).fetchall()
        return [Subscription.from_row(row_of(r, SUBSCRIPTION_COLUMNS)) for r in rows]

    def count_active_subscriptions(self, monitor_id: str) -> int:
        row = self._exec(
            "SELECT count(*) FROM subscriptions WHERE monitor=%s AND state = 'active'", (monitor_id,)
        ).fetchone()
        return int(row[0])

    # --- leases -----------------------------------------------------------------------------------
    @staticmethod
    def _lease(r: tuple[Any, ...]) -> Lease:
        values = list(r)
        values[1], values[3] = _dec(values[1]), _dec(values[3])
        return Lease.from_row(row_of(tuple(values), LEASE_COLUMNS))

    def get_lease(self, monitor_id: str, subject: str) -> Lease | None:
        if not storable(subject):
            return None
        row = self._exec(
            f"{_GET_LEASE} WHERE monitor=%s AND subject=%s", (monitor_id, _enc(subject))
        ).fetchone()
        return self._lease(row) if row else None

    def list_leases(self, monitor_id: str | None = None) -> list[Lease]:
        if monitor_id is None:
            rows = self._exec(f"{_GET_LEASE} ORDER BY monitor, subject").fetchall()
        else:
            rows = self._exec(f"{_GET_LEASE} WHERE monitor=%s ORDER BY subject", (monitor_id,)).fetchall()
        return [self._lease(r) for r in rows]

    # --- publish idempotency keys -----------------------------------------------------------------
    def get_publish_key(self, monitor_id: str, key: str) -> PublishKey | None:
        row = self._exec(
            "SELECT seq, at FROM publish_keys WHERE monitor=%s AND key=%s", (monitor_id, key)
        ).fetchone()
        return PublishKey(monitor_id, key, int(row[0]), float(row[1])) if row else None

    def list_publish_keys(self, monitor_id: str) -> list[PublishKey]:
        rows = self._exec(
            "SELECT key, seq, at FROM publish_keys WHERE monitor=%s ORDER BY key", (monitor_id,)
        ).fetchall()
        return [PublishKey(monitor_id, r[0], int(r[1]), float(r[2])) for r in rows]

    # --- between servers: appends heard, and one leader ------------------------------------------
    def leading(self) -> bool:
        """Whether this server holds the leader lock (sweeps and push run here)."""
        return self._leader

    def start_leader_election(self, poll_seconds: float = LEADER_POLL_SECONDS) -> None:
        thread = threading.Thread(target=self._lead, args=(poll_seconds,), name="mp-pg-leader", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _lead(self, poll: float) -> None:
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    self._leader = False
                    conn = self._new_connection(autocommit=True)
                    # The database drops a vanished holder's session (and so the lock) within seconds.
                    conn.execute(f"SET tcp_keepalives_idle TO {KEEPALIVE_IDLE_SECONDS}")
                    conn.execute(f"SET tcp_keepalives_interval TO {KEEPALIVE_INTERVAL_SECONDS}")
                    conn.execute(f"SET tcp_keepalives_count TO {KEEPALIVE_COUNT}")
                    conn.execute(f"SET tcp_user_timeout TO {TCP_USER_TIMEOUT_MS}")
                if not self._leader:
                    got = conn.execute("SELECT pg_try_advisory_lock(%s, 0)", (LOCK_LEADER,)).fetchone()[0]
                    if got:
                        log.info("this server now runs the sweeps and push delivery (leader lock taken)")
                    self._leader = bool(got)
                else:
                    conn.execute("SELECT 1")  # still connected: the session, and so the lock, is alive
            except Exception as exc:  # whatever it was, this thread goes on: without it nobody may lead here
                if self._leader:
                    log.warning("lost the leader lock's connection: %s", scrub(str(exc), self.url))
                self._leader = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self._stop.wait(poll)
        self._leader = False
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def listen(self, on_append: Callable[[str, int], None], on_reconnect: Callable[[], None]) -> None:
        """Hear the other servers' appends: `on_append(monitor, head)` on a thread of its own; after every
        (re)connection `on_reconnect()`, since appends made while the connection was down were not heard."""
        thread = threading.Thread(
            target=self._listen, args=(on_append, on_reconnect), name="mp-pg-listen", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _listen(self, on_append: Callable[[str, int], None], on_reconnect: Callable[[], None]) -> None:
        delay = 0.1
        while not self._stop.is_set():
            conn: Any = None
            try:
                conn = self._new_connection(autocommit=True)
                conn.execute(f"LISTEN {CHANNEL}")
                delay = 0.1
                on_reconnect()
                pinged = time.monotonic()
                while not self._stop.is_set():
                    if time.monotonic() - pinged >= LISTEN_PING_SECONDS:
                        conn.execute("SELECT 1")  # a connection that only listens would never notice it died
                        pinged = time.monotonic()
                    for note in conn.notifies(timeout=0.5):
                        instance, _, rest = note.payload.partition("\t")
                        head, _, monitor_id = rest.partition("\t")
                        if instance != self.instance and head.isdigit():
                            try:
                                on_append(monitor_id, int(head))
                            except Exception:
                                log.exception("an append listener failed")
            except Exception as exc:  # whatever it was, keep listening: a dead listener would wake nobody
                log.warning(
                    "LISTEN %s: %s; reconnecting in %.1f s", CHANNEL, scrub(str(exc), self.url), delay
                )
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            self._stop.wait(delay)
            delay = min(delay * 2, 5.0)


def wait_for_database(url: str, seconds: float) -> None:
    """Block until PostgreSQL at `url` accepts a connection (tests and scripts), or raise StorageError."""
    psycopg = _driver()
    deadline = time.monotonic() + seconds
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.Error as exc:
            if time.monotonic() > deadline:
                raise StorageError(f"PostgreSQL at {redacted(url)} did not answer: {exc}") from exc
            time.sleep(0.2)
