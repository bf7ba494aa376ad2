"""One engine call's unit of work. A rule reads through the Tx (which reads through to the store and then
sees its own staged writes) and stages new record versions in it; it never writes to the store. When the
rule returns, `changes()` is what the applier hands to `Store.apply` in the call's one transaction.

The Tx is the only mutable thing a rule holds: records are frozen, so "the monitor" is always
`tx.monitor(id)`, the latest version staged in this call.

Reader mode (`Tx(store, now, reader=True)`, on a store several servers share): the call promises to write
nothing but the subscriptions it reads by id or token (a pull, an ack). It takes its monitor's lock shared and
each such subscription's own lock, so readers of one monitor do not wait for each other. What a pull counts on
its monitor (`counters.delivered`, `last_pull`, once the monitor has a stored `last_pull`) goes to
`Changes.pulls` instead of a write of the monitor's row. Staging anything else raises ExclusiveNeeded before
anything is written: the engine runs the call again with the monitor's lock whole (core/runtime.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from monitor_protocol.core.records import Lease, Monitor, Observation, PublishKey, Subscription, evolve
from monitor_protocol.core.store_contract import Changes, LogQuery, Store

_MISSING = object()


class ExclusiveNeeded(Exception):
    """A reader-mode call staged a write only a call holding its monitor's lock whole may make: nothing was
    written, and the call is to be run again in the ordinary mode."""


class Tx:
    def __init__(self, store: Store, now: float, *, reader: bool = False) -> None:
        self.store = store
        self.now = now
        # A store that several servers write (PostgreSQL): a record is read only under its monitor's lock,
        # so what a rule reads is what the last commit on that monitor left (core/store_contract.py, isolation).
        self.shared = bool(getattr(store, "shared", False))
        self.reader = reader and self.shared
        self._stored_monitors: dict[str, Monitor | None] = {}  # reader mode: as read, before this call
        self._counted: set[str] = set()  # reader mode: monitors whose only change is what pulls count
        self._own_subs: set[str] = set()  # reader mode: the subscriptions whose own lock this call holds
        self._monitors: dict[str, Monitor] = {}
        self._subs: dict[str, Subscription] = {}
        self._leases: dict[tuple[str, str], Lease] = {}
        self._keys: dict[tuple[str, str], PublishKey] = {}
        self._appended: dict[str, list[Observation]] = {}
        self._subjects: dict[tuple[str, str], None] = {}
        self._compactions: dict[str, int] = {}
        self._purge_before: float | None = None
        self._locked: set[str] = set()
        # what this call appended, per monitor: the new head (listeners hear it after the commit)
        self.appended: dict[str, int] = {}
        # pulls whose sign of life is remembered by the engine instead of written (the lazy mute clock)
        self.life: dict[str, float] = {}
        self.monitor_pulls: dict[str, float] = {}

    # ----------------------------------------------------------------------------- monitors
    def lock(self, monitor_id: str) -> bool:
        """Hold the monitor's lock for the rest of the call; True when this call had not held it yet."""
        if monitor_id in self._locked:
            return False
        self._locked.add(monitor_id)
        if self.reader:
            self.store.lock_monitor(monitor_id, shared=True)
        else:
            self.store.lock_monitor(monitor_id)
        return True

    def _exclusive(self, what: str) -> None:
        if self.reader:
            raise ExclusiveNeeded(what)

    def monitor(self, monitor_id: str) -> Monitor | None:
        staged = self._monitors.get(monitor_id)
        if staged is not None:
            return staged
        self.lock(monitor_id)
        found = self.store.get_monitor(monitor_id)
        if self.reader:
            self._stored_monitors.setdefault(monitor_id, found)
        return found

    def monitors(self) -> list[Monitor]:
        found = {m.id: m for m in self.store.list_monitors()}
        found.update(self._monitors)
        return [found[k] for k in sorted(found)]

    def monitors_page(self, after: str, limit: int) -> tuple[list[Monitor], bool]:
        """The first `limit` monitors, by id, of those with an id past `after` (this call's changes too), and
        whether more follow (one more is read to know)."""
        found = {m.id: m for m in self.store.list_monitors_page(after, limit + 1)}
        found.update((k, m) for k, m in self._monitors.items() if k > after)
        ids = sorted(found)
        return [found[k] for k in ids[:limit]], len(ids) > limit

    def put_monitor(self, monitor: Monitor) -> Monitor:
        if self.reader:
            stored = self._stored_monitors.get(monitor.id)
            if stored is None or stored.last_pull is None or not _only_counted(stored, monitor):
                raise ExclusiveNeeded(f"a write of monitor {monitor.id}")
            self._counted.add(monitor.id)
        self._monitors[monitor.id] = monitor
        return monitor

    # ----------------------------------------------------------------------------- the log
    def append(self, obs: Observation) -> None:
        self._exclusive("an append")
        self._appended.setdefault(obs.monitor, []).append(obs)
        self.appended[obs.monitor] = obs.seq

    def add_subject(self, monitor_id: str, subject: str) -> None:
        self._exclusive("a subject")
        self._subjects[(monitor_id, subject)] = None

    def has_subject(self, monitor_id: str, subject: str) -> bool:
        return (monitor_id, subject) in self._subjects or self.store.has_subject(monitor_id, subject)

    def observation(self, monitor_id: str, seq: int) -> Observation | None:
        for obs in self._appended.get(monitor_id, ()):
            if obs.seq == seq:
                return obs
        return self.store.get_observation(monitor_id, seq)

    def scan(
        self, monitor_id: str, from_seq: int, to_seq: int, query: LogQuery | None = None
    ) -> Iterator[Observation]:
        """The stored rows, then those this call appended (always above the stored head)."""
        staged = self._appended.get(monitor_id, ())
        stored_to = min(to_seq, staged[0].seq - 1) if staged else to_seq
        if from_seq <= stored_to:
            yield from self.store.scan(monitor_id, from_seq, stored_to, query)
        for obs in staged:
            if from_seq <= obs.seq <= to_seq and (query is None or query.holds(obs)):
                yield obs

    def read_range(self, monitor_id: str, from_seq: int, to_seq: int, *, served: bool = False) -> list[Any]:
        """`scan` of every row in the range, unfiltered, as a list (Store.read_range, then staged rows).
        `served`: as Store.read_range's (the staged rows are observations either way)."""
        staged = self._appended.get(monitor_id, ())
        stored_to = min(to_seq, staged[0].seq - 1) if staged else to_seq
        rows: list[Any] = []
        if from_seq <= stored_to:
            rows = self.store.read_range(monitor_id, from_seq, stored_to, served=served)
        rows.extend(obs for obs in staged if from_seq <= obs.seq <= to_seq)
        return rows

    def count(
        self,
        monitor_id: str,
        from_seq: int,
        to_seq: int,
        query: LogQuery | None = None,
        cap: int | None = None,
    ) -> int:
        staged = self._appended.get(monitor_id, ())
        stored_to = min(to_seq, staged[0].seq - 1) if staged else to_seq
        n = self.store.count(monitor_id, from_seq, stored_to, query, cap) if from_seq <= stored_to else 0
        n += sum(1 for o in staged if from_seq <= o.seq <= to_seq and (query is None or query.holds(o)))
        return n if cap is None else min(n, cap)

    def compact(self, monitor_id: str, below: int) -> None:
        self._exclusive("a compaction")
        self._compactions[monitor_id] = max(below, self._compactions.get(monitor_id, 0))

    # ----------------------------------------------------------------------------- subscriptions
    def subscription(self, sub_id: str) -> Subscription | None:
        staged = self._subs.get(sub_id)
        if staged is not None:
            return staged
        if not self.shared:
            return self.store.get_subscription(sub_id)
        return self._locked_subscription(sub_id, by_token=False)

    def _locked_subscription(self, key: str, *, by_token: bool) -> Subscription | None:
        """A subscription read under its monitor's lock (and, in reader mode, its own lock): found, locked,
        and read again. The call's first lock in one store call (one statement on PostgreSQL)."""
        if not self._locked:
            found = self.store.locked_subscription(key, by_token=by_token, shared=self.reader)
            if found is not None:
                self._locked.add(found.monitor)
                if self.reader:
                    self._own_subs.add(found.id)
            return found
        get = self.store.find_subscription_by_token if by_token else self.store.get_subscription
        found = get(key)
        if found is None:
            return None
        again = self.lock(found.monitor)
        if self.reader and found.id not in self._own_subs:
            self.store.lock_subscription(found.id)
            self._own_subs.add(found.id)
            again = True
        return get(key) if again else found  # again, now under the lock(s)

    def find_subscription(self, monitor_id: str, subscriber: str) -> Subscription | None:
        for sub in self._subs.values():
            if sub.monitor == monitor_id and sub.subscriber == subscriber:
                return sub
        if self.shared:
            self.lock(monitor_id)
        found = self.store.find_subscription(monitor_id, subscriber)
        return self._subs.get(found.id, found) if found is not None else None

    def subscription_by_token(self, token_hash: str, *, lock: bool = True) -> Subscription | None:
        """`lock=False`: a read to decide who may see something already locked, never to write."""
        for sub in self._subs.values():
            if sub.token_hash == token_hash:
                return sub
        if lock and self.shared:
            found = self._locked_subscription(token_hash, by_token=True)
        else:
            found = self.store.find_subscription_by_token(token_hash)
        if found is None:
            return None
        staged = self._subs.get(found.id)
        if staged is not None and staged.token_hash != token_hash:
            return None  # this call renewed that token away
        return found

    def subscriptions(self, monitor_id: str | None = None) -> list[Subscription]:
        found = {s.id: s for s in self.store.list_subscriptions(monitor_id)}
        for sub in self._subs.values():
            if monitor_id is None or sub.monitor == monitor_id:
                found[sub.id] = sub
        return [found[k] for k in sorted(found)]

    def active_subscriptions(self) -> list[Subscription]:
        """Every active subscription, by id, as this call sees them (the store's, with what the call wrote):
        the retired, which accumulate, are not read."""
        subs = {s.id: s for s in self.store.list_active_subscriptions()}
        for sub in self._subs.values():
            if sub.active:
                subs[sub.id] = sub
            else:
                subs.pop(sub.id, None)
        return [subs[k] for k in sorted(subs)]

    def sweep_reads(self) -> tuple[list[Lease], dict[str, Monitor], list[Subscription]]:
        """What the sweep reads: the held leases, the active subscriptions and the monitors they belong to."""
        leases = {(x.monitor, x.subject): x for x in self.store.list_held_leases()}
        for key, lease in self._leases.items():
            if lease.holder is not None:
                leases[key] = lease
            else:
                leases.pop(key, None)
        monitors = {m.id: m for m in self.store.list_monitors_with_readers()}
        monitors.update(self._monitors)
        return [leases[k] for k in sorted(leases)], monitors, self.active_subscriptions()

    def count_active_subscriptions(self, monitor_id: str) -> int:
        if not any(s.monitor == monitor_id for s in self._subs.values()):
            return self.store.count_active_subscriptions(monitor_id)
        return sum(1 for s in self.subscriptions(monitor_id) if s.active)

    def put_subscription(self, sub: Subscription) -> Subscription:
        if self.reader and sub.id not in self._own_subs:
            raise ExclusiveNeeded(f"a write of subscription {sub.id}")
        self._subs[sub.id] = sub
        return sub

    # ----------------------------------------------------------------------------- leases
    def lease(self, monitor_id: str, subject: str) -> Lease | None:
        staged = self._leases.get((monitor_id, subject))
        if staged is not None:
            return staged
        if self.shared:
            self.lock(monitor_id)
        return self.store.get_lease(monitor_id, subject)

    def leases(self, monitor_id: str | None = None) -> list[Lease]:
        found = {(x.monitor, x.subject): x for x in self.store.list_leases(monitor_id)}
        for key, lease in self._leases.items():
            if monitor_id is None or key[0] == monitor_id:
                found[key] = lease
        return [found[k] for k in sorted(found)]

    def put_lease(self, lease: Lease) -> Lease:
        self._exclusive("a lease")
        self._leases[(lease.monitor, lease.subject)] = lease
        return lease

    # ----------------------------------------------------------------------------- publish keys
    def publish_key(self, monitor_id: str, key: str) -> PublishKey | None:
        staged = self._keys.get((monitor_id, key))
        if staged is not None:
            return staged
        if self.shared:
            self.lock(monitor_id)
        return self.store.get_publish_key(monitor_id, key)

    def put_publish_key(self, rec: PublishKey) -> None:
        self._exclusive("a publish key")
        self._keys[(rec.monitor, rec.key)] = rec

    def purge_publish_keys(self, before: float) -> None:
        self._exclusive("a purge")
        self._purge_before = before

    # ----------------------------------------------------------------------------- the applier's input
    def changes(self) -> Changes:
        appended = self._appended
        monitors = list(self._monitors.values()) if self._monitors else []
        pulls: list[tuple[str, int, float | None]] = []
        if self._counted:
            monitors = [m for m in monitors if m.id not in self._counted]
            for monitor_id in self._counted:
                stored, now = self._stored_monitors[monitor_id], self._monitors[monitor_id]
                assert stored is not None
                pulls.append((monitor_id, now.counters.delivered - stored.counters.delivered, now.last_pull))
        return Changes(
            monitors=monitors,
            observations=(
                (
                    next(iter(appended.values()))
                    if len(appended) == 1
                    else [o for obs in appended.values() for o in obs]
                )
                if appended
                else []
            ),
            subjects=list(self._subjects) if self._subjects else [],
            subscriptions=list(self._subs.values()) if self._subs else [],
            leases=list(self._leases.values()) if self._leases else [],
            publish_keys=list(self._keys.values()) if self._keys else [],
            compactions=list(self._compactions.items()) if self._compactions else [],
            purge_keys_before=self._purge_before,
            pulls=pulls,
        )


def _only_counted(stored: Monitor, now: Monitor) -> bool:
    """Whether `now` differs from `stored` only in what a pull counts (delivered, last_pull)."""
    same = evolve(
        now, counters=evolve(now.counters, delivered=stored.counters.delivered), last_pull=stored.last_pull
    )
    return same == stored
