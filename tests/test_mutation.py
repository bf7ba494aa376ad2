"""Mutation testing of the conformance suite: each mutant is the engine with one rule deliberately broken
(a small MonitorService subclass, or one engine function patched for the test). The suite must fail every
mutant on at least one check, and pass the unbroken engine. A suite that cannot fail a wrong server is
decorative (PROTOCOL.md section 11)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from monitor_protocol import delivery as delivery_mod
from monitor_protocol import events as events_mod
from monitor_protocol import filters as filters_mod
from monitor_protocol import leases as leases_mod
from monitor_protocol import netguard as netguard_mod
from monitor_protocol import provenance as provenance_mod
from monitor_protocol import publishing as publishing_mod
from monitor_protocol import service as service_mod
from monitor_protocol import timefmt as timefmt_mod
from monitor_protocol import tokens as tokens_mod
from monitor_protocol import validation as validation_mod
from monitor_protocol import wire as wire_mod
from monitor_protocol.binding import jsonrpc as jsonrpc_mod
from monitor_protocol.conformance import run_suite
from monitor_protocol.conformance.inprocess import InProcessTransport
from monitor_protocol.errors import ProtocolError
from monitor_protocol.monitors import MonitorRules
from monitor_protocol.publishing import PublishRules
from monitor_protocol.service import MonitorService

# ---- the mutants ------------------------------------------------------------------------------------


class SkipCeiling(MonitorService):
    """P1 broken: publishing never checks the provenance ceilings (only vocabulary)."""

    def _validate_publish(self, rec, body):
        try:
            return super()._validate_publish(rec, body)
        except ProtocolError as exc:
            if exc.code not in ("PROVENANCE_CEILING", "TIER_NOT_ASSERTABLE"):
                raise
            trimmed = {k: v for k, v in body.items() if k not in ("on_behalf_of", "origin", "verification")}
            trimmed["tier"] = "measured"
            return super()._validate_publish(rec, trimmed)


class AckBackwards(MonitorService):
    """P4 broken: an ack below the committed cursor moves it back."""

    def _ack(self, sub_id, token, body, *, system):
        try:
            return super()._ack(sub_id, token, body, system=system)
        except ProtocolError as exc:
            if exc.code != "CURSOR_BACKWARDS":
                raise
            sub = self.store.get_subscription(sub_id)
            sub["cursor"] = body["cursor"]
            sub["_last_ack"] = None
            self.store.put_subscription(sub)
            return {"subscription": sub_id, "cursor": body["cursor"], "head": exc.extras["head"], "lag": 0}


class ForgetRefusalLog(MonitorService):
    """P2 broken: a refusal is returned but its rejected observation is never appended."""

    def _reject(self, rec, error, raw, actor):
        return service_mod._LoggedRefusal(error)


class LagOverWholeLog(MonitorService):
    """P5 broken: lag counts everything after the cursor, ignoring the subscription's filter."""

    def _lag(self, rec, sub):
        start = max(sub["cursor"], 1, rec["_floor"])
        return max(0, rec["_head"] - start + 1)


class ActOnRequest(MonitorService):
    """P7 broken: whatever capabilities a subscriber asks for are granted."""

    def _subscribe(self, body, token):
        try:
            return super()._subscribe(body, token)
        except ProtocolError as exc:
            if exc.code != "CAPABILITY_MISSING":
                raise
            asked = list(body["capabilities"])
            out = super()._subscribe({**body, "capabilities": exc.extras["granted"]}, token)
            sub = self.store.get_subscription(out["subscription"]["id"])
            sub["capabilities"] = asked
            self.store.put_subscription(sub)
            out["subscription"]["capabilities"] = asked
            return out


class StaleHolderCompletes(MonitorService):
    """Leases broken: a holder whose lease expired and was taken over may still complete."""

    def _lease(self, sub_id, token, action, body):
        try:
            return super()._lease(sub_id, token, action, body)
        except ProtocolError as exc:
            if exc.code != "LEASE_LOST" or action != "complete":
                raise
            return {"ok": True, "seq": 0, "idempotent": False}


class PullCommits(MonitorService):
    """P4 broken: a pull commits the cursor as if it were an ack."""

    def _pull(self, sub_id, token, cursor, limit, inline, *, system):
        out = super()._pull(sub_id, token, cursor, limit, inline, system=system)
        if cursor is None:
            sub = self.store.get_subscription(sub_id)
            sub["cursor"] = out["next"]
            self.store.put_subscription(sub)
        return out


class FilteredHead(MonitorService):
    """P5 broken: head is reported as the last observation the filter lets through."""

    def _pull(self, sub_id, token, cursor, limit, inline, *, system):
        out = super()._pull(sub_id, token, cursor, limit, inline, system=system)
        sub = self.store.get_subscription(sub_id)
        if sub["filter"] and out["observations"]:
            out["head"] = int(out["observations"][-1]["id"])
        return out


class SecondClaimWins(MonitorService):
    """Leases broken: a claim on a subject someone else holds takes it over."""

    def _claim(self, rec, sub, lease, subject, body, now, holder):
        if lease is not None and lease["holder"] not in (None, holder):
            lease["holder"] = None
        return super()._claim(rec, sub, lease, subject, body, now, holder)


class RetireKeepsLeases(MonitorService):
    """P6 broken: retiring a subscription (by request or mute) does not free its leases."""

    _retiring = False

    def _retire_sub(self, rec, sub, actor, reason, note=None):
        self._retiring = True
        try:
            return super()._retire_sub(rec, sub, actor, reason, note)
        finally:
            self._retiring = False

    def _free_lease(self, rec, lease, action, actor, **kw):
        if self._retiring:
            return 0
        return super()._free_lease(rec, lease, action, actor, **kw)


class NoRedeliveredMark(MonitorService):
    """P4 broken: a second delivery is not marked redelivered."""

    def _pull(self, sub_id, token, cursor, limit, inline, *, system):
        out = super()._pull(sub_id, token, cursor, limit, inline, system=system)
        for obs in out["observations"]:
            obs.pop("redelivered", None)
        out["redelivered"] = 0
        return out


class PrivateListedToAll(MonitorService):
    """P14 broken: every monitor is visible to everyone."""

    def _visible(self, rec, token):
        return True


class InlineFilterWidens(MonitorService):
    """P12 broken: an inline pull filter replaces the subscription's filter instead of narrowing it."""

    def _pull(self, sub_id, token, cursor, limit, inline, *, system):
        if inline is None:
            return super()._pull(sub_id, token, cursor, limit, inline, system=system)
        sub = self.store.get_subscription(sub_id)
        kept = sub["filter"] if sub else None
        if sub:
            sub["filter"] = {}
            self.store.put_subscription(sub)
        try:
            return super()._pull(sub_id, token, cursor, limit, inline, system=system)
        finally:
            if sub:
                sub = self.store.get_subscription(sub_id)
                sub["filter"] = kept
                self.store.put_subscription(sub)


class NeverDeadLetters(MonitorService):
    """Leases broken: rejects never dead-letter a subject."""

    def _free_lease(self, rec, lease, action, actor, **kw):
        seq = super()._free_lease(rec, lease, action, actor, **kw)
        if lease.get("dead_letter"):
            lease["dead_letter"] = False
            self.store.put_lease(lease)
        return seq


class ClaimAnySubject(MonitorService):
    """Leases broken: a subscription may claim a subject its own monitor never published."""

    def _lease(self, sub_id, token, action, body):
        sub = self.store.get_subscription(sub_id) if isinstance(sub_id, str) else None
        if sub and isinstance(body, dict) and isinstance(body.get("subject"), str) and body["subject"]:
            self.store.add_subject(sub["monitor"], body["subject"])
        return super()._lease(sub_id, token, action, body)


class SeekWithoutReason(MonitorService):
    """Seek broken: moving back needs no reason."""

    def _seek(self, sub_id, token, body):
        if isinstance(body, dict) and not body.get("reason"):
            body = {**body, "reason": "(none given)"}
        return super()._seek(sub_id, token, body)


class RenewKeepsOldToken(MonitorService):
    """Renew broken: the new token is minted but the old one is kept (it must be dead at once)."""

    def renew(self, sub_id, token):
        sub = self.store.get_subscription(sub_id)
        old = sub["token_hash"] if sub else None
        out = super().renew(sub_id, token)
        sub = self.store.get_subscription(sub_id)
        sub["token_hash"] = old
        self.store.put_subscription(sub)
        return out


class UnclampedAck(MonitorService):
    """Ack broken: an ack beyond the head is not clamped to head + 1, so later observations are skipped."""

    def _ack(self, sub_id, token, body, *, system):
        out = super()._ack(sub_id, token, body, system=system)
        if isinstance(body, dict) and isinstance(body.get("cursor"), int) and body["cursor"] > out["cursor"]:
            sub = self.store.get_subscription(sub_id)
            sub["cursor"] = body["cursor"]
            self.store.put_subscription(sub)
            out = {**out, "cursor": body["cursor"]}
        return out


class PausedAcceptsWrites(MonitorService):
    """Lifecycle broken: a paused monitor still accepts observations."""

    _forced: dict | None = None

    def _owner_monitor(self, monitor_id, token):
        rec = super()._owner_monitor(monitor_id, token)
        if self._forced is None and rec["_status"] == "paused":
            rec["_status"] = "active"
            self._forced = rec
        return rec

    def _publish(self, monitor_id, body, token, header_key=None):
        self._forced = None
        try:
            return super()._publish(monitor_id, body, token, header_key)
        finally:
            if self._forced is not None:
                self._forced["_status"] = "paused"
                self.store.put_monitor(self._forced)
                self._forced = None


class ConfidenceDefaulted(MonitorService):
    """P3 broken: confidence is given a number while its inputs are missing."""

    def state(self, monitor_id, token):
        out = super().state(monitor_id, token)
        out["confidence"]["value"] = 0.0
        return out


class AckRecomputed(MonitorService):
    """Idempotency broken: a re-sent ack is recomputed instead of returning the prior result."""

    def _ack(self, sub_id, token, body, *, system):
        sub = self.store.get_subscription(sub_id) if isinstance(sub_id, str) else None
        if sub is not None:
            sub["_last_ack"] = None
            self.store.put_subscription(sub)
        return super()._ack(sub_id, token, body, system=system)


def _any_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Auth broken: any non-empty bearer token matches every stored token hash."""
    monkeypatch.setattr(tokens_mod, "matches", lambda token, digest: bool(token) and digest is not None)


def _tokens_from_the_wrong_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribe broken: a subscriber's name is enough to re-key its subscription (no token compared)."""
    real = MonitorService._subscribe

    def _subscribe(self, body, token):
        if isinstance(body, dict) and isinstance(body.get("monitor"), str):
            existing = [
                s
                for s in self.store.list_subscriptions()
                if s["monitor"] == body["monitor"] and s["subscriber"] == body.get("subscriber")
            ]
            if existing and token is None:
                existing[0]["token_hash"] = tokens_mod.digest("anyone")
                self.store.put_subscription(existing[0])
                token = "anyone"
        return real(self, body, token)

    monkeypatch.setattr(MonitorService, "_subscribe", _subscribe)


# ---- mutants of the trust and hardening rules (PROTOCOL.md sections 3, 6-10) ---------------------------


def _speak_for_anyone(mp: pytest.MonkeyPatch) -> None:
    """Rule 6 broken: a token may publish as any person, not only its owner."""
    real = provenance_mod.resolve

    def resolve(owner, actor, body):
        if provenance_mod.is_human(actor) and actor != owner:
            return dataclasses.replace(real(owner, owner, body), actor=actor)
        return real(owner, actor, body)

    mp.setattr(provenance_mod, "resolve", resolve)


def _write_as_the_system(mp: pytest.MonkeyPatch) -> None:
    """Rule 7 broken: a publisher may write as system:... or declare origin system."""
    real = provenance_mod.resolve

    def resolve(owner, actor, body):
        if provenance_mod.is_system(actor) or body.get("origin") == "system":
            trimmed = {k: v for k, v in body.items() if k != "origin"}
            out = real(owner, "agent:stand-in", trimmed)
            return dataclasses.replace(out, actor=actor, origin="system", tier="measured")
        return real(owner, actor, body)

    mp.setattr(provenance_mod, "resolve", resolve)


def _protocol_rows_inherit_the_callers_origin(mp: pytest.MonkeyPatch) -> None:
    """Section 7 broken: a protocol row takes its origin from the caller's name (human:ceo -> human)."""
    real = events_mod.build_protocol

    def build_protocol(**kw):
        event = real(**kw)
        origin = provenance_mod.origin_of_actor(kw["actor"])
        event["origin"] = origin
        event["data"]["provenance"]["origin"] = origin
        return event

    mp.setattr(events_mod, "build_protocol", build_protocol)


def _subscriber_names_need_a_prefix(mp: pytest.MonkeyPatch) -> None:
    """Section 3 broken: a subscriber name without a known prefix is refused (as before the revision)."""
    real = validation_mod.check_actor

    def check_actor(value, name):
        out = real(value, name)
        if name == "subscriber" and not provenance_mod.actor_prefix(out):
            raise validation_mod.invalid("subscriber must be prefixed, e.g. agent:you.")
        return out

    mp.setattr(delivery_mod, "check_actor", check_actor)


def _any_time_accepted(mp: pytest.MonkeyPatch) -> None:
    """Time broken: a publish dated far in the future is accepted."""
    mp.setattr(publishing_mod, "MAX_FUTURE_SECONDS", 10**12)


class ClientClockFreshness(MonitorService):
    """Time broken: freshness (ages, covers_until) comes from the publisher's claimed time."""

    def _publish(self, monitor_id, body, token, header_key=None):
        out = super()._publish(monitor_id, body, token, header_key)
        if not out.get("idempotent"):
            rec = self.store.get_monitor(monitor_id)
            rec["_last"]["ts"] = timefmt_mod.parse(out["observation"]["time"])
            self.store.put_monitor(rec)
        return out


def _disjoint_inline_filters_pass(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: an inline filter disjoint from the subscription's answers an empty page."""
    mp.setattr(filters_mod, "disjoint", lambda a, b: None)


def _nesting_unbounded(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: JSON may nest as deep as the parser allows."""
    mp.setattr(wire_mod, "MAX_JSON_DEPTH", 10**6)


def _nan_accepted(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: NaN, Infinity and lone surrogates are accepted (and served bare)."""
    mp.setattr(wire_mod, "_constant", lambda name: float(name.replace("-Infinity", "-inf")))
    mp.setattr(wire_mod, "_float", float)
    mp.setattr(wire_mod, "problem", lambda value: None)


def _names_unbounded(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: subjects, actors, types and ids may be any length."""
    mp.setattr(validation_mod, "MAX_NAME_CHARS", 10**9)
    mp.setattr(publishing_mod, "MAX_NAME_CHARS", 10**9)


def _filter_text_unbounded(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: a filter's text may be any length (a 480 KB subscribed row)."""
    mp.setattr(filters_mod, "MAX_FILTER_TEXT_CHARS", 10**9)
    mp.setattr(filters_mod, "MAX_FILTER_BYTES", 10**9)


def _unicode_digits(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: any Unicode digit (\u00b2) or padded text counts as an integer."""
    mp.setattr(validation_mod, "is_digits", lambda text: text.strip().lstrip("-+").isdigit())

    real = validation_mod.as_int

    def as_int(value, name, **kw):
        if isinstance(value, str):
            import unicodedata

            value = "".join(str(unicodedata.digit(c, 0)) if c.isdigit() else c for c in value.strip())
        return real(value, name, **kw)

    for mod in (validation_mod, delivery_mod):
        mp.setattr(mod, "as_int", as_int)


def _batch_unbounded(mp: pytest.MonkeyPatch) -> None:
    """Section 10 broken: a JSON-RPC batch may hold any number of calls."""
    mp.setattr(jsonrpc_mod, "MAX_RPC_BATCH", 10**9)


def _no_revocation(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: a grant outlives the definition that allowed it."""
    mp.setattr(MonitorRules, "_revoke_narrowed", lambda self, rec: {})


def _expiry_not_counted(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: an expired lease does not count as an attempt."""
    mp.setitem(leases_mod.COUNTS_AS_ATTEMPT, "expired", False)


def _no_idempotency(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: a repeated idempotency key appends again."""
    mp.setattr(PublishRules, "_idempotency_key", staticmethod(lambda body, header: None))


def _short_subscription_ids(mp: pytest.MonkeyPatch) -> None:
    """Section 4 broken: subscription ids of 4 hex digits (they collide, and replace each other)."""
    mp.setattr(delivery_mod, "SUBSCRIPTION_ID_HEX", 4)


def _any_sink(mp: pytest.MonkeyPatch) -> None:
    """Section 9 broken: push sinks on loopback and link-local addresses are accepted."""
    mp.setattr(netguard_mod, "sink_refusal", lambda url, allowed=(), resolve=None: None)


class ForgetDeliveredPage(MonitorService):
    """Bounded reads broken: a capped page that delivered something is remembered as examined in vain, so
    a reader that crashes before acking never gets it again."""

    def _pull(self, sub_id, token, cursor, limit, inline, *, system):
        out = super()._pull(sub_id, token, cursor, limit, inline, system=system)
        if out.get("scan_capped") and out["observations"] and cursor is None:
            sub = self.store.get_subscription(sub_id)
            sub["_scan_mark"] = [max(sub["cursor"], 1), out["next"] - 1]
            self.store.put_subscription(sub)
        return out


def _no_scan_memory(mp: pytest.MonkeyPatch) -> None:
    """Bounded reads broken: an empty capped page is forgotten, so a reader that does not ack empty pages
    (push, watch, SSE) examines the same rows forever."""
    mp.setattr(delivery_mod.DeliveryRules, "_past_known_misses", staticmethod(lambda sub, start: start))


@dataclass
class Mutant:
    name: str
    service: type[MonitorService] = MonitorService
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    expected: tuple[str, ...] = ()  # checks that are written for this rule (at least one must catch it)


MUTANTS = [
    Mutant("skip the provenance ceiling", SkipCeiling, expected=("C26", "C04")),
    Mutant("ack moves backwards", AckBackwards, expected=("C06",)),
    Mutant("forget to log a refusal", ForgetRefusalLog, expected=("C16", "C26")),
    Mutant("lag over the whole log", LagOverWholeLog, expected=("C07", "X10")),
    Mutant("act granted on request", ActOnRequest, expected=("C28",)),
    Mutant("stale lease holder completes", StaleHolderCompletes, expected=("C13",)),
    Mutant("pull commits the cursor", PullCommits, expected=("C05",)),
    Mutant("head is the filtered head", FilteredHead, expected=("C07",)),
    Mutant("second concurrent claim wins", SecondClaimWins, expected=("C12",)),
    Mutant("retire keeps leases", RetireKeepsLeases, expected=("X15", "C19")),
    Mutant("no redelivered marking", NoRedeliveredMark, expected=("X14",)),
    Mutant("any bearer token accepted", patch=_any_bearer, expected=("C23",)),
    Mutant("private monitors listed to everyone", PrivateListedToAll, expected=("C18",)),
    Mutant("inline filter widens", InlineFilterWidens, expected=("C08",)),
    Mutant("no DEAD_LETTERED after 5 rejects", NeverDeadLetters, expected=("C33",)),
    Mutant("claim a subject from another monitor", ClaimAnySubject, expected=("C34",)),
    Mutant("seek without a reason", SeekWithoutReason, expected=("X01",)),
    Mutant("renew keeps the old token alive", RenewKeepsOldToken, expected=("X02",)),
    Mutant("ack not clamped to head + 1", UnclampedAck, expected=("X17",)),
    Mutant("a subscriber's name is a credential", patch=_tokens_from_the_wrong_place, expected=("C32",)),
    Mutant("a paused monitor accepts writes", PausedAcceptsWrites, expected=("C14", "X07")),
    Mutant("confidence defaulted to a number", ConfidenceDefaulted, expected=("C15", "C29")),
    Mutant("a re-sent ack is recomputed", AckRecomputed, expected=("C20",)),
    Mutant("a token speaks for another person", patch=_speak_for_anyone, expected=("X27",)),
    Mutant("a publisher writes as the system", patch=_write_as_the_system, expected=("X27",)),
    Mutant("protocol rows inherit the caller's origin", patch=_protocol_rows_inherit_the_callers_origin,
           expected=("X25", "X44")),
    Mutant("subscriber names need a prefix", patch=_subscriber_names_need_a_prefix, expected=("X24",)),
    Mutant("a publish dated 2999 is accepted", patch=_any_time_accepted, expected=("X29",)),
    Mutant("freshness from the publisher's clock", ClientClockFreshness, expected=("X29",)),
    Mutant("a disjoint inline filter passes", patch=_disjoint_inline_filters_pass, expected=("X28",)),
    Mutant("JSON nesting unbounded", patch=_nesting_unbounded, expected=("X30",)),
    Mutant("NaN and lone surrogates accepted", patch=_nan_accepted, expected=("X31",)),
    Mutant("names of any length", patch=_names_unbounded, expected=("X32",)),
    Mutant("filter text of any length", patch=_filter_text_unbounded, expected=("X26",)),
    Mutant("Unicode digits are integers", patch=_unicode_digits, expected=("X33",)),
    Mutant("JSON-RPC batches of any size", patch=_batch_unbounded, expected=("X34",)),
    Mutant("grants outlive the definition", patch=_no_revocation, expected=("X35",)),
    Mutant("an expired lease is not an attempt", patch=_expiry_not_counted, expected=("X36",)),
    Mutant("idempotency keys ignored", patch=_no_idempotency, expected=("X37",)),
    Mutant("4-hex subscription ids", patch=_short_subscription_ids, expected=("X38",)),
    Mutant("internal push sinks accepted", patch=_any_sink, expected=("X39",)),
    Mutant("a capped page that delivered is forgotten", ForgetDeliveredPage, expected=("X45",)),
    Mutant("empty capped pages are not remembered", patch=_no_scan_memory, expected=("X45",)),
]  # fmt: skip


async def _run(mutant: Mutant, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as mp:
        if mutant.patch is not None:
            mutant.patch(mp)
        cls = mutant.service
        transport = InProcessTransport.create(service_factory=lambda store, clock: cls(store, clock=clock))
        return await run_suite(transport)


async def test_the_unbroken_engine_passes_every_check():
    transport = InProcessTransport.create(
        service_factory=lambda store, clock: MonitorService(store, clock=clock)
    )
    report = await run_suite(transport)
    assert report.ok, report.table()


async def test_every_mutant_is_caught(monkeypatch):
    rows: list[tuple[str, list[str], bool]] = []
    for mutant in MUTANTS:
        report = await _run(mutant, monkeypatch)
        caught = [r.id for r in report.results if r.status == "fail"]
        rows.append((mutant.name, caught, bool(set(caught) & set(mutant.expected))))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'mutant':<{width}}  caught by", "-" * (width + 40)]
    for name, caught, on_target in rows:
        mark = "" if on_target or not caught else "  (not by its own check)"
        lines.append(f"{name:<{width}}  {', '.join(caught) or 'NOT CAUGHT'}{mark}")
    killed = sum(1 for _, caught, _ in rows if caught)
    lines.append(f"mutation score: {killed}/{len(rows)} = {100 * killed / len(rows):.0f}%")
    print("\n" + "\n".join(lines))
    assert len(MUTANTS) >= 14
    assert killed == len(rows), "\n".join(lines)
    assert all(on_target for _, _, on_target in rows), "\n".join(lines)
