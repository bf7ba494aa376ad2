"""The store contract: typed records in, typed records out, and one explicit write per engine call.

An engine call (one `ServiceCore._call`) runs inside `store.transaction()`. Its rule reads records
through the store's read methods, stages what changes in a `Tx` (engine/monitor_protocol/core/tx.py) and
never writes directly; at the end the applier hands the whole `Changes` to `store.apply()` once, still
inside that transaction, and the transaction commits. A call that changes nothing applies nothing, and a
store must then write nothing durable (no fsync): an empty pull or a long-poll re-check costs no commit.

Isolation the engine needs (what a store shared by several servers must honour):
- every write of one call concerns the monitor it names (and that monitor's subscriptions, leases,
  keys and log), or, for a sweep, each monitor it touches;
- a call's reads of those records and its apply must be serializable with every other call that writes
  the same monitor: a shared store takes a row lock on the monitor (`lock_monitor`, called by the engine
  before a call reads the records it will change) for the rest of the transaction; the single-writer
  stores (memory, SQLite with BEGIN IMMEDIATE) are serial already and may ignore it; a reader's call
  (a pull, an ack: it writes only its own subscription, core/tx.py) takes that lock shared and the
  subscription's own lock (`lock_subscription`), so readers of one monitor need not wait for each other;
- `apply` is all or nothing together with the commit; a commit reported is durable. A store whose commit is
  a network round trip may send the writes with it (`writes_at_commit`): a refusal of the writes (a unique
  index) is then raised by the commit, and nothing of the call is written.
Every storage failure is raised as StorageError (the engine answers 503 UNAVAILABLE, retry).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core.records import Lease, Monitor, Observation, PublishKey, Subscription


class StorageError(Exception):
    """The storage itself failed (disk full, I/O error, a database that cannot be written). Every store
    raises this, wrapping its driver's error, from any method or from the commit; the transaction is rolled
    back, and the engine answers 503 UNAVAILABLE (never 400: the request was not at fault).
    `outcome_unknown`: raised by the commit of a store over a network, whose connection was lost while it
    committed: the transaction may have been written, and the caller is told so."""

    outcome_unknown = False
    detail: str | None = (
        None  # for the operator (a log line, a CLI's error), when str() is what a client hears
    )


# ===================================================================================== log queries
# The indexed columns of the log, and the filter keys they answer (filters.prefilter builds queries).
LOG_COLUMNS = ("type", "subject", "actor", "origin", "tier", "horizon")
# The log columns every store that indexes its log keeps an index of its own on, (monitor, column, seq).
SEEK_COLUMNS = ("type", "subject", "actor")


@dataclass(frozen=True, slots=True)
class Term:
    """The column's value is one of `exact`, or starts with one of `prefixes` (a NULL column never
    matches)."""

    column: str
    exact: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()

    def holds(self, value: str | None) -> bool:
        if value is None:
            return False
        return value in self.exact or any(value.startswith(p) for p in self.prefixes)


# An alternative holds when all its terms hold; a clause holds when one of its alternatives holds (an
# empty alternative holds always: that clause lets everything through).
Alternative = tuple[Term, ...]
Clause = tuple[Alternative, ...]


@dataclass(frozen=True, slots=True)
class LogQuery:
    """What a store can test on its indexed columns for a filtered read: every clause must hold. It is a
    necessary condition of the filter; `complete` says it is also sufficient, so a store's count is the
    exact lag and rows need no further check."""

    clauses: tuple[Clause, ...] = ()
    complete: bool = True

    def holds(self, obs: Observation) -> bool:
        return all(
            any(all(t.holds(getattr(obs, t.column)) for t in alt) for alt in clause)
            for clause in self.clauses
        )

    @property
    def selects_all(self) -> bool:
        return all(any(not alt for alt in clause) for clause in self.clauses)

    @property
    def seeks_alone(self) -> bool:
        """Whether a store reads this query by seeking one index and nothing else: one term, of exact values,
        on a column every store indexes (SEEK_COLUMNS). Such a read examines only the rows it returns. Any
        other query (an unindexed column, a prefix, two terms, alternatives, two clauses) may have the store
        test rows in vain that the engine never sees, so the engine bounds its reads by seqs (SCAN_SPAN)."""
        if len(self.clauses) != 1 or len(self.clauses[0]) != 1 or len(self.clauses[0][0]) != 1:
            return False
        term = self.clauses[0][0][0]
        return term.column in SEEK_COLUMNS and not term.prefixes

    @property
    def walks(self) -> bool:
        """Whether a read of this query walks the log, testing rows the engine may never see: it is neither
        every row (selects_all) nor one index sought alone (seeks_alone). Such reads are bounded by seqs."""
        return not (self.selects_all or self.seeks_alone)


def serialized(method: Callable[..., Any]) -> Callable[..., Any]:
    """A store method run under the store's `_serial` RLock, the lock its transactions hold (memory, SQLite):
    another thread's `apply` or `close` waits for an open transaction to end instead of writing into it."""

    def run(store: Any, *args: Any, **kwargs: Any) -> Any:
        with store._serial:
            return method(store, *args, **kwargs)

    run.__doc__, run.__name__, run.__qualname__ = method.__doc__, method.__name__, method.__qualname__
    return run


def chunked_rows(
    fetch: Callable[[int, int, int], Sequence[Sequence[Any]]], start: int, to_seq: int, *, windowed: bool
) -> Iterator[Sequence[Any]]:
    """The rows of a log read, seq ascending, fetched in chunks: `fetch(start, end, limit)` returns at most
    `limit` rows with start <= seq <= end, seq first. Chunks grow 8, 16, ... 256 rows: a pull of one reads a
    few rows, a drain reads in bulk, and a reader stopping early never loads the rest; a read of at most 256
    seqs that is not windowed (a page of unfiltered rows, which are dense) is one fetch of them all. `windowed` (a filtered
    read) also bounds each chunk to a window of seqs: an index on one column serves seq order for one value,
    but for several (IN, a prefix range, OR) the database reads every match in range to sort them. The window
    doubles over stretches with few matches (a million rows that do not match take ~log2(10^6) seeks) and
    follows the density where matches come thick (twice the span the last full chunk needed)."""
    chunk, window = 8, 256
    if not windowed and 8 < to_seq - start + 1 <= 256:
        chunk = to_seq - start + 1  # a read bounded to what it wants (a page of a reader's limit): one fetch
    while start <= to_seq:
        end = min(to_seq, start + window - 1) if windowed else to_seq
        rows = fetch(start, end, chunk)
        yield from rows
        if len(rows) == chunk:
            window = max(256, 2 * (rows[-1][0] - start + 1))
            start = rows[-1][0] + 1
            chunk = min(chunk * 2, 256)
        elif not windowed:
            return
        else:
            start, window = end + 1, window * 2


# ===================================================================================== changes
@dataclass(slots=True)
class Changes:
    """Everything one engine call writes, applied by `Store.apply` in one transaction. Each record is the
    whole new version (an upsert by its key); `compactions` delete the log below a seq."""

    monitors: list[Monitor] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    subjects: list[tuple[str, str]] = field(default_factory=list)
    subscriptions: list[Subscription] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    publish_keys: list[PublishKey] = field(default_factory=list)
    compactions: list[tuple[str, int]] = field(default_factory=list)  # (monitor, delete seq < this)
    purge_keys_before: float | None = None  # forget publish keys recorded before this server time
    # What a reader's call counted without writing its monitor (core/tx.py reader mode, a shared store only):
    # (monitor, deliveries to add to counters.delivered, its newest last_pull). The store adds them to the
    # monitor's row later, so that readers of one monitor do not queue behind that row's lock.
    pulls: list[tuple[str, int, float | None]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.monitors
            or self.observations
            or self.subjects
            or self.subscriptions
            or self.leases
            or self.publish_keys
            or self.compactions
            or self.purge_keys_before is not None
            or self.pulls
        )


@dataclass(slots=True)
class StoreStats:
    """What a store counts for benchmarks and /metrics: durable commits (with writes) and read-only
    transactions (which must cost no fsync)."""

    commits: int = 0
    read_only: int = 0


class GroupConflict(BaseException):
    """A call of a shared store's group commit (PostgresStore.batch, run by doors/engines.py EngineLanes)
    asked for a lock the group does not hold: nothing of that call was sent. The group is rolled back and
    each of its calls runs again by itself. A BaseException, so that no door's `except Exception` answers it
    as the request's own failure."""


class StaleRead(GroupConflict):
    """A shared store answered a read under a lock from its memory of the row (PostgresStore: the monitor's
    row as this server last read or wrote it), and the database, checking that memory when the lock was
    taken, found the row changed by another writer: the call's transaction is aborted, nothing of it was
    written, and the engine runs the call again, this time reading the row (core/runtime.py). In a group
    commit it is the group's conflict: the group is rolled back and each call runs again by itself."""


class Store(ABC):
    stats: StoreStats
    writes_at_commit = False  # see the module's docstring

    @abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """One engine call: its reads and its one apply, committed together or not at all."""

    @abstractmethod
    def apply(self, changes: Changes) -> None:
        """Write every change of one call, inside the open transaction."""

    def lock_monitor(self, monitor_id: str, *, shared: bool = False) -> None:  # noqa: B027 - serial stores need no lock
        """Hold the monitor's lock until the transaction ends (a shared store's isolation). `shared`: a
        reader's call (core/tx.py), which writes only its own subscription (held by `lock_subscription`):
        readers share the lock among themselves and exclude every call that takes it whole."""

    def lock_subscription(self, sub_id: str) -> None:  # noqa: B027 - serial stores need no lock
        """Hold this subscription's own lock until the transaction ends (a reader's call, with its monitor's
        lock shared)."""

    def locked_subscription(
        self, key: str, *, by_token: bool = False, shared: bool = False
    ) -> Subscription | None:
        """The subscription by id (or by token hash), read under its monitor's lock (`shared`: that lock
        shared and the subscription's own lock held): found, locked, and read again, since only the record
        names its monitor. A store may do it in one statement."""
        get = self.find_subscription_by_token if by_token else self.get_subscription
        found = get(key)
        if found is None:
            return None
        if shared:
            self.lock_monitor(found.monitor, shared=True)
            self.lock_subscription(found.id)
        else:
            self.lock_monitor(found.monitor)  # a store that has no shared locks need not know the word
        return get(key)

    def close(self) -> None:  # noqa: B027 - optional hook, a memory store has nothing to release
        """Release the store's resources; the default has none."""

    # monitors
    @abstractmethod
    def get_monitor(self, monitor_id: str) -> Monitor | None: ...

    @abstractmethod
    def list_monitors(self) -> list[Monitor]:
        """Every monitor, by id."""

    def list_monitors_page(self, after: str, limit: int) -> list[Monitor]:
        """The first `limit` monitors, by id, of those whose id sorts after `after` (code point order; ""
        starts at the first): a listing a page at a time (GET /monitors). The SQL stores read only the page."""
        return [m for m in self.list_monitors() if m.id > after][:limit]

    # the log
    @abstractmethod
    def get_observation(self, monitor_id: str, seq: int) -> Observation | None: ...

    @abstractmethod
    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        """Observations with from_seq <= seq <= to_seq for which `query` holds, ascending; lazily (a
        reader that stops early never loads the rest)."""

    def read_range(self, monitor_id: str, from_seq: int, to_seq: int, *, served: bool = False) -> list[Any]:
        """Every stored row with from_seq <= seq <= to_seq, ascending, at once: a page of unfiltered rows
        (their seqs are dense, so the caller bounds it to what it wants). A store may read it in one
        statement, without a generator's step per row; by default it is `scan`'s rows. `served`: the rows
        are only served (each one's `seq`, `size` and `to_wire`), so a store that keeps each event as its
        text may give records.ServedRow instead of observations."""
        return list(self.scan(monitor_id, from_seq, to_seq))

    def count(
        self,
        monitor_id: str,
        from_seq: int,
        to_seq: int,
        query: LogQuery | None = None,
        cap: int | None = None,
    ) -> int:
        """How many of those rows there are, counting at most `cap` (then it returns `cap`). Here: by
        walking `scan`; a store that can count faster (SQL, a dense log) answers itself and falls back on
        this for the rest."""
        if cap is not None and cap <= 0:
            return 0
        n = 0
        for _ in self.scan(monitor_id, from_seq, to_seq, query):
            n += 1
            if n == cap:
                break
        return n

    # subjects a monitor has published (leases may only name these)
    @abstractmethod
    def has_subject(self, monitor_id: str, subject: str) -> bool: ...

    @abstractmethod
    def list_subjects(self, monitor_id: str) -> list[str]:
        """Every subject the monitor has published, sorted (mp migrate copies them)."""

    # subscriptions
    @abstractmethod
    def get_subscription(self, sub_id: str) -> Subscription | None: ...

    @abstractmethod
    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None: ...

    @abstractmethod
    def find_subscription_by_token(self, token_hash: str) -> Subscription | None: ...

    @abstractmethod
    def list_subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        """By id; of one monitor, or every one."""

    @abstractmethod
    def count_active_subscriptions(self, monitor_id: str) -> int:
        """How many subscriptions of this monitor are active (the 10,000 cap, docs/protocol.md section 10)."""

    def list_active_subscriptions(self) -> list[Subscription]:
        """Every active subscription, by id: what the sweep reads (each one's mute deadline). A store that can
        leave the retired ones unread (the SQL stores) should: they accumulate, and the sweep runs every
        second on a shared store's leader."""
        return [s for s in self.list_subscriptions() if s.active]

    def list_monitors_with_readers(self) -> list[Monitor]:
        """By id, the monitors that have an active subscription (with list_active_subscriptions, the sweep's
        reads); a store may leave the others unread."""
        read = {s.monitor for s in self.list_active_subscriptions()}
        return [m for m in self.list_monitors() if m.id in read]

    def backlog_summary(self, top: int) -> dict[str, Any]:
        """For /metrics: how many monitors the store holds (`monitors`) and active subscriptions (`active`), the
        rows past the committed cursors of those whose monitor exists (`total`), and the `top` largest such
        backlogs as (rows, monitor, subscription), largest first, then by monitor and id. This default
        decodes every record; the SQL stores count in the database, so a scrape's cost does not grow with the
        records churned (retired subscriptions, monitors)."""
        monitors = {m.id: m for m in self.list_monitors()}
        rows = []
        active = 0
        for sub in self.list_subscriptions():
            if not sub.active:
                continue
            active += 1
            rec = monitors.get(sub.monitor)
            if rec is not None:
                rows.append((max(0, rec.head - max(sub.cursor, 1, rec.floor) + 1), sub.monitor, sub.id))
        rows.sort(key=lambda r: (-r[0], r[1], r[2]))
        return {
            "monitors": len(monitors),
            "active": active,
            "top": rows[:top],
            "total": sum(r[0] for r in rows),
        }

    # leases
    @abstractmethod
    def get_lease(self, monitor_id: str, subject: str) -> Lease | None: ...

    @abstractmethod
    def list_leases(self, monitor_id: str | None = None) -> list[Lease]:
        """By (monitor, subject)."""

    def list_held_leases(self) -> list[Lease]:
        """Every lease with a holder, by (monitor, subject): the sweep's (each one's expiry). A store may leave
        the free ones, one per subject ever claimed, unread."""
        return [x for x in self.list_leases() if x.holder is not None]

    # publish idempotency keys (docs/protocol.md section 8)
    @abstractmethod
    def get_publish_key(self, monitor_id: str, key: str) -> PublishKey | None: ...

    @abstractmethod
    def list_publish_keys(self, monitor_id: str) -> list[PublishKey]:
        """The monitor's remembered idempotency keys, by key (mp migrate copies them)."""
