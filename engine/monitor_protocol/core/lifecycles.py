"""Lifecycles as named states, each with its transitions in one table (in the style of h11's `_state.py`):
a rule asks the table where an event leads, and an event the table does not list is refused there."""

from __future__ import annotations

from enum import StrEnum


class MonitorStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    RETIRED = "retired"


# (state, owner action) -> next state. A retired monitor takes no action at all (section 4).
MONITOR_TRANSITIONS: dict[tuple[MonitorStatus, str], MonitorStatus] = {
    (MonitorStatus.ACTIVE, "update"): MonitorStatus.ACTIVE,
    (MonitorStatus.ACTIVE, "pause"): MonitorStatus.PAUSED,
    (MonitorStatus.ACTIVE, "resume"): MonitorStatus.ACTIVE,
    (MonitorStatus.ACTIVE, "retire"): MonitorStatus.RETIRED,
    (MonitorStatus.PAUSED, "update"): MonitorStatus.PAUSED,
    (MonitorStatus.PAUSED, "pause"): MonitorStatus.PAUSED,
    (MonitorStatus.PAUSED, "resume"): MonitorStatus.ACTIVE,
    (MonitorStatus.PAUSED, "retire"): MonitorStatus.RETIRED,
}
MONITOR_ACTIONS = ("update", "pause", "resume", "retire")


def monitor_next(status: MonitorStatus, action: str) -> MonitorStatus | None:
    return MONITOR_TRANSITIONS.get((status, action))


class SubscriptionState(StrEnum):
    ACTIVE = "active"
    RETIRED = "retired"


# (state, event) -> next state. Subscribing again with the same subscriber reactivates (section 8); a
# retirement keeps the cursor whatever its cause (by request, mute, revoked).
SUBSCRIPTION_TRANSITIONS: dict[tuple[SubscriptionState, str], SubscriptionState] = {
    (SubscriptionState.ACTIVE, "subscribe"): SubscriptionState.ACTIVE,
    (SubscriptionState.RETIRED, "subscribe"): SubscriptionState.ACTIVE,
    (SubscriptionState.ACTIVE, "by request"): SubscriptionState.RETIRED,
    (SubscriptionState.ACTIVE, "mute"): SubscriptionState.RETIRED,
    (SubscriptionState.ACTIVE, "revoked"): SubscriptionState.RETIRED,
}


def subscription_next(state: SubscriptionState, event: str) -> SubscriptionState | None:
    return SUBSCRIPTION_TRANSITIONS.get((state, event))


class LeaseState(StrEnum):
    FREE = "free"
    HELD = "held"
    DEAD_LETTERED = "dead_lettered"


# (state, event) -> next state. "expired" is the server's event for a holder whose time ran out.
LEASE_TRANSITIONS: dict[tuple[LeaseState, str], LeaseState] = {
    (LeaseState.FREE, "claim"): LeaseState.HELD,
    (LeaseState.HELD, "claim"): LeaseState.HELD,  # the holder repeating its claim (C20b); others: LEASE_HELD
    (LeaseState.HELD, "renew"): LeaseState.HELD,
    (LeaseState.HELD, "complete"): LeaseState.FREE,
    (LeaseState.HELD, "release"): LeaseState.FREE,
    (LeaseState.HELD, "reject"): LeaseState.FREE,
    (LeaseState.HELD, "expired"): LeaseState.FREE,
}
# Which ways of letting go count as a failed attempt (section 8): a reject, or an expiry (a worker that
# dies holding a lease has failed it). At delivery_count_limit failed attempts the subject goes to
# DEAD_LETTERED instead of FREE, and is never claimed again.
COUNTS_AS_ATTEMPT = {"reject": True, "expired": True, "release": False, "complete": False}


def lease_next(state: LeaseState, event: str, *, attempts_after: int, limit: int) -> LeaseState | None:
    nxt = LEASE_TRANSITIONS.get((state, event))
    if nxt is LeaseState.FREE and COUNTS_AS_ATTEMPT.get(event, False) and attempts_after >= limit:
        return LeaseState.DEAD_LETTERED
    return nxt
