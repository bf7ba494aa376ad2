"""What the PostgreSQL store needs besides its reads and writes: connections (a URL's password never printed),
which driver failures are the database's, and the duties that run beside the engine on connections of their
own (docs/scale-out.md):

* the leader lock: sweeps and HTTP push run on one server at a time, the holder of a session advisory lock;
* LISTEN: the other servers' appends, heard to wake this server's parked readers;
* readers' counts: a pull that only counts (the monitor's `delivered` and `last_pull`) does not write the
  monitor's row, so that readers of one monitor never queue behind that row's lock; what this server's pulls
  counted is added to the row by one short transaction per monitor about once a second (`Counts`).
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

from monitor_protocol.core import wire
from monitor_protocol.core.repeats import Repeats
from monitor_protocol.core.store_contract import StorageError
from monitor_protocol.store.postgres_sql import CHANNEL, LISTING_KEY_READ, LISTING_KEY_SQL, LOCK_LEADER, enc
from monitor_protocol.store.postgres_wire import sqlstate

log = logging.getLogger("monitor_protocol.store.postgres")

LEADER_POLL_SECONDS = 1.0
# The leader's session, polled every LEADER_POLL_SECONDS, ends itself after this long unpolled (PostgreSQL 14+).
LEADER_IDLE_SECONDS = 10.0
KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT = 5, 2, 3
TCP_USER_TIMEOUT_MS = 15_000  # unacknowledged data for this long: the connection is dead
LISTEN_PING_SECONDS = 5.0
# While the database is away, one connection attempt per this, per connection (the engine's sessions, LISTEN):
# an attempt is cheap for the database, and a LISTEN not made again is a server whose readers other servers'
# appends do not wake (re-checked at the reconnection, so late, never lost).
RECONNECT_SECONDS = 0.5
COUNTS_FLUSH_SECONDS = 1.0  # how late a monitor's delivered count and last pull may be stored

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
        # Only where it stands alone: a password that is also part of a word (the role "mpweak" with the
        # password "weak", the database "weakdb") would otherwise be masked inside it, which mangles the
        # message's names and SQL and, next to a name everyone knows, shows the password.
        text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", "***", text)
    return text


def is_postgres_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


def driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the message is the point
        raise RuntimeError(
            "a postgresql:// database needs psycopg 3: pip install 'psycopg[binary]' (the [postgres] extra)"
        ) from exc
    return psycopg


def storage_failure(psycopg: Any, exc: BaseException) -> bool:
    """The database failed, not the request: connection, timeouts, deadlock, resources, a read-only standby."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.InternalError)


PRIVILEGE_SQLSTATE = "42501"  # insufficient_privilege: a REVOKE, a role without a grant


def privilege_refusal(exc: BaseException) -> bool:
    """The database refused a statement for a privilege the role lacks (a DBA's REVOKE: the server's set-up,
    not the request, is at fault; a storage failure once the schema is open): nothing was written."""
    return PRIVILEGE_SQLSTATE in (sqlstate(exc), getattr(exc, "sqlstate", None))


READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction: a standby, or default_transaction_read_only


def read_only_refusal(exc: BaseException) -> bool:
    """The database refused a write because it is read-only: certain that nothing was written."""
    return READ_ONLY_SQLSTATE in (sqlstate(exc), getattr(exc, "sqlstate", None))  # the wire's, or psycopg's


# Errors that PostgreSQL answers by rolling the statement's transaction back, and nothing else: a
# serialization failure or deadlock (class 40), a lock or statement timeout, bad data, a constraint, an
# access rule, a transaction already aborted. Anything else (a connection lost, a session ended, a PANIC,
# disk full during the WAL flush, an internal error) may come after a COMMIT took effect.
_ROLLED_BACK_CLASSES = ("40", "22", "23", "42")
_ROLLED_BACK_STATES = ("55P03", "57014", "25P02")


def answered(exc: BaseException) -> bool:
    """The database answered the call with an error that rolled its whole transaction back (a lock timeout,
    a deadlock, a serialization failure, a constraint): nothing of it was written. False for anything else,
    a lost connection above all: then a COMMIT may have happened."""
    state = sqlstate(exc) or getattr(exc, "sqlstate", None)
    if not isinstance(state, str):
        return False
    return state[:2] in _ROLLED_BACK_CLASSES or state in _ROLLED_BACK_STATES


@contextlib.contextmanager
def on_failure(undo: Callable[[], Any]) -> Iterator[None]:
    """Run `undo` (close what was opened) when the block raises, and raise on."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            undo()
        raise


def connect(psycopg: Any, url: str, connect_timeout: float, *, autocommit: bool) -> Any:
    """A connection to `url`, or StorageError saying generically what failed (the operator's `detail` says
    where and why, without the password)."""
    try:
        return psycopg.connect(
            url,
            autocommit=autocommit,
            connect_timeout=max(1, int(connect_timeout)),
            application_name="mp serve",
            # A peer that vanished (host lost, partition) is noticed in seconds, not hours: every connection
            # here waits on the other side (LISTEN, the leader's session, a commit).
            keepalives=1,
            keepalives_idle=KEEPALIVE_IDLE_SECONDS,
            keepalives_interval=KEEPALIVE_INTERVAL_SECONDS,
            keepalives_count=KEEPALIVE_COUNT,
            tcp_user_timeout=TCP_USER_TIMEOUT_MS,
        )
    except Exception as exc:  # psycopg.Error, or a malformed URL libpq could not even parse
        # What a client hears stays generic. Where the database is and what libpq said is the operator's
        # `detail` (mp serve prints it at start and logs it when a reconnection fails; mp migrate prints it).
        said = str(exc).lower()
        full = getattr(exc, "sqlstate", None) == "53300" or any(  # too_many_connections, or its words
            words in said for words in ("too many clients", "too many connections", "connection slots")
        )
        failure = StorageError(
            "the database refuses more connections (max_connections, or the role's or the database's "
            "CONNECTION LIMIT, is reached: each mp serve holds up to --db-connections + 3, docs/scale-out.md)"
            if full
            else f"the database is unreachable ({type(exc).__name__}; the server's log says why)"
        )
        failure.detail = f"cannot connect to PostgreSQL at {redacted(url)}: " + scrub(
            " ".join(str(exc).split()) or type(exc).__name__,
            url,  # libpq's lines as one
        )
        raise failure from None


def schema_refused(exc: BaseException, url: str, role: str) -> StorageError:
    """The database refused to create this server's tables: StorageError whose `detail` tells the operator
    what to grant, in one line (libpq's LINE and caret lines quote the SQL, of no use to them)."""
    message = re.sub(r"^(ERROR|FATAL):\s+", "", str(exc).strip().split("\n", 1)[0]) or type(exc).__name__
    failure = StorageError("the database refused this server's tables (the server's log says why)")
    where = f"PostgreSQL at {redacted(url)}"
    if sqlstate(exc) == "42501":  # insufficient_privilege
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", role):  # as SQL names it: a quoted identifier otherwise
            role = '"' + role.replace('"', '""') + '"'
        failure.detail = (
            f"{where} does not let the role {role} create this server's tables ({scrub(message, url)}). Since "
            "PostgreSQL 15 only a database's owner may create tables in its public schema: give the role a "
            f"database of its own (CREATE DATABASE mp OWNER {role};) and name it in the URL, or, as the "
            f"database's owner, GRANT CREATE ON SCHEMA public TO {role};"
        )
    else:
        failure.detail = f"{where} refused this server's tables: {scrub(message, url)}"
    return failure


def wait_for_database(url: str, seconds: float) -> None:
    """Block until PostgreSQL at `url` accepts a connection (tests and scripts), or raise StorageError."""
    psycopg = driver()
    deadline = time.monotonic() + seconds
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.Error as exc:
            if time.monotonic() > deadline:
                raise StorageError(f"PostgreSQL at {redacted(url)} did not answer: {exc}") from exc
            time.sleep(0.2)


class Counts:
    """What this server's readers counted and did not write: per monitor, deliveries to add to its `delivered`
    counter and the newest pull. `add` after each commit (engine thread); a thread of its own folds them into
    the monitors' rows, each under that monitor's lock, about once a second, and once more at `close`. What a
    fold could not write is kept for the next one; a server killed outright loses at most the last second's
    count (never a delivery: the reader's own row, its cursor and high-water mark, is written by the pull)."""

    def __init__(self, open_connection: Callable[[], Any], stop: threading.Event) -> None:
        self._open = open_connection
        self._stop = stop
        self._lock = threading.Lock()
        self._pending: dict[str, list[float]] = {}  # monitor -> [deliveries, newest pull]
        self._thread: threading.Thread | None = None
        self.folded = 0  # monitors' rows written by folds (tests and benchmarks)
        # Told each monitor whose row a fold rewrote (PostgresStore forgets its memory of that row).
        self.on_written: Callable[[str], None] | None = None
        self._fold_failures = Repeats(log, "storing readers' counts failed (kept for the next attempt)")

    def add(self, pulls: list[tuple[str, int, float | None]]) -> None:
        with self._lock:
            for monitor_id, delivered, last_pull in pulls:
                have = self._pending.get(monitor_id)
                pulled = float("-inf") if last_pull is None else last_pull
                if have is None:
                    self._pending[monitor_id] = [delivered, pulled]
                else:
                    have[0] += delivered
                    have[1] = max(have[1], pulled)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mp-pg-counts", daemon=True)
                self._thread.start()

    def pending(self) -> dict[str, tuple[int, float | None]]:
        with self._lock:
            return {m: (int(d), None if p == float("-inf") else p) for m, (d, p) in self._pending.items()}

    def _run(self) -> None:
        conn: Any = None
        while True:
            stopping = self._stop.wait(COUNTS_FLUSH_SECONDS)
            conn = self.fold(conn)
            if stopping:
                break
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def fold(self, conn: Any) -> Any:
        """Write what is pending (one transaction per monitor); returns the connection to reuse (None: it
        failed and is closed, what was not written is pending again)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return conn
        try:
            if conn is not None and not conn.closed and conn.info.transaction_status != 0:
                conn.close()  # not idle: left broken by a failure (a restart ended it under us)
            if conn is not None and not conn.closed:
                try:  # a connection idle a second may have died (the database restarted): found now, not mid-write
                    conn.execute("SELECT 1")
                except Exception:
                    conn.close()
            if conn is None or conn.closed:
                conn = self._open()
            for monitor_id in sorted(batch):
                delivered, pulled = batch[monitor_id]
                with conn.transaction():
                    # The monitor's lock first (its row is read and written whole by the engine's calls).
                    conn.execute("SELECT mp2_lock(%s, false)", (enc(monitor_id),))
                    row = conn.execute("SELECT rec FROM monitors WHERE id=%s", (monitor_id,)).fetchone()
                    if row is not None:
                        rec = wire.decode_trusted(row[0])
                        counters = rec.setdefault("counters", {})
                        counters["delivered"] = int(counters.get("delivered", 0)) + int(delivered)
                        if pulled != float("-inf"):
                            last = rec.get("last_pull")
                            rec["last_pull"] = pulled if last is None else max(float(last), pulled)
                        conn.execute(
                            "UPDATE monitors SET rec=%s WHERE id=%s", (wire.encode_text(rec), monitor_id)
                        )
                        self.folded += 1
                if row is not None and self.on_written is not None:
                    self.on_written(monitor_id)
                del batch[monitor_id]
            self._fold_failures.ok()
        except Exception as exc:  # whatever it was, nothing is lost: what is left waits for the next fold
            said = getattr(exc, "detail", None) or exc  # the operator's reason, not a client's sentence
            self._fold_failures.failed(said)
            with self._lock:
                for monitor_id, (delivered, pulled) in batch.items():
                    have = self._pending.setdefault(monitor_id, [0, float("-inf")])
                    have[0] += delivered
                    have[1] = max(have[1], pulled)
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            return None
        return conn


class Peers:
    """The leader lock and LISTEN, each on a thread and a connection of its own."""

    def __init__(self, url: str, psycopg: Any, instance: str, open_connection: Callable[[], Any]) -> None:
        self.url = url
        self.psycopg = psycopg
        self.instance = instance
        self._open = open_connection
        self.leader = False
        self.held_at = 0.0  # when the leader lock's session last answered (time.monotonic)
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        # What /metrics says of the link (read from other threads: each a plain value, written by one thread).
        self.listening = False  # the LISTEN connection is up
        self.listen_connects = 0  # LISTENs made: the first, then one per reconnection
        self.heard = 0  # notifications of other servers' appends heard (one per commit and monitor)

    @property
    def leading(self) -> bool:
        """Whether this server leads: it holds the lock, and its session answered less than half of
        LEADER_IDLE_SECONDS ago (a poll stuck on a silent connection stops it leading before the database
        ends that session and another server takes the lock)."""
        return self.leader and time.monotonic() - self.held_at < LEADER_IDLE_SECONDS / 2

    def start_leader_election(self, poll_seconds: float = LEADER_POLL_SECONDS) -> None:
        thread = threading.Thread(target=self._lead, args=(poll_seconds,), name="mp-pg-leader", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _lead(self, poll: float) -> None:
        conn: Any = None
        failing = Repeats(
            log,
            "the leader lock's connection cannot be held by this server (it cannot lead; while no other "
            "server holds the lock, the sweeps and push delivery wait)",
        )
        while not self.stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    self.leader = False
                    conn = self._open()
                    # The database drops a vanished holder's session (and so the lock) within seconds.
                    conn.execute(f"SET tcp_keepalives_idle TO {KEEPALIVE_IDLE_SECONDS}")
                    conn.execute(f"SET tcp_keepalives_interval TO {KEEPALIVE_INTERVAL_SECONDS}")
                    conn.execute(f"SET tcp_keepalives_count TO {KEEPALIVE_COUNT}")
                    conn.execute(f"SET tcp_user_timeout TO {TCP_USER_TIMEOUT_MS}")
                    if conn.info.server_version >= 140000:
                        # A session nobody polls any more ends itself, and frees the lock: one left behind a
                        # proxy that keeps its side of the connection alive (keepalives reach only the proxy).
                        conn.execute(f"SET idle_session_timeout TO {int(LEADER_IDLE_SECONDS * 1000)}")
                if not self.leader:
                    got = conn.execute("SELECT pg_try_advisory_lock(%s, 0)", (LOCK_LEADER,)).fetchone()[0]
                    if got:
                        log.info("this server now runs the sweeps and push delivery (leader lock taken)")
                        self.held_at = time.monotonic()
                    self.leader = bool(got)
                else:
                    conn.execute("SELECT 1")  # still connected: the session, and so the lock, is alive
                    self.held_at = time.monotonic()
                failing.ok()
            except Exception as exc:  # whatever it was, this thread goes on: without it nobody may lead here
                if self.leader:
                    log.warning("lost the leader lock's connection: %s", scrub(str(exc), self.url))
                else:
                    failing.failed(getattr(exc, "detail", None) or scrub(str(exc), self.url))
                self.leader = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self.stop.wait(poll)
        self.leader = False
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def listen(self, on_append: Callable[[str, int], None], on_reconnect: Callable[[], None]) -> None:
        thread = threading.Thread(
            target=self._listen, args=(on_append, on_reconnect), name="mp-pg-listen", daemon=True
        )
        self.threads.append(thread)
        thread.start()

    def _listen(self, on_append: Callable[[str, int], None], on_reconnect: Callable[[], None]) -> None:
        import select

        mine = self.instance.encode() + b"\t"
        lost_at: float | None = None  # when the connection was lost (or first refused), while it stays lost
        said = ""  # the reason last logged while it stays lost: logged again only when it changes
        while not self.stop.is_set():
            conn: Any = None
            try:
                conn = self._open()
                conn.execute(f"LISTEN {CHANNEL}")
                self.listen_connects += 1  # counted first: a scrape that reads `listening` 1 counts it
                self.listening = True
                if lost_at is not None:
                    said = ""
                    log.warning(
                        "LISTEN %s again after %.1f s away; every parked reader re-checks",
                        CHANNEL,
                        time.monotonic() - lost_at,
                    )
                    lost_at = None
                on_reconnect()
                # libpq's own calls from here: every append of every server (this one's too) arrives here,
                # and psycopg's notifies() costs several times what reading them costs.
                pg = conn.pgconn
                poll = select.poll()
                poll.register(pg.socket, select.POLLIN)
                pinged = time.monotonic()

                def heard(payload: bytes) -> None:
                    if payload.startswith(mine):
                        return  # this server's own append: its readers heard it at the commit
                    head, _, monitor_id = payload.partition(b"\t")[2].partition(b"\t")
                    if head.isdigit():
                        self.heard += 1
                        try:
                            on_append(monitor_id.decode(), int(head))
                        except Exception:
                            log.exception("an append listener failed")

                while not self.stop.is_set():
                    if time.monotonic() - pinged >= LISTEN_PING_SECONDS:
                        conn.execute("SELECT 1")  # a connection that only listens would never notice it died
                        for note in conn.notifies(timeout=0):  # those psycopg took in meanwhile
                            heard(note.payload.encode())
                        pinged = time.monotonic()
                    if not poll.poll(500):
                        continue
                    pg.consume_input()
                    while (note := pg.notifies()) is not None:
                        heard(note.extra)
            except Exception as exc:  # whatever it was, keep listening: a dead listener would wake nobody
                if lost_at is None:
                    lost_at = time.monotonic()
                # the operator's detail (where and why), not what a client hears ("see the server log")
                reason = scrub(getattr(exc, "detail", None) or str(exc), self.url)
                if reason != said:  # once per outage, and again when the reason changes, not every attempt
                    said = reason
                    log.warning(
                        "LISTEN %s: %s; trying again every %.1f s (until then other servers' appends wake "
                        "nobody here)",
                        CHANNEL,
                        reason,
                        RECONNECT_SECONDS,
                    )
            finally:
                self.listening = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            self.stop.wait(RECONNECT_SECONDS)


def shared_listing_key(store: Any) -> bytes | None:
    """The key all servers on `store`'s database seal a listing's `next` with (core/listing_seal.py), in
    mp_meta: the first server on the database makes it, the others read it. None, said in the log, where it
    can be neither read nor made (a standby without one, the database away at start): the process's own
    key then, and a listing's sealed pages open only on this server."""
    with contextlib.suppress(store.psycopg.Error, StorageError, ValueError):
        for sql in (LISTING_KEY_READ, LISTING_KEY_SQL, LISTING_KEY_READ):
            made = sql is LISTING_KEY_SQL
            with store.transaction():
                row = store._rows(sql, (secrets.token_hex(32),) if made else (), prepare=False)
                store._s.wrote = made
            if not made and row:
                return bytes.fromhex(row[0][0].decode())
    log.warning("no listing key shared in mp_meta: a listing's sealed pages open only on this server")
    return None
