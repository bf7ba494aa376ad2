"""Monitors: create (ids, tokens, attestation, defaults), list/get with visibility, state, update,
pause/resume/retire, each logged as a configured observation (P10)."""

from __future__ import annotations

from typing import Any

from . import events, filters, state, timefmt, tokens
from .errors import ProtocolError
from .provenance import is_system
from .service_base import (
    UPDATABLE_FIELDS,
    ServiceCore,
)
from .store.base import Record
from .validation import (
    as_int,
    check_actor,
    check_json_size,
    check_name,
    check_reason,
    check_vocab,
    check_vocab_list,
    invalid,
    require_object,
)
from .vocab import (
    CAPABILITIES,
    HORIZONS,
    MAX_DEFINITION_BYTES,
    MONITOR_ID_PATTERN,
    SOURCE_KINDS,
    T_CONFIGURED,
    TYPE_PATTERN,
    VISIBILITIES,
)


class MonitorRules(ServiceCore):
    # ================================================================================ monitors
    def _validate_definition(self, body: dict[str, Any], rec: Record) -> None:
        """Validate the definable fields present in `body` and copy them onto `rec` (create and update)."""
        for key in UPDATABLE_FIELDS:
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
            elif key == "filter":
                value = filters.validate(value, body.get("types", rec.get("types", [])))
            elif key == "horizon":
                check_vocab(value, HORIZONS, "horizon")
            elif key in ("capabilities", "default_grant"):
                value = check_vocab_list(value, CAPABILITIES, key)
            elif key == "cadence":
                if not isinstance(value, dict):
                    raise invalid('cadence must be an object such as {"heartbeat_seconds": 60}.')
            elif key in ("ttl_seconds", "retire_after_mute_seconds"):
                if value is not None:
                    value = as_int(value, key, minimum=1, text=False)
            elif key == "budget":
                if value is not None and not isinstance(value, dict):
                    raise invalid("budget must be an object or null.")
            elif key == "visibility":
                check_vocab(value, VISIBILITIES, "visibility")
            elif key == "rules":
                if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                    raise invalid("rules must be an array of objects with id, when and then.")
                for r in value:
                    if (
                        not isinstance(r.get("id"), str)
                        or "when" not in r
                        or not isinstance(r.get("then"), str)
                    ):
                        raise invalid("Each rule needs a string id, a when filter and a then action.")
                    filters.validate(r["when"], body.get("types", rec.get("types", [])))
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
                        known=["^[a-z0-9]+(\\.[a-z0-9_-]+)+$"],
                    )
                value = list(dict.fromkeys(value))
            elif key == "limits":
                if not isinstance(value, dict):
                    raise invalid("limits must be an object.")
                if "observations_per_day" in value:
                    as_int(
                        value["observations_per_day"], "limits.observations_per_day", minimum=1, text=False
                    )
            rec[key] = value
        check_json_size(
            {k: rec.get(k) for k in UPDATABLE_FIELDS}, "The monitor definition", MAX_DEFINITION_BYTES
        )  # a configured row carries it (section 7: protocol rows stay small)
        missing = [c for c in rec["default_grant"] if c not in rec["capabilities"]]
        if missing:
            raise invalid(
                f"default_grant must be a subset of capabilities; {missing} are not in {rec['capabilities']}.",
                invalid=missing,
            )

    def create_monitor(self, body: Any, token: str | None) -> dict[str, Any]:
        return self._call(lambda: self._create_monitor(body, token))

    def _create_monitor(self, body: Any, token: str | None) -> dict[str, Any]:
        body = require_object(body, "monitor")
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
            raise invalid(
                "id is required: 2-64 letters, digits, '_', '.' or '-' (e.g. \"ci\").", invalid=monitor_id
            )
        if self.store.get_monitor(monitor_id) is not None:
            raise ProtocolError("DUPLICATE", f"A monitor {monitor_id!r} already exists.", monitor=monitor_id)
        unknown = sorted(
            set(body) - set(UPDATABLE_FIELDS) - {"id", "owner", "subscribe_token", "reason", "rule"}
        )
        if unknown:
            raise invalid(f"Unknown monitor field(s) {unknown}.", invalid=unknown)
        owner = body.get("owner", "human:owner" if attested else "agent:owner")
        check_actor(owner, "owner")
        if is_system(owner):
            raise invalid("owner may not be system:...: only the server writes as the system.")
        reason = check_reason(body.get("reason"), "reason")
        rule = check_reason(body.get("rule"), "rule")
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
            raise invalid("subscribe_token must be true or false.")
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
        seq = self._configured(rec, "create", None, None, reason, rule)
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
        self,
        rec: Record,
        action: str,
        before: dict[str, Any] | None,
        diff: Any,
        reason: Any,
        rule: Any,
        extra: dict[str, Any] | None = None,
    ) -> int:
        payload = {
            "action": action,
            "before_digest": events.canonical_digest(before) if before is not None else None,
            "after": None,
            "diff": diff,
            "rule": rule,
            "reason": reason,
            "actor": rec["owner"],
            **(extra or {}),
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
        body = require_object(body, action)
        reason = check_reason(body.get("reason"), "reason")
        rule = check_reason(body.get("rule"), "rule")
        before = self.served_monitor(rec)
        status = rec["_status"]
        if status == "retired":
            raise ProtocolError(
                "UNAVAILABLE",
                f"Monitor {monitor_id} is retired; it can no longer be {action}d.",
                live=state.live_of(rec),
            )
        out: dict[str, Any] = {}
        extra: dict[str, Any] | None = None
        if action == "update":
            patch = body.get("patch")
            if not isinstance(patch, dict) or not patch:
                raise invalid('update needs {"patch": {field: value, ...}} with at least one field.')
            unknown = sorted(set(patch) - set(UPDATABLE_FIELDS))
            if unknown:
                raise invalid(
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
            if {"visibility", "capabilities", "default_grant"} & set(diff):
                extra = self._revoke_narrowed(rec)
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
        seq = self._configured(rec, action, before, diff, reason, rule, extra)
        out.update({"monitor": self.served_monitor(rec), "seq": seq})
        return out

    def _allowed_now(self, rec: Record, sub: Record) -> list[str] | None:
        """What this subscription could be granted under the definition as it is now (None: it could not
        subscribe at all). The basis is how it was granted: the owner's token, the subscribe token, or none."""
        basis = sub.get("_grant", "default")
        visibility = rec["visibility"]
        if basis == "owner":
            return list(rec["capabilities"])
        if basis == "subscribe" and visibility != "private":
            return list(rec["capabilities"])
        if visibility in ("private", "shared"):
            return None
        return [c for c in rec["default_grant"] if c in rec["capabilities"]]

    def _revoke_narrowed(self, rec: Record) -> dict[str, Any]:
        """A grant never outlives the definition that allowed it (section 8): shrink every subscription's
        capabilities to what it could be granted now, and retire (reason revoked, cursor kept) those that
        could no longer subscribe at all."""
        narrowed: list[str] = []
        revoked: list[str] = []
        for sub in self.store.list_subscriptions(rec["id"]):
            allowed = self._allowed_now(rec, sub)
            if allowed is None:
                if not sub.get("_revoked"):
                    sub["_revoked"] = True
                    revoked.append(sub["id"])
                    if sub["active"]:
                        self._retire_sub(rec, sub, rec["owner"], "revoked")
                    else:
                        self.store.put_subscription(sub)
                continue
            kept = [c for c in sub["capabilities"] if c in allowed]
            if kept != sub["capabilities"]:
                sub["capabilities"] = kept
                narrowed.append(sub["id"])
                self.store.put_subscription(sub)
                holder = f"sub:{sub['id']}"
                if "act" not in kept:
                    for lease in self.store.list_leases(rec["id"]):
                        if lease["holder"] == holder:
                            self._free_lease(rec, lease, "release", rec["owner"], reason="act revoked")
        return {"revoked": revoked, "narrowed": narrowed} if revoked or narrowed else {}
