"""Monitors: create (ids, tokens, attestation, defaults), list/get with visibility, state, update,
pause/resume/retire, each logged as a configured observation (P10)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import cron, filters, listing_seal, tokens
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import MONITOR_ACTIONS, MonitorStatus, monitor_next
from monitor_protocol.core.records import DEFINITION_FIELDS, Counters, Monitor, Subscription, evolve
from monitor_protocol.core.rules import events, state
from monitor_protocol.core.rules.ledger import append_protocol, free_lease, retire_subscription
from monitor_protocol.core.rules.lookups import Viewer, monitor_of, owner_monitor, visible_monitor
from monitor_protocol.core.rules.provenance import is_system
from monitor_protocol.core.runtime import ServiceCore
from monitor_protocol.core.sources import SETTINGS_KEYS
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import (
    as_int,
    check_actor,
    check_json_size,
    check_monitor_id,
    check_name,
    check_reason,
    check_vocab,
    check_vocab_list,
    invalid,
    json_kind,
    refuse_unknown,
    require_object,
)
from monitor_protocol.core.vocab import (
    CAPABILITIES,
    HORIZONS,
    MAX_DEFINITION_BYTES,
    MAX_HEARTBEAT_SECONDS,
    MAX_INTEGER,
    MONITORS_PAGE_MAX,
    MONITORS_PAGE_SCAN,
    RULE_ACTION_PATTERN,
    RULE_ACTION_REGEX,
    RUNNABLE_SOURCE_KINDS,
    SOURCE_KINDS,
    T_CONFIGURED,
    TYPE_PATTERN,
    TYPE_REGEX,
    VISIBILITIES,
)

DEFAULT_DEFINITION: dict[str, Any] = {
    "description": None,
    "source": {"kind": "log"},
    "filter": {},
    "horizon": "event",
    "capabilities": ["observe"],
    "cadence": {},
    "ttl_seconds": None,
    "retire_after_mute_seconds": None,
    "budget": None,
    "visibility": "private",
    "rules": [],
    "types": [],
    "default_grant": ["observe"],
    "limits": {},
}


def validate_definition(
    body: dict[str, Any], rec: dict[str, Any], *, known_settings: bool = True
) -> dict[str, Any]:
    """Validate the definable fields present in `body` and copy them onto the definition `rec` (create
    and update); return it. `known_settings`: a runnable source's settings must be ones this server knows
    (create and update; an imported log keeps the definitions it was written with, which this server's
    supervisor refuses to run with a sentence if it must), and cadence, budget and limits typed as the
    published schema types them (an imported log's are only objects, as earlier releases checked)."""
    for key in DEFINITION_FIELDS:
        if key not in body:
            continue
        value = body[key]
        if key == "name":
            if not isinstance(value, str) or not value.strip():
                raise invalid("name must be a non-empty string.")
            check_name(value, "name", '"CI runs"')
        elif key == "description":
            if value is not None and not isinstance(value, str):
                raise invalid("description must be a string or null.")
            if value is not None:
                check_json_size(value, "description", 4096)
        elif key == "source":
            if not isinstance(value, dict):
                raise invalid('source must be an object such as {"kind": "log"}.')
            value = dict(value)
            value.setdefault("kind", "log")
            check_vocab(value["kind"], SOURCE_KINDS, "source.kind")
            if "ref" in value and not isinstance(value["ref"], str):
                raise invalid("source.ref must be a string.")
            if "settings" in value and not isinstance(value["settings"], dict):
                raise invalid("source.settings must be an object.")
            if known_settings and value["kind"] in RUNNABLE_SOURCE_KINDS:  # here, not later by its runner
                unknown = sorted(set(value.get("settings") or {}) - SETTINGS_KEYS)
                if unknown:
                    raise invalid(
                        f"Unknown source.settings {[u[:64] for u in unknown[:8]]}; known: {sorted(SETTINGS_KEYS)}. "
                        "How often it runs is the monitor's cadence: cadence.event_driven true for a long-lived "
                        "command (a line each), heartbeat_seconds or schedule for a periodic one.",
                        invalid=[u[:64] for u in unknown[:8]],
                    )
        elif key == "filter":
            value = filters.validate(value, body.get("types", rec.get("types", [])))
        elif key == "horizon":
            check_vocab(value, HORIZONS, "horizon")
        elif key in ("capabilities", "default_grant"):
            value = check_vocab_list(value, CAPABILITIES, key)
        elif key == "cadence":
            check_cadence(value, strict=known_settings)
        elif key in ("ttl_seconds", "retire_after_mute_seconds"):
            if value is not None:
                value = as_int(value, key, minimum=1, text=False)
        elif key == "budget":
            check_budget(value, strict=known_settings)
        elif key == "visibility":
            check_vocab(value, VISIBILITIES, "visibility")
        elif key == "rules":
            if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                raise invalid("rules must be an array of objects with id, when and then.")
            value = [check_rule(r, body.get("types", rec.get("types", []))) for r in value]
        elif key == "types":
            if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                raise invalid("types must be an array of reverse-DNS strings.")
            for t in value:
                check_name(t, "types[]", "com.example.ci.run")
            bad = [t for t in value if not TYPE_PATTERN.match(t)]
            if bad:
                raise ProtocolError(
                    "UNKNOWN_VOCABULARY",
                    f"Type(s) {bad} are not reverse-DNS; send names like com.example.ci.run.",
                    field="types",
                    invalid=bad,
                    known=[TYPE_REGEX],
                )
            value = list(dict.fromkeys(value))
        elif key == "limits":
            check_limits(value, strict=known_settings)
        rec[key] = value
    check_json_size(
        {k: rec.get(k) for k in DEFINITION_FIELDS}, "The monitor definition", MAX_DEFINITION_BYTES
    )  # a configured row carries it (section 7: protocol rows stay small)
    missing = [c for c in rec["default_grant"] if c not in rec["capabilities"]]
    if missing:
        raise invalid(
            f"default_grant must be a subset of capabilities; {missing} are not in {rec['capabilities']}.",
            invalid=missing,
        )
    return rec


def check_cadence(value: Any, *, strict: bool = True) -> None:
    """`cadence` as the published schema types it (a served monitor must validate), checked when written
    rather than when a source first runs: heartbeat_seconds an integer of seconds, schedule a cron
    expression this server can run, event_driven a boolean. Other members are stored as given."""
    if not isinstance(value, dict):
        raise invalid('cadence must be an object such as {"heartbeat_seconds": 60}.')
    if not strict:  # an imported log keeps the definitions earlier releases accepted (an object)
        return
    if "heartbeat_seconds" in value:
        as_int(
            value["heartbeat_seconds"],
            "cadence.heartbeat_seconds",
            minimum=1,
            maximum=MAX_HEARTBEAT_SECONDS,
            text=False,
        )
    if "schedule" in value:
        try:
            cron.parse(value["schedule"])
        except cron.CronError as exc:
            raise invalid(str(exc)) from None
    if "event_driven" in value and not isinstance(value["event_driven"], bool):
        raise invalid("cadence.event_driven must be true or false.")


def check_budget(value: Any, *, strict: bool = True) -> None:
    """`budget`: null, or an object whose `currency` is a string and `per_day` a number (the published
    schema), and whose `observations_per_minute` (a source's rate, section 12) is an integer of at least 1."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid('budget must be an object such as {"per_day": 5, "currency": "USD"}, or null.')
    if not strict:
        return
    if "currency" in value:
        if not isinstance(value["currency"], str):
            raise invalid('budget.currency must be a string such as "USD".')
        check_name(value["currency"], "budget.currency", '"USD"')
    per_day = value.get("per_day")
    if "per_day" in value and (
        isinstance(per_day, bool) or not isinstance(per_day, int | float) or not 0 <= per_day <= MAX_INTEGER
    ):
        raise invalid(f"budget.per_day must be a number from 0 to 2^53, not {json_kind(per_day)[:60]}.")
    if "observations_per_minute" in value:
        as_int(value["observations_per_minute"], "budget.observations_per_minute", minimum=1, text=False)


def check_limits(value: Any, *, strict: bool = True) -> None:
    """`limits`: an object; the two members this server reads are checked (section 4 of docs/protocol.md),
    others are stored as given."""
    if not isinstance(value, dict):
        raise invalid('limits must be an object such as {"observations_per_day": 1000}.')
    if "observations_per_day" in value:
        as_int(value["observations_per_day"], "limits.observations_per_day", minimum=1, text=False)
    if strict and "require_evidence" in value and not isinstance(value["require_evidence"], bool):
        raise invalid("limits.require_evidence must be true or false.")


def registration_attested(core: ServiceCore, token: str | None, what: str = "create a monitor") -> bool:
    """Whether `token` is the server's registration token (a monitor made with it is attested); when the
    server requires one, a missing or wrong token is refused, naming what it was needed for."""
    if core.registration_token is None:
        return False
    if not token or not tokens.matches(token, tokens.digest(core.registration_token)):
        raise ProtocolError(
            "UNAUTHORIZED",
            f"This server requires its registration token to {what}.",
            needs="registration_token",
        )
    return True


def check_rule(rule: dict[str, Any], types: list[str]) -> dict[str, Any]:
    """One of a monitor's rules as the published schema has it: {id, when, then, version?, derived_from?,
    reason?}, with `when` normalised as a monitor's filter is (`{"types": "a.b"}` is stored as a list). It
    is stored, never run (P9), but it is served, so it must be what readers can parse."""
    if not isinstance(rule.get("id"), str) or "when" not in rule or not isinstance(rule.get("then"), str):
        raise invalid("Each rule needs a string id, a when filter and a then action.")
    check_name(rule["id"], "rules[].id", '"page-on-fail"')
    if not RULE_ACTION_PATTERN.match(rule["then"]):
        raise invalid(
            f"A rule's then is one of log, annotate, label, escalate:<who>, run:<what> or notify:human, not "
            f"{rule['then'][:64]!r}.",
            invalid=rule["then"][:64],
            known=[RULE_ACTION_REGEX],
        )
    for name in ("version", "reason"):
        if name in rule and not isinstance(rule[name], str):
            raise invalid(f"A rule's {name} is a string when given.")
    derived = rule.get("derived_from", [])
    if not isinstance(derived, list) or not all(isinstance(d, str) for d in derived):
        raise invalid("A rule's derived_from is an array of strings when given.")
    return {**rule, "when": filters.validate(rule["when"], types)}


# What a creation takes: the definition, and the call's own members.
CREATE_FIELDS = frozenset(DEFINITION_FIELDS) | {"id", "owner", "subscribe_token", "reason", "rule"}


def create_monitor(core: ServiceCore, tx: Tx, body: Any, token: str | None) -> dict[str, Any]:
    body = require_object(body, "monitor")
    attested = registration_attested(core, token)
    monitor_id = check_monitor_id(body.get("id"), "id", '"ci"')
    if tx.monitor(monitor_id) is not None:
        raise ProtocolError("DUPLICATE", f"A monitor {monitor_id!r} already exists.", monitor=monitor_id)
    refuse_unknown(body, "monitor", CREATE_FIELDS)
    owner = body.get("owner", "human:owner" if attested else "agent:owner")
    check_actor(owner, "owner")
    if is_system(owner):
        raise invalid("owner may not be system:...: only the server writes as the system.")
    reason = check_reason(body.get("reason"), "reason")
    rule = check_reason(body.get("rule"), "rule")
    defn: dict[str, Any] = {"name": monitor_id, **DEFAULT_DEFINITION}
    if "default_grant" not in body and "capabilities" in body and isinstance(body["capabilities"], list):
        defn["default_grant"] = ["observe"] if "observe" in body["capabilities"] else []
    validate_definition(body, defn)
    want_subscribe = body.get("subscribe_token", False)
    if not isinstance(want_subscribe, bool):
        raise invalid("subscribe_token must be true or false.")
    owner_token = tokens.mint("mpo")
    subscribe_token = tokens.mint("mps") if defn["visibility"] == "shared" or want_subscribe else None
    rec = Monitor(
        id=monitor_id,
        owner=owner,
        owner_hash=tokens.digest(owner_token),
        created=tx.now,
        updated=tx.now,
        attested=attested,
        subscribe_hash=tokens.digest(subscribe_token) if subscribe_token else None,
        counters=Counters(),
        **defn,
    )
    tx.put_monitor(rec)
    seq = _configured(tx, rec.id, "create", None, None, reason, rule)
    out: dict[str, Any] = {"monitor": _served(tx, rec.id), "owner_token": owner_token}
    if subscribe_token:
        out["subscribe_token"] = subscribe_token
    out["seq"] = seq
    out["notice"] = (
        "Keep the owner_token: it is shown once and stored only as a hash. It publishes and configures."
        + (" The subscribe_token lets others subscribe to this shared monitor." if subscribe_token else "")
    )
    return out


def _served(tx: Tx, monitor_id: str) -> dict[str, Any]:
    rec = tx.monitor(monitor_id)
    assert rec is not None
    return rec.to_wire()


def _configured(
    tx: Tx,
    monitor_id: str,
    action: str,
    before: dict[str, Any] | None,
    diff: Any,
    reason: Any,
    rule: Any,
    extra: dict[str, Any] | None = None,
) -> int:
    rec = tx.monitor(monitor_id)
    assert rec is not None
    after = rec.to_wire()
    after["head"] = rec.head + 1  # `after` is the monitor as served once this row is in the log
    payload = {
        "action": action,
        "before_digest": events.canonical_digest(before) if before is not None else None,
        "after": after,
        "diff": diff,
        "rule": rule,
        "reason": reason,
        "actor": rec.owner,
        **(extra or {}),
    }
    return append_protocol(tx, monitor_id, T_CONFIGURED, rec.owner, payload).seq


def list_monitors(
    core: ServiceCore, tx: Tx, token: str | None, limit: Any = None, after: Any = None
) -> dict[str, Any]:
    """The monitors this token may see, by id, a page at a time (this server's extension, EXT_MONITOR_PAGES):
    at most `limit` of them past `after`, reading at most MONITORS_PAGE_SCAN records. `next` is the `after`
    of the next page, null once the listing is whole; where the page ended on a monitor the caller may not
    see, its id is sealed (core/listing_seal.py)."""
    lim = MONITORS_PAGE_MAX if limit is None else as_int(limit, "limit", minimum=1, maximum=MONITORS_PAGE_MAX)
    viewer = Viewer(tx, token)
    start, anchor, count = _listing_start(core, tx, viewer, after)
    shown: list[dict[str, Any]] = []
    left = MONITORS_PAGE_SCAN
    while True:
        want = min(MONITORS_PAGE_MAX, left)  # whole chunks whatever `limit`: a bound on the reads too
        page, more = tx.monitors_page(start, want)
        left -= len(page)
        for i, m in enumerate(page):
            if viewer.sees(m):
                shown.append(m.to_wire())
                anchor, count = m.id, 0
                if len(shown) == lim:
                    return _listing(shown, m.id if more or i + 1 < len(page) else None, token)
        if not more:  # the whole listing is read
            return _listing(shown, None, token)
        start = page[-1].id
        if left <= 0:  # as many records as one call may read: the caller goes on from here
            sealed = start != anchor
            boundary = listing_seal.seal(core.listing_key, anchor, start, count + 1) if sealed else start
            return _listing(shown, boundary, token)


def _listing_start(core: ServiceCore, tx: Tx, viewer: Viewer, after: Any) -> tuple[str, str, int]:
    """(where the page starts, the last id the caller was shown, the sealed pages since) for `after`: a seal
    this server made, or an id the caller may see. Any other id is refused: a page from an arbitrary point
    says whether a visible monitor lies within the records one call reads, and a search over such points
    found private ids (a tester's report)."""
    if after is None:
        return "", "", 0
    asked = check_name(after, "after", "the `next` of the previous page")
    opened = listing_seal.opened(core.listing_key, asked)
    start, anchor, count = opened if opened is not None else (asked, asked, 0)
    rec = tx.monitor(anchor) if count == 0 and anchor else None  # an id, or the anchor of a seal not ours
    if count == 0 and anchor and (rec is None or not viewer.sees(rec)):
        raise invalid(
            f"after {asked[:80]!r} is not where a page of yours ended: send the `next` of the previous page "
            "(or no after, to start the listing)."
        )
    return start, anchor, count


def _listing(shown: list[dict[str, Any]], after: str | None, token: str | None) -> dict[str, Any]:
    return {"monitors": shown, "next": after, "ttlMs": 5000, "cacheScope": "private" if token else "public"}


def get_monitor(core: ServiceCore, tx: Tx, monitor_id: str, token: str | None) -> dict[str, Any]:
    return visible_monitor(tx, monitor_id, token).to_wire()


def monitor_state(core: ServiceCore, tx: Tx, monitor_id: str, token: str | None) -> dict[str, Any]:
    rec = visible_monitor(tx, monitor_id, token)
    active = tx.count_active_subscriptions(rec.id)
    return state.compute(
        rec, tx.now, active, core.last_pull_of(rec), sources_here=getattr(core, "sources_here", False)
    )


# What an update, pause, resume or retire body may hold (anything else is refused, naming it).
CONFIGURE_FIELDS = {
    "update": frozenset(("patch", "reason", "rule")),
    **{action: frozenset(("reason", "rule")) for action in ("pause", "resume", "retire")},
}


def configure(
    core: ServiceCore, tx: Tx, monitor_id: str, action: str, body: Any, token: str | None
) -> dict[str, Any]:
    rec = owner_monitor(tx, monitor_id, token)
    if action not in MONITOR_ACTIONS:
        raise ProtocolError("NOT_FOUND", f"No action {action!r}; use update, pause, resume or retire.")
    body = require_object(body, action, CONFIGURE_FIELDS[action])
    reason = check_reason(body.get("reason"), "reason")
    rule = check_reason(body.get("rule"), "rule")
    before = rec.to_wire()
    status = monitor_next(rec.status, action)
    if status is None:
        raise ProtocolError(
            "UNAVAILABLE",
            f"Monitor {monitor_id} is {rec.status.value}; it can no longer be {action}d.",
            live=state.live_of(rec),
        )
    out: dict[str, Any] = {}
    extra: dict[str, Any] | None = None
    if action == "update":
        patch = body.get("patch")
        if not isinstance(patch, dict) or not patch:
            raise invalid('update needs {"patch": {field: value, ...}} with at least one field.')
        unknown = sorted(set(patch) - set(DEFINITION_FIELDS))
        if unknown:
            raise invalid(
                f"These fields cannot be updated: {unknown}; updatable: {list(DEFINITION_FIELDS)}.",
                invalid=unknown,
            )
        defn = validate_definition(patch, rec.definition())
        diff = {
            k: {"before": before.get(k), "after": defn.get(k)} for k in patch if before.get(k) != defn.get(k)
        }
        rec = tx.put_monitor(evolve(rec, **defn, version=rec.version + 1, updated=tx.now))
        if rec.visibility == "shared" and not rec.subscribe_hash:
            subscribe_token = tokens.mint("mps")
            rec = tx.put_monitor(evolve(rec, subscribe_hash=tokens.digest(subscribe_token)))
            out["subscribe_token"] = subscribe_token
        if {"visibility", "capabilities", "default_grant"} & set(diff):
            extra = revoke_narrowed(core, tx, rec.id)
        if "retire_after_mute_seconds" in diff:
            core.deadlines_moved()  # its readers' mute windows may now end sooner than the sweep expects
    else:
        rec = tx.put_monitor(evolve(rec, status=status, updated=tx.now))
        if status is MonitorStatus.RETIRED:
            for lease in tx.leases(rec.id):
                if lease.holder is not None:
                    free_lease(core, tx, lease, "release", rec.owner, reason="monitor retired")
        diff = {"active": {"before": before["active"], "after": status is MonitorStatus.ACTIVE}}
    seq = _configured(tx, rec.id, action, before, diff, reason, rule, extra)
    out.update({"monitor": _served(tx, rec.id), "seq": seq})
    return out


def allowed_now(rec: Monitor, sub: Subscription) -> list[str] | None:
    """What this subscription could be granted under the definition as it is now (None: it could not
    subscribe at all). The basis is how it was granted: the owner's token, the subscribe token, or none."""
    if sub.grant == "owner":
        return list(rec.capabilities)
    if sub.grant == "subscribe" and rec.visibility != "private":
        return list(rec.capabilities)
    if rec.visibility in ("private", "shared"):
        return None
    return [c for c in rec.default_grant if c in rec.capabilities]


def revoke_narrowed(core: ServiceCore, tx: Tx, monitor_id: str) -> dict[str, Any]:
    """A grant never outlives the definition that allowed it (section 8): shrink every subscription's
    capabilities to what it could be granted now, and retire (reason revoked, cursor kept) those that
    could no longer subscribe at all."""
    rec = monitor_of(tx, monitor_id)
    narrowed: list[str] = []
    revoked: list[str] = []
    for sub in tx.subscriptions(rec.id):
        allowed = allowed_now(rec, sub)
        if allowed is None:
            if not sub.revoked:
                revoked.append(sub.id)
                sub = tx.put_subscription(evolve(sub, revoked=True))
                if sub.active:
                    retire_subscription(core, tx, sub, rec.owner, "revoked")
            continue
        kept = [c for c in sub.capabilities if c in allowed]
        if kept != list(sub.capabilities):
            narrowed.append(sub.id)
            tx.put_subscription(evolve(sub, capabilities=kept))
            holder = f"sub:{sub.id}"
            if "act" not in kept:
                for lease in tx.leases(rec.id):
                    if lease.holder == holder:
                        free_lease(core, tx, lease, "release", rec.owner, reason="act revoked")
    return {"revoked": revoked, "narrowed": narrowed} if revoked or narrowed else {}
