"""The State projection (section 4): computed from the monitor's counters, never written by hand, and
explicit about what it does not know (P3)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import timefmt
from monitor_protocol.core.records import Monitor
from monitor_protocol.core.vocab import CONFIDENCE_MISSING, CONFIDENCE_PRESENT, GAPS_ORDER

STATE_TTL_MS = 1000
COMPUTED_BY = "monitor-protocol/0.1 mechanical projection (P9: no model)"


def _age(now: float, then: float | None) -> int | None:
    if then is None:
        return None
    return max(0, int(now - then))


def live_of(monitor: Monitor) -> dict[str, Any]:
    if monitor.active:
        return {"value": True, "reason": None}
    return {"value": False, "reason": monitor.status.value}


def freshness(monitor: Monitor) -> float | None:
    """What stale_source measures from: the last observation, except while the source does not answer
    (section 12): then the last time it did answer (else when the monitor was made), so a stream of
    "not answering" observations never looks fresh."""
    last = monitor.last
    if last is None:
        return None
    if monitor.quiet_since is None:
        return last.ts
    return monitor.source_contact if monitor.source_contact is not None else monitor.created


NOT_RUN_HERE = (
    "this server does not run sources (mp serve --sources runs them); a producer or `mp probe` may be "
    "publishing for it from elsewhere"
)


def source_of(monitor: Monitor, sources_here: bool) -> dict[str, Any]:
    """The state's `source` (this project's extension, section 12): what watches, whether the server runs
    it and how that stands (`status`, `reason`, `since`), and whether the source answers."""
    kind = (monitor.source or {}).get("kind", "log")
    run = monitor.source_status or {}
    if kind == "log":
        status, reason, since = None, "producers publish (source.kind log): nothing runs", None
    elif not sources_here:
        status, reason, since = "not_run", NOT_RUN_HERE, None
    elif run:
        status, reason, since = run.get("status"), run.get("reason"), run.get("since")
    else:
        status, reason, since = "pending", "the server has not started it yet", None
    if monitor.quiet_since is not None:
        answering: bool | None = False
    else:
        answering = True if monitor.source_contact is not None else None
    return {
        "kind": kind,
        "status": status,
        "reason": reason,
        "since": timefmt.iso(since) if isinstance(since, int | float) else None,
        "answering": answering,
        "not_answering_since": timefmt.iso(monitor.quiet_since) if monitor.quiet_since is not None else None,
    }


def compute(
    monitor: Monitor,
    now: float,
    subscriptions_active: int,
    last_pull: float | None,
    *,
    sources_here: bool = False,
) -> dict[str, Any]:
    c = monitor.counters
    last = monitor.last
    fresh = freshness(monitor)
    actors = [a for a in monitor.actors if not a.startswith("system:")]
    gaps = []
    for gap in GAPS_ORDER:
        if (
            gap == "independence_unknown"
            or gap == "no_event_provenance"
            and c.observations == 0
            or gap == "single_actor"
            and len(actors) == 1
            or (
                gap == "stale_source"
                and monitor.ttl_seconds
                and fresh is not None
                and now - fresh > monitor.ttl_seconds
            )
            or gap == "no_subscribers"
            and subscriptions_active == 0
            or gap == "unattested_origin"
            and not monitor.attested
        ):
            gaps.append(gap)
    head = monitor.head
    return {
        "monitor": monitor.id,
        "as_of": timefmt.iso(now),
        "as_of_seq": head,
        "covers_until": timefmt.iso(last.ts) if last else None,
        "head": head,
        "retention_floor": monitor.floor,
        "live": live_of(monitor),
        "counters": {
            "observations": c.observations,
            "delivered": c.delivered,
            "acted": c.acted,
            "subscriptions_active": subscriptions_active,
            "rejected": c.rejected,
        },
        "last": {"seq": last.seq, "time": timefmt.iso(last.ts), "type": last.type} if last else None,
        "ages": {
            "since_last_observation_s": _age(now, last.ts if last else None),
            "since_last_pull_s": _age(now, last_pull),
            "since_last_source_contact_s": _age(now, monitor.source_contact),
        },
        "contradictions_open": max(0, c.contradictions - c.contradictions_resolved),
        "confidence": {
            # P3: the value stays empty while any input is missing.
            "value": None,
            "computed_by": COMPUTED_BY,
            "inputs": {"present": list(CONFIDENCE_PRESENT), "missing": list(CONFIDENCE_MISSING)},
            "gaps": gaps,
        },
        # The counters are kept since seq 1, compacted rows included: that is what they are computed from.
        "computed_from": {"seq_from": 1, "seq_to": head},
        "ttl_ms": STATE_TTL_MS,
        "supersedes": None,
        "source": source_of(monitor, sources_here),
    }
