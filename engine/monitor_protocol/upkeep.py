"""Upkeep and admin: the mute sweep (P6) and lease expiry on a deadline, compaction, snapshot, the log."""

from __future__ import annotations

from typing import Any

from . import state, timefmt
from .service_base import (
    ServiceCore,
)
from .store.base import Record
from .validation import as_int
from .vocab import (
    DEFAULT_LIMIT,
    IDEMPOTENCY_WINDOW_SECONDS,
    MAX_LIMIT,
)

IDEMPOTENCY_PURGE_SECONDS = 60.0


class UpkeepRules(ServiceCore):
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

            # Leases first: a lease whose time ran out is an expiry (an attempt) even when its holder is
            # also retired for silence in this sweep.
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
            self._next_deadline = nearest
            self._deadline_known = True
            if moment - self._last_idempotency_purge >= IDEMPOTENCY_PURGE_SECONDS:
                self._last_idempotency_purge = moment
                self.store.purge_idempotency(moment - IDEMPOTENCY_WINDOW_SECONDS)
            return changed

        return self._call(run, lazy_sweep=False)

    # ================================================================================ admin
    def compact(self, monitor_id: str | None, upto_seq: Any) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            upto = as_int(upto_seq, "upto_seq", minimum=1, text=False)
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
            start = as_int(from_seq, "from", minimum=0)
            lim = DEFAULT_LIMIT if limit is None else as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT)
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
