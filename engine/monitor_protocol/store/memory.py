"""The memory store: dicts of frozen records, with an undo journal (rollback) and a change journal (for the
browser's IndexedDB door, which persists `drain_changes()` after each call and restores with `load()`).

Records are immutable and the engine never mutates the JSON values inside them, so a read returns the
stored record itself: no copies. `apply` checks a whole `Changes` before it touches anything (as SQLite's
constraints would refuse it), so it is all or nothing without a rollback of its own; the undo journal is
for a transaction that fails after its apply.

The change journal's rows are `(table, key, row or None for deleted)`, keyed as the previous version keyed
them (so a browser's stored records are overwritten in place, and boot.js `readLog` still finds the log):
monitors by id, observations by `<monitor>/<seq, 20 digits>` with the event as the row, subjects and
leases by JSON `[monitor, subject]`, subscriptions by id, publish keys (table "idempotency") by JSON
`[monitor, key]`."""

from __future__ import annotations

import heapq
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from monitor_protocol.core.records import Lease, Monitor, Observation, PublishKey, Subscription
from monitor_protocol.core.store_contract import Changes, LogQuery, Store, StoreStats, serialized

TABLES = ("monitors", "observations", "subjects", "subscriptions", "leases", "idempotency")

Change = tuple[str, str, Any]
Record = Monitor | Observation | Subscription | Lease | PublishKey
# A change journal entry: the record written (turned into its row only when drained), None for a deletion,
# or a subject's row itself.
Entry = tuple[str, str, Record | dict[str, str] | None]


def pair_key(a: str, b: str) -> str:
    return json.dumps([a, b])


def observation_key(monitor: str, seq: int) -> str:
    return f"{monitor}/{seq:020d}"


_FROM_ROW: dict[str, Any] = {
    "monitors": Monitor.from_row,
    "subscriptions": Subscription.from_row,
    "leases": Lease.from_row,
    "idempotency": PublishKey.from_row,
}


class _Log:
    """One monitor's observations by seq, with the lowest and highest seq held (rows are appended above
    the head and compacted from below, so the span is dense and a count without a query is arithmetic)."""

    __slots__ = ("rows", "lo", "hi")

    def __init__(self) -> None:
        self.rows: dict[int, Observation] = {}
        self.lo = 0
        self.hi = -1

    def add(self, obs: Observation) -> None:
        if not self.rows:
            self.lo = self.hi = obs.seq
        else:
            self.lo, self.hi = min(self.lo, obs.seq), max(self.hi, obs.seq)
        self.rows[obs.seq] = obs

    def remove(self, seq: int) -> None:
        del self.rows[seq]
        if not self.rows:
            self.lo, self.hi = 0, -1
            return
        # Step to the next row held: one step in a dense log, so compaction stays linear.
        while self.lo not in self.rows:
            self.lo += 1
        while self.hi not in self.rows:
            self.hi -= 1

    def span(self, from_seq: int, to_seq: int) -> range:
        return range(max(from_seq, self.lo), min(to_seq, self.hi) + 1)

    def dense(self) -> bool:
        return len(self.rows) == self.hi - self.lo + 1


class MemoryStore(Store):
    def __init__(self) -> None:
        self.stats = StoreStats()
        self._monitors: dict[str, Monitor] = {}
        self._logs: dict[str, _Log] = {}
        self._subjects: set[tuple[str, str]] = set()
        self._subs: dict[str, Subscription] = {}
        self._subs_by_name: dict[tuple[str, str], str] = {}
        self._subs_by_token: dict[str, str] = {}
        self._subs_by_monitor: dict[str, set[str]] = {}
        self._active_by_monitor: dict[str, set[str]] = {}
        self._leases: dict[tuple[str, str], Lease] = {}
        self._keys: dict[tuple[str, str], PublishKey] = {}
        self._in_tx = False
        self._serial = threading.RLock()
        self._undo: list[tuple[str, Any, Any]] = []
        self._pending: list[Entry] = []
        self._changes: list[Entry] = []

    # ============================================================================== transactions
    @contextmanager
    def transaction(self) -> Iterator[None]:
        # One at a time whichever thread calls: `_in_tx` alone would let another thread's call join this one.
        with self._serial:
            if self._in_tx:  # nested: the outer transaction owns commit and rollback
                yield
                return
            self._in_tx = True
            self._undo, self._pending = [], []
            try:
                yield
            except BaseException:
                for kind, key, before in reversed(self._undo):
                    self._restore(kind, key, before)
                self._end()
                raise
            if self._undo:
                self.stats.commits += 1
                self._changes.extend(self._pending)
            else:
                self.stats.read_only += 1
            self._end()

    def _end(self) -> None:
        self._in_tx = False
        self._undo, self._pending = [], []

    @serialized
    def apply(self, changes: Changes) -> None:
        if not self._in_tx:  # outside a call: a transaction of its own
            with self.transaction():
                self.apply(changes)
            return
        if changes.empty():
            return
        self._check(changes)
        self._write(changes)

    # ============================================================================== apply: check, then write
    def _check(self, changes: Changes) -> None:
        """Refuse what SQLite's constraints would refuse, before anything is written."""
        fresh: set[tuple[str, int]] = set()
        for obs in changes.observations:
            log = self._logs.get(obs.monitor)
            key = (obs.monitor, obs.seq)
            if key in fresh or (log is not None and obs.seq in log.rows):
                raise ValueError(f"seq {obs.seq} already exists in {obs.monitor}")
            fresh.add(key)
        # The unique (monitor, subscriber) rule, statement by statement as SQLite checks it: a name may pass
        # to another subscription once its holder has moved away earlier in the same Changes. `taken` and
        # `named` overlay the indexes with what this Changes has done so far (None: a name left free).
        taken: dict[tuple[str, str], str | None] = {}
        named: dict[str, tuple[str, str]] = {}
        for sub in changes.subscriptions:
            name = (sub.monitor, sub.subscriber)
            owner = taken[name] if name in taken else self._subs_by_name.get(name)
            if owner is not None and owner != sub.id:
                raise ValueError(
                    f"subscriber {sub.subscriber!r} of monitor {sub.monitor!r} already belongs to "
                    f"subscription {owner}, not {sub.id}"
                )
            old = named.get(sub.id)
            if old is None and sub.id in self._subs:
                old = (self._subs[sub.id].monitor, self._subs[sub.id].subscriber)
            if old is not None and old != name:
                taken[old] = None
            taken[name], named[sub.id] = sub.id, name

    def _write(self, changes: Changes) -> None:
        for mon in changes.monitors:
            self._remember("monitor", mon.id, self._monitors.get(mon.id), ("monitors", mon.id, mon))
            self._monitors[mon.id] = mon
        for obs in changes.observations:
            key = (obs.monitor, obs.seq)
            self._remember("obs", key, None, ("observations", observation_key(*key), obs))
            self._logs.setdefault(obs.monitor, _Log()).add(obs)
        for monitor, subject in changes.subjects:
            self._add_subject(monitor, subject)
        for sub in changes.subscriptions:
            self._put_subscription(sub)
        for lease in changes.leases:
            key = (lease.monitor, lease.subject)
            self._remember("lease", key, self._leases.get(key), ("leases", pair_key(*key), lease))
            self._leases[key] = lease
        for rec in changes.publish_keys:
            key = (rec.monitor, rec.key)
            self._remember("key", key, self._keys.get(key), ("idempotency", pair_key(*key), rec))
            self._keys[key] = rec
        for monitor, below in changes.compactions:
            self._compact(monitor, below)
        if changes.purge_keys_before is not None:
            self._purge_keys(changes.purge_keys_before)

    def _remember(self, kind: str, key: Any, before: Any, change: Entry) -> None:
        self._undo.append((kind, key, before))
        self._pending.append(change)

    def _add_subject(self, monitor: str, subject: str) -> None:
        key = (monitor, subject)
        if key not in self._subjects:
            self._remember("subject", key, None, ("subjects", pair_key(*key), {"monitor": monitor}))
            self._subjects.add(key)

    def _put_subscription(self, sub: Subscription) -> None:
        before = self._subs.get(sub.id)
        self._remember("sub", sub.id, before, ("subscriptions", sub.id, sub))
        if before is not None:
            self._unindex_sub(before)
        self._subs[sub.id] = sub
        self._index_sub(sub)

    def _compact(self, monitor: str, below: int) -> None:
        log = self._logs.get(monitor)
        if log is None:
            return
        for seq in log.span(log.lo, below - 1):
            obs = log.rows.get(seq)
            if obs is not None:
                self._remember(
                    "obs", (monitor, seq), obs, ("observations", observation_key(monitor, seq), None)
                )
                log.remove(seq)

    def _purge_keys(self, before: float) -> None:
        for key in [k for k, rec in self._keys.items() if rec.at < before]:
            self._remember("key", key, self._keys[key], ("idempotency", pair_key(*key), None))
            del self._keys[key]

    def _restore(self, kind: str, key: Any, before: Any) -> None:
        if kind == "monitor":
            _put_or_pop(self._monitors, key, before)
        elif kind == "obs":
            log = self._logs.setdefault(key[0], _Log())
            if before is None:
                log.remove(key[1])
            else:
                log.add(before)
        elif kind == "subject":
            self._subjects.discard(key)
        elif kind == "sub":
            current = self._subs.pop(key, None)
            if current is not None:
                self._unindex_sub(current)
            if before is not None:
                self._subs[key] = before
                self._index_sub(before)
        elif kind == "lease":
            _put_or_pop(self._leases, key, before)
        elif kind == "key":
            _put_or_pop(self._keys, key, before)

    # ============================================================================== browser persistence
    def drain_changes(self) -> list[Change]:
        """Records written since the last drain as (table, key, row or None for deleted), in order."""
        out, self._changes = self._changes, []
        return [(table, key, _row(rec)) for table, key, rec in out]

    def load(self, records: list[Change]) -> None:
        """Restore rows read back from a persistent medium (drain_changes' rows)."""
        for table, key, row in records:
            if row is not None:
                self._load_one(table, key, row)
        self._changes = []

    def _load_one(self, table: str, key: str, row: Any) -> None:
        if table == "observations":
            monitor, _, seq = key.rpartition("/")
            self._logs.setdefault(monitor, _Log()).add(Observation.of(monitor, int(seq), row))
        elif table == "subjects":
            monitor, subject = json.loads(key)
            self._subjects.add((monitor, subject))
        elif table in _FROM_ROW:
            rec = _FROM_ROW[table](row)
            if isinstance(rec, Monitor):
                self._monitors[rec.id] = rec
            elif isinstance(rec, Subscription):
                self._subs[rec.id] = rec
                self._index_sub(rec)
            elif isinstance(rec, Lease):
                self._leases[(rec.monitor, rec.subject)] = rec
            else:
                self._keys[(rec.monitor, rec.key)] = rec

    # ============================================================================== monitors
    def get_monitor(self, monitor_id: str) -> Monitor | None:
        return self._monitors.get(monitor_id)

    def list_monitors(self) -> list[Monitor]:
        return [m for _, m in sorted(self._monitors.items())]

    def list_monitors_page(self, after: str, limit: int) -> list[Monitor]:
        ids = heapq.nsmallest(limit, (k for k in self._monitors if k > after))
        return [self._monitors[k] for k in ids]

    def list_monitors_with_readers(self) -> list[Monitor]:
        return [self._monitors[m] for m in sorted(self._active_by_monitor) if m in self._monitors]

    # ============================================================================== the log
    def get_observation(self, monitor_id: str, seq: int) -> Observation | None:
        log = self._logs.get(monitor_id)
        return log.rows.get(seq) if log is not None else None

    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        log = self._logs.get(monitor_id)
        if log is None:
            return
        test = None if query is None or query.selects_all else query.holds
        for seq in log.span(from_seq, to_seq):
            obs = log.rows.get(seq)
            if obs is not None and (test is None or test(obs)):
                yield obs

    def count(
        self,
        monitor_id: str,
        from_seq: int,
        to_seq: int,
        query: LogQuery | None = None,
        cap: int | None = None,
    ) -> int:
        log = self._logs.get(monitor_id)
        if log is None or (cap is not None and cap <= 0):
            return 0
        if (query is None or query.selects_all) and log.dense():
            n = len(log.span(from_seq, to_seq))
            return n if cap is None else min(n, cap)
        return super().count(monitor_id, from_seq, to_seq, query, cap)

    # ============================================================================== subjects
    def has_subject(self, monitor_id: str, subject: str) -> bool:
        return (monitor_id, subject) in self._subjects

    def list_subjects(self, monitor_id: str) -> list[str]:
        return sorted(s for m, s in self._subjects if m == monitor_id)

    # ============================================================================== subscriptions
    def _index_sub(self, sub: Subscription) -> None:
        self._subs_by_name[(sub.monitor, sub.subscriber)] = sub.id
        self._subs_by_token[sub.token_hash] = sub.id
        self._subs_by_monitor.setdefault(sub.monitor, set()).add(sub.id)
        if sub.active:
            self._active_by_monitor.setdefault(sub.monitor, set()).add(sub.id)

    def _unindex_sub(self, sub: Subscription) -> None:
        # Only what still points at this subscription: another one may have taken a name it left.
        if self._subs_by_name.get((sub.monitor, sub.subscriber)) == sub.id:
            del self._subs_by_name[(sub.monitor, sub.subscriber)]
        if self._subs_by_token.get(sub.token_hash) == sub.id:
            del self._subs_by_token[sub.token_hash]
        _discard(self._subs_by_monitor, sub.monitor, sub.id)
        _discard(self._active_by_monitor, sub.monitor, sub.id)

    def get_subscription(self, sub_id: str) -> Subscription | None:
        return self._subs.get(sub_id)

    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None:
        sub_id = self._subs_by_name.get((monitor_id, subscriber))
        return self._subs.get(sub_id) if sub_id else None

    def find_subscription_by_token(self, token_hash: str) -> Subscription | None:
        sub_id = self._subs_by_token.get(token_hash)
        return self._subs.get(sub_id) if sub_id else None

    def list_subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        if monitor_id is None:
            return [s for _, s in sorted(self._subs.items())]
        return [self._subs[sid] for sid in sorted(self._subs_by_monitor.get(monitor_id, ()))]

    def list_active_subscriptions(self) -> list[Subscription]:
        return [
            self._subs[sid] for sid in sorted(sid for ids in self._active_by_monitor.values() for sid in ids)
        ]

    def count_active_subscriptions(self, monitor_id: str) -> int:
        return len(self._active_by_monitor.get(monitor_id, ()))

    # ============================================================================== leases
    def get_lease(self, monitor_id: str, subject: str) -> Lease | None:
        return self._leases.get((monitor_id, subject))

    def list_leases(self, monitor_id: str | None = None) -> list[Lease]:
        return [x for key, x in sorted(self._leases.items()) if monitor_id is None or key[0] == monitor_id]

    def list_held_leases(self) -> list[Lease]:
        return [x for _key, x in sorted(self._leases.items()) if x.holder is not None]

    # ============================================================================== publish keys
    def get_publish_key(self, monitor_id: str, key: str) -> PublishKey | None:
        return self._keys.get((monitor_id, key))

    def list_publish_keys(self, monitor_id: str) -> list[PublishKey]:
        return [k for (m, _key), k in sorted(self._keys.items()) if m == monitor_id]


def _row(rec: Record | dict[str, str] | None) -> Any:
    """A journal entry's persisted row: to_row(), or the event itself for an observation."""
    if rec is None or isinstance(rec, dict):
        return rec
    if isinstance(rec, Observation):
        return rec.event
    return rec.to_row()


def _put_or_pop(table: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def _discard(index: dict[str, set[str]], monitor: str, sub_id: str) -> None:
    ids = index.get(monitor)
    if ids is not None:
        ids.discard(sub_id)
        if not ids:
            del index[monitor]
