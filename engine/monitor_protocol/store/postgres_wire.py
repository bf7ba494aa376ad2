"""The PostgreSQL store's engine connection, driven through libpq's own calls (psycopg.pq) in pipeline mode.

Why not psycopg's cursors: a statement through them costs ~25-50 µs of Python per execute (cursor, adapters,
transaction bookkeeping), several times what libpq itself needs, and a call of the engine is a few statements
(bench/scaleout.py, docs/bench.md "Scale-out that scales"). Each statement is prepared (parsed once per
connection), its parameters sent as text, its rows read as text and converted by the caller who knows the
columns.

Transactions are implicit: the connection stays in pipeline mode, and everything sent between two Syncs runs
in one transaction (the extended query protocol's own rule), which commits at the Sync. A call's statements are
sent each with a flush request (their rows come back at once, the transaction stays open) and the call ends
with `sync()`, its commit: no BEGIN and no COMMIT statement. `rollback()` ends it without a commit.

Errors keep psycopg's classes (`psycopg.errors.lookup(sqlstate)`), so that a refusal of the database (a unique
index) is an IntegrityError as with psycopg's cursors, and a failure of the connection is an OperationalError.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from monitor_protocol.core.lanes import lane_wait

Row = tuple[Any, ...]

# A call that hears nothing from PostgreSQL for SILENCE_SECONDS asks whether the database can still be reached
# (a statement waiting for a lock, or a long one, is silent too): a new connection is tried, and one that
# cannot be made within the store's connect_timeout means this one is lost (a stalled proxy or a frozen
# server: TCP's keepalives see neither, since something still acknowledges). Past ANSWER_SECONDS without an
# answer (a healthy server ends any statement at its statement_timeout, postgres_session.py), it is lost
# whatever the probe says.
SILENCE_SECONDS = 3.0
ANSWER_SECONDS = 40.0


def wait_socket(fd: int, writable: bool, timeout: float) -> bool:
    """Wait until `fd` is ready (True) or `timeout` seconds pass (False): on the event loop for a green lane,
    blocking the thread otherwise."""
    green = lane_wait()
    if green is not None:
        return green(fd, writable, timeout)
    import select

    poll = select.poll()
    poll.register(fd, select.POLLOUT if writable else select.POLLIN)
    return bool(poll.poll(max(0, int(timeout * 1000))))


def can_connect(pq: Any, conninfo: str, seconds: float) -> bool:
    """Whether the server at `conninfo` answers a new connection within `seconds` (a refusal it sends counts:
    it answered), driven through libpq's non-blocking connect so that a green lane's loop goes on."""
    deadline = time.monotonic() + seconds
    try:
        pg = pq.PGconn.connect_start(conninfo.encode())
    except Exception:
        return False
    try:
        state = pq.PollingStatus.WRITING
        while state not in (pq.PollingStatus.OK, pq.PollingStatus.FAILED):
            left = deadline - time.monotonic()
            if left <= 0 or not wait_socket(pg.socket, state == pq.PollingStatus.WRITING, left):
                return False
            state = pg.connect_poll()
        if state == pq.PollingStatus.OK:
            return True
        return b"FATAL" in (pg.error_message or b"")  # the server refused it (too many clients): it is there
    except Exception:
        return False
    finally:
        pg.finish()


class Wire:
    """One connection, used by one thread at a time. `statements` counts the statements sent (a regression
    shows as a count, never as a timing) and `round_trips` the waits for the server's answer."""

    def __init__(self, conn: Any, psycopg: Any, reachable: Callable[[], bool] | None = None) -> None:
        """`reachable`: asked after SILENCE_SECONDS without an answer, whether the database can still be reached
        (can_connect); without it, a call waits up to ANSWER_SECONDS."""
        import select  # here: the engine's pure modules import nothing they do not need on Pyodide

        self._select = select
        self.conn = conn  # the psycopg.Connection that opened it (autocommit: psycopg never sends BEGIN)
        self.psycopg = psycopg
        self.pq = psycopg.pq
        self.pg = conn.pgconn
        self.reachable = reachable
        self._prepared: dict[str, bytes] = {}
        # Statements prepared since the last round trip read without a failure: a failure aborts the rest of
        # the pipeline, preparations included, so these are forgotten then (prepared again on next use, under
        # a new name: the old one may or may not exist on the server).
        self._fresh: list[str] = []
        self._names = 0
        self.statements = 0
        self.round_trips = 0
        self.in_tx = False  # something was sent since the last Sync: an implicit transaction is open
        self.sent_later = False  # a statement went by `later` (every write does) since the last Sync
        self._later: list[int] = []  # results of statements sent by `later`, not read yet
        self._failure: BaseException | None = None
        self._syncs_unread = 0  # Syncs sent without waiting (read-only transactions), answers not read yet
        self._answered: list[Any] = []  # answers to `later` statements read before the Sync
        self.pg.nonblocking = 1
        self.pg.enter_pipeline_mode()
        self._poll = select.poll()
        self._poll.register(self.pg.socket, select.POLLIN)
        self._ok = (
            self.pq.ExecStatus.TUPLES_OK,
            self.pq.ExecStatus.COMMAND_OK,
            self.pq.ExecStatus.EMPTY_QUERY,
        )

    @property
    def broken(self) -> bool:
        return self.conn.closed or self.pg.status != self.pq.ConnStatus.OK

    def closed_while_idle(self) -> bool:
        """Whether the server ended this connection while it was idle between calls (a restart, an idle
        timeout, a terminated backend): its socket then has something to read, the goodbye and the end of
        the stream. What is read stays in libpq's buffer (a Sync's answer sent earlier is read by the next
        round trip); a healthy idle connection has nothing to read, and costs one poll."""
        if not self._poll.poll(0):
            return self.broken
        if not self._syncs_unread and not self._later:
            return True  # the server sent something nobody asked for: its goodbye (the end may follow later)
        try:
            for _ in range(3):  # a FATAL message, then the end of the stream
                if not self._poll.poll(0):
                    break
                self.pg.consume_input()
        except Exception:  # libpq could not read: the connection is gone
            return True
        return self.broken

    def close(self) -> None:
        self.conn.close()

    # --- sending -----------------------------------------------------------------------------------
    def _send(self, sql: str, params: tuple[Any, ...] | list[Any], prepare: bool) -> int:
        """Queue one statement; how many results it produces (a first use of a prepared one: two)."""
        values = [encode(v) for v in params]
        self.statements += 1
        self.in_tx = True
        if not prepare:
            self.pg.send_query_params(sql.encode(), values)
            return 1
        name = self._prepared.get(sql)
        if name is not None:
            self.pg.send_query_prepared(name, values)
            return 1
        name = b"mp_%d" % self._names
        self._names += 1
        self.pg.send_prepare(name, sql.encode())
        self.pg.send_query_prepared(name, values)
        self._prepared[sql] = name
        self._fresh.append(sql)
        return 2

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = (), *, prepare: bool = True) -> list[Row]:
        """Run one statement in the open transaction (or open one) and return its rows (text values, None
        for NULL)."""
        return self.many([(sql, params)], prepare=prepare)[-1]

    def many(
        self, statements: list[tuple[str, tuple[Any, ...] | list[Any]]], *, prepare: bool = True
    ) -> list[list[Row]]:
        """Several statements in one round trip, each with its rows (those sent by `later` before them are
        read first). The first failure is raised once every result has been read; the transaction is then
        aborted (the caller rolls back)."""
        return [rows_of(res) for res in self.results(statements, prepare=prepare)]

    def results(
        self, statements: list[tuple[str, tuple[Any, ...] | list[Any]]], *, prepare: bool = True
    ) -> list[Any]:
        """As `many`, each statement's result itself (a PGresult, or None when it returns no rows): the
        caller reads only the values it needs."""
        with self._sending():
            expected = [self._send(sql, params, prepare) for sql, params in statements]
            self.pg.send_flush_request()
        return self._read(expected)

    def later(self, sql: str, params: tuple[Any, ...] | list[Any], *, prepare: bool = True) -> None:
        """Send a statement now and read its result with the next round trip (the next `many`, or `sync`):
        a call's writes travel with its commit."""
        self.sent_later = True
        with self._sending():
            self._later.append(self._send(sql, params, prepare))

    def sync(self, *, wait: bool = True) -> list[Any]:
        """End the implicit transaction: its commit (or, after a failure, its abort). Returns the results of
        the statements sent by `later` (PGresult or None); raises what failed. `wait=False`, for a
        transaction that wrote nothing and whose results are all read: the Sync is sent (the server ends the
        transaction and releases its locks on reading it) and its answer read with the next round trip."""
        with self._sending():
            self.pg.pipeline_sync()
        self.in_tx = self.sent_later = False
        if not wait and not self._later and not self._answered:
            self._syncs_unread += 1
            return []
        self._drain_syncs()
        pending, self._later = self._later, []
        out, self._answered = [*self._answered, *self._collect(pending)], []
        while True:
            res = self._next()
            if res is not None and res.status == self.pq.ExecStatus.PIPELINE_SYNC:
                break
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return out

    def rollback(self, *, wrote: bool = True) -> None:
        """Abort the open transaction (nothing of it is committed), then Sync. `wrote=False`, for a transaction
        that sent no write: the Sync alone ends it, which keeps nothing either, and PostgreSQL logs no WARNING
        "there is no transaction in progress" (a ROLLBACK outside a transaction block: an implicit one's
        statements are not a block), once for every refused call."""
        if not self.in_tx:
            return
        try:
            if wrote or self.sent_later:  # (a write its caller did not count is still rolled back)
                self._send("ROLLBACK", (), False)
                self.statements -= 1  # the end of a transaction, not a statement of a call
                self._later.append(1)
            self.sync()
        except self.psycopg.Error:
            # The transaction was already aborted by a failure (which the caller heard), or the connection is
            # gone: either way nothing of it commits.
            self._failure = None
        self._answered = []

    @contextlib.contextmanager
    def _sending(self) -> Iterator[None]:
        try:
            yield
        except self.psycopg.Error:
            raise
        except Exception as exc:  # libpq's own failure to send: the connection is gone
            raise self.psycopg.OperationalError(f"sending to PostgreSQL failed: {exc}") from exc

    def _read(self, expected: list[int]) -> list[Any]:
        pending, self._later = self._later, []
        rows = self._collect([*pending, *expected])
        self._answered.extend(rows[: len(pending)])  # returned by the next sync
        rows = rows[len(pending) :]
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return rows

    # --- receiving ---------------------------------------------------------------------------------
    def _drain_syncs(self) -> None:
        """Read the answers of the Syncs sent without waiting (they come before anything sent after them)."""
        while self._syncs_unread:
            res = self._next()
            if res is not None and res.status == self.pq.ExecStatus.PIPELINE_SYNC:
                self._syncs_unread -= 1

    def _flush(self) -> None:
        while self.pg.flush() == 1:
            self._wait(self._select.POLLOUT)

    def _wait(self, events: int) -> None:
        """Until the socket is ready, asking after each SILENCE_SECONDS whether the database can still be
        reached; when it cannot (or past ANSWER_SECONDS), the connection is closed and OperationalError
        raised: whatever was sent may or may not have been done."""
        began = time.monotonic()
        while not self._ready(events, SILENCE_SECONDS):
            waited = time.monotonic() - began  # (the probes' time included)
            if waited < ANSWER_SECONDS and (self.reachable is None or self.reachable()):
                continue  # a lock waited for, or a long statement: the server is there
            self.conn.close()
            raise self.psycopg.OperationalError(
                f"PostgreSQL has not answered for {waited:.0f} s"
                + ("" if waited >= ANSWER_SECONDS else " and no new connection could be made")
                + ": this connection is taken as lost"
            )

    def _ready(self, events: int, timeout: float) -> bool:
        green = lane_wait()
        if green is not None:  # a green lane (doors/green_lanes.py): the event loop runs while it waits
            return green(self.pg.socket, events == self._select.POLLOUT, timeout)
        self._poll.modify(self.pg.socket, events)
        try:
            return bool(self._poll.poll(int(timeout * 1000)))
        finally:
            self._poll.modify(self.pg.socket, self._select.POLLIN)

    def _next(self) -> Any:
        """The next result (None between two statements' results), waiting on the socket, GIL released."""
        pg = self.pg
        while pg.is_busy():
            self._wait(self._select.POLLIN)
            pg.consume_input()
        return pg.get_result()

    def _collect(self, expected: list[int]) -> list[Any]:
        """The results of statements sent, in order (one round trip: flushed, then read); the first failure is
        kept in `_failure` for the caller to raise once everything sent has been read."""
        self.round_trips += 1
        with self._sending():
            self._flush()
        self._drain_syncs()
        out: list[Any] = []
        tuples = self.pq.ExecStatus.TUPLES_OK
        for n in expected:
            found = None
            for _ in range(n):
                res = self._next()
                while res is not None:
                    if res.status == tuples:
                        found = res
                    elif res.status not in self._ok and self._failure is None:
                        self._failure = self._error(res)
                    res = self._next()
            out.append(found)
        if self._failure is not None:
            for sql in self._fresh:
                self._prepared.pop(sql, None)
        self._fresh = []
        return out

    def _error(self, res: Any) -> BaseException:
        pq = self.pq
        if res.status == pq.ExecStatus.PIPELINE_ABORTED:
            return self.psycopg.OperationalError("the transaction was aborted by an earlier failure")
        sqlstate = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        message = (res.error_message or b"").decode(errors="replace").strip()
        try:
            cls = self.psycopg.errors.lookup(sqlstate) if sqlstate else self.psycopg.OperationalError
        except KeyError:
            cls = self.psycopg.DatabaseError
        error = cls(message or f"PostgreSQL failed ({sqlstate or 'no SQLSTATE'})")
        error.mp_sqlstate = (
            sqlstate  # psycopg's own `sqlstate` is read from a result this error was not made from
        )
        return error


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of an error raised by a Wire ('' for any other)."""
    return getattr(exc, "mp_sqlstate", "") or ""


def rows_of(res: Any) -> list[Row]:
    """A result's rows as tuples of text values (None for NULL)."""
    if res is None:
        return []
    get = res.get_value
    width = range(res.nfields)
    return [tuple([get(r, c) for c in width]) for r in range(res.ntuples)]


def _str(value: str) -> bytes:
    # libpq sends a text parameter as a C string: U+0000 would cut it. No stored text holds it (written in
    # the store's prefix code, store/postgres_sql.py), so a lookup by such a value finds nothing.
    return (_nul_free(value) if "\x00" in value else value).encode()


_ENCODE: dict[type, Any] = {
    str: _str,
    bool: lambda v: b"t" if v else b"f",
    int: lambda v: b"%d" % v,
    float: lambda v: repr(v).encode(),  # the shortest text that reads back as the same float
    list: lambda v: array_literal(v).encode(),
    tuple: lambda v: array_literal(v).encode(),
    type(None): lambda v: None,
}


def encode(value: Any) -> bytes | None:
    """A parameter in PostgreSQL's text format (the statement's context gives its type)."""
    try:
        return _ENCODE[type(value)](value)  # type: ignore[no-any-return]
    except KeyError:
        raise TypeError(f"no text form for a {type(value).__name__} parameter") from None


def array_literal(values: list[Any] | tuple[Any, ...]) -> str:
    """A one-dimensional array in PostgreSQL's text form: every element quoted (NULL unquoted)."""
    parts = []
    for v in values:
        if v is None:
            parts.append("NULL")
        else:
            text = v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)
            if "\x00" in text:
                text = _nul_free(text)
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


def _nul_free(value: str) -> str:
    """The store's prefix code (store/postgres_sql.py enc): U+0001 -> 01 02, U+0000 -> 01 01."""
    return value.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")


def text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()
