"""Publishing: vocabulary, provenance ceilings (P1), budget, references; every refusal logged (P2)."""

from __future__ import annotations

from typing import Any

from . import events, provenance, state, timefmt
from .errors import ProtocolError
from .service_base import (
    MAX_TRACKED_ACTORS,
    PUBLISHABLE_PROTOCOL_TYPES,
    ServiceCore,
)
from .store.base import Record
from .validation import check_actor, invalid
from .vocab import (
    PROTOCOL_PREFIX,
    TYPE_PATTERN,
)


class PublishRules(ServiceCore):
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
                raise invalid(
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
            raise invalid(
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
        actor = check_actor(body.get("actor", rec["owner"]), "actor")
        prov = provenance.resolve(rec["owner"], actor, body)
        subject = body.get("subject")
        if subject is not None and (not isinstance(subject, str) or not subject):
            raise invalid("subject must be a non-empty string or null.")
        data = body.get("data", {})
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise invalid("data must be a JSON object (your fields stay at its top level).")
        reserved = sorted({"tags", "provenance"} & set(data))
        if reserved:
            raise invalid(f"data may not carry {reserved}: send tags in the request's tags field.")
        tags = body.get("tags", {})
        if tags is None:
            tags = {}
        if not isinstance(tags, dict):
            raise invalid('tags must be an object such as {"env": "prod"}.')
        t = self._now()
        if "time" in body and body["time"] is not None:
            t = timefmt.parse(body["time"])
            if t is None:
                raise invalid("time must be RFC 3339, e.g. 2026-09-22T17:10:11.188Z.")
        for name in ("source_ref", "rule"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise invalid(f"{name} must be a string.")
        derived = body.get("wasDerivedFrom") or []
        if not isinstance(derived, list):
            raise invalid('wasDerivedFrom must be an array of {"source", "id"} objects.')
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
            raise invalid(f'{name} must be a seq or {{"source", "id"}}.')
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            value = {"source": own, "id": str(int(value))}
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("source"), str)
            or not isinstance(value.get("id"), str | int)
            or isinstance(value.get("id"), bool)
        ):
            raise invalid(f'{name} must be a seq or an object {{"source": "monitor:<id>", "id": "<seq>"}}.')
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
