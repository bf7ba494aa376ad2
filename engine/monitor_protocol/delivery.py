"""Subscriptions and delivery: subscribe with granted capabilities (P7), pull that never commits (P4),
lag under the reader's own filter (P5), ack, seek, renew, retire, retention and the bookmark."""

from __future__ import annotations

from typing import Any

from . import filters, netguard, timefmt, tokens
from .errors import ProtocolError
from .service_base import (
    ServiceCore,
)
from .store.base import Record
from .validation import (
    as_int,
    check_actor,
    check_name,
    check_reason,
    check_vocab,
    check_vocab_list,
    invalid,
    require_object,
)
from .vocab import (
    CAPABILITIES,
    DEFAULT_LIMIT,
    LAG_COUNT_CAP,
    MAX_ACTIVE_SUBSCRIPTIONS,
    MAX_LIMIT,
    PROTOCOLS,
    RESET_POLICIES,
    SCAN_BUDGET,
    SUBSCRIPTION_ID_HEX,
    T_BOOKMARK,
    T_SUBSCRIBED,
    T_SUBSCRIPTION_RETIRED,
)


class DeliveryRules(ServiceCore):
    # ================================================================================ subscriptions
    def subscribe(self, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._subscribe(body, token))

    def _subscribe(self, body: Any, token: str | None) -> dict[str, Any]:
        body = require_object(body, "subscribe")
        monitor_id = body.get("monitor")
        if not isinstance(monitor_id, str):
            raise invalid('subscribe needs {"monitor": "<id>", "subscriber": "agent:you"}.')
        rec = self._monitor_rec(monitor_id)
        subscriber = check_actor(body.get("subscriber"), "subscriber")
        existing = self.store.find_subscription(monitor_id, subscriber)
        is_owner = tokens.matches(token, rec["_owner_hash"])
        # The subscribe token grants the monitor's capabilities wherever it exists (shared or public).
        is_sub_token = rec["visibility"] != "private" and tokens.matches(token, rec.get("_subscribe_hash"))
        holds_existing = existing is not None and tokens.matches(token, existing["token_hash"])
        if rec["visibility"] == "private" and not (is_owner or holds_existing):
            raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
        requested = body.get("capabilities")
        if requested is not None:
            requested = check_vocab_list(requested, CAPABILITIES, "capabilities")
        if existing is not None and not (holds_existing or is_owner):
            raise ProtocolError(
                "UNAUTHORIZED",
                f"{subscriber} already subscribes to {monitor_id}; a name is not a credential. Re-subscribe "
                "with that subscription's current token or the owner's token.",
            )
        # On a private monitor only a grant made with the owner's token survives: a revoked reader's old
        # token opens nothing.
        if (
            rec["visibility"] == "private"
            and existing is not None
            and not is_owner
            and existing.get("_grant", "default") != "owner"
        ):
            raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
        if is_owner or is_sub_token:
            grant = list(rec["capabilities"])
        else:
            grant = list(rec["default_grant"])
            if existing is not None:
                grant += [c for c in existing["capabilities"] if c not in grant]
        if requested is None:
            requested = list(existing["capabilities"]) if existing else ["observe"]
        excess = [c for c in requested if c not in grant]
        if excess:
            raise ProtocolError(
                "CAPABILITY_MISSING",
                f"Capabilities are granted, not requested: {excess} are not granted to this caller "
                f"(granted: {grant}). Ask the owner for the owner or subscribe token.",
                granted=grant,
                monitor_capabilities=list(rec["capabilities"]),
                requested=requested,
            )
        if rec["visibility"] == "shared" and not (
            is_owner
            or is_sub_token
            or (holds_existing and existing.get("_grant", "default") in ("owner", "subscribe"))
        ):
            raise ProtocolError(
                "UNAUTHORIZED",
                f"Monitor {monitor_id} is shared: subscribing needs its subscribe token (or the owner's).",
            )
        # What this subscription's grant rests on, so a narrowed definition can revoke it (section 8).
        basis = "owner" if is_owner else "subscribe" if is_sub_token else None
        if basis is None:
            basis = (
                existing.get("_grant", "default") if holds_existing and existing is not None else "default"
            )
        flt = filters.validate(body.get("filter"), rec.get("types") or [])
        protocol = body.get("protocol", existing["protocol"] if existing else "pull")
        check_vocab(protocol, PROTOCOLS, "protocol")
        reset_policy = body.get("reset_policy", existing["reset_policy"] if existing else "none")
        check_vocab(reset_policy, RESET_POLICIES, "reset_policy")
        sink = body.get("sink", existing.get("sink") if existing else None)
        if protocol == "http":
            if basis == "default":
                raise ProtocolError(
                    "UNAUTHORIZED",
                    "An HTTP push subscription needs the monitor's owner or subscribe token: the server "
                    "will POST to the sink on the monitor's behalf.",
                )
            if not isinstance(sink, str) or not sink.startswith(("http://", "https://")):
                raise invalid('protocol "http" needs a sink URL such as "https://example.com/hook".')
            check_name(sink, "sink", '"https://example.com/hook"')
            refusal = netguard.sink_refusal(sink, self.allowed_sinks)
            if refusal is not None:
                raise invalid(refusal, sink=sink)
        elif sink is not None:
            if not isinstance(sink, str):
                raise invalid("sink must be a URL string or null.")
            check_name(sink, "sink", '"https://example.com/hook"')
        mute = body.get(
            "retire_after_mute_seconds", existing.get("retire_after_mute_seconds") if existing else None
        )
        if mute is not None:
            mute = as_int(mute, "retire_after_mute_seconds", minimum=1, text=False)
        head = rec["_head"]
        floor = rec["_floor"]
        start: int | None = None
        if "from" in body and body["from"] is not None:
            frm = body["from"]
            if frm == "head":
                start = head + 1
            elif frm == "earliest":
                start = floor if floor > 1 else 0
            elif isinstance(frm, int) and not isinstance(frm, bool) and frm >= 0:
                start = min(frm, head + 1)
            else:
                raise invalid('from must be "head", "earliest" or a non-negative integer seq.', invalid=frm)
        now = self._now()
        if (existing is None or not existing["active"]) and self.store.count_active_subscriptions(
            monitor_id
        ) >= MAX_ACTIVE_SUBSCRIPTIONS:
            raise ProtocolError(
                "OVER_BUDGET",
                f"Monitor {monitor_id} has {MAX_ACTIVE_SUBSCRIPTIONS} active subscriptions, the most it "
                "serves; retire one first.",
                limit=MAX_ACTIVE_SUBSCRIPTIONS,
            )
        token_out = tokens.mint("mpr")
        if existing is None:
            sub: Record = {
                "id": self._new_subscription_id(),
                "monitor": monitor_id,
                "subscriber": subscriber,
                "filter": flt,
                "capabilities": requested,
                "cursor": start if start is not None else 0,
                "reset_policy": reset_policy,
                "protocol": protocol,
                "sink": sink,
                "retire_after_mute_seconds": mute,
                "created": timefmt.iso(now),
                "last_pull": None,
                "active": True,
                "token_hash": tokens.digest(token_out),
                "_hwm": 0,
                "_mute_since": now,
                "_last_ack": None,
                "_relist": False,
                "_grant": basis,
            }
            renewed = False
        else:
            sub = existing
            if start is not None and max(start, 1) < max(sub["cursor"], 1):
                raise ProtocolError(
                    "CURSOR_BACKWARDS",
                    f"from={body['from']!r} is below this subscription's committed cursor {sub['cursor']}; "
                    "use seek (with a reason) to move backwards.",
                    cursor=sub["cursor"],
                    requested=start,
                    head=head,
                )
            if start is not None:
                sub["cursor"] = start
            if "filter" in body and flt != sub["filter"]:
                sub["_scan_mark"] = None  # what was found not to match, was found for the old filter
            sub.update(
                {
                    "filter": flt if "filter" in body else sub["filter"],
                    "capabilities": requested,
                    "reset_policy": reset_policy,
                    "protocol": protocol,
                    "sink": sink,
                    "retire_after_mute_seconds": mute,
                    "active": True,
                    "token_hash": tokens.digest(token_out),
                    "_mute_since": now,
                    "_grant": basis,
                    "_revoked": False,
                }
            )
            renewed = True
        if protocol == "http":
            secret = body.get("sink_secret")
            if secret is not None:
                sub["_sink_secret"] = tokens.check_sink_secret(secret)
            elif not sub.get("_sink_secret"):
                sub["_sink_secret"] = tokens.mint_sink_secret()
        self.store.put_subscription(sub)
        self._schedule(now + self._mute_seconds(rec, sub))
        seq = self._append_protocol(
            rec,
            T_SUBSCRIBED,
            subscriber,
            {
                "subscription": sub["id"],
                "subscriber": subscriber,
                "filter": sub["filter"],
                "capabilities": sub["capabilities"],
                "cursor": sub["cursor"],
                "renewed": renewed,
            },
        )
        self.store.put_monitor(rec)
        out: dict[str, Any] = {
            "subscription": self.served_subscription(sub, self._lag(rec, sub)),
            "token": token_out,
            "seq": seq,
            "notice": "Keep the token: it is shown once and stored only as a hash. Pull reads, ack commits.",
        }
        if protocol == "http":
            out["sink_secret"] = sub["_sink_secret"]
        return out

    def _new_subscription_id(self) -> str:
        """sub- and 16 hex digits; a new id never replaces an existing subscription (section 4)."""
        while True:
            candidate = tokens.new_id("sub", SUBSCRIPTION_ID_HEX)
            if self.store.get_subscription(candidate) is None:
                return candidate

    def _mute_seconds(self, rec: Record, sub: Record) -> int:
        return int(
            sub.get("retire_after_mute_seconds")
            or rec.get("retire_after_mute_seconds")
            or self.default_retire_after_mute
        )

    def touch(self, sub_id: str, token: str | None) -> dict[str, Any]:
        """A reader following by SSE is consuming (P6) although the stream never commits: reset its mute
        clock without delivering anything."""

        def run() -> dict[str, Any]:
            sub = self._subscription(sub_id, token)
            now = self._now()
            sub["_mute_since"] = now
            self.store.put_subscription(sub)
            self._schedule(now + self._mute_seconds(self._monitor_rec(sub["monitor"]), sub))
            return {"subscription": sub["id"], "active": sub["active"]}

        return self._call(run)

    def subscription_info(self, sub_id: str, token: str | None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            sub = self._subscription(sub_id, token, allow_retired=True)
            rec = self._monitor_rec(sub["monitor"])
            return self.served_subscription(sub, self._lag(rec, sub))

        return self._call(run)

    # ---------------------------------------------------------------------------- lag and pull
    def _lag(self, rec: Record, sub: Record) -> int:
        return self._lag_count(rec, sub)[0]

    @staticmethod
    def _past_known_misses(sub: Record, start: int) -> int:
        """Where a filtered scan from `start` has to begin: past the run of rows a bounded pull already
        examined and found not matching this subscription's filter (`_scan_mark`, [from, to])."""
        mark = sub.get("_scan_mark")
        if mark and mark[0] <= start <= mark[1] + 1:
            return mark[1] + 1
        return start

    def _lag_count(self, rec: Record, sub: Record) -> tuple[int, bool]:
        """P5: what this subscription would receive if it pulled now, its own filter included, and whether
        the count is capped. A filtered count examines at most SCAN_BUDGET rows (section 10: no reader can
        stall the others); past that it reports an upper bound (matched + rows not yet examined)."""
        start = max(sub["cursor"], 1, rec["_floor"])
        head = rec["_head"]
        if start > head:
            return 0, False
        flt = sub["filter"]
        if filters.is_empty(flt):
            return min(head - start + 1, LAG_COUNT_CAP), head - start + 1 > LAG_COUNT_CAP
        start = self._past_known_misses(sub, start)
        if start > head:
            return 0, False
        count = examined = 0
        last = start - 1
        for event in self.store.scan(rec["id"], start, head):
            examined += 1
            last = int(event["id"])
            if filters.matches(flt, event):
                count += 1
            if examined >= SCAN_BUDGET:
                break
        if last < head and examined >= SCAN_BUDGET:
            return min(count + head - last, LAG_COUNT_CAP), True
        return count, False

    def pull(
        self,
        sub_id: str,
        token: str | None,
        *,
        cursor: Any = None,
        limit: Any = None,
        filter: Any = None,  # noqa: A002 - the protocol's word
    ) -> dict[str, Any]:
        return self._call(lambda: self._pull(sub_id, token, cursor, limit, filter, system=False))

    def pull_as_system(self, sub_id: str, *, limit: int | None = None) -> dict[str, Any]:
        """The server's own push delivery reads as the subscription, without its token."""
        return self._call(lambda: self._pull(sub_id, None, None, limit, None, system=True))

    def _pull(
        self, sub_id: str, token: str | None, cursor: Any, limit: Any, inline: Any, *, system: bool
    ) -> dict[str, Any]:
        if system:
            sub = self.store.get_subscription(sub_id)
            if sub is None or not sub["active"]:
                raise ProtocolError("NOT_FOUND", f"No active subscription {sub_id!r}.", subscription=sub_id)
        else:
            sub = self._subscription(sub_id, token)
        if "observe" not in sub["capabilities"]:  # P7: observe reads, for the server's own push too
            raise ProtocolError(
                "CAPABILITY_MISSING",
                "Pulling needs the observe capability, which this subscription does not hold (now).",
                granted=sub["capabilities"],
                required="observe",
            )
        rec = self._monitor_rec(sub["monitor"])
        lim = DEFAULT_LIMIT if limit is None else as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
        replay = cursor is not None
        inline_flt = filters.validate(inline, rec.get("types") or []) if inline is not None else {}
        if inline_flt:
            clash = filters.disjoint(sub["filter"], inline_flt)
            if clash is not None:
                raise ProtocolError(
                    "INVALID_FILTER",
                    f"The inline filter cannot match anything this subscription's filter lets through "
                    f"({clash}); an inline filter only narrows the subscription's own.",
                    subscription_filter=sub["filter"],
                    inline_filter=inline_flt,
                )
        for f in (sub["filter"], inline_flt):
            f_lim = filters.limit_of(f)
            if f_lim:
                lim = min(lim, f_lim)
        start = as_int(cursor, "cursor", minimum=0) if replay else sub["cursor"]
        head, floor = rec["_head"], rec["_floor"]
        now = self._now()
        if max(start, 1) < floor:  # something below the floor was really compacted
            if replay or sub["reset_policy"] == "none":
                raise ProtocolError(
                    "CURSOR_EXPIRED",
                    f"Cursor {start} is below the retention floor {floor}: those observations were compacted. "
                    "Relist (read the monitor's state), then seek to retention_floor.",
                    retention_floor=floor,
                    relist=f"monitors/state?id={rec['id']}",
                    requested=start,
                    reset_policy=sub["reset_policy"],
                )
            start = floor if sub["reset_policy"] == "earliest" else head + 1
            sub["cursor"] = start
            sub["_relist"] = sub["reset_policy"] == "earliest"
        batch: list[dict[str, Any]] = []
        first = self._past_known_misses(sub, max(start, 1))
        last_examined, capped = first - 1, False
        for examined, event in enumerate(self.store.scan(rec["id"], first, head), start=1):
            last_examined = int(event["id"])
            if filters.matches(sub["filter"], event) and filters.matches(inline_flt, event):
                batch.append(event)
                if len(batch) >= lim:
                    break
            elif examined >= SCAN_BUDGET and last_examined < head:
                capped = True  # bounded read: the rest waits for the next pull, from `next`
                break
        if capped and not batch and not replay and not inline_flt:
            # Remember what was examined in vain, so the next pull goes on from there even if this reader
            # never acks an empty page (push, watch, SSE): bounded work per request, never a stall. Only
            # an empty page: rows delivered but not acked must come back on the next pull (P4).
            mark = sub.get("_scan_mark")
            begins = mark[0] if mark and first == mark[1] + 1 else max(start, 1)
            sub["_scan_mark"] = [begins, last_examined]
        if (
            not replay
            and not capped
            and sub.get("_relist")
            and (not batch or int(batch[-1]["id"]) == head)
            and len(batch) < lim
        ):
            # A replay after a relist ends with a bookmark that says where the replay stopped.
            seq = self._append_protocol(
                rec,
                T_BOOKMARK,
                "system:relist",
                {"subscription": sub["id"], "from": start, "to": head, "reason": "replay after relist"},
            )
            batch.append(self.store.get_observation(rec["id"], seq))
            sub["_relist"] = False
            head = rec["_head"]
        hwm = sub["_hwm"]
        redelivered = 0
        for event in batch:
            if int(event["id"]) <= hwm:
                event["redelivered"] = True
                redelivered += 1
        if capped:
            next_cursor = last_examined + 1  # every row below it was examined and did not match
        else:
            next_cursor = int(batch[-1]["id"]) + 1 if batch else head + 1
        if not replay:
            new_hwm = max(hwm, int(batch[-1]["id"])) if batch else hwm
            rec["_counters"]["delivered"] += len(batch) - redelivered
            sub["_hwm"] = new_hwm
            sub["last_pull"] = timefmt.iso(now)
            sub["_mute_since"] = now
            rec["_last_pull"] = now
            self.store.put_subscription(sub)
            self.store.put_monitor(rec)
            self._schedule(now + self._mute_seconds(rec, sub))
        lag, lag_capped = self._lag_count(rec, sub)
        out = {
            "subscription": sub["id"],
            "monitor": rec["id"],
            "cursor": sub["cursor"],
            "head": head,
            "lag": lag,
            "retention_floor": floor,
            "next": next_cursor,
            "redelivered": redelivered,
            "observations": batch,
        }
        if lag_capped:
            out["lag_capped"] = True
        if capped:
            out["scan_capped"] = True  # more rows remain past `next`: pull again (after acking `next`)
        return out

    # ---------------------------------------------------------------------------- ack, seek, renew, retire
    def ack(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        return self._call(lambda: self._ack(sub_id, token, body, system=False))

    def ack_as_system(self, sub_id: str, cursor: int) -> dict[str, Any]:
        return self._call(lambda: self._ack(sub_id, None, {"cursor": cursor}, system=True))

    def _ack(self, sub_id: str, token: str | None, body: Any, *, system: bool) -> dict[str, Any]:
        if system:
            sub = self.store.get_subscription(sub_id)
            if sub is None:
                raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r}.", subscription=sub_id)
        else:
            sub = self._subscription(sub_id, token)
        body = require_object(body, "ack")
        if "cursor" not in body:
            raise invalid('ack needs {"cursor": <next>} where next is the pull reply\'s "next".')
        requested = as_int(body["cursor"], "cursor", minimum=0, text=False)  # a JSON integer (C27)
        rec = self._monitor_rec(sub["monitor"])
        head = rec["_head"]
        target = min(requested, head + 1)
        current = sub["cursor"]
        if max(target, 1) < max(current, 1):
            raise ProtocolError(
                "CURSOR_BACKWARDS",
                f"ack {requested} is below the committed cursor {current}; acks never move backwards "
                "(seek, with a reason, is the only way back).",
                cursor=current,
                requested=requested,
                head=head,
            )
        if (
            max(target, 1) == max(current, 1)
            and sub.get("_last_ack")
            and sub["_last_ack"]["cursor"] == current
        ):
            return dict(sub["_last_ack"]["body"])  # an identical ack returns the prior result (C20)
        sub["cursor"] = target
        reply = {"subscription": sub["id"], "cursor": target, "head": head, "lag": self._lag(rec, sub)}
        sub["_last_ack"] = {"cursor": target, "body": reply}
        self.store.put_subscription(sub)
        return dict(reply)

    def seek(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        return self._call(lambda: self._seek(sub_id, token, body))

    def _seek(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        sub = self._subscription(sub_id, token)
        body = require_object(body, "seek")
        reason = check_reason(body.get("reason"), "reason")
        if reason is None or not reason.strip():
            raise invalid('seek needs a reason: {"cursor": <seq>, "reason": "why you are moving"}.')
        if "cursor" not in body:
            raise invalid('seek needs {"cursor": <seq>, "reason": "..."}.')
        rec = self._monitor_rec(sub["monitor"])
        target = as_int(body["cursor"], "cursor", minimum=0, text=False)
        target = min(target, rec["_head"] + 1)
        before = sub["cursor"]
        sub["cursor"] = target
        sub["_last_ack"] = None
        if rec["_floor"] > 1 and target >= rec["_floor"]:
            sub["_relist"] = sub.get("_relist") or target == rec["_floor"]
        self.store.put_subscription(sub)
        self._append_protocol(
            rec,
            T_SUBSCRIBED,
            sub["subscriber"],
            {
                "subscription": sub["id"],
                "subscriber": sub["subscriber"],
                "seek": {"from": before, "to": target},
                "reason": reason,
            },
        )
        self.store.put_monitor(rec)
        return {"subscription": sub["id"], "cursor": target}

    def renew(self, sub_id: str, token: str | None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            sub = self._subscription(sub_id, token)
            new_token = tokens.mint("mpr")
            sub["token_hash"] = tokens.digest(new_token)
            self.store.put_subscription(sub)
            return {"subscription": sub["id"], "token": new_token, "cursor": sub["cursor"]}

        return self._call(run)

    def retire_subscription(self, sub_id: str, token: str | None, body: Any) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            sub = self._subscription(sub_id, token)
            b = require_object(body, "retire")
            reason = check_reason(b.get("reason", "by request"), "reason") or "by request"
            rec = self._monitor_rec(sub["monitor"])
            seq = self._retire_sub(rec, sub, sub["subscriber"], "by request", note=reason)
            return {"ok": True, "subscription": sub["id"], "seq": seq, "cursor_kept": sub["cursor"]}

        return self._call(run)

    def push_targets(self) -> list[dict[str, Any]]:
        """Every active HTTP-push subscription, for the server's delivery task."""

        def run() -> list[dict[str, Any]]:
            return [
                {
                    "id": s["id"],
                    "monitor": s["monitor"],
                    "sink": s["sink"],
                    "sink_secret": s.get("_sink_secret"),
                    "cursor": s["cursor"],
                }
                for s in self.store.list_subscriptions()
                if s["active"] and s["protocol"] == "http" and s.get("sink")
            ]

        return self._call(run)

    def retire_as_system(self, sub_id: str, reason: str) -> dict[str, Any]:
        """The push delivery retires a subscription whose sink answered 410 Gone."""

        def run() -> dict[str, Any]:
            sub = self.store.get_subscription(sub_id)
            if sub is None:
                raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r}.", subscription=sub_id)
            if not sub["active"]:
                return {"ok": True, "subscription": sub_id, "seq": None, "cursor_kept": sub["cursor"]}
            rec = self._monitor_rec(sub["monitor"])
            seq = self._retire_sub(rec, sub, "system:push", "by request", note=reason)
            return {"ok": True, "subscription": sub_id, "seq": seq, "cursor_kept": sub["cursor"]}

        return self._call(run)

    def _retire_sub(self, rec: Record, sub: Record, actor: str, reason: str, note: str | None = None) -> int:
        sub["active"] = False
        self.store.put_subscription(sub)
        holder = f"sub:{sub['id']}"
        for lease in self.store.list_leases(rec["id"]):
            if lease["holder"] == holder:
                self._free_lease(rec, lease, "release", actor, reason=f"subscription retired ({reason})")
        payload: dict[str, Any] = {
            "subscription": sub["id"],
            "subscriber": sub["subscriber"],
            "reason": reason,
            "cursor": sub["cursor"],
            "mute_since": timefmt.iso(sub["_mute_since"]),
        }
        if reason == "mute":
            payload["retire_after_mute_seconds"] = self._mute_seconds(rec, sub)
        if note and note != reason:
            payload["note"] = note
        seq = self._append_protocol(rec, T_SUBSCRIPTION_RETIRED, actor, payload)
        self.store.put_monitor(rec)
        return seq
