"""Sources run by the server (docs/protocol.md section 12): the engine's side of `mp serve --sources`.

The server holds only token digests, so what its runners publish comes in here, as the monitor's own source,
without a bearer token; it then goes through the very publish a producer's request goes through
(`publishing.publish_one`: vocabulary, provenance ceilings, the day's budget, idempotency keys, refusals
logged), so a source never gets past a rule a publisher cannot. What a runner has reached (a file's offset,
a feed's seq, the last result for on_change) is committed with what it published, so a restart, even after
`kill -9`, resumes exactly there. Its start, stop, crash and restart are rows of this project's own type
(`python.monitor-protocol.source`), written like the protocol's rows, and the last one is the monitor's
`source_status` the state shows."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import filters, sources, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.records import Monitor, evolve
from monitor_protocol.core.rules import publishing, state
from monitor_protocol.core.rules.ledger import append_protocol
from monitor_protocol.core.rules.lookups import monitor_of
from monitor_protocol.core.rules.page_bytes import walk_bound
from monitor_protocol.core.runtime import LoggedRefusal, ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import check_json_size
from monitor_protocol.core.vocab import MAX_SOURCE_CHECKPOINT_BYTES, T_SOURCE

SOURCE_ACTOR = "system:sources"
FEED_STEP_ROWS = 100  # rows of the other monitor a feed examines per engine call
SOURCES_PAGE = 500  # monitors the supervisor's full look reads per engine call


def _checkpoint(tx: Tx, monitor_id: str, checkpoint: dict[str, Any] | None) -> None:
    if checkpoint is None:
        return
    check_json_size(checkpoint, "A source's checkpoint", MAX_SOURCE_CHECKPOINT_BYTES)
    rec = tx.monitor(monitor_id)
    assert rec is not None
    tx.put_monitor(evolve(rec, source_checkpoint=checkpoint))


def _running(tx: Tx, monitor_id: str) -> Monitor:
    """The monitor whose source publishes: it exists and is active (a paused or retired monitor's source is
    being stopped; what it still sends is not published, and not logged as a refusal either)."""
    rec = monitor_of(tx, monitor_id)
    if not rec.active:
        raise ProtocolError(
            "UNAVAILABLE",
            f"Monitor {monitor_id} is {rec.status.value}; its source is stopped.",
            live=state.live_of(rec),
        )
    return rec


def publish_as_source(
    core: ServiceCore, tx: Tx, monitor_id: str, body: Any, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Publish `body` as the monitor's own source and commit `checkpoint` with it (also when the body is
    refused: its rejected row is the evidence, and the source moves on; except OVER_BUDGET, which the source
    waits out and sends again, so where it stands does not move)."""
    rec = _running(tx, monitor_id)
    try:
        _obs, seq, repeated = publishing.publish_one(tx, rec, body, None)
    except LoggedRefusal as refusal:
        if refusal.error.code != "OVER_BUDGET":
            _checkpoint(tx, monitor_id, checkpoint)
        # Over the day's budget the source stands still: it sends the same observation on the next UTC day.
        raise
    _checkpoint(tx, monitor_id, checkpoint)
    return {"seq": seq, "idempotent": bool(repeated)}


def keep_checkpoint(core: ServiceCore, tx: Tx, monitor_id: str, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Commit where a source stands without publishing (a file's first position, a feed's start)."""
    monitor_of(tx, monitor_id)
    _checkpoint(tx, monitor_id, checkpoint)
    return {"checkpoint": checkpoint}


def source_event(
    core: ServiceCore, tx: Tx, monitor_id: str, action: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """A supervision row (start, stop, crash, restart, refused, throttled, gap) and the status it gives the
    monitor's source."""
    status = sources.STATUS_OF_ACTION.get(action)
    if status is None:
        raise ProtocolError("INVALID", f"Unknown source action {action!r}.")
    monitor_of(tx, monitor_id)
    wire.check(payload)
    seq = append_protocol(tx, monitor_id, T_SOURCE, SOURCE_ACTOR, {**payload, "action": action}).seq
    rec = tx.monitor(monitor_id)
    assert rec is not None
    previous = rec.source_status or {}
    if action not in sources.NOTE_ACTIONS or not previous:
        since = previous.get("since") if previous.get("status") == status else tx.now
        reason = payload.get("reason")
        tx.put_monitor(
            evolve(rec, source_status={"status": status, "reason": reason, "action": action, "since": since})
        )
    return {"seq": seq, "status": status}


def view(rec: Monitor) -> dict[str, Any]:
    """What the supervisor needs of one monitor: its definition as served, whether it is active, its
    version, the source's last status and checkpoint, and its ttl (for on_change)."""
    return {
        "monitor": rec.to_wire(),
        "active": rec.active,
        "status": rec.status.value,
        "version": rec.version,
        "head": rec.head,
        "source_status": rec.source_status,
        "checkpoint": rec.source_checkpoint,
        "ttl_seconds": rec.ttl_seconds,
    }


def _sourced(rec: Monitor) -> bool:
    return (rec.source or {}).get("kind", "log") != "log"


def sources_view(core: ServiceCore, tx: Tx, monitor_id: str) -> list[dict[str, Any]]:
    """The monitor's source, if other than `log` ([] when it is gone or its source is `log`): one the server
    runs, or one it must say it does not (ws, cir, formula)."""
    rec = tx.monitor(monitor_id)
    return [view(rec)] if rec is not None and _sourced(rec) else []


def sources_page(core: ServiceCore, tx: Tx, after: str) -> dict[str, Any]:
    """sources_view of the first SOURCES_PAGE monitors past the id `after`, and `next`, where the next page
    starts (None after the last): the supervisor's full look, a page an engine call, so that no one call
    reads every monitor."""
    recs, more = tx.monitors_page(after, SOURCES_PAGE)
    return {"views": [view(r) for r in recs if _sourced(r)], "next": recs[-1].id if more else None}


def feed_step(
    core: ServiceCore, tx: Tx, monitor_id: str, plan: sources.Plan, limit: int = FEED_STEP_ROWS
) -> dict[str, Any]:
    """One step of a feed: read the other monitor's log from where this one stands, publish here each
    observation that passes this monitor's filter (tier derived, wasDerivedFrom naming it, the idempotency
    key `feed:<monitor>:<seq>`), and commit the new position with them, in one transaction."""
    rec = _running(tx, monitor_id)
    source = rec.source or {}
    if source.get("kind") != "feed" or source.get("ref") != plan.ref:
        return {"published": 0, "refused": 0, "more": False, "changed": True}
    # Read without its lock: a feed only reads the other monitor, and taking a second monitor's lock (in any
    # order) could deadlock with a feed reading the other way on a shared store.
    other = tx.store.get_monitor(plan.ref)
    if other is None:
        raise sources.SourceRefused(f"monitor {plan.ref} (the feed's ref) does not exist on this server")
    if other.visibility != "public":
        raise sources.SourceRefused(
            f"monitor {plan.ref} is not public: a feed reads only public monitors, since the server cannot "
            "tell that this monitor's owner may read a private or shared one"
        )
    if (other.source or {}).get("kind") == "feed":
        raise sources.SourceRefused(
            f"monitor {plan.ref} is itself a feed: a feed reads only a monitor whose observations are its own "
            "(feeds of feeds could echo one observation between them for ever)"
        )
    checkpoint = dict(rec.source_checkpoint or {})
    if checkpoint.get("feed") != other.id:
        start = 0 if plan.from_start else other.head
        checkpoint = {"feed": other.id, "seq": start}
        _checkpoint(tx, monitor_id, checkpoint)
        if start >= other.head:
            return {"published": 0, "refused": 0, "more": False, "seq": start}
    at = max(int(checkpoint.get("seq", 0)) + 1, other.floor)
    head = other.head
    if at > head:
        return {"published": 0, "refused": 0, "more": False, "seq": at - 1}
    flt = rec.filter
    query = filters.prefilter(flt)
    published = refused = examined = 0
    last = at - 1
    # (bounded as a reader's filtered read is: rules/pages.py scan_page)
    end = walk_bound(query, at, head)[0]
    for obs in tx.scan(other.id, at, end, query):
        examined += 1
        if filters.is_empty(flt) or filters.matches(flt, obs.event):
            body = sources.feed_body(plan, obs.event, f"feed:{other.id}:{obs.seq}")
            if body is not None:
                try:
                    publishing.publish_one(tx, tx.monitor(rec.id) or rec, body, None)
                    published += 1
                except LoggedRefusal as refusal:  # logged here (P2); the feed goes on past it ...
                    if refusal.error.code == "OVER_BUDGET":
                        # ... except past the day's budget: it stands before this row until the next day
                        _checkpoint(tx, monitor_id, {"feed": other.id, "seq": last})
                        return {"published": published, "refused": refused, "more": False, "seq": last,
                                "over_budget": True}  # fmt: skip
                    refused += 1
        last = obs.seq
        if examined >= limit:
            break
    if examined < limit:
        last = end  # the scan found no more rows up to its end: nothing below it is left to read
    _checkpoint(tx, monitor_id, {"feed": other.id, "seq": last})
    return {"published": published, "refused": refused, "more": last < head, "seq": last}
