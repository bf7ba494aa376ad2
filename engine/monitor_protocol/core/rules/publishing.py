"""Publishing: vocabulary, provenance ceilings (P1), time, budget, references, idempotency keys; every
refusal logged (P2)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import timefmt, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import MonitorStatus
from monitor_protocol.core.records import (
    Counters,
    LastSeen,
    Monitor,
    Observation,
    PublishKey,
    copier,
    evolve,
    new_counters,
    new_observation,
)
from monitor_protocol.core.rules import events, provenance, state
from monitor_protocol.core.rules.ledger import reject, stage
from monitor_protocol.core.rules.lookups import owner_monitor
from monitor_protocol.core.runtime import LoggedRefusal, ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import check_actor, check_name, invalid
from monitor_protocol.core.vocab import (
    IDEMPOTENCY_KEY_MAX_CHARS,
    IDEMPOTENCY_WINDOW_SECONDS,
    MAX_FUTURE_SECONDS,
    MAX_NAME_CHARS,
    MAX_PUBLISH_BATCH,
    MAX_PUBLISH_BYTES,
    PROJECT_PREFIX,
    PROTOCOL_PREFIX,
    T_CONTRADICTION,
    T_CONTRADICTION_RESOLVED,
    TYPE_PATTERN,
    TYPE_REGEX,
)

MAX_REFERENCES = 64
MAX_TRACKED_ACTORS = 16
PUBLISHABLE_PROTOCOL_TYPES = (T_CONTRADICTION, T_CONTRADICTION_RESOLVED)


def check_idempotency_key(value: Any) -> str:
    """1-128 printable ASCII characters (docs/protocol.md section 8)."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= IDEMPOTENCY_KEY_MAX_CHARS
        or not all(" " <= ch <= "~" for ch in value)
    ):
        raise invalid(
            f"idempotency_key must be 1-{IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters "
            "(e.g. a UUID), sent in the body or as the Idempotency-Key header.",
            limit=IDEMPOTENCY_KEY_MAX_CHARS,
        )
    return value


def _kind(obs_type: str) -> int:
    """What an accepted observation of `obs_type` counts besides itself: 1 a contradiction, 2 its
    resolution, 0 nothing more (the one place for it: a publish, a batch's run and an import's recount)."""
    if obs_type.endswith(".contradiction"):
        return 1
    if obs_type.endswith(".contradiction_resolved"):
        return 2
    return 0


def counted(counters: Counters, obs_type: str) -> Counters:
    """What one accepted publish of `obs_type` adds to a monitor's counters (an import recounts with it)."""
    counters = counters.observed()
    kind = _kind(obs_type)
    if kind == 1:
        return counters.bump(contradictions=1)
    if kind == 2:
        return counters.bump(contradictions_resolved=1)
    return counters


def with_actor(actors: tuple[str, ...], actor: str) -> tuple[str, ...]:
    """The monitor's tracked actors once `actor` has published (the first MAX_TRACKED_ACTORS are kept)."""
    return actors if actor in actors or len(actors) >= MAX_TRACKED_ACTORS else (*actors, actor)


class Run:
    """Accepted publishes of one call not yet written into their monitor. Each publish is judged in order
    as if alone, against what the ones before it changed (the head a reference may name, the day's budget);
    the new version of the monitor is written once per run, when the run is flushed: at the call's end, and
    before a refusal, whose own log row and bookkeeping read the monitor. A lone publish is a run of one,
    so one rule writes both."""

    __slots__ = (
        "base", "now", "head", "added", "contradictions", "resolved", "last_type", "actors", "source_contact",
        "quiet_since", "budget_day", "budget_used",
    )  # fmt: skip

    def __init__(self, base: Monitor, now: float) -> None:
        self.now = now
        self.rebase(base)

    def rebase(self, base: Monitor) -> None:
        """Start again from `base`, the monitor as the transaction now holds it."""
        self.base = base
        self.head = base.head
        self.added = self.contradictions = self.resolved = 0
        self.last_type = ""  # the type of the run's newest observation (its seq is the head)
        self.actors = base.actors
        self.source_contact = base.source_contact
        self.quiet_since = base.quiet_since
        self.budget_day = base.budget_day
        self.budget_used = base.budget_used

    def accepted(self, obs: Observation, actor: str, answered: bool, budget: tuple[str, int] | None) -> None:
        """What one accepted publish changes. Freshness is the server's: the publisher's `time` is its claim,
        kept on the event only; the day's budget is spent in the same new version of the monitor."""
        self.head = obs.seq
        self.added += 1
        self.last_type = type_ = obs.type
        if ".contradiction" in type_:  # the usual observation is neither: one test, not two
            kind = _kind(type_)
            if kind == 1:
                self.contradictions += 1
            elif kind == 2:
                self.resolved += 1
        self.actors = with_actor(self.actors, actor)
        # A source that did not answer (section 12) is no contact with it: the age of the last contact goes
        # on growing, so stale_source means what it says.
        if answered:
            self.source_contact = self.now
            self.quiet_since = None
        elif self.quiet_since is None:
            self.quiet_since = self.now
        if budget is not None:
            self.budget_day, self.budget_used = budget

    def flush(self, tx: Tx) -> Monitor:
        """Write the run's new version of the monitor (nothing when nothing was accepted since the last)."""
        if not self.added:
            return self.base
        c = self.base.counters
        counters = new_counters(
            c.observations + self.added, c.delivered, c.acted, c.rejected,
            c.contradictions + self.contradictions, c.contradictions_resolved + self.resolved,
        )  # fmt: skip
        new = _published(
            self.base, self.head, counters, LastSeen(self.head, self.now, self.last_type), self.actors,
            self.source_contact, self.quiet_since, self.budget_day, self.budget_used,
        )  # fmt: skip
        tx.put_monitor(new)
        self.rebase(new)
        return new


def publish(
    core: ServiceCore, tx: Tx, monitor_id: str, body: Any, token: str | None, header_key: str | None = None
) -> dict[str, Any]:
    rec = owner_monitor(tx, monitor_id, token)
    return _reply(*publish_one(tx, rec, body, header_key))


def _reply(obs: Observation | None, seq: int, repeated: bool | None) -> dict[str, Any]:
    """A lone publish's reply: the observation and its seq (and, with a key, whether it was a repeat)."""
    out: dict[str, Any] = {"observation": obs.to_wire() if obs is not None else None, "seq": seq}
    if repeated is not None:
        out["idempotent"] = repeated
    return out


# One lone publish of several (publish_each): monitor id, body, bearer token, Idempotency-Key header.
Lone = tuple[str, Any, "str | None", "str | None"]


def publish_each(core: ServiceCore, tx: Tx, entries: list[Lone]) -> list[tuple[bool, Any]]:
    """Several lone publishes, each its own request, in one call: each is judged in order as if it were a
    call of its own in the same group commit (its token checked, refused and logged on its own, P2), and each
    monitor's new version is written once (one Run per monitor, as a batch's). Each entry's outcome is
    (True, its reply) or (False, its ProtocolError); a refusal never costs the others theirs."""
    runs: dict[str, Run] = {}
    owned: dict[tuple[str, str | None], Monitor] = {}  # a token already found to own its monitor here
    outcomes: list[tuple[bool, Any]] = []
    for monitor_id, body, token, header_key in entries:
        rec = owned.get((monitor_id, token))
        if rec is None:
            try:
                rec = owned[(monitor_id, token)] = owner_monitor(tx, monitor_id, token)
            except ProtocolError as err:  # a refusal here stages nothing
                outcomes.append((False, err))
                continue
        run = runs.get(rec.id)
        if run is None:
            run = runs[rec.id] = Run(rec, tx.now)  # owner_monitor read it from this transaction
        try:
            outcomes.append((True, _reply(*publish_item(tx, run, body, header_key))))
        except LoggedRefusal as refusal:  # its rejected row stays staged: it commits with the others
            outcomes.append((False, refusal.error))
            current = tx.monitor(rec.id)
            assert current is not None
            run.rebase(current)
    for run in runs.values():
        run.flush(tx)
    return outcomes


def publish_many(
    core: ServiceCore, tx: Tx, monitor_id: str, items: Any, token: str | None, header_key: str | None = None
) -> dict[str, Any]:
    """A batch (a JSON array body, docs/serve.md): each item is published in order as if alone, refused and
    logged on its own (P2), and the whole batch commits once. The reply lists each item's seq or error."""
    rec = owner_monitor(tx, monitor_id, token)
    if header_key is not None:
        raise reject(
            tx,
            rec.id,
            invalid("A batch takes no Idempotency-Key header: give each item its own idempotency_key."),
            items,
            rec.owner,
        )
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_PUBLISH_BATCH:
        raise reject(
            tx,
            rec.id,
            invalid(
                f"A batch is a JSON array of 1 to {MAX_PUBLISH_BATCH} observations; split a longer one.",
                limit=MAX_PUBLISH_BATCH,
            ),
            items,
            rec.owner,
        )
    run = Run(rec, tx.now)  # owner_monitor read it from this transaction
    results: list[dict[str, Any]] = []
    published = 0
    for index, item in enumerate(items):
        try:
            obs, seq, repeated = publish_item(tx, run, item, None)
        except LoggedRefusal as refusal:  # its rejected row stays staged: it commits with the batch
            results.append({"index": index, "status": refusal.error.status, "error": refusal.error.body()})
            current = tx.monitor(rec.id)
            assert current is not None
            run.rebase(current)
            continue
        published += 1
        one: dict[str, Any] = {
            "index": index,
            "seq": seq,
            "id": obs.event.get("id") if obs is not None else None,
        }
        if repeated is not None:
            one["idempotent"] = repeated
        results.append(one)
    run.flush(tx)
    return {
        "monitor": rec.id,
        "published": published,
        "refused": len(results) - published,
        "results": results,
    }


def says_no_answer(body: Any) -> bool:
    """Whether a publish says its source did not answer (section 12: `data.answered: false`, with the
    reason): such an observation is kept like any other, but it is no contact with the source."""
    data = body.get("data") if isinstance(body, dict) else None
    return isinstance(data, dict) and data.get("answered") is False


def publish_one(
    tx: Tx, rec: Monitor, body: Any, header_key: str | None
) -> tuple[Observation | None, int, bool | None]:
    """Publish one observation for an owner already authenticated, or for the monitor's own source run by
    the server (rules/sources.py): (the observation, its seq, whether a key made it a repeat: None without a
    key). A refusal is logged and raised as LoggedRefusal."""
    run = Run(tx.monitor(rec.id) or rec, tx.now)
    out = publish_item(tx, run, body, header_key)
    run.flush(tx)
    return out


def publish_item(
    tx: Tx, run: Run, body: Any, header_key: str | None
) -> tuple[Observation | None, int, bool | None]:
    """One publish of a run (its monitor's new version is the run's to write): publish_one's answer."""
    rec = run.base
    now = run.now
    try:
        key = idempotency_key(body, header_key)
    except ProtocolError as err:
        run.flush(tx)
        raise reject(tx, rec.id, err, body, rec.owner) from None
    if key is not None:
        seen = tx.publish_key(rec.id, key)
        if seen is not None and now - seen.at < IDEMPOTENCY_WINDOW_SECONDS:
            # The first reply again: same seq, nothing appended (a retry after a lost reply).
            return tx.observation(rec.id, seen.seq), seen.seq, True
    try:
        if not rec.active:
            raise ProtocolError(
                "UNAVAILABLE",
                f"Monitor {rec.id} is paused; it accepts no observations until resumed."
                if rec.status is MonitorStatus.PAUSED
                else f"Monitor {rec.id} is {rec.status.value}, which is final: it accepts no more "
                "observations (publish to another monitor).",
                live=state.live_of(rec),
            )
        if not isinstance(body, dict):
            raise invalid(
                'The observation body must be a JSON object such as {"type": "com.example.ci.run"}.'
            )
        wire.check(body)
        check_publish_size(body)
        judged = validate_publish(tx, rec, body, head=run.head)
        budget = spend_budget(rec, now, run.budget_day, run.budget_used)
    except ProtocolError as err:
        current = run.flush(tx)
        if not says_no_answer(body):
            tx.put_monitor(evolve(current, source_contact=now))  # the source was heard from, even refused
        claimed_actor = body.get("actor") if isinstance(body, dict) else None
        raise reject(
            tx, rec.id, err, body, claimed_actor if isinstance(claimed_actor, str) else rec.owner
        ) from None
    prov, type_, subject, t, data, tags, source_ref, rule, derived, supersedes = judged
    seq = run.head + 1
    actor, origin = prov.actor, prov.origin
    event = events.build(
        rec, seq, type_, subject, t, actor, origin, prov.tier, prov.verification, data, tags, prov.on_behalf_of,
        source_ref, rule, derived, supersedes,
    )  # fmt: skip
    obs = new_observation(
        rec.id, seq, type_, subject, actor, origin, prov.tier, event["horizon"] or "", event, 0
    )
    stage(tx, obs)
    run.accepted(obs, actor, not (origin == "probe" and data.get("answered") is False), budget)
    if key is None:
        return obs, seq, None
    tx.put_publish_key(PublishKey(rec.id, key, seq, now))
    return obs, seq, False


def check_publish_size(body: dict[str, Any]) -> None:
    """An observation's publish is at most MAX_PUBLISH_BYTES of compact JSON, whatever the door: measured only
    when the text it was parsed from could be that large (compact JSON of a parsed value is at most ~5 times
    its text, for numbers written short: 1e15), so a door's usual body costs no encoding here."""
    parsed = wire.parsed_size(body)
    if parsed is not None and parsed * 8 <= MAX_PUBLISH_BYTES:
        return
    size = len(wire.encode(body))
    if size > MAX_PUBLISH_BYTES:
        raise ProtocolError(
            "TOO_LARGE",
            f"An observation's publish is at most {MAX_PUBLISH_BYTES} bytes of JSON (1 MiB); this one is "
            f"{size}: send less, or keep the payload elsewhere and publish where it is (source_ref).",
            max_bytes=MAX_PUBLISH_BYTES,
        )


def refuse_publish(tx: Tx, monitor_id: str, token: str | None, error: ProtocolError, raw: str) -> None:
    """A publish whose body could not even be parsed (not JSON, NaN, too deep) is still evidence (P2):
    for the owner, the refusal and a bounded excerpt of the text are logged before the error returns."""
    rec = owner_monitor(tx, monitor_id, token)
    raise reject(tx, rec.id, error, raw, rec.owner)


def idempotency_key(body: Any, header_key: str | None) -> str | None:
    body_key = body.get("idempotency_key") if isinstance(body, dict) else None
    if header_key is not None:
        header_key = check_idempotency_key(header_key)
    if body_key is not None:
        body_key = check_idempotency_key(body_key)
        if header_key is not None and header_key != body_key:
            raise invalid("The Idempotency-Key header and idempotency_key in the body differ; send one.")
    return body_key if body_key is not None else header_key


# What one accepted publish changes in its monitor, in this order (`_published(monitor, *values)`).
_published = copier(
    Monitor,
    ("head", "counters", "last", "actors", "source_contact", "quiet_since", "budget_day", "budget_used"),
)


def spend_budget(
    rec: Monitor, now: float, budget_day: str | None, budget_used: int
) -> tuple[str, int] | None:
    """limits.observations_per_day caps accepted observations per UTC day (429 OVER_BUDGET past it): the
    monitor's budget_day and budget_used once one more observation is accepted, from what they are now (None
    without a cap: they do not change)."""
    cap = rec.limits.get("observations_per_day") if rec.limits else None
    if not isinstance(cap, int) or isinstance(cap, bool):
        return None
    day = timefmt.iso(now)[:10]
    count = budget_used if budget_day == day else 0
    if count >= cap:
        raise ProtocolError(
            "OVER_BUDGET",
            f"Monitor {rec.id} accepts {cap} observations per UTC day and has used them; try after "
            f"{day}T24:00Z or raise limits.observations_per_day.",
            limit=cap,
            window="day",
            day=day,
        )
    return day, count + 1


PUBLISH_FIELDS = frozenset(
    {
        "type", "subject", "data", "tags", "actor", "origin", "tier", "verification", "on_behalf_of",
        "time", "source_ref", "rule", "wasDerivedFrom", "supersedes", "idempotency_key",
    }
)  # fmt: skip


# What a publish's body says once judged, in events.build's order: (provenance, type, subject, time, data,
# tags, source_ref, rule, wasDerivedFrom, supersedes).
Judged = tuple[
    provenance.Provenance, str, str | None, float, dict[str, Any], dict[str, Any], str | None, str | None,
    list[dict[str, str]], dict[str, str] | None,
]  # fmt: skip


def validate_publish(tx: Tx, rec: Monitor, body: dict[str, Any], *, head: int | None = None) -> Judged:
    """The event's fields from a publish's body, judged for monitor `rec` whose log's head is `head` (what
    a reference may name: rec.head unless a run has appended since)."""
    known_fields = PUBLISH_FIELDS
    unknown = [] if body.keys() <= known_fields else sorted(set(body) - known_fields)
    if unknown:
        raise invalid(
            f"Unknown observation field(s) {[u[:64] for u in unknown[:10]]}; known: {sorted(known_fields)}.",
            invalid=[u[:64] for u in unknown[:10]],
        )
    type_ = body.get("type")
    declared = rec.types or []
    if isinstance(type_, str) and len(type_) > MAX_NAME_CHARS:
        check_name(type_, "type", "com.example.ci.run")  # a limit (section 10): 400 INVALID
    if not isinstance(type_, str) or len(type_) > MAX_NAME_CHARS or not TYPE_PATTERN.match(type_):
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"type is required and must be reverse-DNS of at most {MAX_NAME_CHARS} characters, "
            "e.g. com.example.ci.run.",
            field="type",
            invalid=type_[:MAX_NAME_CHARS] if isinstance(type_, str) else None,
            known=declared or [TYPE_REGEX],
        )
    if type_.startswith(PROJECT_PREFIX):
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Type {type_} is written only by this server (its sources' supervision); publish your own "
            "reverse-DNS type.",
            field="type",
            invalid=type_,
            known=declared or [TYPE_REGEX],
        )
    if type_.startswith(PROTOCOL_PREFIX) and type_ not in PUBLISHABLE_PROTOCOL_TYPES:
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Type {type_} is written only by the protocol itself; publish your own reverse-DNS type.",
            field="type",
            invalid=type_,
            known=declared or list(PUBLISHABLE_PROTOCOL_TYPES),
        )
    if declared and type_ not in declared and type_ not in PUBLISHABLE_PROTOCOL_TYPES:
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Type {type_} is not declared by monitor {rec.id}; use one of {declared}.",
            field="type",
            invalid=type_,
            known=declared,
        )
    actor = check_actor(body.get("actor", rec.owner), "actor")
    prov = provenance.resolve(rec.owner, actor, body)
    subject = body.get("subject")
    if subject is not None:
        check_name(subject, "subject", '"build-412"')
    data = body.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise invalid("data must be a JSON object (your fields stay at its top level).")
    if "tags" in data or "provenance" in data:
        reserved = sorted({"tags", "provenance"} & set(data))
        hints = {
            "tags": "send tags in the request's tags field",
            "provenance": "the server writes provenance; send tier, origin, verification, actor or "
            "on_behalf_of in the request's own fields",
        }
        raise invalid(f"data may not carry {reserved}: " + "; ".join(hints[k] for k in reserved) + ".")
    tags = body.get("tags", {})
    if tags is None:
        tags = {}
    if not isinstance(tags, dict):
        raise invalid('tags must be an object such as {"env": "prod"}.')
    now = tx.now
    t = now
    if "time" in body and body["time"] is not None:
        t = timefmt.parse(body["time"]) if isinstance(body["time"], str) else None
        if t is None:
            raise invalid("time must be RFC 3339, e.g. 2026-09-22T17:10:11.188Z.")
        if t > now + MAX_FUTURE_SECONDS:
            raise invalid(
                f"time {body['time']} is more than {MAX_FUTURE_SECONDS} s ahead of the server's clock "
                f"({timefmt.iso(now)}); send when the event happened, by a clock that is set.",
                server_time=timefmt.iso(now),
                limit=MAX_FUTURE_SECONDS,
            )
    source_ref, rule = body.get("source_ref"), body.get("rule")
    if source_ref is not None:
        check_name(source_ref, "source_ref", '"build-412"')
    if rule is not None:
        check_name(rule, "rule", '"build-412"')
    derived = body.get("wasDerivedFrom")
    if derived is None:  # absent or null: derived from nothing; 0, "" or {} are refused (P11), not read as []
        derived = []
    if derived != []:
        if not isinstance(derived, list) or len(derived) > MAX_REFERENCES:
            raise invalid(
                f'wasDerivedFrom must be an array of at most {MAX_REFERENCES} {{"source", "id"}} objects.'
            )
        derived = [_reference(rec, item, "wasDerivedFrom") for item in derived]
    supersedes = body.get("supersedes")
    if supersedes is not None:
        supersedes = _reference(rec, supersedes, "supersedes", head=rec.head if head is None else head)
    return prov, type_, subject, t, data, tags, source_ref, rule, derived, supersedes


def _reference(rec: Monitor, value: Any, name: str, *, head: int | None = None) -> dict[str, str]:
    """A {source, id} reference; a bare seq (int or decimal string) names this monitor's log. With `head`,
    one of this monitor's observations must exist at it (1..head)."""
    own = events.source_of(rec.id)
    if isinstance(value, bool):
        raise invalid(f'{name} must be a seq or {{"source", "id"}}.')
    if isinstance(value, int) or (isinstance(value, str) and value.isascii() and value.isdigit()):
        value = {"source": own, "id": str(int(value))}
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("source"), str)
        or not isinstance(value.get("id"), str | int)
        or isinstance(value.get("id"), bool)
    ):
        raise invalid(f'{name} must be a seq or an object {{"source": "monitor:<id>", "id": "<seq>"}}.')
    ref = {
        "source": check_name(value["source"], f"{name}.source", '"monitor:ci"'),
        "id": check_name(str(value["id"]), f"{name}.id", '"4"'),
    }
    if head is not None and ref["source"] == own:
        seq = int(ref["id"]) if ref["id"].isascii() and ref["id"].isdigit() and len(ref["id"]) < 17 else -1
        if not 1 <= seq <= head:
            raise ProtocolError(
                "NOT_FOUND",
                f"{name} names observation {ref['id']} of {own}, which does not exist.",
                field=name,
            )
    return ref
