"""One engine call's unit of work. A rule reads through the Tx (which reads through to the store and then
sees its own staged writes) and stages new record versions in it; it never writes to the store. When the
rule returns, `changes()` is what the applier hands to `Store.apply` in the call's one transaction.

The Tx is the only mutable thing a rule holds: records are frozen, so "the monitor" is always
`tx.monitor(id)`, the latest version staged in this call."""

from __future__ import annotations

from collections.abc import Iterator

from monitor_protocol.core.records import Lease, Monitor, Observation, PublishKey, Subscription
from monitor_protocol.core.store_contract import Changes, LogQuery, Store

_MISSING = object()


class Tx:
    def __init__(self, store: Store, now: float) -> None:
        self.store = store
        self.now = now
        # A store that several servers write (PostgreSQL): a record is read only under its monitor's lock,
        # so what a rule reads is what the last commit on that monitor left (core/store_contract.py, isolation).
        self.shared = bool(getattr(store, "shared", False))
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
        self.store.lock_monitor(monitor_id)
        return True

    def monitor(self, monitor_id: str) -> Monitor | None:
        staged = self._monitors.get(monitor_id)
        if staged is not None:
            return staged
        self.lock(monitor_id)
        return self.store.get_monitor(monitor_id)

    def monitors(self) -> list[Monitor]:
        found = {m.id: m for m in self.store.list_monitors()}
        found.update(self._monitors)
        return [found[k] for k in sorted(found)]

    def put_monitor(self, monitor: Monitor) -> Monitor:
        self._monitors[monitor.id] = monitor
        return monitor

    # ----------------------------------------------------------------------------- the log
    def append(self, obs: Observation) -> None:
        self._appended.setdefault(obs.monitor, []).append(obs)
        self.appended[obs.monitor] = obs.seq

    def add_subject(self, monitor_id: str, subject: str) -> None:
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
        self._compactions[monitor_id] = max(below, self._compactions.get(monitor_id, 0))

    # ----------------------------------------------------------------------------- subscriptions
    def subscription(self, sub_id: str) -> Subscription | None:
        staged = self._subs.get(sub_id)
        if staged is not None:
            return staged
        found = self.store.get_subscription(sub_id)
        if found is not None and self.shared and self.lock(found.monitor):
            found = self.store.get_subscription(sub_id)  # again, now under its monitor's lock
        return found

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
        found = self.store.find_subscription_by_token(token_hash)
        if found is not None and lock and self.shared and self.lock(found.monitor):
            found = self.store.find_subscription_by_token(token_hash)  # again, under the lock
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

    def count_active_subscriptions(self, monitor_id: str) -> int:
        if not any(s.monitor == monitor_id for s in self._subs.values()):
            return self.store.count_active_subscriptions(monitor_id)
        return sum(1 for s in self.subscriptions(monitor_id) if s.active)

    def put_subscription(self, sub: Subscription) -> Subscription:
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
        self._keys[(rec.monitor, rec.key)] = rec

    def purge_publish_keys(self, before: float) -> None:
        self._purge_before = before

    # ----------------------------------------------------------------------------- the applier's input
    def changes(self) -> Changes:
        appended = self._appended
        return Changes(
            monitors=list(self._monitors.values()) if self._monitors else [],
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
        )
