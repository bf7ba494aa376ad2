"""The memory store: dicts with an undo journal (rollback) and a change journal (for the browser's
IndexedDB door, which persists `drain_changes()` after each call and restores with `load()`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .base import Record, Store, lease_key, observation_key

TABLES = ("monitors", "observations", "subjects", "subscriptions", "leases", "idempotency")


class MemoryStore(Store):
    def __init__(self) -> None:
        self._monitors: dict[str, Record] = {}
        self._logs: dict[str, dict[int, Record]] = {}
        self._subjects: set[tuple[str, str]] = set()
        self._subs: dict[str, Record] = {}
        self._subs_by_name: dict[tuple[str, str], str] = {}
        self._subs_by_token: dict[str, str] = {}
        self._subs_by_monitor: dict[str, dict[str, None]] = {}
        self._leases: dict[tuple[str, str], Record] = {}
        self._idem: dict[tuple[str, str], Record] = {}
        self._undo: list[tuple[str, Any, Any]] | None = None
        self._pending: list[tuple[str, str, Any]] = []
        self._changes: list[tuple[str, str, Any]] = []

    # --- transactions -------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._undo is not None:  # nested: the outer transaction owns commit and rollback
            yield
            return
        self._undo = []
        self._pending = []
        try:
            yield
        except BaseException:
            for kind, key, before in reversed(self._undo):
                self._restore(kind, key, before)
            self._undo = None
            self._pending = []
            raise
        self._undo = None
        self._changes.extend(self._pending)
        self._pending = []

    def _journal(self, kind: str, key: Any, before: Any, change: tuple[str, str, Any]) -> None:
        if self._undo is not None:
            self._undo.append((kind, key, before))
            self._pending.append(change)
        else:
            self._changes.append(change)

    def _restore(self, kind: str, key: Any, before: Any) -> None:
        if kind == "monitor":
            if before is None:
                self._monitors.pop(key, None)
            else:
                self._monitors[key] = before
        elif kind == "obs":
            monitor, seq = key
            if before is None:
                self._logs.get(monitor, {}).pop(seq, None)
            else:
                self._logs.setdefault(monitor, {})[seq] = before
        elif kind == "subject":
            self._subjects.discard(key)
        elif kind == "sub":
            current = self._subs.get(key)
            if current is not None:
                self._unindex_sub(current)
            if before is None:
                self._subs.pop(key, None)
            else:
                self._subs[key] = before
                self._index_sub(before)
        elif kind == "lease":
            if before is None:
                self._leases.pop(key, None)
            else:
                self._leases[key] = before
        elif kind == "idem":
            if before is None:
                self._idem.pop(key, None)
            else:
                self._idem[key] = before

    # --- browser persistence ------------------------------------------------------------------------
    def drain_changes(self) -> list[tuple[str, str, Any]]:
        """Records written since the last drain as (table, key, value or None for deleted)."""
        out, self._changes = self._changes, []
        return out

    def load(self, records: list[tuple[str, str, Any]]) -> None:
        """Restore records read back from a persistent medium (drain_changes' format)."""
        for table, key, value in records:
            if value is None:
                continue
            if table == "monitors":
                self._monitors[key] = value
            elif table == "observations":
                self._logs.setdefault(value["source"].split(":", 1)[1], {})[int(value["id"])] = value
            elif table == "subjects":
                monitor, subject = json.loads(key)
                self._subjects.add((monitor, subject))
            elif table == "subscriptions":
                self._subs[key] = value
                self._index_sub(value)
            elif table == "leases":
                self._leases[(value["monitor"], value["subject"])] = value
            elif table == "idempotency":
                monitor, idem_key = json.loads(key)
                self._idem[(monitor, idem_key)] = value
        self._changes = []

    # --- monitors ---------------------------------------------------------------------------------
    def get_monitor(self, monitor_id: str) -> Record | None:
        rec = self._monitors.get(monitor_id)
        return copy.deepcopy(rec) if rec is not None else None

    def put_monitor(self, rec: Record) -> None:
        key = rec["id"]
        self._journal("monitor", key, self._monitors.get(key), ("monitors", key, copy.deepcopy(rec)))
        self._monitors[key] = copy.deepcopy(rec)

    def list_monitors(self) -> list[Record]:
        return [copy.deepcopy(m) for _, m in sorted(self._monitors.items())]

    # --- the log ----------------------------------------------------------------------------------
    def append(self, monitor_id: str, seq: int, event: Record) -> None:
        log = self._logs.setdefault(monitor_id, {})
        if seq in log:
            raise ValueError(f"seq {seq} already exists in {monitor_id}")
        self._journal(
            "obs", (monitor_id, seq), None, ("observations", observation_key(monitor_id, seq), event)
        )
        log[seq] = copy.deepcopy(event)

    # Observations are written once (a deep copy on append) and never edited (P13): a reader gets a
    # shallow copy, enough for the one top-level mark a pull adds (`redelivered`).
    def get_observation(self, monitor_id: str, seq: int) -> Record | None:
        ev = self._logs.get(monitor_id, {}).get(seq)
        return dict(ev) if ev is not None else None

    def scan(self, monitor_id: str, from_seq: int, to_seq: int) -> Iterator[Record]:
        log = self._logs.get(monitor_id, {})
        for seq in range(max(from_seq, 1), to_seq + 1):
            ev = log.get(seq)
            if ev is not None:
                yield dict(ev)

    def delete_below(self, monitor_id: str, seq: int) -> int:
        log = self._logs.get(monitor_id, {})
        gone = [s for s in log if s < seq]
        for s in gone:
            self._journal(
                "obs", (monitor_id, s), log[s], ("observations", observation_key(monitor_id, s), None)
            )
            del log[s]
        return len(gone)

    # --- subjects ---------------------------------------------------------------------------------
    def has_subject(self, monitor_id: str, subject: str) -> bool:
        return (monitor_id, subject) in self._subjects

    def add_subject(self, monitor_id: str, subject: str) -> None:
        key = (monitor_id, subject)
        if key in self._subjects:
            return
        self._journal(
            "subject", key, None, ("subjects", json.dumps([monitor_id, subject]), {"monitor": monitor_id})
        )
        self._subjects.add(key)

    # --- subscriptions ----------------------------------------------------------------------------
    def _index_sub(self, rec: Record) -> None:
        self._subs_by_name[(rec["monitor"], rec["subscriber"])] = rec["id"]
        self._subs_by_token[rec["token_hash"]] = rec["id"]
        self._subs_by_monitor.setdefault(rec["monitor"], {})[rec["id"]] = None

    def _unindex_sub(self, rec: Record) -> None:
        self._subs_by_name.pop((rec["monitor"], rec["subscriber"]), None)
        self._subs_by_token.pop(rec["token_hash"], None)
        ids = self._subs_by_monitor.get(rec["monitor"])
        if ids is not None:
            ids.pop(rec["id"], None)
            if not ids:
                del self._subs_by_monitor[rec["monitor"]]

    def get_subscription(self, sub_id: str) -> Record | None:
        rec = self._subs.get(sub_id)
        return copy.deepcopy(rec) if rec is not None else None

    def put_subscription(self, rec: Record) -> None:
        key = rec["id"]
        owner = self._subs_by_name.get((rec["monitor"], rec["subscriber"]))
        if owner is not None and owner != key:  # as SQLite's unique (monitor, subscriber) index refuses it
            raise ValueError(
                f"subscriber {rec['subscriber']!r} of monitor {rec['monitor']!r} already belongs to "
                f"subscription {owner}, not {key}"
            )
        before = self._subs.get(key)
        self._journal("sub", key, before, ("subscriptions", key, copy.deepcopy(rec)))
        if before is not None:
            self._unindex_sub(before)
        self._subs[key] = copy.deepcopy(rec)
        self._index_sub(rec)

    def find_subscription(self, monitor_id: str, subscriber: str) -> Record | None:
        sub_id = self._subs_by_name.get((monitor_id, subscriber))
        return self.get_subscription(sub_id) if sub_id else None

    def count_active_subscriptions(self, monitor_id: str) -> int:
        subs = self._subs
        return sum(1 for sid in self._subs_by_monitor.get(monitor_id, ()) if subs[sid].get("active"))

    def find_subscription_by_token(self, token_hash: str) -> Record | None:
        sub_id = self._subs_by_token.get(token_hash)
        return self.get_subscription(sub_id) if sub_id else None

    def list_subscriptions(self, monitor_id: str | None = None) -> list[Record]:
        return [
            copy.deepcopy(s)
            for _, s in sorted(self._subs.items())
            if monitor_id is None or s["monitor"] == monitor_id
        ]

    # --- leases -----------------------------------------------------------------------------------
    def get_lease(self, monitor_id: str, subject: str) -> Record | None:
        rec = self._leases.get((monitor_id, subject))
        return copy.deepcopy(rec) if rec is not None else None

    def put_lease(self, rec: Record) -> None:
        key = (rec["monitor"], rec["subject"])
        self._journal("lease", key, self._leases.get(key), ("leases", lease_key(*key), copy.deepcopy(rec)))
        self._leases[key] = copy.deepcopy(rec)

    def list_leases(self, monitor_id: str | None = None) -> list[Record]:
        return [
            copy.deepcopy(rec)
            for key, rec in sorted(self._leases.items())
            if monitor_id is None or key[0] == monitor_id
        ]

    # --- publish idempotency keys -----------------------------------------------------------------
    def get_idempotency(self, monitor_id: str, key: str) -> Record | None:
        rec = self._idem.get((monitor_id, key))
        return copy.deepcopy(rec) if rec is not None else None

    def put_idempotency(self, monitor_id: str, key: str, rec: Record) -> None:
        k = (monitor_id, key)
        self._journal("idem", k, self._idem.get(k), ("idempotency", json.dumps(list(k)), copy.deepcopy(rec)))
        self._idem[k] = copy.deepcopy(rec)

    def purge_idempotency(self, before: float) -> int:
        gone = [k for k, rec in self._idem.items() if rec["at"] < before]
        for k in gone:
            self._journal("idem", k, self._idem[k], ("idempotency", json.dumps(list(k)), None))
            del self._idem[k]
        return len(gone)
