"""Mutation testing of the conformance suite: each mutant is the engine with one rule deliberately broken
(one rule function patched for the test, or a small MonitorService subclass). The suite must fail every
mutant on at least one check, and pass the unbroken engine. A suite that cannot fail a wrong server is
decorative (docs/protocol.md section 11).

A rule is a plain function `rule(core, tx, ...)` that reads through the Tx and stages new (frozen) record
versions in it; a mutant wraps the real function where the engine looks it up: the facade calls
`module.function` through the module attribute, and a rule module calls what it imported from ledger or
lookups through its own global name (so `publishing_mod.reject`, not `ledger_mod.reject`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import pytest
from monitor_protocol.api import jsonrpc as jsonrpc_mod
from monitor_protocol.conformance import run_suite
from monitor_protocol.conformance.inprocess import InProcessTransport
from monitor_protocol.core import filters as filters_mod
from monitor_protocol.core import lifecycles as states_mod
from monitor_protocol.core import netguard as netguard_mod
from monitor_protocol.core import timefmt as timefmt_mod
from monitor_protocol.core import tokens as tokens_mod
from monitor_protocol.core import validation as validation_mod
from monitor_protocol.core import wire as wire_mod
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus
from monitor_protocol.core.rules import delivery as delivery_mod
from monitor_protocol.core.rules import events as events_mod
from monitor_protocol.core.rules import leases as leases_mod
from monitor_protocol.core.rules import ledger as ledger_mod
from monitor_protocol.core.rules import lookups as lookups_mod
from monitor_protocol.core.rules import monitors as monitors_mod
from monitor_protocol.core.rules import pages as pages_mod
from monitor_protocol.core.rules import provenance as provenance_mod
from monitor_protocol.core.rules import publishing as publishing_mod
from monitor_protocol.core.rules import upkeep as upkeep_mod
from monitor_protocol.core.service import LoggedRefusal, MonitorService

Wrapper = Callable[..., Any]


def _wrap(
    mp: pytest.MonkeyPatch, modules: tuple[ModuleType, ...], name: str, make: Callable[[Wrapper], Wrapper]
) -> None:
    """Replace `name` in each module (where that module looks it up) by `make(the real function)`."""
    for module in modules:
        mp.setattr(module, name, make(getattr(module, name)))


def _sub_of(tx: Any, sub_id: Any) -> Any:
    """The subscription as this call sees it (staged or stored), or None for an id that names none."""
    return tx.subscription(sub_id) if isinstance(sub_id, str) else None


# ---- the mutants ------------------------------------------------------------------------------------


def _skip_ceiling(mp: pytest.MonkeyPatch) -> None:
    """P1 broken: publishing never checks the provenance ceilings (only vocabulary)."""

    def make(real: Wrapper) -> Wrapper:
        def validate_publish(tx, rec, body, **kw):
            try:
                return real(tx, rec, body, **kw)
            except ProtocolError as exc:
                if exc.code not in ("PROVENANCE_CEILING", "TIER_NOT_ASSERTABLE"):
                    raise
                trimmed = {
                    k: v for k, v in body.items() if k not in ("on_behalf_of", "origin", "verification")
                }
                trimmed["tier"] = "measured"
                return real(tx, rec, trimmed, **kw)

        return validate_publish

    _wrap(mp, (publishing_mod,), "validate_publish", make)


def _ack_backwards(mp: pytest.MonkeyPatch) -> None:
    """P4 broken: an ack below the committed cursor moves it back."""

    def make(real: Wrapper) -> Wrapper:
        def ack(core, tx, sub_id, token, body, *, system):
            try:
                return real(core, tx, sub_id, token, body, system=system)
            except ProtocolError as exc:
                if exc.code != "CURSOR_BACKWARDS":
                    raise
                sub = tx.subscription(sub_id)
                tx.put_subscription(replace(sub, cursor=body["cursor"], last_ack=None))
                return {
                    "subscription": sub_id,
                    "cursor": body["cursor"],
                    "head": exc.extras["head"],
                    "lag": 0,
                }

        return ack

    _wrap(mp, (delivery_mod,), "ack", make)


def _forget_refusal_log(mp: pytest.MonkeyPatch) -> None:
    """P2 broken: a refusal is returned but its rejected observation is never appended."""
    mp.setattr(publishing_mod, "reject", lambda tx, monitor_id, error, raw, actor: LoggedRefusal(error))


def _lag_over_whole_log(mp: pytest.MonkeyPatch) -> None:
    """P5 broken: lag counts everything after the cursor, ignoring the subscription's filter."""

    def lag_count(tx, rec, sub, memo=None):
        start = max(sub.cursor, 1, rec.floor)
        return max(0, rec.head - start + 1), False

    for module in (delivery_mod, ledger_mod):  # every lag shown: a subscription's, a pull's, an ack's
        mp.setattr(module, "lag_count", lag_count)


def _act_on_request(mp: pytest.MonkeyPatch) -> None:
    """P7 broken: whatever capabilities a subscriber asks for are granted."""

    def make(real: Wrapper) -> Wrapper:
        def subscribe(core, tx, body, token):
            try:
                return real(core, tx, body, token)
            except ProtocolError as exc:
                if exc.code != "CAPABILITY_MISSING":
                    raise
                asked = list(body["capabilities"])
                out = real(core, tx, {**body, "capabilities": exc.extras["granted"]}, token)
                sub = tx.subscription(out["subscription"]["id"])
                tx.put_subscription(replace(sub, capabilities=asked))
                out["subscription"]["capabilities"] = asked
                return out

        return subscribe

    _wrap(mp, (delivery_mod,), "subscribe", make)


def _stale_holder_completes(mp: pytest.MonkeyPatch) -> None:
    """Leases broken: a holder whose lease expired and was taken over may still complete."""

    def make(real: Wrapper) -> Wrapper:
        def lease(core, tx, sub_id, token, action, body):
            try:
                return real(core, tx, sub_id, token, action, body)
            except ProtocolError as exc:
                if exc.code != "LEASE_LOST" or action != "complete":
                    raise
                return {"ok": True, "seq": 0, "idempotent": False}

        return lease

    _wrap(mp, (leases_mod,), "lease", make)


def _pull_commits(mp: pytest.MonkeyPatch) -> None:
    """P4 broken: a pull commits the cursor as if it were an ack."""

    def make(real: Wrapper) -> Wrapper:
        def pull(core, tx, sub_id, token, cursor, limit, inline, *, system, **kw):
            out = real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            if cursor is None:
                tx.put_subscription(replace(tx.subscription(sub_id), cursor=out["next"]))
            return out

        return pull

    _wrap(mp, (delivery_mod,), "pull", make)


def _filtered_head(mp: pytest.MonkeyPatch) -> None:
    """P5 broken: head is reported as the last observation the filter lets through."""

    def make(real: Wrapper) -> Wrapper:
        def pull(core, tx, sub_id, token, cursor, limit, inline, *, system, **kw):
            out = real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            if tx.subscription(sub_id).filter and out["observations"]:
                out["head"] = int(out["observations"][-1]["id"])
            return out

        return pull

    _wrap(mp, (delivery_mod,), "pull", make)


def _second_claim_wins(mp: pytest.MonkeyPatch) -> None:
    """Leases broken: a claim on a subject someone else holds takes it over."""

    def make(real: Wrapper) -> Wrapper:
        def _claim(core, tx, rec, sub, current, subject, body, holder):
            if current is not None and current.holder not in (None, holder):
                current = replace(current, holder=None)
            return real(core, tx, rec, sub, current, subject, body, holder)

        return _claim

    _wrap(mp, (leases_mod,), "_claim", make)


def _retire_keeps_leases(mp: pytest.MonkeyPatch) -> None:
    """P6 broken: retiring a subscription (by request or mute) does not free its leases."""
    retiring = [False]

    def make_retire(real: Wrapper) -> Wrapper:
        def retire_subscription(core, tx, sub, actor, reason, note=None):
            retiring[0] = True
            try:
                return real(core, tx, sub, actor, reason, note)
            finally:
                retiring[0] = False

        return retire_subscription

    def make_free(real: Wrapper) -> Wrapper:
        def free_lease(core, tx, lease, action, actor, **kw):
            if retiring[0]:
                return lease, 0
            return real(core, tx, lease, action, actor, **kw)

        return free_lease

    # every rule that retires a subscription, and the free_lease that retire_subscription calls (ledger's)
    _wrap(mp, (delivery_mod, monitors_mod, upkeep_mod), "retire_subscription", make_retire)
    _wrap(mp, (ledger_mod,), "free_lease", make_free)


def _no_redelivered_mark(mp: pytest.MonkeyPatch) -> None:
    """P4 broken: a second delivery is not marked redelivered."""

    def make(real: Wrapper) -> Wrapper:
        def pull(core, tx, sub_id, token, cursor, limit, inline, *, system, **kw):
            out = real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            for obs in out["observations"]:
                obs.pop("redelivered", None)
            out["redelivered"] = 0
            return out

        return pull

    _wrap(mp, (delivery_mod,), "pull", make)


def _private_listed_to_all(mp: pytest.MonkeyPatch) -> None:
    """P14 broken: every monitor is visible to everyone."""
    mp.setattr(lookups_mod.Viewer, "sees", lambda self, rec: True)


def _inline_filter_widens(mp: pytest.MonkeyPatch) -> None:
    """P12 broken: an inline pull filter replaces the subscription's filter instead of narrowing it."""

    def make(real: Wrapper) -> Wrapper:
        def pull(core, tx, sub_id, token, cursor, limit, inline, *, system, **kw):
            sub = _sub_of(tx, sub_id)
            if inline is None or sub is None:
                return real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            kept = sub.filter
            tx.put_subscription(replace(sub, filter={}))
            try:
                return real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            finally:
                tx.put_subscription(replace(tx.subscription(sub_id), filter=kept))

        return pull

    _wrap(mp, (delivery_mod,), "pull", make)


def _never_dead_letters(mp: pytest.MonkeyPatch) -> None:
    """Leases broken: rejects never dead-letter a subject."""

    def make(real: Wrapper) -> Wrapper:
        def free_lease(core, tx, lease, action, actor, **kw):
            freed, seq = real(core, tx, lease, action, actor, **kw)
            if freed.dead_letter:
                freed = tx.put_lease(replace(freed, state=LeaseState.FREE))
            return freed, seq

        return free_lease

    # every module that frees a lease (its own imported name)
    _wrap(mp, (leases_mod, ledger_mod, monitors_mod, upkeep_mod), "free_lease", make)


def _claim_any_subject(mp: pytest.MonkeyPatch) -> None:
    """Leases broken: a subscription may claim a subject its own monitor never published."""

    def make(real: Wrapper) -> Wrapper:
        def lease(core, tx, sub_id, token, action, body):
            sub = _sub_of(tx, sub_id)
            if sub and isinstance(body, dict) and isinstance(body.get("subject"), str) and body["subject"]:
                tx.add_subject(sub.monitor, body["subject"])
            return real(core, tx, sub_id, token, action, body)

        return lease

    _wrap(mp, (leases_mod,), "lease", make)


def _seek_without_reason(mp: pytest.MonkeyPatch) -> None:
    """Seek broken: moving back needs no reason."""

    def make(real: Wrapper) -> Wrapper:
        def seek(core, tx, sub_id, token, body):
            if isinstance(body, dict) and not body.get("reason"):
                body = {**body, "reason": "(none given)"}
            return real(core, tx, sub_id, token, body)

        return seek

    _wrap(mp, (delivery_mod,), "seek", make)


def _renew_keeps_old_token(mp: pytest.MonkeyPatch) -> None:
    """Renew broken: the new token is minted but the old one is kept (it must be dead at once)."""

    def make(real: Wrapper) -> Wrapper:
        def renew(core, tx, sub_id, token):
            sub = _sub_of(tx, sub_id)
            old = sub.token_hash if sub else None
            out = real(core, tx, sub_id, token)
            tx.put_subscription(replace(tx.subscription(sub_id), token_hash=old))
            return out

        return renew

    _wrap(mp, (delivery_mod,), "renew", make)


def _unclamped_ack(mp: pytest.MonkeyPatch) -> None:
    """Ack broken: an ack beyond the head is not clamped to head + 1, so later observations are skipped."""

    def make(real: Wrapper) -> Wrapper:
        def ack(core, tx, sub_id, token, body, *, system):
            out = real(core, tx, sub_id, token, body, system=system)
            if (
                isinstance(body, dict)
                and isinstance(body.get("cursor"), int)
                and body["cursor"] > out["cursor"]
            ):
                tx.put_subscription(replace(tx.subscription(sub_id), cursor=body["cursor"]))
                out = {**out, "cursor": body["cursor"]}
            return out

        return ack

    _wrap(mp, (delivery_mod,), "ack", make)


def _paused_accepts_writes(mp: pytest.MonkeyPatch) -> None:
    """Lifecycle broken: a paused monitor still accepts observations."""
    forced: list[str] = []  # the monitor this publish made active for the while
    publishing = [False]

    def make_owner(real: Wrapper) -> Wrapper:
        def owner_monitor(tx, monitor_id, token):
            rec = real(tx, monitor_id, token)
            if publishing[0] and not forced and rec.status is MonitorStatus.PAUSED:
                rec = tx.put_monitor(replace(rec, status=MonitorStatus.ACTIVE))
                forced.append(rec.id)
            return rec

        return owner_monitor

    def make_publish(real: Wrapper) -> Wrapper:
        def publish(core, tx, monitor_id, body, token, header_key=None):
            forced.clear()
            publishing[0] = True
            try:
                return real(core, tx, monitor_id, body, token, header_key)
            finally:
                publishing[0] = False
                if forced:
                    tx.put_monitor(replace(tx.monitor(forced[0]), status=MonitorStatus.PAUSED))
                    forced.clear()

        return publish

    _wrap(mp, (publishing_mod,), "owner_monitor", make_owner)
    _wrap(mp, (publishing_mod,), "publish", make_publish)


class ConfidenceDefaulted(MonitorService):
    """P3 broken: confidence is given a number while its inputs are missing."""

    def state(self, monitor_id, token):
        out = super().state(monitor_id, token)
        out["confidence"]["value"] = 0.0
        return out


def _ack_recomputed(mp: pytest.MonkeyPatch) -> None:
    """Idempotency broken: a re-sent ack is recomputed instead of returning the prior result."""

    def make(real: Wrapper) -> Wrapper:
        def ack(core, tx, sub_id, token, body, *, system):
            sub = _sub_of(tx, sub_id)
            if sub is not None:
                tx.put_subscription(replace(sub, last_ack=None))
            return real(core, tx, sub_id, token, body, system=system)

        return ack

    _wrap(mp, (delivery_mod,), "ack", make)


def _any_bearer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Auth broken: any non-empty bearer token matches every stored token hash."""
    monkeypatch.setattr(tokens_mod, "matches", lambda token, digest: bool(token) and digest is not None)


def _tokens_from_the_wrong_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribe broken: a subscriber's name is enough to re-key its subscription (no token compared)."""

    def make(real: Wrapper) -> Wrapper:
        def subscribe(core, tx, body, token):
            if isinstance(body, dict) and isinstance(body.get("monitor"), str):
                existing = [
                    s for s in tx.subscriptions(body["monitor"]) if s.subscriber == body.get("subscriber")
                ]
                if existing and token is None:
                    tx.put_subscription(replace(existing[0], token_hash=tokens_mod.digest("anyone")))
                    token = "anyone"
            return real(core, tx, body, token)

        return subscribe

    _wrap(monkeypatch, (delivery_mod,), "subscribe", make)


# ---- mutants of the trust and hardening rules (docs/protocol.md sections 3, 6-10) ---------------------------


def _speak_for_anyone(mp: pytest.MonkeyPatch) -> None:
    """Rule 6 broken: a token may publish as any person, not only its owner."""
    real = provenance_mod.resolve

    def resolve(owner, actor, body):
        if provenance_mod.is_human(actor) and actor != owner:
            return replace(real(owner, owner, body), actor=actor)
        return real(owner, actor, body)

    mp.setattr(provenance_mod, "resolve", resolve)


def _write_as_the_system(mp: pytest.MonkeyPatch) -> None:
    """Rule 7 broken: a publisher may write as system:... or declare origin system."""
    real = provenance_mod.resolve

    def resolve(owner, actor, body):
        if provenance_mod.is_system(actor) or body.get("origin") == "system":
            trimmed = {k: v for k, v in body.items() if k != "origin"}
            out = real(owner, "agent:stand-in", trimmed)
            return replace(out, actor=actor, origin="system", tier="measured")
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


def _client_clock_freshness(mp: pytest.MonkeyPatch) -> None:
    """Time broken: freshness (ages, covers_until) comes from the publisher's claimed time."""

    def make(real: Wrapper) -> Wrapper:
        def publish(core, tx, monitor_id, body, token, header_key=None):
            out = real(core, tx, monitor_id, body, token, header_key)
            if not out.get("idempotent"):
                rec = tx.monitor(monitor_id)
                claimed = timefmt_mod.parse(out["observation"]["time"])
                tx.put_monitor(replace(rec, last=replace(rec.last, ts=claimed)))
            return out

        return publish

    _wrap(mp, (publishing_mod,), "publish", make)


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
    mp.setattr(monitors_mod, "revoke_narrowed", lambda core, tx, monitor_id: {})


def _expiry_not_counted(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: an expired lease does not count as an attempt."""
    mp.setitem(states_mod.COUNTS_AS_ATTEMPT, "expired", False)  # the one table ledger and states read


def _no_idempotency(mp: pytest.MonkeyPatch) -> None:
    """Section 8 broken: a repeated idempotency key appends again."""
    mp.setattr(publishing_mod, "idempotency_key", lambda body, header_key: None)


def _short_subscription_ids(mp: pytest.MonkeyPatch) -> None:
    """Section 4 broken: subscription ids of 4 hex digits (they collide, and replace each other)."""
    mp.setattr(delivery_mod, "SUBSCRIPTION_ID_HEX", 4)


def _any_sink(mp: pytest.MonkeyPatch) -> None:
    """Section 9 broken: push sinks on loopback and link-local addresses are accepted."""
    mp.setattr(netguard_mod, "sink_refusal", lambda url, allowed=(), resolve=None: None)


def _forget_delivered_page(mp: pytest.MonkeyPatch) -> None:
    """Bounded reads broken: a capped page that delivered something is remembered as examined in vain, so
    a reader that crashes before acking never gets it again."""

    def make(real: Wrapper) -> Wrapper:
        def pull(core, tx, sub_id, token, cursor, limit, inline, *, system, **kw):
            out = real(core, tx, sub_id, token, cursor, limit, inline, system=system, **kw)
            if out.get("scan_capped") and out["observations"] and cursor is None:
                sub = tx.subscription(sub_id)
                tx.put_subscription(replace(sub, scan_mark=(max(sub.cursor, 1), out["next"] - 1)))
            return out

        return pull

    _wrap(mp, (delivery_mod,), "pull", make)


def _no_scan_memory(mp: pytest.MonkeyPatch) -> None:
    """Bounded reads broken: an empty capped page is forgotten, so a reader that does not ack empty pages
    (push, watch, SSE) examines the same rows forever."""
    for module in (
        pages_mod,
        delivery_mod,
        ledger_mod,
    ):  # the pull's page, its mark, and lag's (ledger.lag_count)
        mp.setattr(module, "past_known_misses", lambda sub, start: start)


@dataclass
class Mutant:
    name: str
    service: type[MonitorService] = MonitorService
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    expected: tuple[str, ...] = ()  # checks that are written for this rule (at least one must catch it)


MUTANTS = [
    Mutant("skip the provenance ceiling", patch=_skip_ceiling, expected=("C26", "C04")),
    Mutant("ack moves backwards", patch=_ack_backwards, expected=("C06",)),
    Mutant("forget to log a refusal", patch=_forget_refusal_log, expected=("C16", "X55")),
    Mutant("lag over the whole log", patch=_lag_over_whole_log, expected=("C07", "X10")),
    Mutant("act granted on request", patch=_act_on_request, expected=("C28",)),
    Mutant("stale lease holder completes", patch=_stale_holder_completes, expected=("C13",)),
    Mutant("pull commits the cursor", patch=_pull_commits, expected=("C05",)),
    Mutant("head is the filtered head", patch=_filtered_head, expected=("C07",)),
    Mutant("second concurrent claim wins", patch=_second_claim_wins, expected=("C12",)),
    Mutant("retire keeps leases", patch=_retire_keeps_leases, expected=("X15", "C19")),
    Mutant("no redelivered marking", patch=_no_redelivered_mark, expected=("X14",)),
    Mutant("any bearer token accepted", patch=_any_bearer, expected=("C23",)),
    Mutant("private monitors listed to everyone", patch=_private_listed_to_all, expected=("C18",)),
    Mutant("inline filter widens", patch=_inline_filter_widens, expected=("C08",)),
    Mutant("no DEAD_LETTERED after 5 rejects", patch=_never_dead_letters, expected=("C33",)),
    Mutant("claim a subject from another monitor", patch=_claim_any_subject, expected=("C34",)),
    Mutant("seek without a reason", patch=_seek_without_reason, expected=("X01",)),
    Mutant("renew keeps the old token alive", patch=_renew_keeps_old_token, expected=("X02",)),
    Mutant("ack not clamped to head + 1", patch=_unclamped_ack, expected=("X17",)),
    Mutant("a subscriber's name is a credential", patch=_tokens_from_the_wrong_place, expected=("C32",)),
    Mutant("a paused monitor accepts writes", patch=_paused_accepts_writes, expected=("C14", "X07")),
    Mutant("confidence defaulted to a number", ConfidenceDefaulted, expected=("C15", "X53")),
    Mutant("a re-sent ack is recomputed", patch=_ack_recomputed, expected=("X52",)),
    Mutant("a token speaks for another person", patch=_speak_for_anyone, expected=("X27",)),
    Mutant("a publisher writes as the system", patch=_write_as_the_system, expected=("X27",)),
    Mutant("protocol rows inherit the caller's origin", patch=_protocol_rows_inherit_the_callers_origin,
           expected=("X25", "X44")),
    Mutant("subscriber names need a prefix", patch=_subscriber_names_need_a_prefix, expected=("X24",)),
    Mutant("a publish dated 2999 is accepted", patch=_any_time_accepted, expected=("X29",)),
    Mutant("freshness from the publisher's clock", patch=_client_clock_freshness, expected=("X29",)),
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
    Mutant("a capped page that delivered is forgotten", patch=_forget_delivered_page, expected=("X45",)),
    Mutant("empty capped pages are not remembered", patch=_no_scan_memory, expected=("X45",)),
]  # fmt: skip


def _forget_what_the_rules_remembered() -> None:
    """The engine remembers names and claims its rules found good (validation._GOOD_ACTORS,
    provenance._RESOLVED). What a mutant's broken rule let in must not be remembered as good by the next
    mutant, or by the tests that run after these in the same process (a 257-character subscriber name)."""
    validation_mod._GOOD_ACTORS.clear()
    provenance_mod._RESOLVED.clear()


async def _run(mutant: Mutant, monkeypatch: pytest.MonkeyPatch) -> Any:
    _forget_what_the_rules_remembered()
    try:
        with monkeypatch.context() as mp:
            if mutant.patch is not None:
                mutant.patch(mp)
            cls = mutant.service
            transport = InProcessTransport.create(
                service_factory=lambda store, clock: cls(store, clock=clock)
            )
            return await run_suite(transport)
    finally:
        _forget_what_the_rules_remembered()


async def test_the_unbroken_engine_passes_every_check():
    transport = InProcessTransport.create(
        service_factory=lambda store, clock: MonitorService(store, clock=clock)
    )
    report = await run_suite(transport)
    assert report.ok, report.table()


def _crashed(note: str) -> bool:
    """A failure because the server answered 5xx: the mutant broke the engine, not the rule (a mutant whose
    wrapper no longer fits the function it wraps would be "caught" by every check, proving nothing)."""
    return "(never 500)" in note


async def test_every_mutant_is_caught(monkeypatch):
    rows: list[tuple[str, list[str], bool]] = []
    for mutant in MUTANTS:
        report = await _run(mutant, monkeypatch)
        caught = [r.id for r in report.results if r.status == "fail"]
        # on target: one of the checks written for this rule fails on the rule itself, not on a crash
        genuine = {r.id for r in report.results if r.status == "fail" and not _crashed(r.note)}
        rows.append((mutant.name, caught, bool(genuine & set(mutant.expected))))
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'mutant':<{width}}  caught by", "-" * (width + 40)]
    for name, caught, on_target in rows:
        mark = "" if on_target or not caught else "  (not by its own check, or only by a crash)"
        lines.append(f"{name:<{width}}  {', '.join(caught) or 'NOT CAUGHT'}{mark}")
    killed = sum(1 for _, caught, _ in rows if caught)
    lines.append(f"mutation score: {killed}/{len(rows)} = {100 * killed / len(rows):.0f}%")
    print("\n" + "\n".join(lines))
    assert len(MUTANTS) >= 14
    assert killed == len(rows), "\n".join(lines)
    assert all(on_target for _, _, on_target in rows), "\n".join(lines)
