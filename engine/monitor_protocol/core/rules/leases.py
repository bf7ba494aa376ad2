"""Leases: claim, renew, complete, release, reject, expiry, attempts and dead letters, per monitor. The
lifecycle (free, held, dead-lettered) and which ways of letting go count as a failed attempt are the
table in core/lifecycles.py."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import timefmt
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus
from monitor_protocol.core.records import Completion, Lease, Monitor, Subscription, evolve
from monitor_protocol.core.rules import state
from monitor_protocol.core.rules.ledger import append_protocol, free_lease, lease_payload
from monitor_protocol.core.rules.lookups import monitor_of, subscription_of
from monitor_protocol.core.runtime import ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import (
    as_int,
    check_json_size,
    check_name,
    check_reason,
    invalid,
    require_object,
)
from monitor_protocol.core.vocab import (
    DEFAULT_LEASE_SECONDS,
    DELIVERY_COUNT_LIMIT,
    MAX_EVIDENCE_BYTES,
    MAX_LEASE_SECONDS,
    MAX_OUTCOME_CHARS,
    T_LEASE,
)

LEASE_ACTIONS = ("claim", "renew", "complete", "release", "reject")
# What each lease call's body may hold (anything else is refused, naming it: a release's `outcome` was
# dropped without a word).
LEASE_FIELDS = {
    "claim": frozenset(("subject", "lease_duration_seconds", "note")),
    "renew": frozenset(("subject", "lease_duration_seconds", "note")),
    "complete": frozenset(("subject", "outcome", "evidence", "note")),
    "release": frozenset(("subject", "reason")),
    "reject": frozenset(("subject", "reason")),
}


def _duration(value: Any) -> int:
    return as_int(value, "lease_duration_seconds", minimum=1, maximum=MAX_LEASE_SECONDS, text=False)


def lease(
    core: ServiceCore, tx: Tx, sub_id: str, token: str | None, action: str, body: Any
) -> dict[str, Any]:
    if action not in LEASE_ACTIONS:
        raise ProtocolError(
            "NOT_FOUND", f"No lease action {action!r}; use claim, renew, complete, release or reject."
        )
    sub = subscription_of(tx, sub_id, token)
    if "act" not in sub.capabilities:
        offered = monitor_of(tx, sub.monitor).capabilities
        how = (
            "subscribe again asking for it, with the owner token (or, on a shared or public monitor, its "
            "subscribe token)"
            if "act" in offered
            else f"monitor {sub.monitor} does not offer it ({list(offered)}): its owner adds act to the "
            "monitor's capabilities (an update), then the subscription asks for it with the owner token"
        )
        raise ProtocolError(
            "CAPABILITY_MISSING",
            f"Leases need the act capability, which this subscription was not granted: {how}.",
            granted=list(sub.capabilities),
            required="act",
        )
    body = require_object(body, action, LEASE_FIELDS[action])
    subject = body.get("subject")
    if not isinstance(subject, str) or not subject:
        raise invalid(f'{action} needs {{"subject": "<a subject this monitor published>"}}.')
    check_name(subject, "subject", '"build-412"')
    note = check_reason(body.get("note"), "note")
    rec = monitor_of(tx, sub.monitor)
    if rec.status is MonitorStatus.RETIRED:
        raise ProtocolError("UNAVAILABLE", f"Monitor {rec.id} is retired.", live=state.live_of(rec))
    if not tx.has_subject(rec.id, subject):
        raise ProtocolError(
            "NOT_FOUND",
            f"Monitor {rec.id} never published subject {subject!r}; leases cover its own work items only.",
            subject=subject,
        )
    holder = f"sub:{sub.id}"
    current = tx.lease(rec.id, subject)
    if current is not None and current.holder is not None and tx.now > current.expires:
        current, _ = free_lease(core, tx, current, "expired", "system:sweep")
    if action == "claim":
        return _claim(core, tx, rec, sub, current, subject, body, holder)
    if action == "complete" and current is not None and current.completed is not None:
        done = current.completed
        if done.by == holder and current.holder is None:
            return {"ok": True, "seq": done.seq, "idempotent": True, "lease": current.to_wire()}
    if current is None or current.holder != holder:
        if current is not None and current.holder is not None:  # another's, live (expired ones were freed)
            until = timefmt.iso(current.expires)
            why = f"another subscription holds it until {until}; claim it once it is free"
        else:
            why = "nobody holds it now (never claimed, released, or expired and freed); claim it first"
        raise ProtocolError(
            "LEASE_LOST",
            f"This subscription does not hold the lease on {subject!r}: {why}.",
            subject=subject,
            holder=current.holder if current else None,
        )
    if action == "renew":
        duration = (
            _duration(body["lease_duration_seconds"])
            if "lease_duration_seconds" in body
            else current.duration
        )
        renewed = tx.put_lease(evolve(current, duration=duration, renewed=tx.now))
        core.schedule(renewed.expires)
        append_protocol(
            tx,
            rec.id,
            T_LEASE,
            sub.subscriber,
            lease_payload("renew", renewed, sub, note=note),
            subject=subject,
        )
        return {"lease": renewed.to_wire(), "expires": timefmt.iso(renewed.expires)}
    if action == "complete":
        return _complete(tx, rec, sub, current, body, holder, note)
    reason = check_reason(body.get("reason"), "reason")
    freed, seq = free_lease(core, tx, current, action, sub.subscriber, reason=reason, sub=sub)
    return {"ok": True, "seq": seq, "dead_letter": freed.dead_letter, "lease": freed.to_wire()}


def _complete(
    tx: Tx, rec: Monitor, sub: Subscription, current: Lease, body: dict[str, Any], holder: str, note: Any
) -> dict[str, Any]:
    outcome = body.get("outcome")
    if not isinstance(outcome, str) or not outcome or len(outcome) > MAX_OUTCOME_CHARS:
        raise invalid(
            'complete needs {"subject", "outcome": "done" (or another word of at most '
            f'{MAX_OUTCOME_CHARS} characters), "evidence"?}}.'
        )
    evidence = body.get("evidence")
    if evidence is not None:
        check_json_size(evidence, "evidence", MAX_EVIDENCE_BYTES)
    if (rec.limits or {}).get("require_evidence") and not evidence:
        raise ProtocolError(
            "EVIDENCE_REQUIRED",
            f"Monitor {rec.id} requires evidence to complete a lease: send evidence with the outcome.",
            subject=current.subject,
        )
    done = evolve(current, holder=None, state=LeaseState.FREE)
    seq = append_protocol(
        tx,
        rec.id,
        T_LEASE,
        sub.subscriber,
        lease_payload("complete", done, sub, outcome=outcome, evidence=evidence, note=note),
        subject=current.subject,
    ).seq
    done = tx.put_lease(evolve(done, completed=Completion(holder, seq, outcome)))
    rec = monitor_of(tx, rec.id)
    tx.put_monitor(evolve(rec, counters=rec.counters.bump(acted=1)))
    return {"ok": True, "seq": seq, "idempotent": False, "lease": done.to_wire()}


def _claim(
    core: ServiceCore,
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    current: Lease | None,
    subject: str,
    body: dict[str, Any],
    holder: str,
) -> dict[str, Any]:
    duration = _duration(body.get("lease_duration_seconds", DEFAULT_LEASE_SECONDS))
    if current is not None and current.dead_letter:
        raise ProtocolError(
            "DEAD_LETTERED",
            f"Subject {subject!r} failed {current.attempts} times (rejected or expired) and is "
            "dead-lettered; it is not claimed again.",
            subject=subject,
            attempts=current.attempts,
            delivery_count_limit=current.delivery_count_limit,
        )
    if current is not None and current.holder is not None:
        if current.holder == holder:  # the holder repeating its claim gets the same lease (C20b)
            return {"lease": current.to_wire(), "expires": timefmt.iso(current.expires), "idempotent": True}
        raise ProtocolError(
            "LEASE_HELD",
            f"Subject {subject!r} is leased by {current.holder} until {timefmt.iso(current.expires)}.",
            subject=subject,
            holder=current.holder,
            expires=timefmt.iso(current.expires),
        )
    now = tx.now
    if current is None:
        current = Lease(
            monitor=rec.id,
            subject=subject,
            duration=duration,
            acquired=now,
            renewed=now,
            delivery_count_limit=DELIVERY_COUNT_LIMIT,
        )
    transitions = current.transitions + (1 if current.last_holder not in (None, holder) else 0)
    held = tx.put_lease(
        evolve(
            current,
            state=LeaseState.HELD,
            holder=holder,
            duration=duration,
            acquired=now,
            renewed=now,
            transitions=transitions,
            last_holder=holder,
            completed=None,
        )
    )
    core.schedule(held.expires)
    append_protocol(
        tx,
        rec.id,
        T_LEASE,
        sub.subscriber,
        lease_payload("claim", held, sub, note=body.get("note")),
        subject=subject,
    )
    return {"lease": held.to_wire(), "expires": timefmt.iso(held.expires), "idempotent": False}
