"""The core every rule module builds on: one transaction per call, listeners, records as served, the log."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from typing import Any

from . import __version__, events, tokens, wire
from .errors import ProtocolError, storage_unavailable
from .store.base import Record, StorageError, Store
from .validation import check_name, invalid
from .vocab import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMIT,
    DEFAULT_RETIRE_AFTER_MUTE_SECONDS,
    DELIVERY_COUNT_LIMIT,
    EXTENSION_ID,
    IDEMPOTENCY_KEY_MAX_CHARS,
    IDEMPOTENCY_WINDOW_SECONDS,
    LAG_COUNT_CAP,
    MAX_ACTIVE_SUBSCRIPTIONS,
    MAX_FILTER_BYTES,
    MAX_FILTER_TEXT_CHARS,
    MAX_FUTURE_SECONDS,
    MAX_INTEGER,
    MAX_JSON_DEPTH,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    MAX_NAME_CHARS,
    MAX_REASON_BYTES,
    MAX_RPC_BATCH,
    MAX_WAIT_SECONDS,
    PROTOCOL_PREFIX,
    PROTOCOL_VERSION,
    SCAN_BUDGET,
    T_CONTRADICTION,
    T_CONTRADICTION_RESOLVED,
    T_REJECTED,
)

SERVER_NAME = "monitor-protocol-python"
SERVER_VERSION = __version__
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


class ServiceCore:
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = _time.time,
        registration_token: str | None = None,
        retire_after_mute_seconds: int | None = None,
        allowed_sinks: tuple[str, ...] | list[str] = (),
        streams: bool = True,
    ) -> None:
        self.store = store
        # Push sinks the operator allowed although they are internal addresses (--allow-sink).
        self.allowed_sinks = tuple(allowed_sinks)
        # Whether the door in front of this engine can hold SSE streams (the browser's cannot).
        self.streams = streams
        self.clock = clock
        self.registration_token = registration_token
        self.default_retire_after_mute = retire_after_mute_seconds or DEFAULT_RETIRE_AFTER_MUTE_SECONDS
        self._listeners: list[Listener] = []
        self._next_deadline: float | None = None  # recomputed by sweep(); None = must scan
        self._deadline_known = False
        self._last_idempotency_purge = float("-inf")

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
        try:
            with self.store.transaction():
                try:
                    result = fn()
                except _LoggedRefusal as refusal:  # the rejected row commits, then the error is raised
                    deferred = refusal.error
        except StorageError as exc:  # rolled back: nothing half-written, and the client should retry
            self._appended = {}
            raise storage_unavailable(str(exc) or type(exc).__name__) from None
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
            raise invalid("The monitor id must be a string.")
        check_name(monitor_id, "monitor", '"ci"')
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
            if sub is not None and sub["monitor"] == rec["id"] and not sub.get("_revoked"):
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
            raise invalid("The subscription id must be a string.")
        check_name(sub_id, "subscription", '"sub-0123456789abcdef"')
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
        reason = error.message if len(error.message) <= 1024 else error.message[:1021] + "..."
        if not isinstance(actor, str) or wire.problem(actor) or len(actor) > MAX_NAME_CHARS:
            actor = rec["owner"]  # the claimed name was itself unusable; the refusal's raw keeps it
        seq = self._append_protocol(
            rec,
            T_REJECTED,
            "system:guard",
            {"code": error.code, "reason": reason, **wire.bounded_raw(raw), "actor": actor},
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
                "feeds": {"pull": True, "http": True, "mcp": True, "sse": self.streams},
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
                "max_name_chars": MAX_NAME_CHARS,
                "max_json_depth": MAX_JSON_DEPTH,
                "max_filter_bytes": MAX_FILTER_BYTES,
                "max_filter_text_chars": MAX_FILTER_TEXT_CHARS,
                "max_reason_bytes": MAX_REASON_BYTES,
                "max_rpc_batch": MAX_RPC_BATCH,
                "max_active_subscriptions": MAX_ACTIVE_SUBSCRIPTIONS,
                "max_future_seconds": MAX_FUTURE_SECONDS,
                "max_integer": MAX_INTEGER,
                "scan_budget": SCAN_BUDGET,
                "idempotency_key_max_chars": IDEMPOTENCY_KEY_MAX_CHARS,
                "idempotency_window_seconds": IDEMPOTENCY_WINDOW_SECONDS,
            },
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION, "implementation": "python"},
            "ttlMs": 60000,
            "cacheScope": "public",
        }


_PRIVATE_SUB_FIELDS = (
    "token_hash",
    "_hwm",
    "_mute_since",
    "_last_ack",
    "_relist",
    "_sink_secret",
    "_grant",
    "_revoked",
    "_scan_mark",
)


class _LoggedRefusal(Exception):
    """Carries a refusal out of a transaction that must still commit (its rejected row is evidence)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(error.message)
        self.error = error
