"""Leases: claim, renew, complete, release, reject, expiry, attempts and dead letters, per monitor."""

from __future__ import annotations

from typing import Any

from . import state, timefmt
from .errors import ProtocolError
from .service_base import (
    ServiceCore,
)
from .store.base import Record
from .validation import as_int, check_json_size, check_name, check_reason, invalid, require_object
from .vocab import (
    DEFAULT_LEASE_SECONDS,
    DELIVERY_COUNT_LIMIT,
    MAX_EVIDENCE_BYTES,
    MAX_LEASE_SECONDS,
    MAX_OUTCOME_CHARS,
    T_LEASE,
)

# Which ways of letting go of a held lease count as a failed attempt (PROTOCOL.md section 8): a reject, or
# an expiry (a worker that dies holding a lease has failed it); a release gives the work back and a complete
# finishes it. At delivery_count_limit attempts the subject is dead-lettered.
COUNTS_AS_ATTEMPT = {"reject": True, "expired": True, "release": False, "complete": False}


def counts_as_attempt(action: str) -> bool:
    return COUNTS_AS_ATTEMPT.get(action, False)


class LeaseRules(ServiceCore):
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
        body = require_object(body, action)
        subject = body.get("subject")
        if not isinstance(subject, str) or not subject:
            raise invalid(f'{action} needs {{"subject": "<a subject this monitor published>"}}.')
        check_name(subject, "subject", '"build-412"')
        note = check_reason(body.get("note"), "note")
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
        if action == "renew":
            if "lease_duration_seconds" in body:
                lease["lease_duration_seconds"] = as_int(
                    body["lease_duration_seconds"],
                    "lease_duration_seconds",
                    minimum=1,
                    maximum=MAX_LEASE_SECONDS,
                    text=False,
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
            if not isinstance(outcome, str) or not outcome or len(outcome) > MAX_OUTCOME_CHARS:
                raise invalid(
                    'complete needs {"subject", "outcome": "done" (or another word of at most '
                    f'{MAX_OUTCOME_CHARS} characters), "evidence"?}}.'
                )
            evidence = body.get("evidence")
            if evidence is not None:
                check_json_size(evidence, "evidence", MAX_EVIDENCE_BYTES)
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
        reason = check_reason(body.get("reason"), "reason")
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
        duration = as_int(
            body.get("lease_duration_seconds", DEFAULT_LEASE_SECONDS),
            "lease_duration_seconds",
            minimum=1,
            maximum=MAX_LEASE_SECONDS,
            text=False,
        )
        if lease is not None and lease["dead_letter"]:
            raise ProtocolError(
                "DEAD_LETTERED",
                f"Subject {subject!r} failed {lease['attempts']} times (rejected or expired) and is "
                "dead-lettered; it is not claimed again.",
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
        if action == "release" and previous is not None and self._expired(lease, self._now()):
            action = "expired"  # freed by a retirement after its time ran out: the holder failed it
        lease["holder"] = None
        extra: dict[str, Any] = {"reason": reason, "previous_holder": previous}
        if counts_as_attempt(action):
            lease["attempts"] += 1
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
