"""MonitorService: every rule of the Monitor Protocol v0 (PROTOCOL.md sections 1-8) over a Store.

No I/O of its own, standard library only, an injectable clock: it runs unchanged in CPython, in Pyodide and
under tests. Each public method is one store transaction and returns the REST success body of section 5, or
raises ProtocolError. A refusal that must be logged (P2) commits its rejected observation, then raises."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from typing import Any

from . import events, filters, provenance, state, timefmt, tokens
from .errors import ProtocolError
from .store.base import Record, Store
from .vocab import (
    ACTOR_PATTERN,
    CAPABILITIES,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMIT,
    DEFAULT_RETIRE_AFTER_MUTE_SECONDS,
    DELIVERY_COUNT_LIMIT,
    EXTENSION_ID,
    HORIZONS,
    LAG_COUNT_CAP,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    MAX_WAIT_SECONDS,
    MONITOR_ID_PATTERN,
    PROTOCOL_PREFIX,
    PROTOCOL_VERSION,
    PROTOCOLS,
    RESET_POLICIES,
    SOURCE_KINDS,
    T_BOOKMARK,
    T_CONFIGURED,
    T_CONTRADICTION,
    T_CONTRADICTION_RESOLVED,
    T_LEASE,
    T_REJECTED,
    T_SUBSCRIBED,
    T_SUBSCRIPTION_RETIRED,
    TYPE_PATTERN,
    VISIBILITIES,
)

SERVER_NAME = "monitor-protocol-python"
SERVER_VERSION = "0.1.0"
PUBLISHABLE_PROTOCOL_TYPES = (T_CONTRADICTION, T_CONTRADICTION_RESOLVED)
UPDATABLE_FIELDS = (
    "name",
    "description",
    "source",
    "filter",
    "horizon",
    "capabilities",
    "cadence",
    "ttl_seconds",
    "retire_after_mute_seconds",
    "budget",
    "visibility",
    "rules",
    "types",
    "default_grant",
    "limits",
)
MAX_TRACKED_ACTORS = 16

Listener = Callable[[str, int], None]


def _invalid(message: str, **extras: Any) -> ProtocolError:
    return ProtocolError("INVALID", message, **extras)


def _as_int(value: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Integers only (a JSON number without a fraction, or a decimal string from a query)."""
    if isinstance(value, bool):
        raise _invalid(f"{name} must be an integer, not a boolean.")
    if isinstance(value, str):
        text = value.strip()
        if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            raise _invalid(f"{name} must be an integer, not {value!r}.")
        value = int(text)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise _invalid(f"{name} must be an integer, not {type(value).__name__}.")
    if minimum is not None and value < minimum:
        raise _invalid(f"{name} must be at least {minimum} (got {value}).")
    if maximum is not None and value > maximum:
        raise _invalid(f"{name} must be at most {maximum} (got {value}).")
    return value


def _require_object(body: Any, what: str) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise _invalid(f"The {what} body must be a JSON object.")
    return body


def _check_actor(value: Any, name: str) -> str:
    if not isinstance(value, str) or not ACTOR_PATTERN.match(value):
        raise _invalid(
            f"{name} must be an actor such as human:you, agent:claude or probe:ci (got {value!r})."
        )
    return value


def _check_vocab(value: Any, known: tuple[str, ...], name: str) -> str:
    if value not in known:
        raise ProtocolError(
            "UNKNOWN_VOCABULARY",
            f"Unknown {name} {value!r}; use one of {', '.join(known)}.",
            field=name,
            invalid=value,
            known=list(known),
        )
    return value


def _check_vocab_list(value: Any, known: tuple[str, ...], name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _invalid(f"{name} must be an array of strings from {list(known)}.")
    for v in value:
        _check_vocab(v, known, name)
    return list(dict.fromkeys(value))


class MonitorService:
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = _time.time,
        registration_token: str | None = None,
        retire_after_mute_seconds: int | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.registration_token = registration_token
        self.default_retire_after_mute = retire_after_mute_seconds or DEFAULT_RETIRE_AFTER_MUTE_SECONDS
        self._listeners: list[Listener] = []
        self._next_deadline: float | None = None  # recomputed by sweep(); None = must scan
        self._deadline_known = False

    # ================================================================================ infrastructure
    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _notify(self, appended: dict[str, int]) -> None:
        for monitor_id, head in appended.items():
            for fn in list(self._listeners):
                try:
                    fn(monitor_id, head)
                except Exception:  # a broken listener must never undo a committed append
                    pass

    def _call(self, fn: Callable[[], Any], *, lazy_sweep: bool = True) -> Any:
        """One engine call = one store transaction; listeners hear about appends after the commit."""
        if lazy_sweep:
            self._maybe_sweep()
        self._appended: dict[str, int] = {}
        deferred: ProtocolError | None = None
        with self.store.transaction():
            try:
                result = fn()
            except _LoggedRefusal as refusal:  # the rejected row commits, then the error is raised
                deferred = refusal.error
        appended, self._appended = self._appended, {}
        self._notify(appended)
        if deferred is not None:
            raise deferred
        return result

    def _now(self) -> float:
        return float(self.clock())

    # ================================================================================ records
    def _monitor_rec(self, monitor_id: Any) -> Record:
        if not isinstance(monitor_id, str):
            raise _invalid("The monitor id must be a string.")
        rec = self.store.get_monitor(monitor_id)
        if rec is None:
            raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
        return rec

    @staticmethod
    def served_monitor(rec: Record) -> dict[str, Any]:
        out = {k: v for k, v in rec.items() if not k.startswith("_")}
        out["active"] = rec["_status"] == "active"
        out["head"] = rec["_head"]
        return out

    def _visible(self, rec: Record, token: str | None) -> bool:
        if rec["visibility"] == "public":
            return True
        if tokens.matches(token, rec["_owner_hash"]):
            return True
        if rec["visibility"] == "shared" and tokens.matches(token, rec.get("_subscribe_hash")):
            return True
        if token:
            sub = self.store.find_subscription_by_token(tokens.digest(token))
            if sub is not None and sub["monitor"] == rec["id"]:
                return True
        return False

    def _visible_monitor(self, monitor_id: Any, token: str | None) -> Record:
        rec = self._monitor_rec(monitor_id)
        if not self._visible(rec, token):
            raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
        return rec

    def _owner_monitor(self, monitor_id: Any, token: str | None) -> Record:
        rec = self._monitor_rec(monitor_id)
        if not tokens.matches(token, rec["_owner_hash"]):
            raise ProtocolError(
                "UNAUTHORIZED",
                "This needs the monitor's owner token: send Authorization: Bearer <owner_token>.",
            )
        return rec

    def _subscription(self, sub_id: Any, token: str | None, *, allow_retired: bool = False) -> Record:
        if not isinstance(sub_id, str):
            raise _invalid("The subscription id must be a string.")
        sub = self.store.get_subscription(sub_id)
        if sub is None:
            raise ProtocolError("NOT_FOUND", f"No subscription {sub_id!r} here.", subscription=sub_id)
        if not tokens.matches(token, sub["token_hash"]):
            raise ProtocolError(
                "UNAUTHORIZED",
                "This needs the subscription's reader token: send Authorization: Bearer <token>.",
            )
        if not sub["active"] and not allow_retired:
            raise ProtocolError(
                "NOT_FOUND",
                f"Subscription {sub_id} is retired; subscribe again with the same subscriber to reactivate it.",
                retired=True,
                cursor=sub["cursor"],
                subscription=sub_id,
            )
        return sub

    @staticmethod
    def served_subscription(sub: Record, lag: int | None = None) -> dict[str, Any]:
        out = {k: v for k, v in sub.items() if k not in _PRIVATE_SUB_FIELDS}
        if lag is not None:
            out["lag"] = lag
        return out

    @staticmethod
    def served_lease(lease: Record) -> dict[str, Any]:
        return {k: v for k, v in lease.items() if k != "monitor" and not k.startswith("_")}

    # ================================================================================ the log
    def _append(
        self, rec: Record, type_: str, build: Callable[[int], dict[str, Any]], *, subject: str | None
    ) -> dict[str, Any]:
        """Append the event `build(seq)` at the next seq of this monitor's log and return it."""
        seq = rec["_head"] + 1
        event = build(seq)
        self.store.append(rec["id"], seq, event)
        rec["_head"] = seq
        if subject is not None and not type_.startswith(PROTOCOL_PREFIX):
            self.store.add_subject(rec["id"], subject)
        self._appended[rec["id"]] = seq
        return event

    def _append_protocol(
        self, rec: Record, type_: str, actor: str, payload: dict[str, Any], *, subject: str | None = None
    ) -> int:
        now = self._now()
        event = self._append(
            rec,
            type_,
            lambda s: events.build_protocol(
                monitor=rec, seq=s, type_=type_, subject=subject, time=now, actor=actor, payload=payload
            ),
            subject=subject,
        )
        seq = int(event["id"])
        if type_ == T_REJECTED:
            rec["_counters"]["rejected"] += 1
        return seq

    def _reject(self, rec: Record, error: ProtocolError, raw: Any, actor: str) -> _LoggedRefusal:
        """P2: the refused payload is kept as evidence; the caller raises what this returns."""
        seq = self._append_protocol(
            rec,
            T_REJECTED,
            "system:guard",
            {"code": error.code, "reason": error.message, "raw": raw, "actor": actor},
        )
        self.store.put_monitor(rec)
        error.extras["rejected_seq"] = seq
        return _LoggedRefusal(error)

    # ================================================================================ discovery
    def discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": [PROTOCOL_VERSION],
            "protocol": "monitor-protocol",
            "capabilities": {
                "monitors": True,
                "feeds": {"pull": True, "http": True, "mcp": True, "sse": True},
                "leases": {"delivery_count_limit": DELIVERY_COUNT_LIMIT},
                "extensions": {EXTENSION_ID: {"version": PROTOCOL_VERSION}},
            },
            "limits": {
                "max_limit": MAX_LIMIT,
                "default_limit": DEFAULT_LIMIT,
                "max_wait_seconds": MAX_WAIT_SECONDS,
                "lease_duration_seconds": {
                    "default": DEFAULT_LEASE_SECONDS,
                    "min": 1,
                    "max": MAX_LEASE_SECONDS,
                },
                "delivery_count_limit": DELIVERY_COUNT_LIMIT,
                "retire_after_mute_seconds": self.default_retire_after_mute,
                "lag_count_cap": LAG_COUNT_CAP,
                "registration_required": self.registration_token is not None,
            },
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION, "implementation": "python"},
            "ttlMs": 60000,
            "cacheScope": "public",
        }

    # ================================================================================ monitors
    def _validate_definition(self, body: dict[str, Any], rec: Record) -> None:
        """Validate the definable fields present in `body` and copy them onto `rec` (create and update)."""
        for key in UPDATABLE_FIELDS:
            if key not in body:
                continue
            value = body[key]
            if key == "name":
                if not isinstance(value, str) or not value.strip():
                    raise _invalid("name must be a non-empty string.")
            elif key == "description":
                if value is not None and not isinstance(value, str):
                    raise _invalid("description must be a string or null.")
            elif key == "source":
                if not isinstance(value, dict):
                    raise _invalid('source must be an object such as {"kind": "log"}.')
                value = dict(value)
                value.setdefault("kind", "log")
                _check_vocab(value["kind"], SOURCE_KINDS, "source.kind")
                if "ref" in value and not isinstance(value["ref"], str):
                    raise _invalid("source.ref must be a string.")
                if "settings" in value and not isinstance(value["settings"], dict):
                    raise _invalid("source.settings must be an object.")
            elif key == "filter":
                value = filters.validate(value, body.get("types", rec.get("types", [])))
            elif key == "horizon":
                _check_vocab(value, HORIZONS, "horizon")
            elif key in ("capabilities", "default_grant"):
                value = _check_vocab_list(value, CAPABILITIES, key)
            elif key == "cadence":
                if not isinstance(value, dict):
                    raise _invalid('cadence must be an object such as {"heartbeat_seconds": 60}.')
            elif key in ("ttl_seconds", "retire_after_mute_seconds"):
                if value is not None:
                    value = _as_int(value, key, minimum=1)
            elif key == "budget":
                if value is not None and not isinstance(value, dict):
                    raise _invalid("budget must be an object or null.")
            elif key == "visibility":
                _check_vocab(value, VISIBILITIES, "visibility")
            elif key == "rules":
                if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                    raise _invalid("rules must be an array of objects with id, when and then.")
                for r in value:
                    if (
                        not isinstance(r.get("id"), str)
                        or "when" not in r
                        or not isinstance(r.get("then"), str)
                    ):
                        raise _invalid("Each rule needs a string id, a when filter and a then action.")
                    filters.validate(r["when"], body.get("types", rec.get("types", [])))
            elif key == "types":
                if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                    raise _invalid("types must be an array of reverse-DNS strings.")
                bad = [t for t in value if not TYPE_PATTERN.match(t)]
                if bad:
                    raise ProtocolError(
                        "UNKNOWN_VOCABULARY",
                        f"Type(s) {bad} are not reverse-DNS; send names like com.example.ci.run.",
                        field="types",
                        invalid=bad,
                        known=["^[a-z0-9]+(\\.[a-z0-9_-]+)+$"],
                    )
                value = list(dict.fromkeys(value))
            elif key == "limits":
                if not isinstance(value, dict):
                    raise _invalid("limits must be an object.")
                if "observations_per_day" in value:
                    _as_int(value["observations_per_day"], "limits.observations_per_day", minimum=1)
            rec[key] = value
        missing = [c for c in rec["default_grant"] if c not in rec["capabilities"]]
        if missing:
            raise _invalid(
                f"default_grant must be a subset of capabilities; {missing} are not in {rec['capabilities']}.",
                invalid=missing,
            )

    def create_monitor(self, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._create_monitor(body, token))

    def _create_monitor(self, body: Any, token: str | None) -> dict[str, Any]:
        body = _require_object(body, "monitor")
        attested = False
        if self.registration_token is not None:
            if not token or not tokens.matches(token, tokens.digest(self.registration_token)):
                raise ProtocolError(
                    "UNAUTHORIZED",
                    "This server requires its registration token to create a monitor: "
                    "send Authorization: Bearer <registration token>.",
                )
            attested = True
        monitor_id = body.get("id")
        if not isinstance(monitor_id, str) or not MONITOR_ID_PATTERN.match(monitor_id):
            raise _invalid(
                "id is required: 2-64 letters, digits, '_', '.' or '-' (e.g. \"ci\").", invalid=monitor_id
            )
        if self.store.get_monitor(monitor_id) is not None:
            raise ProtocolError("DUPLICATE", f"A monitor {monitor_id!r} already exists.", monitor=monitor_id)
        unknown = sorted(
            set(body) - set(UPDATABLE_FIELDS) - {"id", "owner", "subscribe_token", "reason", "rule"}
        )
        if unknown:
            raise _invalid(f"Unknown monitor field(s) {unknown}.", invalid=unknown)
        owner = body.get("owner", "human:owner" if attested else "agent:owner")
        _check_actor(owner, "owner")
        now = self._now()
        rec: Record = {
            "id": monitor_id,
            "name": monitor_id,
            "description": None,
            "version": 1,
            "owner": owner,
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
            "attested": attested,
            "default_grant": ["observe"],
            "limits": {},
            "created": timefmt.iso(now),
            "updated": timefmt.iso(now),
        }
        if "default_grant" not in body and "capabilities" in body and isinstance(body["capabilities"], list):
            rec["default_grant"] = ["observe"] if "observe" in body["capabilities"] else []
        self._validate_definition(body, rec)
        want_subscribe = body.get("subscribe_token", False)
        if not isinstance(want_subscribe, bool):
            raise _invalid("subscribe_token must be true or false.")
        owner_token = tokens.mint("mpo")
        subscribe_token = tokens.mint("mps") if rec["visibility"] == "shared" or want_subscribe else None
        rec.update(
            {
                "_status": "active",
                "_owner_hash": tokens.digest(owner_token),
                "_subscribe_hash": tokens.digest(subscribe_token) if subscribe_token else None,
                "_head": 0,
                "_floor": 1,
                "_counters": {
                    "observations": 0,
                    "delivered": 0,
                    "acted": 0,
                    "rejected": 0,
                    "contradictions": 0,
                    "contradictions_resolved": 0,
                },
                "_last": None,
                "_actors": [],
                "_source_contact": None,
                "_last_pull": None,
            }
        )
        seq = self._configured(rec, "create", None, None, body.get("reason"), body.get("rule"))
        out: dict[str, Any] = {"monitor": self.served_monitor(rec), "owner_token": owner_token}
        if subscribe_token:
            out["subscribe_token"] = subscribe_token
        out["seq"] = seq
        out["notice"] = (
            "Keep the owner_token: it is shown once and stored only as a hash. It publishes and configures."
            + (
                " The subscribe_token lets others subscribe to this shared monitor."
                if subscribe_token
                else ""
            )
        )
        return out

    def _configured(
        self, rec: Record, action: str, before: dict[str, Any] | None, diff: Any, reason: Any, rule: Any
    ) -> int:
        payload = {
            "action": action,
            "before_digest": events.canonical_digest(before) if before is not None else None,
            "after": None,
            "diff": diff,
            "rule": rule,
            "reason": reason,
            "actor": rec["owner"],
        }
        # `after` is the monitor as served once this observation is in the log, head included.
        rec["_head"] += 1
        payload["after"] = self.served_monitor(rec)
        rec["_head"] -= 1
        seq = self._append_protocol(rec, T_CONFIGURED, rec["owner"], payload)
        self.store.put_monitor(rec)
        return seq

    def list_monitors(self, token: str | None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            visible = [self.served_monitor(m) for m in self.store.list_monitors() if self._visible(m, token)]
            return {"monitors": visible, "ttlMs": 5000, "cacheScope": "private" if token else "public"}

        return self._call(run)

    def get_monitor(self, monitor_id: str, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self.served_monitor(self._visible_monitor(monitor_id, token)))

    def state(self, monitor_id: str, token: str | None) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            rec = self._visible_monitor(monitor_id, token)
            subs = self.store.list_subscriptions(rec["id"])
            active = sum(1 for s in subs if s["active"])
            return state.compute(rec, self._now(), active, rec.get("_last_pull"))

        return self._call(run)

    def configure(self, monitor_id: str, action: str, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._configure(monitor_id, action, body, token))

    def _configure(self, monitor_id: str, action: str, body: Any, token: str | None) -> dict[str, Any]:
        rec = self._owner_monitor(monitor_id, token)
        body = _require_object(body, action)
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise _invalid("reason must be a string.")
        rule = body.get("rule")
        if rule is not None and not isinstance(rule, str):
            raise _invalid("rule must be a string.")
        before = self.served_monitor(rec)
        status = rec["_status"]
        if status == "retired":
            raise ProtocolError(
                "UNAVAILABLE",
                f"Monitor {monitor_id} is retired; it can no longer be {action}d.",
                live=state.live_of(rec),
            )
        out: dict[str, Any] = {}
        if action == "update":
            patch = body.get("patch")
            if not isinstance(patch, dict) or not patch:
                raise _invalid('update needs {"patch": {field: value, ...}} with at least one field.')
            unknown = sorted(set(patch) - set(UPDATABLE_FIELDS))
            if unknown:
                raise _invalid(
                    f"These fields cannot be updated: {unknown}; updatable: {list(UPDATABLE_FIELDS)}.",
                    invalid=unknown,
                )
            self._validate_definition(patch, rec)
            diff = {
                k: {"before": before.get(k), "after": rec.get(k)}
                for k in patch
                if before.get(k) != rec.get(k)
            }
            rec["version"] += 1
            rec["updated"] = timefmt.iso(self._now())
            if rec["visibility"] == "shared" and not rec.get("_subscribe_hash"):
                subscribe_token = tokens.mint("mps")
                rec["_subscribe_hash"] = tokens.digest(subscribe_token)
                out["subscribe_token"] = subscribe_token
        elif action in ("pause", "resume", "retire"):
            diff = None
            rec["_status"] = {"pause": "paused", "resume": "active", "retire": "retired"}[action]
            rec["updated"] = timefmt.iso(self._now())
            if action == "retire":
                for lease in self.store.list_leases(rec["id"]):
                    if lease["holder"] is not None:
                        self._free_lease(rec, lease, "release", rec["owner"], reason="monitor retired")
            diff = {"active": {"before": before["active"], "after": rec["_status"] == "active"}}
        else:
            raise ProtocolError("NOT_FOUND", f"No action {action!r}; use update, pause, resume or retire.")
        seq = self._configured(rec, action, before, diff, reason, rule)
        out.update({"monitor": self.served_monitor(rec), "seq": seq})
        return out

    # ================================================================================ publish
    def publish(self, monitor_id: str, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._publish(monitor_id, body, token))

    def _publish(self, monitor_id: str, body: Any, token: str | None) -> dict[str, Any]:
        rec = self._owner_monitor(monitor_id, token)
        now = self._now()
        rec["_source_contact"] = now
        claimed_actor = body.get("actor") if isinstance(body, dict) else None
        actor_for_log = claimed_actor if isinstance(claimed_actor, str) else rec["owner"]
        try:
            if rec["_status"] != "active":
                raise ProtocolError(
                    "UNAVAILABLE",
                    f"Monitor {monitor_id} is {rec['_status']}; it accepts no observations until resumed.",
                    live=state.live_of(rec),
                )
            if not isinstance(body, dict):
                raise _invalid(
                    'The observation body must be a JSON object such as {"type": "com.example.ci.run"}.'
                )
            event_kwargs = self._validate_publish(rec, body)
            self._spend_budget(rec, now)
        except ProtocolError as err:
            raise self._reject(rec, err, body, actor_for_log) from None
        prov = event_kwargs.pop("prov")
        event = self._append(
            rec,
            event_kwargs["type_"],
            lambda s: events.build(
                monitor=rec,
                seq=s,
                actor=prov.actor,
                origin=prov.origin,
                tier=prov.tier,
                verification=prov.verification,
                on_behalf_of=prov.on_behalf_of,
                **event_kwargs,
            ),
            subject=event_kwargs["subject"],
        )
        seq = int(event["id"])
        c = rec["_counters"]
        c["observations"] += 1
        type_ = event_kwargs["type_"]
        if type_.endswith(".contradiction"):
            c["contradictions"] += 1
        elif type_.endswith(".contradiction_resolved"):
            c["contradictions_resolved"] += 1
        rec["_last"] = {"seq": seq, "ts": event_kwargs["time"], "type": type_}
        if prov.actor not in rec["_actors"] and len(rec["_actors"]) < MAX_TRACKED_ACTORS:
            rec["_actors"].append(prov.actor)
        self.store.put_monitor(rec)
        return {"observation": event, "seq": seq}

    @staticmethod
    def _spend_budget(rec: Record, now: float) -> None:
        """limits.observations_per_day caps accepted observations per UTC day (429 OVER_BUDGET past it)."""
        cap = (rec.get("limits") or {}).get("observations_per_day")
        if not isinstance(cap, int) or isinstance(cap, bool):
            return
        day = timefmt.iso(now)[:10]
        spent = rec.get("_budget") or {}
        count = spent.get("count", 0) if spent.get("day") == day else 0
        if count >= cap:
            raise ProtocolError(
                "OVER_BUDGET",
                f"Monitor {rec['id']} accepts {cap} observations per UTC day and has used them; try after "
                f"{day}T24:00Z or raise limits.observations_per_day.",
                limit=cap,
                window="day",
                day=day,
            )
        rec["_budget"] = {"day": day, "count": count + 1}

    def _validate_publish(self, rec: Record, body: dict[str, Any]) -> dict[str, Any]:
        known_fields = {
            "type", "subject", "data", "tags", "actor", "origin", "tier", "verification", "on_behalf_of",
            "time", "source_ref", "rule", "wasDerivedFrom", "supersedes",
        }  # fmt: skip
        unknown = sorted(set(body) - known_fields)
        if unknown:
            raise _invalid(
                f"Unknown observation field(s) {unknown}; known: {sorted(known_fields)}.", invalid=unknown
            )
        type_ = body.get("type")
        declared = rec.get("types") or []
        if not isinstance(type_, str) or not TYPE_PATTERN.match(type_):
            raise ProtocolError(
                "UNKNOWN_VOCABULARY",
                "type is required and must be reverse-DNS, e.g. com.example.ci.run.",
                field="type",
                invalid=type_,
                known=declared or ["^[a-z0-9]+(\\.[a-z0-9_-]+)+$"],
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
                f"Type {type_} is not declared by monitor {rec['id']}; use one of {declared}.",
                field="type",
                invalid=type_,
                known=declared,
            )
        actor = _check_actor(body.get("actor", rec["owner"]), "actor")
        prov = provenance.resolve(rec["owner"], actor, body)
        subject = body.get("subject")
        if subject is not None and (not isinstance(subject, str) or not subject):
            raise _invalid("subject must be a non-empty string or null.")
        data = body.get("data", {})
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise _invalid("data must be a JSON object (your fields stay at its top level).")
        reserved = sorted({"tags", "provenance"} & set(data))
        if reserved:
            raise _invalid(f"data may not carry {reserved}: send tags in the request's tags field.")
        tags = body.get("tags", {})
        if tags is None:
            tags = {}
        if not isinstance(tags, dict):
            raise _invalid('tags must be an object such as {"env": "prod"}.')
        t = self._now()
        if "time" in body and body["time"] is not None:
            t = timefmt.parse(body["time"])
            if t is None:
                raise _invalid("time must be RFC 3339, e.g. 2026-09-22T17:10:11.188Z.")
        for name in ("source_ref", "rule"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise _invalid(f"{name} must be a string.")
        derived = body.get("wasDerivedFrom") or []
        if not isinstance(derived, list):
            raise _invalid('wasDerivedFrom must be an array of {"source", "id"} objects.')
        derived = [self._reference(rec, item, "wasDerivedFrom", must_exist=False) for item in derived]
        supersedes = body.get("supersedes")
        if supersedes is not None:
            supersedes = self._reference(rec, supersedes, "supersedes", must_exist=True)
        return {
            "prov": prov,
            "type_": type_,
            "subject": subject,
            "time": t,
            "data": data,
            "tags": tags,
            "source_ref": body.get("source_ref"),
            "rule": body.get("rule"),
            "was_derived_from": derived,
            "supersedes": supersedes,
        }

    def _reference(self, rec: Record, value: Any, name: str, *, must_exist: bool) -> dict[str, str]:
        """A {source, id} reference; a bare seq (int or decimal string) names this monitor's log."""
        own = events.source_of(rec["id"])
        if isinstance(value, bool):
            raise _invalid(f'{name} must be a seq or {{"source", "id"}}.')
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            value = {"source": own, "id": str(int(value))}
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("source"), str)
            or not isinstance(value.get("id"), str | int)
            or isinstance(value.get("id"), bool)
        ):
            raise _invalid(f'{name} must be a seq or an object {{"source": "monitor:<id>", "id": "<seq>"}}.')
        ref = {"source": value["source"], "id": str(value["id"])}
        if must_exist and ref["source"] == own:
            seq = int(ref["id"]) if ref["id"].isdigit() else -1
            if not 1 <= seq <= rec["_head"]:
                raise ProtocolError(
                    "NOT_FOUND",
                    f"{name} names observation {ref['id']} of {own}, which does not exist.",
                    field=name,
                )
        return ref

    # ================================================================================ subscriptions
    def subscribe(self, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._subscribe(body, token))

    def _subscribe(self, body: Any, token: str | None) -> dict[str, Any]:
        body = _require_object(body, "subscribe")
        monitor_id = body.get("monitor")
        if not isinstance(monitor_id, str):
            raise _invalid('subscribe needs {"monitor": "<id>", "subscriber": "agent:you"}.')
        rec = self._monitor_rec(monitor_id)
        subscriber = _check_actor(body.get("subscriber"), "subscriber")
        existing = self.store.find_subscription(monitor_id, subscriber)
        is_owner = tokens.matches(token, rec["_owner_hash"])
        is_sub_token = rec["visibility"] == "shared" and tokens.matches(token, rec.get("_subscribe_hash"))
        holds_existing = existing is not None and tokens.matches(token, existing["token_hash"])
        if rec["visibility"] == "private" and not (is_owner or holds_existing):
            raise ProtocolError("NOT_FOUND", f"No monitor {monitor_id!r} here.", monitor=monitor_id)
        requested = body.get("capabilities")
        if requested is not None:
            requested = _check_vocab_list(requested, CAPABILITIES, "capabilities")
        if existing is not None and not (holds_existing or is_owner):
            raise ProtocolError(
                "UNAUTHORIZED",
                f"{subscriber} already subscribes to {monitor_id}; a name is not a credential. Re-subscribe "
                "with that subscription's current token or the owner's token.",
            )
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
        if rec["visibility"] == "shared" and not (is_owner or is_sub_token or holds_existing):
            raise ProtocolError(
                "UNAUTHORIZED",
                f"Monitor {monitor_id} is shared: subscribing needs its subscribe token (or the owner's).",
            )
        flt = filters.validate(body.get("filter"), rec.get("types") or [])
        protocol = body.get("protocol", existing["protocol"] if existing else "pull")
        _check_vocab(protocol, PROTOCOLS, "protocol")
        reset_policy = body.get("reset_policy", existing["reset_policy"] if existing else "none")
        _check_vocab(reset_policy, RESET_POLICIES, "reset_policy")
        sink = body.get("sink", existing.get("sink") if existing else None)
        if protocol == "http":
            if not isinstance(sink, str) or not sink.startswith(("http://", "https://")):
                raise _invalid('protocol "http" needs a sink URL such as "https://example.com/hook".')
        elif sink is not None and not isinstance(sink, str):
            raise _invalid("sink must be a URL string or null.")
        mute = body.get(
            "retire_after_mute_seconds", existing.get("retire_after_mute_seconds") if existing else None
        )
        if mute is not None:
            mute = _as_int(mute, "retire_after_mute_seconds", minimum=1)
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
                raise _invalid('from must be "head", "earliest" or a non-negative integer seq.', invalid=frm)
        now = self._now()
        token_out = tokens.mint("mpr")
        if existing is None:
            sub: Record = {
                "id": tokens.new_id("sub"),
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
        """P5: what this subscription would receive if it pulled now, its own filter included."""
        start = max(sub["cursor"], 1, rec["_floor"])
        head = rec["_head"]
        if start > head:
            return 0
        flt = sub["filter"]
        if filters.is_empty(flt):
            return head - start + 1
        count = 0
        for event in self.store.scan(rec["id"], start, head):
            if filters.matches(flt, event):
                count += 1
                if count >= LAG_COUNT_CAP:
                    break
        return count

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
        rec = self._monitor_rec(sub["monitor"])
        lim = DEFAULT_LIMIT if limit is None else _as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
        replay = cursor is not None
        inline_flt = filters.validate(inline, rec.get("types") or []) if inline is not None else {}
        for f in (sub["filter"], inline_flt):
            f_lim = filters.limit_of(f)
            if f_lim:
                lim = min(lim, f_lim)
        start = _as_int(cursor, "cursor", minimum=0) if replay else sub["cursor"]
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
        for event in self.store.scan(rec["id"], max(start, 1), head):
            if filters.matches(sub["filter"], event) and filters.matches(inline_flt, event):
                batch.append(event)
                if len(batch) >= lim:
                    break
        if (
            not replay
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
        return {
            "subscription": sub["id"],
            "monitor": rec["id"],
            "cursor": sub["cursor"],
            "head": head,
            "lag": self._lag(rec, sub),
            "retention_floor": floor,
            "next": next_cursor,
            "redelivered": redelivered,
            "observations": batch,
        }

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
        body = _require_object(body, "ack")
        if "cursor" not in body:
            raise _invalid('ack needs {"cursor": <next>} where next is the pull reply\'s "next".')
        requested = body["cursor"]
        is_int = isinstance(requested, int) and not isinstance(requested, bool)
        if not is_int and not (isinstance(requested, float) and requested.is_integer()):
            raise _invalid(f"cursor must be an integer (the pull reply's next), not {requested!r}.")
        requested = int(requested)
        if requested < 0:
            raise _invalid(f"cursor must be at least 0 (got {requested}).")
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
        body = _require_object(body, "seek")
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise _invalid('seek needs a reason: {"cursor": <seq>, "reason": "why you are moving"}.')
        if "cursor" not in body:
            raise _invalid('seek needs {"cursor": <seq>, "reason": "..."}.')
        rec = self._monitor_rec(sub["monitor"])
        target = _as_int(body["cursor"], "cursor", minimum=0)
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
            b = _require_object(body, "retire")
            reason = b.get("reason", "by request")
            if not isinstance(reason, str):
                raise _invalid("reason must be a string.")
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

    # ================================================================================ leases
    def lease(self, sub_id: str, token: str | None, action: str, body: Any) -> dict[str, Any]:
        return self._call(lambda: self._lease(sub_id, token, action, body))

    def _lease(self, sub_id: str, token: str | None, action: str, body: Any) -> dict[str, Any]:
        if action not in ("claim", "renew", "complete", "release", "reject"):
            raise ProtocolError(
                "NOT_FOUND", f"No lease action {action!r}; use claim, renew, complete, release or reject."
            )
        sub = self._subscription(sub_id, token)
        if "act" not in sub["capabilities"]:
            raise ProtocolError(
                "CAPABILITY_MISSING",
                "Leases need the act capability, which this subscription was not granted.",
                granted=sub["capabilities"],
                required="act",
            )
        body = _require_object(body, action)
        subject = body.get("subject")
        if not isinstance(subject, str) or not subject:
            raise _invalid(f'{action} needs {{"subject": "<a subject this monitor published>"}}.')
        rec = self._monitor_rec(sub["monitor"])
        if rec["_status"] == "retired":
            raise ProtocolError("UNAVAILABLE", f"Monitor {rec['id']} is retired.", live=state.live_of(rec))
        if not self.store.has_subject(rec["id"], subject):
            raise ProtocolError(
                "NOT_FOUND",
                f"Monitor {rec['id']} never published subject {subject!r}; leases cover its own work items only.",
                subject=subject,
            )
        now = self._now()
        holder = f"sub:{sub['id']}"
        lease = self.store.get_lease(rec["id"], subject)
        if lease is not None and lease["holder"] is not None and self._expired(lease, now):
            self._free_lease(rec, lease, "expired", "system:sweep")
        if action == "claim":
            return self._claim(rec, sub, lease, subject, body, now, holder)
        if action == "complete" and lease is not None and lease.get("_completed"):
            done = lease["_completed"]
            if done["by"] == holder and lease["holder"] is None:
                return {"ok": True, "seq": done["seq"], "idempotent": True, "lease": self.served_lease(lease)}
        if lease is None or lease["holder"] != holder:
            raise ProtocolError(
                "LEASE_LOST",
                f"This subscription does not hold the lease on {subject!r} (expired or taken); claim it again.",
                subject=subject,
                holder=lease["holder"] if lease else None,
            )
        note = body.get("note")
        if action == "renew":
            if "lease_duration_seconds" in body:
                lease["lease_duration_seconds"] = _as_int(
                    body["lease_duration_seconds"],
                    "lease_duration_seconds",
                    minimum=1,
                    maximum=MAX_LEASE_SECONDS,
                )
            lease["renew_time"] = timefmt.iso(now)
            lease["_renew_ts"] = now
            self.store.put_lease(lease)
            self._schedule(self._expiry(lease))
            self._append_protocol(
                rec,
                T_LEASE,
                sub["subscriber"],
                self._lease_payload("renew", lease, sub, note=note),
                subject=subject,
            )
            self.store.put_monitor(rec)
            return {"lease": self.served_lease(lease), "expires": timefmt.iso(self._expiry(lease))}
        if action == "complete":
            outcome = body.get("outcome")
            if not isinstance(outcome, str) or not outcome:
                raise _invalid(
                    'complete needs {"subject", "outcome": "done" (or another word), "evidence"?}.'
                )
            evidence = body.get("evidence")
            if (rec.get("limits") or {}).get("require_evidence") and not evidence:
                raise ProtocolError(
                    "EVIDENCE_REQUIRED",
                    f"Monitor {rec['id']} requires evidence to complete a lease: send evidence with the outcome.",
                    subject=subject,
                )
            lease["holder"] = None
            seq = self._append_protocol(
                rec,
                T_LEASE,
                sub["subscriber"],
                self._lease_payload("complete", lease, sub, outcome=outcome, evidence=evidence, note=note),
                subject=subject,
            )
            lease["_completed"] = {"by": holder, "seq": seq, "outcome": outcome}
            rec["_counters"]["acted"] += 1
            self.store.put_lease(lease)
            self.store.put_monitor(rec)
            return {"ok": True, "seq": seq, "idempotent": False, "lease": self.served_lease(lease)}
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise _invalid("reason must be a string.")
        seq = self._free_lease(rec, lease, action, sub["subscriber"], reason=reason, sub=sub)
        return {
            "ok": True,
            "seq": seq,
            "dead_letter": bool(lease["dead_letter"]),
            "lease": self.served_lease(lease),
        }

    def _claim(
        self,
        rec: Record,
        sub: Record,
        lease: Record | None,
        subject: str,
        body: dict,
        now: float,
        holder: str,
    ) -> dict[str, Any]:
        duration = _as_int(
            body.get("lease_duration_seconds", DEFAULT_LEASE_SECONDS),
            "lease_duration_seconds",
            minimum=1,
            maximum=MAX_LEASE_SECONDS,
        )
        if lease is not None and lease["dead_letter"]:
            raise ProtocolError(
                "DEAD_LETTERED",
                f"Subject {subject!r} was rejected {lease['attempts']} times and is dead-lettered; it is not "
                "claimed again.",
                subject=subject,
                attempts=lease["attempts"],
                delivery_count_limit=lease["delivery_count_limit"],
            )
        if lease is not None and lease["holder"] is not None:
            if lease["holder"] == holder:  # the holder repeating its claim gets the same lease (C20b)
                return {
                    "lease": self.served_lease(lease),
                    "expires": timefmt.iso(self._expiry(lease)),
                    "idempotent": True,
                }
            raise ProtocolError(
                "LEASE_HELD",
                f"Subject {subject!r} is leased by {lease['holder']} until {timefmt.iso(self._expiry(lease))}.",
                subject=subject,
                holder=lease["holder"],
                expires=timefmt.iso(self._expiry(lease)),
            )
        if lease is None:
            lease = {
                "monitor": rec["id"],
                "subject": subject,
                "holder": None,
                "lease_duration_seconds": duration,
                "acquire_time": timefmt.iso(now),
                "renew_time": timefmt.iso(now),
                "lease_transitions": 0,
                "attempts": 0,
                "delivery_count_limit": DELIVERY_COUNT_LIMIT,
                "dead_letter": False,
                "_last_holder": None,
            }
        if lease.get("_last_holder") not in (None, holder):
            lease["lease_transitions"] += 1
        lease.update(
            {
                "holder": holder,
                "lease_duration_seconds": duration,
                "acquire_time": timefmt.iso(now),
                "renew_time": timefmt.iso(now),
                "_renew_ts": now,
                "_last_holder": holder,
                "_completed": None,
            }
        )
        lease["attempts"] += 1
        self.store.put_lease(lease)
        self._schedule(self._expiry(lease))
        self._append_protocol(
            rec, T_LEASE, sub["subscriber"], self._lease_payload("claim", lease, sub, note=body.get("note")),
            subject=subject,
        )  # fmt: skip
        self.store.put_monitor(rec)
        return {
            "lease": self.served_lease(lease),
            "expires": timefmt.iso(self._expiry(lease)),
            "idempotent": False,
        }

    @staticmethod
    def _expiry(lease: Record) -> float:
        return float(lease["_renew_ts"]) + lease["lease_duration_seconds"]

    def _expired(self, lease: Record, now: float) -> bool:
        return now > self._expiry(lease)

    @staticmethod
    def _lease_payload(action: str, lease: Record, sub: Record | None, **extra: Any) -> dict[str, Any]:
        payload = {
            "action": action,
            "subject": lease["subject"],
            "subscription": sub["id"] if sub else (lease["holder"] or "").removeprefix("sub:") or None,
            "holder": lease["holder"],
        }
        payload.update({k: v for k, v in extra.items() if v is not None})
        return payload

    def _free_lease(
        self,
        rec: Record,
        lease: Record,
        action: str,
        actor: str,
        *,
        reason: str | None = None,
        sub: Record | None = None,
    ) -> int:
        """release, reject, or expired: the holder lets go; a reject at the limit dead-letters the subject."""
        previous = lease["holder"]
        lease["holder"] = None
        extra: dict[str, Any] = {"reason": reason, "previous_holder": previous}
        if action == "reject":
            if lease["attempts"] >= lease["delivery_count_limit"]:
                lease["dead_letter"] = True
            extra.update({"attempts": lease["attempts"], "dead_letter": lease["dead_letter"]})
        self.store.put_lease(lease)
        payload = self._lease_payload(action, lease, sub, **extra)
        if sub is None and previous:
            payload["subscription"] = previous.removeprefix("sub:")
        seq = self._append_protocol(rec, T_LEASE, actor, payload, subject=lease["subject"])
        self.store.put_monitor(rec)
        return seq

    # ================================================================================ sweep (P6, leases)
    def _schedule(self, deadline: float) -> None:
        if self._deadline_known and (self._next_deadline is None or deadline < self._next_deadline):
            self._next_deadline = deadline

    def next_deadline(self) -> float | None:
        return self._next_deadline if self._deadline_known else self._now()

    def _maybe_sweep(self) -> None:
        if not self._deadline_known or (
            self._next_deadline is not None and self._now() >= self._next_deadline
        ):
            self.sweep()

    def sweep(self, now: float | None = None) -> int:
        """Retire mute subscriptions and expire leases whose time has passed; return how many changed."""
        moment = self._now() if now is None else now

        def run() -> int:
            changed = 0
            nearest: float | None = None
            monitors: dict[str, Record] = {}

            def monitor(mid: str) -> Record:
                if mid not in monitors:
                    monitors[mid] = self._monitor_rec(mid)
                return monitors[mid]

            for sub in self.store.list_subscriptions():
                if not sub["active"]:
                    continue
                rec = monitor(sub["monitor"])
                deadline = sub["_mute_since"] + self._mute_seconds(rec, sub)
                if moment > deadline:
                    self._retire_sub(rec, sub, "system:sweep", "mute")
                    changed += 1
                else:
                    nearest = deadline if nearest is None else min(nearest, deadline)
            for lease in self.store.list_leases():
                if lease["holder"] is None:
                    continue
                rec = monitor(lease["monitor"])
                if self._expiry(lease) < moment:
                    self._free_lease(rec, lease, "expired", "system:sweep")
                    changed += 1
                else:
                    exp = self._expiry(lease)
                    nearest = exp if nearest is None else min(nearest, exp)
            self._next_deadline = nearest
            self._deadline_known = True
            return changed

        return self._call(run, lazy_sweep=False)

    # ================================================================================ admin
    def compact(self, monitor_id: str | None, upto_seq: Any) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            upto = _as_int(upto_seq, "upto_seq", minimum=1)
            recs = [self._monitor_rec(monitor_id)] if monitor_id is not None else self.store.list_monitors()
            out = []
            for rec in recs:
                new_floor = min(upto, rec["_head"]) + 1
                removed = 0
                if new_floor > rec["_floor"]:
                    removed = self.store.delete_below(rec["id"], new_floor)
                    rec["_floor"] = new_floor
                    self.store.put_monitor(rec)
                out.append({"monitor": rec["id"], "retention_floor": rec["_floor"], "removed": removed})
            return {"ok": True, "compacted": out}

        return self._call(run)

    def read_log(self, monitor_id: str, from_seq: Any = 1, limit: Any = None) -> dict[str, Any]:
        """The operator's view of a monitor's log (admin door): no subscription, no cursor, no commit."""

        def run() -> dict[str, Any]:
            rec = self._monitor_rec(monitor_id)
            start = _as_int(from_seq, "from", minimum=0)
            lim = DEFAULT_LIMIT if limit is None else _as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
            rows = []
            for event in self.store.scan(rec["id"], max(start, rec["_floor"], 1), rec["_head"]):
                rows.append(event)
                if len(rows) >= lim:
                    break
            return {
                "monitor": rec["id"],
                "head": rec["_head"],
                "retention_floor": rec["_floor"],
                "next": int(rows[-1]["id"]) + 1 if rows else rec["_head"] + 1,
                "observations": rows,
            }

        return self._call(run)

    def snapshot(self) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            subs_by_monitor: dict[str, list[Record]] = {}
            for s in self.store.list_subscriptions():
                subs_by_monitor.setdefault(s["monitor"], []).append(s)
            monitors = []
            for rec in self.store.list_monitors():
                subs = subs_by_monitor.get(rec["id"], [])
                monitors.append(
                    {
                        "monitor": self.served_monitor(rec),
                        "state": state.compute(
                            rec, self._now(), sum(1 for s in subs if s["active"]), rec.get("_last_pull")
                        ),
                        "subscriptions": [self.served_subscription(s, self._lag(rec, s)) for s in subs],
                        "leases": [self.served_lease(x) for x in self.store.list_leases(rec["id"])],
                    }
                )
            return {"taken_at": timefmt.iso(self._now()), "monitors": monitors}

        return self._call(run)


_PRIVATE_SUB_FIELDS = ("token_hash", "_hwm", "_mute_since", "_last_ack", "_relist", "_sink_secret")


class _LoggedRefusal(Exception):
    """Carries a refusal out of a transaction that must still commit (its rejected row is evidence)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(error.message)
        self.error = error
