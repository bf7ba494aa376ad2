"""Subscriptions and delivery: subscribe with granted capabilities (P7), pull that never commits (P4),
lag under the reader's own filter (P5), ack, seek, renew, retire, retention and the bookmark.

A pull writes only when it changes something stored: the delivered high-water mark advances (new rows
handed out), a relist bookmark is appended, a bounded scan leaves its mark, or the lazily stored mute
clock is due (runtime.MUTE_FLUSH_SECONDS). An empty pull and a long-poll re-check write nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monitor_protocol.core import filters, netguard, tokens, uri
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import SubscriptionState
from monitor_protocol.core.records import AckMemo, Monitor, Subscription, copier, evolve
from monitor_protocol.core.rules.grants import grant_of, room_for_one_more
from monitor_protocol.core.rules.ledger import (
    append_protocol,
    lag_count,
    past_known_misses,
    retire_subscription,
    with_lag,
)
from monitor_protocol.core.rules.lookups import monitor_of, subscription_of
from monitor_protocol.core.rules.pages import Page, read_page
from monitor_protocol.core.runtime import ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import (
    as_int,
    check_actor,
    check_name,
    check_reason,
    check_vocab,
    invalid,
    require_object,
)
from monitor_protocol.core.vocab import (
    DEFAULT_LIMIT,
    DEFAULT_RETIRE_AFTER_MUTE_SECONDS,
    LAG_COUNT_CAP,
    MAX_LIMIT,
    PROTOCOLS,
    RESET_POLICIES,
    SCAN_BUDGET,
    SUBSCRIPTION_ID_HEX,
    T_BOOKMARK,
    T_SUBSCRIBED,
)

# A reader's usual changes, made on every pull and ack (records.copier: positional, no keyword dicts).
_delivered = copier(Subscription, ("hwm", "last_pull", "mute_since"))
_seen = copier(Subscription, ("last_pull", "mute_since"))
_moved = copier(Subscription, ("cursor",))
_acked = copier(Subscription, ("last_ack",))


# ===================================================================================== subscribe


def _start_of(body: dict[str, Any], rec: Monitor) -> int | None:
    if "from" not in body or body["from"] is None:
        return None
    frm = body["from"]
    if frm == "head":
        return rec.head + 1
    if frm == "earliest":
        return rec.floor if rec.floor > 1 else 0
    if isinstance(frm, int) and not isinstance(frm, bool) and frm >= 0:
        return min(frm, rec.head + 1)
    raise invalid('from must be "head", "earliest" or a non-negative integer seq.', invalid=frm)


def _sink_of(
    core: ServiceCore,
    body: dict[str, Any],
    existing: Subscription | None,
    protocol: str,
    basis: str,
    granting: bool,
) -> Any:
    """The subscription's sink. Where the server POSTs is the owner's or the subscribe token's choice:
    `granting` says the caller holds one; a reader's own token may renew a push subscription, not
    point it (or its secret) elsewhere."""
    sink = body.get("sink", existing.sink if existing else None)
    if protocol == "http":
        moved = (
            existing is None
            or existing.protocol != "http"
            or sink != existing.sink
            or body.get("sink_secret") is not None
        )
        if basis == "default" or (moved and not granting):
            raise ProtocolError(
                "UNAUTHORIZED",
                "An HTTP push subscription needs the monitor's owner or subscribe token: the server "
                "will POST to the sink on the monitor's behalf (a reader's own token renews it, and "
                "cannot point it at another sink).",
                needs="subscribe_token",
            )
        if not isinstance(sink, str) or not sink.startswith(("http://", "https://")):
            raise invalid('protocol "http" needs a sink URL such as "https://example.com/hook".')
        check_name(sink, "sink", '"https://example.com/hook"')
        refusal = netguard.sink_refusal(sink, core.allowed_sinks)  # first: it names the address refused
        if refusal is not None:
            raise invalid(refusal, sink=sink)
        _check_sink_uri(sink, given="sink" in body)
    elif sink is not None:
        if not isinstance(sink, str):
            raise invalid("sink must be a URL string or null.")
        check_name(sink, "sink", '"https://example.com/hook"')
        _check_sink_uri(sink, given="sink" in body)
    return sink


def _check_sink_uri(sink: str, *, given: bool) -> None:
    """A sink is served as the published schema's `uri` (RFC 3986). Only a sink sent now is judged: one a
    subscription already holds (stored before this rule) does not stop its re-subscribe."""
    if given and not uri.is_uri(sink):
        raise invalid(
            f"sink {sink[:80]!r} is not a URI (RFC 3986: a scheme, then ASCII, non-ASCII and spaces "
            'percent-encoded), e.g. "https://example.com/hook".',
            sink=sink[:256],
        )


# The members each body may hold (anything else is refused, naming it: core/validation.require_object).
SUBSCRIBE_FIELDS = frozenset(
    ("monitor", "subscriber", "capabilities", "filter", "from", "protocol", "reset_policy", "sink", "sink_secret",
     "retire_after_mute_seconds")
)  # fmt: skip
ACK_FIELDS = frozenset(("cursor",))
SEEK_FIELDS = frozenset(("cursor", "reason"))
RETIRE_FIELDS = frozenset(("reason",))


def subscribe(core: ServiceCore, tx: Tx, body: Any, token: str | None) -> dict[str, Any]:
    body = require_object(body, "subscribe", SUBSCRIBE_FIELDS)
    monitor_id = body.get("monitor")
    if not isinstance(monitor_id, str):
        raise invalid('subscribe needs {"monitor": "<id>", "subscriber": "agent:you"}.')
    rec = monitor_of(tx, monitor_id)
    subscriber = check_actor(body.get("subscriber"), "subscriber")
    existing = tx.find_subscription(monitor_id, subscriber)
    requested, basis = grant_of(rec, existing, token, body.get("capabilities"))
    flt = filters.validate(body.get("filter"), rec.types or [])
    protocol = body.get("protocol", existing.protocol if existing else "pull")
    check_vocab(protocol, PROTOCOLS, "protocol")
    reset_policy = body.get("reset_policy", existing.reset_policy if existing else "none")
    check_vocab(reset_policy, RESET_POLICIES, "reset_policy")
    granting = tokens.matches(token, rec.owner_hash) or (
        rec.visibility != "private" and tokens.matches(token, rec.subscribe_hash)
    )
    sink = _sink_of(core, body, existing, protocol, basis, granting)
    mute = body.get("retire_after_mute_seconds", existing.retire_after_mute_seconds if existing else None)
    if mute is not None:
        mute = as_int(mute, "retire_after_mute_seconds", minimum=1, text=False)
        asked = "retire_after_mute_seconds" in body  # not a value kept from before this rule
        if asked and basis == "default" and mute > DEFAULT_RETIRE_AFTER_MUTE_SECONDS:  # a place held for ever
            raise invalid(
                f"retire_after_mute_seconds is at most {DEFAULT_RETIRE_AFTER_MUTE_SECONDS} (7 days) for a "
                f"subscriber without a token (got {mute}); ask the owner for the subscribe token for longer.",
                limit=DEFAULT_RETIRE_AFTER_MUTE_SECONDS,
            )
    start = _start_of(body, rec)
    now = tx.now
    if existing is None or not existing.active:
        room_for_one_more(tx, monitor_id, basis)
    token_out = tokens.mint("mpr")
    if existing is None:
        sub = Subscription(
            id=_new_subscription_id(tx),
            monitor=monitor_id,
            subscriber=subscriber,
            token_hash=tokens.digest(token_out),
            created=now,
            mute_since=now,
            filter=flt,
            capabilities=requested,
            cursor=start if start is not None else 0,
            reset_policy=reset_policy,
            protocol=protocol,
            sink=sink,
            retire_after_mute_seconds=mute,
            grant=basis,
        )
        renewed = False
    else:
        sub = core.alive(existing)
        if start is not None and max(start, 1) < max(sub.cursor, 1):
            raise ProtocolError(
                "CURSOR_BACKWARDS",
                f"from={body['from']!r} is below this subscription's committed cursor {sub.cursor}; "
                "use seek (with a reason) to move backwards.",
                cursor=sub.cursor,
                requested=start,
                head=rec.head,
            )
        new_filter = flt if "filter" in body else sub.filter
        sub = evolve(
            sub,
            cursor=start if start is not None else sub.cursor,
            # what was found not to match, was found for the old filter
            scan_mark=None if new_filter != sub.filter else sub.scan_mark,
            filter=new_filter,
            capabilities=requested,
            reset_policy=reset_policy,
            protocol=protocol,
            sink=sink,
            retire_after_mute_seconds=mute,
            state=SubscriptionState.ACTIVE,
            token_hash=tokens.digest(token_out),
            mute_since=now,
            grant=basis,
            revoked=False,
        )
        renewed = True
    # A new anonymous subscription is bounded by the places kept for tokens (grants.py), not by the shared
    # budget: a thousand readers joining a public monitor in a minute is what it is for.
    core.logged_action(sub.id, now, monitor_id, basis == "default" and existing is not None)
    if protocol == "http":
        secret = body.get("sink_secret")
        if secret is not None:
            sub = evolve(sub, sink_secret=tokens.check_sink_secret(secret))
        elif not sub.sink_secret:
            sub = evolve(sub, sink_secret=tokens.mint_sink_secret())
    tx.put_subscription(sub)
    core.schedule(now + core.mute_seconds(rec, sub))
    seq = append_protocol(
        tx,
        monitor_id,
        T_SUBSCRIBED,
        subscriber,
        {
            "subscription": sub.id,
            "subscriber": subscriber,
            "filter": sub.filter,
            "capabilities": list(sub.capabilities),
            "cursor": sub.cursor,
            "renewed": renewed,
        },
    ).seq
    rec = monitor_of(tx, monitor_id)
    out: dict[str, Any] = {
        "subscription": with_lag(tx, rec, sub),
        "token": token_out,
        "seq": seq,
        "notice": "Keep the token: it is shown once and stored only as a hash. Pull reads, ack commits."
        + (
            f" This subscriber's subscription {sub.id} was renewed: its cursor is kept (or moved forward to "
            "`from`), and the token it had before no longer works."
            if renewed
            else ""
        ),
    }
    if protocol == "http":
        out["sink_secret"] = sub.sink_secret
    return out


def _new_subscription_id(tx: Tx) -> str:
    """sub- and 16 hex digits; a new id never replaces an existing subscription (section 4)."""
    while True:
        candidate = tokens.new_id("sub", SUBSCRIPTION_ID_HEX)
        if tx.subscription(candidate) is None:
            return candidate


def touch(core: ServiceCore, tx: Tx, sub_id: str, token: str | None) -> dict[str, Any]:
    """A reader following by SSE is consuming (P6) although the stream never commits: reset its mute
    clock without delivering anything."""
    sub = subscription_of(tx, sub_id, token)
    tx.put_subscription(evolve(core.alive(sub), mute_since=tx.now))
    core.schedule(tx.now + core.mute_seconds(monitor_of(tx, sub.monitor), sub))
    return {"subscription": sub.id, "active": sub.active}


def subscription_info(core: ServiceCore, tx: Tx, sub_id: str, token: str | None) -> dict[str, Any]:
    sub = core.alive(subscription_of(tx, sub_id, token, allow_retired=True))
    return with_lag(tx, monitor_of(tx, sub.monitor), sub)


# ===================================================================================== pull
def _pull_limit(limit: Any, *flts: Any) -> int:
    lim = DEFAULT_LIMIT if limit is None else as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
    for f in flts:
        f_lim = filters.limit_of(f)
        if f_lim:
            lim = min(lim, f_lim)
    return lim


def _inline_filter(rec: Monitor, sub: Subscription, inline: Any) -> Any:
    inline_flt = filters.validate(inline, rec.types or []) if inline is not None else {}
    if inline_flt:
        clash = filters.disjoint(sub.filter, inline_flt)
        if clash is not None:
            raise ProtocolError(
                "INVALID_FILTER",
                f"The inline filter cannot match anything this subscription's filter lets through "
                f"({clash}); an inline filter only narrows the subscription's own.",
                subscription_filter=sub.filter,
                inline_filter=inline_flt,
            )
    return inline_flt


def pull(
    core: ServiceCore,
    tx: Tx,
    sub_id: str,
    token: str | None,
    cursor: Any,
    limit: Any,
    inline: Any,
    *,
    system: bool,
    ack_cursor: Any = None,
    memo: dict[Any, Any] | None = None,
    delivered: dict[str, int] | None = None,
    raw: bool = False,
) -> dict[str, Any]:
    """Read at the cursor. With `ack_cursor` (ack-and-pull, docs/serve.md) the ack runs first, with /ack's
    rules, in this same transaction: the pull then reads from the cursor it just committed. A replay
    (`cursor` given) reads from there and records nothing. `memo`: reads shared with other pulls of the
    same call (pull_many), else those of the group commit. `delivered`: what this pull counts on its
    monitor is added there instead of written (pull_many writes each monitor's count once). `raw`: the
    reply is only encoded (by wire.encode), never read, so its rows may be their stored JSON text as is
    (records.StoredObservation.to_wire)."""
    if ack_cursor is not None:
        if cursor is not None:
            raise invalid(
                "ack commits and cursor is a read-only replay: send them in two calls (ack, then the replay)."
            )
        acked = as_int(ack_cursor, "ack", minimum=0, text=False)  # a JSON integer, like /ack's cursor
        ack(core, tx, sub_id, token, {"cursor": acked}, system=system)
    # what the store holds (the lazy mute clock is measured on it); after an ack, the token it just checked
    # in this transaction is not hashed again
    stored = _reader(tx, sub_id, token, system or ack_cursor is not None)
    sub = core.alive(stored)
    rec = monitor_of(tx, sub.monitor)
    reply, _page = _pull(core, tx, stored, sub, rec, cursor, limit, inline, memo, delivered, raw)
    return reply


def _pull(
    core: ServiceCore,
    tx: Tx,
    stored: Subscription,
    sub: Subscription,
    rec: Monitor,
    cursor: Any,
    limit: Any,
    inline: Any,
    memo: dict[Any, Any] | None,
    delivered: dict[str, int] | None,
    raw: bool = False,
) -> tuple[dict[str, Any], Page]:
    """pull's work once the reader is known: its reply, and the page it read."""
    replay = cursor is not None
    inline_flt = _inline_filter(rec, sub, inline)
    lim = _pull_limit(limit, sub.filter, inline_flt)
    start = as_int(cursor, "cursor", minimum=0) if replay else sub.cursor
    requested = start
    sub, start, reset = _past_the_floor(rec, sub, start, replay)
    # Readers woken together read the same page: shared within the group commit, unless this call appended.
    if rec.id in tx.appended:
        memo = None
    elif memo is None:
        memo = core.group_memo()
    page = read_page(tx, rec, sub, inline_flt, start, lim, memo, raw)
    page.changed = reset
    if not page.batch and not replay and not inline_flt and _walked_in_vain(sub, page, start):
        sub = _mark_examined(sub, page, start)
    caught_up = not page.batch or page.batch[-1].seq == rec.head
    if not replay and not page.capped and sub.relist and caught_up and len(page.batch) < lim:
        sub, rec = _bookmark(tx, rec, sub, page, start)
    hwm = sub.hwm
    if not replay:
        sub = _record_delivery(core, tx, rec, stored, sub, page, delivered)
    if memo is not None and rec.id in tx.appended:
        memo = None  # the bookmark was appended by this call
    reply = _pull_reply(
        tx,
        rec,
        sub,
        page,
        hwm,
        lag_exact=not (page.capped and not replay and not inline_flt),
        memo=memo,
        raw=raw,
    )
    if reset:  # said, not done silently: with `latest`, the rows from the floor to the head were skipped
        reply["reset"] = {
            "reset_policy": sub.reset_policy,
            "requested": requested,
            "retention_floor": rec.floor,
            "cursor": start,
        }
    return reply, page


def _reader(tx: Tx, sub_id: str, token: str | None, by_id: bool) -> Subscription:
    """The subscription reading: by its token, or by id alone (the server's own push, or the pull of an
    ack-and-pull, whose ack checked the token in this transaction); P7: it must hold observe."""
    if by_id:
        sub = tx.subscription(sub_id)
        if sub is None or not sub.active:
            raise ProtocolError("NOT_FOUND", f"No active subscription {sub_id!r}.", subscription=sub_id)
    else:
        sub = subscription_of(tx, sub_id, token)
    if "observe" not in sub.capabilities:  # P7: observe reads, for the server's own push too
        raise ProtocolError(
            "CAPABILITY_MISSING",
            "Pulling needs the observe capability, which this subscription does not hold (now).",
            granted=list(sub.capabilities),
            required="observe",
        )
    return sub


def _past_the_floor(
    rec: Monitor, sub: Subscription, start: int, replay: bool
) -> tuple[Subscription, int, bool]:
    """A cursor below what compaction kept: refused (a replay, or reset_policy none), else moved by the
    reset policy (earliest: the floor, with a relist to come; latest: past the head). (sub, start, moved)."""
    floor, head = rec.floor, rec.head
    if max(start, 1) >= floor:
        return sub, start, False
    if replay or sub.reset_policy == "none":
        raise ProtocolError(
            "CURSOR_EXPIRED",
            f"Cursor {start} is below the retention floor {floor}: those observations were compacted. "
            "Relist (read the monitor's state), then seek to retention_floor.",
            retention_floor=floor,
            relist=f"monitors/state?id={rec.id}",
            requested=start,
            reset_policy=sub.reset_policy,
        )
    start = floor if sub.reset_policy == "earliest" else head + 1
    return evolve(sub, cursor=start, relist=sub.reset_policy == "earliest"), start, True


def _walked_in_vain(sub: Subscription, page: Page, start: int) -> bool:
    """Whether an empty page's read is worth remembering: cut short by its bounds, or a walk of the log (no
    index sought alone, pages.py) of SCAN_BUDGET seqs or more past what was remembered, to the head. A long
    poll's re-checks then read only what was appended since, not that stretch again at every wake."""
    first = past_known_misses(sub, max(start, 1))
    if page.last_examined < first:
        return False  # nothing examined (the request's walk was spent): nothing to remember
    return page.capped or (page.walked and page.last_examined - first + 1 >= SCAN_BUDGET)


def _mark_examined(sub: Subscription, page: Page, start: int) -> Subscription:
    """Remember what an empty page examined in vain (cut short by the scan's bounds, or a long stretch of the
    log walked to its head), so the next pull goes on from there even if this reader never acks an empty page
    (push, watch, SSE, a long poll's re-checks): bounded work per request, never a stall.
    Only an empty page: rows delivered but not acked must come back on the next pull (P4)."""
    mark = sub.scan_mark
    first = past_known_misses(sub, max(start, 1))
    begins = mark[0] if mark and first == mark[1] + 1 else max(start, 1)
    page.changed = True
    return evolve(sub, scan_mark=(begins, page.last_examined))


def _bookmark(
    tx: Tx, rec: Monitor, sub: Subscription, page: Page, start: int
) -> tuple[Subscription, Monitor]:
    """A replay after a relist ends with a bookmark that says where the replay stopped."""
    bookmark = append_protocol(
        tx,
        rec.id,
        T_BOOKMARK,
        "system:relist",
        {"subscription": sub.id, "from": start, "to": rec.head, "reason": "replay after relist"},
    )
    page.batch.append(bookmark)
    page.changed = True
    return evolve(sub, relist=False), monitor_of(tx, rec.id)


def _record_delivery(
    core: ServiceCore,
    tx: Tx,
    rec: Monitor,
    stored: Subscription,
    sub: Subscription,
    page: Page,
    delivered: dict[str, int] | None = None,
    news: tuple[int, int] | None = None,
) -> Subscription:
    """What a (non-replay) pull records: the delivered high-water mark and the monitor's delivered count
    when new rows went out or the reader's record changed, else only a remembered sign of life (the lazy
    mute clock, runtime.MUTE_FLUSH_SECONDS) unless it is due to be written. With `delivered`, the
    monitor's count is added there, for the caller to write once (see count_deliveries). `news`: what
    `_news(page, sub.hwm)` gives, when the caller knows it already (readers in one place)."""
    now = tx.now
    hwm = sub.hwm
    new_hwm, fresh = _news(page, hwm) if news is None else news
    if new_hwm != hwm or fresh or page.changed or core.must_store_life(rec, stored, now):
        sub = tx.put_subscription(_delivered(sub, new_hwm, now, now))
        if delivered is None:
            count_deliveries(tx, rec, fresh)
        else:
            delivered[rec.id] = delivered.get(rec.id, 0) + fresh
    else:
        tx.life[sub.id] = now  # remembered, not written
        tx.monitor_pulls[rec.id] = now
        sub = _seen(sub, now, now)
    core.schedule(now + core.mute_seconds(rec, sub))
    return sub


def _news(page: Page, hwm: int) -> tuple[int, int]:
    """What a page is to a reader whose high-water mark is `hwm`: the mark after it, and its rows not
    delivered before."""
    batch = page.batch
    if not batch:
        return hwm, 0
    last = batch[-1].seq
    if last <= hwm:
        return hwm, 0
    return last, sum(1 for obs in batch if obs.seq > hwm)


def _pull_reply(
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    page: Page,
    hwm: int,
    *,
    lag_exact: bool,
    memo: dict[Any, Any] | None = None,
    raw: bool = False,
) -> dict[str, Any]:
    """The pull's reply; rows at or below the high-water mark the pull began with are marked redelivered."""
    head = rec.head
    batch = page.batch
    if page.capped:
        next_cursor = page.last_examined + 1  # every row below it was examined and did not match
    else:
        next_cursor = batch[-1].seq + 1 if batch else head + 1
    if lag_exact:
        lag_n, lag_capped = lag_count(tx, rec, sub, memo)
    else:
        # This pull just examined every row from the cursor to `next` under the subscription's own filter:
        # the lag is what it found plus the rows not yet examined (an upper bound, flagged), with no
        # second scan of another budget's worth of rows.
        lag_n, lag_capped = min(len(batch) + head - page.last_examined, LAG_COUNT_CAP), True
    out: dict[str, Any] = {
        "subscription": sub.id,
        "monitor": rec.id,
        "cursor": sub.cursor,
        "head": head,
        "lag": lag_n,
        "retention_floor": rec.floor,
        "next": next_cursor,
        "redelivered": sum(1 for obs in batch if obs.seq <= hwm),
        "observations": [obs.to_wire(redelivered=obs.seq <= hwm, raw=raw) for obs in batch],
    }
    if lag_capped:
        out["lag_capped"] = True
    if page.capped:
        out["scan_capped"] = True  # more rows remain past `next`: pull again (after acking `next`)
    return out


PullAsk = tuple[str, str | None, Any, Any, Any]  # (subscription, token, cursor, limit, inline filter)


def pull_many(
    core: ServiceCore, tx: Tx, asks: list[PullAsk], same: list[int] | None = None, *, raw: bool = False
) -> list[dict[str, Any] | ProtocolError]:
    """The pulls of readers one append woke, in one call: what they read alike (the page, the lag) is read
    once, their deliveries are written in one apply; each gets its own reply, or its own refusal (a refusal
    comes before its pull stages anything, so it costs the others nothing). Readers in the same place (see
    _Alike) get the reply the first of them got, with their own id: only what is theirs is done again.
    `same`, when given, is filled with one index per reply: that of the earlier reply it equals but for its
    `subscription`, or -1 (a door may then write it from that one's encoded form). `raw`: as pull's."""
    memo: dict[Any, Any] = {}
    delivered: dict[str, int] = {}  # monitor -> rows its readers got for the first time, written once
    alike: dict[Any, _Alike] = {}
    recs: dict[str, Monitor] = {}  # monitor id -> its version as this call last read it (see _pull_alike)
    out: list[dict[str, Any] | ProtocolError] = []
    like: list[int] = [] if same is None else same
    like.clear()  # (the call may run again: a store that found a row changed retries it whole)
    for sub_id, token, cursor, limit, inline in asks:
        try:
            reply, first = _pull_alike(
                core, tx, sub_id, token, cursor, limit, inline, memo, delivered, alike, recs, len(out), raw
            )
        except ProtocolError as err:
            out.append(err)
            like.append(-1)
        else:
            out.append(reply)
            like.append(first)
    for monitor_id, fresh in delivered.items():
        count_deliveries(tx, monitor_of(tx, monitor_id), fresh)
    return out


@dataclass(slots=True)
class _Alike:
    """A woken pull's outcome, for the next readers in the same place: what they read and what they are told
    are the same, only the reader's own record and id differ."""

    rec: Monitor
    page: Page
    reply: dict[str, Any]
    news: tuple[int, int]  # _news(page, hwm): the same for every reader in the place (the hwm is in it)
    index: int  # the reply's place in pull_many's answer


def _place(rec: Monitor, sub: Subscription, limit: Any) -> Any:
    """Where a reader stands, as far as a pull (no replay, no inline filter) can tell: two readers in the
    same place read the same rows and take the same branches, and their replies differ only in their id.
    What decides each part of _pull: the log's bounds (the floor's reset, the page, the lag), the cursor
    (where the page starts), the high-water mark (which rows come back marked redelivered), the scan mark
    (rows known not to match), relist (the bookmark), the reset policy, the filter and the limit asked
    (the page). None: a limit no other reader will send alike (not a number or its text), pulled alone."""
    if limit is not None and type(limit) not in (int, str):
        return None
    return (
        rec.id,
        rec.head,
        rec.floor,
        sub.cursor,
        sub.hwm,
        sub.scan_mark,
        sub.relist,
        sub.reset_policy,
        filters.key_of(sub.filter),
        limit,
    )


def _pull_alike(
    core: ServiceCore,
    tx: Tx,
    sub_id: str,
    token: str | None,
    cursor: Any,
    limit: Any,
    inline: Any,
    memo: dict[Any, Any],
    delivered: dict[str, int],
    alike: dict[Any, _Alike],
    recs: dict[str, Monitor],
    index: int,
    raw: bool = False,
) -> tuple[dict[str, Any], int]:
    """One woken reader's pull in pull_many (the reply at `index`), with the index of the reply it copies
    (-1: none). Its token, its capability and its record are its own, always; in the place of a reader
    already answered in this call it gets that reply with its own id, its delivery recorded.
    `recs` holds the monitors as this call last read them: only a whole pull may write a new version of
    one (a reset, a bookmark), so it is emptied after each; a reader in a known place writes only its own
    subscription (its monitor's count is written once, after every reader)."""
    if cursor is not None or inline is not None:  # a replay or an inline filter: the whole pull
        recs.clear()
        whole = pull(
            core,
            tx,
            sub_id,
            token,
            cursor,
            limit,
            inline,
            system=False,
            memo=memo,
            delivered=delivered,
            raw=raw,
        )
        return whole, -1
    stored = _reader(tx, sub_id, token, False)
    rec = recs.get(stored.monitor)
    if rec is None:
        rec = recs[stored.monitor] = monitor_of(tx, stored.monitor)
    # The place is read from the stored record: what `alive` adds (a remembered sign of life) is no part of
    # it, and a delivery's write sets both its fields anew, so a reader in a known place needs no copy.
    place = _place(rec, stored, limit)
    known = None if place is None else alike.get(place)
    if known is None or known.rec is not rec:  # (another version of the monitor: read it afresh)
        sub = core.alive(stored)
        recs.clear()
        reply, page = _pull(core, tx, stored, sub, rec, None, limit, None, memo, delivered, raw)
        # Only a plain pull is shared: one that reset the reader, marked rows examined in vain or appended
        # a bookmark changed the reader's record on the way, which is that reader's alone.
        if place is not None and not page.changed and rec.id not in tx.appended:
            alike[place] = _Alike(rec, page, reply, _news(page, sub.hwm), index)
        return reply, -1
    _record_delivery(core, tx, rec, stored, stored, known.page, delivered, known.news)
    reply = dict(known.reply)
    reply["subscription"] = stored.id
    reply["observations"] = list(known.reply["observations"])  # the rows' objects shared, never changed
    return reply, known.index


def count_deliveries(tx: Tx, rec: Monitor, fresh: int) -> None:
    """A pull that wrote its reader's record counts on its monitor: `fresh` rows delivered for the first
    time, and the time of the last pull (one new version of the monitor per call, however many readers)."""
    tx.put_monitor(evolve(rec, counters=rec.counters.bump(delivered=fresh), last_pull=tx.now))


# ===================================================================================== ack, seek, renew, retire
def ack(
    core: ServiceCore, tx: Tx, sub_id: str, token: str | None, body: Any, *, system: bool
) -> dict[str, Any]:
    if system:
        found = tx.subscription(sub_id)
        if found is None:
            raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r}.", subscription=sub_id)
        sub = found
    else:
        sub = subscription_of(tx, sub_id, token)
    body = require_object(body, "ack", ACK_FIELDS)
    if "cursor" not in body:
        raise invalid('ack needs {"cursor": <next>} where next is the pull reply\'s "next".')
    requested = as_int(body["cursor"], "cursor", minimum=0, text=False)  # a JSON integer (C27)
    rec = monitor_of(tx, sub.monitor)
    head = rec.head
    target = min(requested, head + 1)
    current = sub.cursor
    if max(target, 1) < max(current, 1):
        raise ProtocolError(
            "CURSOR_BACKWARDS",
            f"ack {requested} is below the committed cursor {current}; acks never move backwards "
            "(seek, with a reason, is the only way back).",
            cursor=current,
            requested=requested,
            head=head,
        )
    if max(target, 1) == max(current, 1) and sub.last_ack is not None and sub.last_ack.cursor == current:
        return dict(sub.last_ack.reply)  # an identical ack returns the prior result (C20)
    sub = _moved(sub, target)
    count, capped = lag_count(tx, rec, sub)
    reply = {"subscription": sub.id, "cursor": target, "head": head, "lag": count}
    if capped:
        reply["lag_capped"] = True
    tx.put_subscription(_acked(sub, AckMemo(target, reply)))
    return dict(reply)


def seek(core: ServiceCore, tx: Tx, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
    sub = subscription_of(tx, sub_id, token)
    body = require_object(body, "seek", SEEK_FIELDS)
    reason = check_reason(body.get("reason"), "reason")
    if reason is None or not reason.strip():
        raise invalid('seek needs a reason: {"cursor": <seq>, "reason": "why you are moving"}.')
    if "cursor" not in body:
        raise invalid('seek needs {"cursor": <seq>, "reason": "..."}.')
    rec = monitor_of(tx, sub.monitor)
    target = min(as_int(body["cursor"], "cursor", minimum=0, text=False), rec.head + 1)
    core.logged_action(sub.id, tx.now, sub.monitor, sub.grant == "default")
    before = sub.cursor
    relist = sub.relist
    if rec.floor > 1 and target >= rec.floor:
        relist = relist or target == rec.floor
    tx.put_subscription(evolve(sub, cursor=target, last_ack=None, relist=relist))
    append_protocol(
        tx,
        rec.id,
        T_SUBSCRIBED,
        sub.subscriber,
        {
            "subscription": sub.id,
            "subscriber": sub.subscriber,
            "seek": {"from": before, "to": target},
            "reason": reason,
        },
    )
    return {"subscription": sub.id, "cursor": target}


def renew(core: ServiceCore, tx: Tx, sub_id: str, token: str | None) -> dict[str, Any]:
    sub = subscription_of(tx, sub_id, token)
    new_token = tokens.mint("mpr")
    tx.put_subscription(evolve(sub, token_hash=tokens.digest(new_token)))
    return {"subscription": sub.id, "token": new_token, "cursor": sub.cursor}


def retire(core: ServiceCore, tx: Tx, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
    sub = subscription_of(tx, sub_id, token)
    b = require_object(body, "retire", RETIRE_FIELDS)
    reason = check_reason(b.get("reason", "by request"), "reason") or "by request"
    core.logged_action(sub.id, tx.now, sub.monitor, sub.grant == "default")
    seq = retire_subscription(core, tx, sub, sub.subscriber, "by request", note=reason)
    return {"ok": True, "subscription": sub.id, "seq": seq, "cursor_kept": sub.cursor}


def retire_as_system(core: ServiceCore, tx: Tx, sub_id: str, reason: str) -> dict[str, Any]:
    """The push delivery retires a subscription whose sink answered 410 Gone."""
    sub = tx.subscription(sub_id)
    if sub is None:
        raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r}.", subscription=sub_id)
    if not sub.active:
        return {"ok": True, "subscription": sub_id, "seq": None, "cursor_kept": sub.cursor}
    seq = retire_subscription(core, tx, sub, "system:push", "by request", note=reason)
    return {"ok": True, "subscription": sub_id, "seq": seq, "cursor_kept": sub.cursor}


def push_targets(tx: Tx) -> list[dict[str, Any]]:
    """Every active HTTP-push subscription, for the server's delivery task."""
    return [
        {"id": s.id, "monitor": s.monitor, "sink": s.sink, "sink_secret": s.sink_secret, "cursor": s.cursor}
        for s in tx.active_subscriptions()
        if s.protocol == "http" and s.sink
    ]
