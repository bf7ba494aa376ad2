"""What several rules write the same way: an append to a monitor's log, a protocol row, a logged refusal,
a retired subscription, a freed lease, and what a subscription would receive (lag). Every rule module
imports from here and never from another rule module: the call graph is a tree, not a knot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from monitor_protocol.core import filters, timefmt, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import COUNTS_AS_ATTEMPT, LeaseState, lease_next, subscription_next
from monitor_protocol.core.records import Lease, Monitor, Observation, Subscription, copier, evolve
from monitor_protocol.core.rules import events
from monitor_protocol.core.rules.page_bytes import walk_bound
from monitor_protocol.core.runtime import LoggedRefusal, ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.vocab import (
    FEW_ROWS,
    LAG_COUNT_CAP,
    MAX_NAME_CHARS,
    PROTOCOL_PREFIX,
    SCAN_BUDGET,
    T_LEASE,
    T_REJECTED,
    T_SUBSCRIPTION_RETIRED,
)


# ===================================================================================== the log
def append(
    tx: Tx,
    monitor_id: str,
    build: Callable[[Monitor, int], dict[str, Any]],
    next_version: Callable[[Monitor, Observation], Monitor] | None = None,
) -> Observation:
    """Append the event `build(monitor, seq)` at the next seq of this monitor's log. The monitor's new
    version is `next_version(monitor, obs)` (its head at obs.seq and whatever else this append changes:
    one new version, not two), or the monitor with its head moved."""
    rec = tx.monitor(monitor_id)
    assert rec is not None
    seq = rec.head + 1
    event = build(rec, seq)
    obs = Observation.of(rec.id, seq, event)
    stage(tx, obs)
    new = next_version(rec, obs) if next_version is not None else _with_head(rec, seq)
    assert new.head == seq, "an append's new version of its monitor has its head at the new seq"
    tx.put_monitor(new)
    return obs


_with_head = copier(Monitor, ("head",))


def stage(tx: Tx, obs: Observation) -> None:
    """Stage `obs` in its log, and its subject among the monitor's subjects (a protocol row's subject, a
    subscription or a lease, is not one of the publishers'). The caller moves the monitor's head."""
    tx.append(obs)
    if obs.subject is not None and not obs.type.startswith(PROTOCOL_PREFIX):
        tx.add_subject(obs.monitor, obs.subject)


def append_protocol(
    tx: Tx, monitor_id: str, type_: str, actor: str, payload: dict[str, Any], *, subject: str | None = None
) -> Observation:
    now = tx.now
    obs = append(
        tx,
        monitor_id,
        lambda m, s: events.build_protocol(
            monitor=m, seq=s, type_=type_, subject=subject, time=now, actor=actor, payload=payload
        ),
    )
    if type_ == T_REJECTED:
        rec = tx.monitor(monitor_id)
        assert rec is not None
        tx.put_monitor(evolve(rec, counters=rec.counters.bump(rejected=1)))
    return obs


def reject(tx: Tx, monitor_id: str, error: ProtocolError, raw: Any, actor: Any) -> LoggedRefusal:
    """P2: the refused payload is kept as evidence; the caller raises what this returns. `actor` is who the
    caller said it was; when that name is unusable, the owner (whose token every logged refusal carries)."""
    rec = tx.monitor(monitor_id)
    assert rec is not None
    reason = error.message if len(error.message) <= 1024 else error.message[:1021] + "..."
    if not isinstance(actor, str) or wire.problem(actor) or len(actor) > MAX_NAME_CHARS:
        actor = rec.owner  # the claimed name was itself unusable; the refusal's raw keeps it
    obs = append_protocol(
        tx,
        monitor_id,
        T_REJECTED,
        "system:guard",
        {"code": error.code, "reason": reason, **wire.bounded_raw(raw), "actor": actor},
    )
    error.extras["rejected_seq"] = obs.seq
    return LoggedRefusal(error)


# ===================================================================================== subscriptions
def retire_subscription(
    core: ServiceCore, tx: Tx, sub: Subscription, actor: str, reason: str, note: str | None = None
) -> int:
    """Retire (reason "by request", "mute" or "revoked"), keeping the cursor; free the leases it held."""
    nxt = subscription_next(sub.state, reason)
    assert nxt is not None, f"cannot retire a {sub.state} subscription ({reason})"
    sub = core.alive(sub)
    tx.put_subscription(evolve(sub, state=nxt))
    holder = f"sub:{sub.id}"
    for lease in tx.leases(sub.monitor):
        if lease.holder == holder:
            free_lease(core, tx, lease, "release", actor, reason=f"subscription retired ({reason})")
    rec = tx.monitor(sub.monitor)
    assert rec is not None
    payload: dict[str, Any] = {
        "subscription": sub.id,
        "subscriber": sub.subscriber,
        "reason": reason,
        "cursor": sub.cursor,
        "mute_since": timefmt.iso(sub.mute_since),
    }
    if reason == "mute":
        payload["retire_after_mute_seconds"] = core.mute_seconds(rec, sub)
    if note and note != reason:
        payload["note"] = note
    return append_protocol(tx, sub.monitor, T_SUBSCRIPTION_RETIRED, actor, payload).seq


# ===================================================================================== leases
def lease_payload(action: str, lease: Lease, sub: Subscription | None, **extra: Any) -> dict[str, Any]:
    payload = {
        "action": action,
        "subject": lease.subject,
        "subscription": sub.id if sub else (lease.holder or "").removeprefix("sub:") or None,
        "holder": lease.holder,
    }
    payload.update({k: v for k, v in extra.items() if v is not None})
    return payload


def free_lease(
    core: ServiceCore,
    tx: Tx,
    lease: Lease,
    action: str,
    actor: str,
    *,
    reason: str | None = None,
    sub: Subscription | None = None,
) -> tuple[Lease, int]:
    """release, reject, or expired: the holder lets go; a failed attempt at the limit dead-letters."""
    previous = lease.holder
    if action == "release" and previous is not None and tx.now > lease.expires:
        action = "expired"  # freed by a retirement after its time ran out: the holder failed it
    attempts = lease.attempts + (1 if COUNTS_AS_ATTEMPT.get(action, False) else 0)
    state = lease_next(lease.state, action, attempts_after=attempts, limit=lease.delivery_count_limit)
    lease = evolve(lease, holder=None, attempts=attempts, state=state or LeaseState.FREE)
    tx.put_lease(lease)
    extra: dict[str, Any] = {"reason": reason, "previous_holder": previous}
    if COUNTS_AS_ATTEMPT.get(action, False):
        extra.update({"attempts": lease.attempts, "dead_letter": lease.dead_letter})
    payload = lease_payload(action, lease, sub, **extra)
    if sub is None and previous:
        payload["subscription"] = previous.removeprefix("sub:")
    seq = append_protocol(tx, lease.monitor, T_LEASE, actor, payload, subject=lease.subject).seq
    return lease, seq


# ===================================================================================== lag (P5)
def few_rows(tx: Tx, rec: Monitor, first: int, memo: dict[Any, Any] | None) -> list[Any]:
    """The log's rows from `first` to the head, a few (vocab.FEW_ROWS), read whole: once per group commit
    with its memo, for every reader's page and lag that needs them."""
    key = ("rows", rec.id, first, rec.head)
    rows = memo.get(key) if memo is not None else None
    if rows is None:
        rows = tx.read_range(rec.id, first, rec.head)
        if memo is not None:
            memo[key] = rows
    return rows  # type: ignore[no-any-return]


def past_known_misses(sub: Subscription, start: int) -> int:
    """Where a filtered scan from `start` has to begin: past the run of rows a bounded pull already
    examined and found not matching this subscription's filter (`scan_mark`, [from, to])."""
    mark = sub.scan_mark
    if mark and mark[0] <= start <= mark[1] + 1:
        return mark[1] + 1
    return start


def lag_count(
    tx: Tx, rec: Monitor, sub: Subscription, memo: dict[Any, Any] | None = None
) -> tuple[int, bool]:
    """What this subscription would receive if it pulled now, its own filter included, and whether the
    count is capped (section 8: "capped, and say so"). Filters on indexed columns are counted by the
    store, bounded by the cap; a filter the store cannot answer alone is checked on at most SCAN_BUDGET
    rows, and past those the rest is counted as if it matched (an upper bound, flagged). With `memo` (a
    group commit's, see ServiceCore.group_memo) the same count is made once per group."""
    start = max(sub.cursor, 1, rec.floor)
    head = rec.head
    if start > head:
        return 0, False
    flt = sub.filter
    if filters.is_empty(flt):
        return min(head - start + 1, LAG_COUNT_CAP), head - start + 1 > LAG_COUNT_CAP
    if memo is None:
        return _filtered_lag(tx, rec, sub, start, head, flt)
    key = ("lag", rec.id, head, rec.floor, start, sub.scan_mark, filters.key_of(flt))
    found = memo.get(key)
    if found is None:
        found = memo[key] = _filtered_lag(tx, rec, sub, start, head, flt, memo)
    return found  # type: ignore[no-any-return]


def _filtered_lag(
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    start: int,
    head: int,
    flt: Any,
    memo: dict[Any, Any] | None = None,
) -> tuple[int, bool]:
    query = filters.prefilter(flt)
    seeks = query.seeks_alone  # the store examines only what it counts or returns (else: SCAN_SPAN)
    if query.complete and seeks:
        n = tx.count(rec.id, start, head, query, cap=LAG_COUNT_CAP + 1)
        return min(n, LAG_COUNT_CAP), n > LAG_COUNT_CAP
    start = past_known_misses(sub, start)
    if start > head:
        return 0, False
    if head - start < FEW_ROWS and query.walks:  # (vocab.FEW_ROWS)
        return sum(1 for obs in few_rows(tx, rec, start, memo) if filters.matches(flt, obs.event)), False
    end = walk_bound(query, start, head)[0]
    if query.complete:  # counted within the span; the seqs past it count as if they matched
        n = tx.count(rec.id, start, end, query, cap=LAG_COUNT_CAP + 1)
        if end < head:
            return min(n + head - end, LAG_COUNT_CAP), True
        return min(n, LAG_COUNT_CAP), n > LAG_COUNT_CAP
    count = examined = 0
    last = start - 1
    for obs in tx.scan(rec.id, start, end, query):
        examined += 1
        last = obs.seq
        if filters.matches(flt, obs.event):
            count += 1
        if examined >= SCAN_BUDGET:
            break
    if examined >= SCAN_BUDGET and last < head:
        # The rows not examined count as if they matched; the store narrows that bound only when its
        # indexes can (counting every row would cost as much as the scan the budget just refused).
        rest = tx.count(rec.id, last + 1, head, query, cap=LAG_COUNT_CAP + 1) if seeks else head - last
        return min(count + rest, LAG_COUNT_CAP), True
    if end < head:
        return min(count + head - end, LAG_COUNT_CAP), True
    return count, False


def with_lag(tx: Tx, rec: Monitor, sub: Subscription) -> dict[str, Any]:
    """A subscription on the wire with its lag, and `lag_capped: true` when that lag is a bound (as a pull
    says it: section 8, "capped, and say so")."""
    count, capped = lag_count(tx, rec, sub)
    out = sub.to_wire(count)
    if capped:
        out["lag_capped"] = True
    return out
