"""Upkeep and admin: the mute sweep (P6) and lease expiry on a deadline, compaction, snapshot, the log."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import filters, timefmt
from monitor_protocol.core.lifecycles import LeaseState
from monitor_protocol.core.records import Lease, Monitor, Subscription, evolve
from monitor_protocol.core.rules import state
from monitor_protocol.core.rules.ledger import free_lease, retire_subscription, with_lag
from monitor_protocol.core.rules.lookups import monitor_of
from monitor_protocol.core.runtime import ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import as_int
from monitor_protocol.core.vocab import DEFAULT_LIMIT, IDEMPOTENCY_WINDOW_SECONDS, MAX_LIMIT

IDEMPOTENCY_PURGE_SECONDS = 60.0


def sweep(core: ServiceCore, tx: Tx, moment: float) -> int:
    """Retire mute subscriptions and expire leases whose time has passed; return how many changed."""
    changed = 0
    nearest: float | None = None
    # The listed versions decide what is not due: a renewal only moves an expiry later, and a sign of life a
    # mute deadline, so on a shared store (listed without a lock, perhaps stale) only what looks due is
    # locked and read again, and decided on what is committed. A sweep with nothing due locks nothing and
    # writes nothing; what it locks, it locks in monitor order (no deadlock with another multi-monitor call).
    # Only held leases, active readers and their monitors are read: free leases and retired readers accumulate.
    held, monitors, active = tx.sweep_reads()
    leases_due = []
    for listed in held:
        if listed.expires < moment:
            leases_due.append(listed)
        else:
            nearest = listed.expires if nearest is None else min(nearest, listed.expires)
    subs_due = []
    for listed in active:
        if listed.monitor not in monitors:
            continue
        deadline = _mute_deadline(core, monitors[listed.monitor], listed)
        if moment > deadline:
            subs_due.append(listed)
        else:
            nearest = deadline if nearest is None else min(nearest, deadline)
    for monitor_id in sorted({x.monitor for x in leases_due} | {x.monitor for x in subs_due}):
        tx.lock(monitor_id)
    # Leases first: a lease whose time ran out is an expiry (an attempt) even when its holder is also
    # retired for silence in this sweep.
    for listed in leases_due:
        lease = tx.lease(listed.monitor, listed.subject)
        if lease is None or lease.holder is None:
            continue
        if lease.expires < moment:
            free_lease(core, tx, lease, "expired", "system:sweep")
            changed += 1
        else:
            nearest = lease.expires if nearest is None else min(nearest, lease.expires)
    for listed in subs_due:
        rec = monitor_of(tx, listed.monitor)
        stored = tx.subscription(listed.id)  # as committed (or as this sweep just changed it)
        if stored is None or not stored.active:
            continue
        deadline = _mute_deadline(core, rec, stored)
        if moment > deadline:
            retire_subscription(core, tx, core.alive(stored), "system:sweep", "mute")
            changed += 1
        else:
            nearest = deadline if nearest is None else min(nearest, deadline)
    core.sweep_done(nearest)
    if moment - core.last_idempotency_purge >= IDEMPOTENCY_PURGE_SECONDS:
        core.last_idempotency_purge = moment
        tx.purge_publish_keys(moment - IDEMPOTENCY_WINDOW_SECONDS)
    return changed


def _mute_deadline(core: ServiceCore, rec: Monitor, stored: Subscription) -> float:
    """When a subscription that stays silent is retired (P6): its latest sign of life this engine knows,
    plus its mute window, plus what a shared store allows for (runtime.mute_grace)."""
    sub = core.alive(stored)
    return sub.mute_since + core.mute_seconds(rec, sub) + core.mute_grace(rec, stored)


def compact(core: ServiceCore, tx: Tx, monitor_id: str | None, upto_seq: Any) -> dict[str, Any]:
    upto = as_int(upto_seq, "upto_seq", minimum=1, text=False)
    # Each monitor through monitor_of, which locks it first: a shared store's listed version may be stale.
    ids = [monitor_id] if monitor_id is not None else [m.id for m in tx.monitors()]
    recs = [monitor_of(tx, mid) for mid in ids]
    out = []
    for rec in recs:
        new_floor = min(upto, rec.head) + 1
        removed = 0
        if new_floor > rec.floor:
            removed = tx.count(rec.id, rec.floor, new_floor - 1)
            tx.compact(rec.id, new_floor)
            rec = tx.put_monitor(evolve(rec, floor=new_floor))
        out.append({"monitor": rec.id, "retention_floor": rec.floor, "removed": removed})
    return {"ok": True, "compacted": out}


def read_log(
    core: ServiceCore, tx: Tx, monitor_id: str, from_seq: Any = 1, limit: Any = None
) -> dict[str, Any]:
    """The operator's view of a monitor's log (admin door): no subscription, no cursor, no commit."""
    rec = monitor_of(tx, monitor_id)
    start = as_int(from_seq, "from", minimum=0)
    lim = DEFAULT_LIMIT if limit is None else as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
    rows = []
    for obs in tx.scan(rec.id, max(start, rec.floor, 1), rec.head):
        rows.append(obs)
        if len(rows) >= lim:
            break
    return {
        "monitor": rec.id,
        "head": rec.head,
        "retention_floor": rec.floor,
        "next": rows[-1].seq + 1 if rows else rec.head + 1,
        "observations": [o.to_wire() for o in rows],
    }


def _monitor_snapshot(core: ServiceCore, tx: Tx, rec: Monitor) -> dict[str, Any]:
    subs = [core.alive(s) for s in tx.subscriptions(rec.id)]
    active = sum(1 for s in subs if s.active)
    return {
        "monitor": rec.to_wire(),
        "state": state.compute(
            rec, tx.now, active, core.last_pull_of(rec), sources_here=getattr(core, "sources_here", False)
        ),
        "subscriptions": [with_lag(tx, rec, s) for s in subs],
        "leases": [x.to_wire() for x in tx.leases(rec.id)],
    }


def snapshot(core: ServiceCore, tx: Tx) -> dict[str, Any]:
    return {
        "taken_at": timefmt.iso(tx.now),
        "monitors": [_monitor_snapshot(core, tx, rec) for rec in tx.monitors()],
    }


# ===================================================================================== the overview
# At most this many delivered-but-unacknowledged seqs are listed per subscription (the newest ones).
OVERVIEW_UNACKED_MAX = 200


def _unacked(tx: Tx, rec: Monitor, sub: Subscription) -> tuple[list[int], bool]:
    """The seqs this subscription was given and has not acknowledged: from its cursor up to its delivered
    high-water mark, through its own filter (what a pull now would hand back marked redelivered). The walk
    is bounded: it looks at the newest rows of that range only, and says so when older ones were left."""
    start = max(sub.cursor, 1, rec.floor)
    upto = min(sub.hwm, rec.head)
    if upto < start:
        return [], False
    walk_from = max(start, upto - 4 * OVERVIEW_UNACKED_MAX)
    flt = sub.filter
    query = filters.prefilter(flt)
    seqs = [o.seq for o in tx.scan(rec.id, walk_from, upto, query) if filters.matches(flt, o.event)]
    return seqs[-OVERVIEW_UNACKED_MAX:], walk_from > start or len(seqs) > OVERVIEW_UNACKED_MAX


def _subscription_view(tx: Tx, rec: Monitor, sub: Subscription) -> dict[str, Any]:
    unacked, more = _unacked(tx, rec, sub) if sub.active else ([], False)
    return {
        "subscription": with_lag(tx, rec, sub) if sub.active else sub.to_wire(0),  # a retired one is not owed
        "delivered_upto": sub.hwm,
        "unacked": unacked,
        "unacked_more": more,  # older unacknowledged seqs exist beyond the list
    }


def _lease_view(lease: Lease, now: float) -> dict[str, Any]:
    held = lease.state is LeaseState.HELD
    return {
        "lease": lease.to_wire(),
        "state": lease.state.value,
        "expires_in_s": round(lease.expires - now, 3) if held else None,
        "expired": held and now > lease.expires,
    }


def overview(
    core: ServiceCore, tx: Tx, monitor_id: str | None, from_seq: Any = 1, limit: Any = None
) -> dict[str, Any]:
    """The operator's picture of the engine, read-only (nothing appended, no cursor moved): every
    monitor, and for `monitor_id` its state, its subscriptions with their lag and unacknowledged seqs,
    its leases with their time left, and a page of its log from `from_seq`. The playground draws every
    panel from this one reply, whichever door made what it shows."""
    out: dict[str, Any] = {
        "taken_at": timefmt.iso(tx.now),
        "monitors": [
            {
                "id": m.id,
                "name": m.name,
                "head": m.head,
                "active": m.active,
                "visibility": m.visibility,
                "owner": m.owner,
            }
            for m in tx.monitors()
        ],
        "monitor": None,
    }
    if monitor_id is None:
        return out
    rec = monitor_of(tx, monitor_id)
    subs = [core.alive(s) for s in tx.subscriptions(rec.id)]
    active = sum(1 for s in subs if s.active)
    out["monitor"] = {
        "monitor": rec.to_wire(),
        "state": state.compute(
            rec, tx.now, active, core.last_pull_of(rec), sources_here=getattr(core, "sources_here", False)
        ),
        "subscriptions": [_subscription_view(tx, rec, s) for s in subs],
        "leases": [_lease_view(x, tx.now) for x in tx.leases(rec.id)],
        "log": read_log(core, tx, rec.id, from_seq, limit),
    }
    return out
