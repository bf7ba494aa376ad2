"""IndexedDB durability for the browser: the engine runs on a MemoryStore, and this door writes the records
each call changed (`MemoryStore.drain_changes()`) in ONE IndexedDB transaction, awaited before the reply
is given; on load it reads every record back into the MemoryStore (`MemoryStore.load`).

The IndexedDB calls go through a small JavaScript helper (`window.MP.idb` in the playground's boot.js:
`open()`, `loadAll()`, `apply(changesJson)`, `clear()`), so this module imports `js` lazily and the
encoding functions below run (and are tested) in plain CPython too. One engine call is one string handed
to JavaScript, one `JSON.parse` and one IndexedDB transaction there: no per-record proxies or crossings.

Record layout in the object store `records`: key = JSON `[table, key]` (ASCII, as `record_key` writes it),
value = the record as JSON text: its `to_row()`, or for an observation the event as served. The tables are
MemoryStore's `TABLES` (monitors, observations, subjects, subscriptions, leases, idempotency: the publish
keys), all in that one object store: a new table needs no new object store and no IndexedDB version
upgrade. The layout, table names and keys are those of the version before typed records; only the values
of monitors, subscriptions, leases and publish keys changed shape, and `MemoryStore.load` reads both (a
record of the old shape is rewritten in the new one the next time a call changes it).
"""

from __future__ import annotations

import json
from typing import Any

from monitor_protocol.store.memory import TABLES, MemoryStore

Change = tuple[str, str, Any]


def record_key(table: str, key: str) -> str:
    return json.dumps([table, key], separators=(",", ":"))


def encode_changes(changes: list[Change]) -> str:
    """Drained changes as the helper's batch: `[[table, key, value | null], ...]`, in order, encoded ONCE
    (the helper turns each into its record key and value text: nesting each value as a JSON string here
    would escape every record twice, in Python, on the engine's critical path)."""
    return json.dumps(changes, separators=(",", ":"))


def decode_records(text: str) -> list[Change]:
    """`loadAll()`'s `[[recordKey, valueJson], ...]` back into MemoryStore.load's (table, key, value)."""
    out: list[Change] = []
    for rkey, value in json.loads(text):
        table, key = json.loads(rkey)
        out.append((table, key, None if value is None else json.loads(value)))
    # Monitors first, then the log, then what refers to them: load() indexes as it goes.
    order = {table: i for i, table in enumerate(TABLES)}
    out.sort(key=lambda rec: order.get(rec[0], 9))
    return out


class StorageUnavailable(Exception):
    """IndexedDB was refused (private mode, blocked storage, no API): the page runs in memory only."""


class IndexedDBStore:
    """Makes a MemoryStore durable in IndexedDB. Use: `await open()`, `await restore()`, then after every
    engine call `await flush()` before replying. When IndexedDB is refused, `durable` stays False and
    `flush` does nothing: the page says so ("storage: memory — not saved")."""

    def __init__(self, memory: MemoryStore, helper: Any = None) -> None:
        self.memory = memory
        self._helper = helper
        self.durable = False
        self.reason: str | None = None
        self.flushed_batches = 0
        self.flushed_records = 0

    @property
    def helper(self) -> Any:
        if self._helper is None:
            import js  # Pyodide only

            self._helper = js.MP.idb
        return self._helper

    async def open(self) -> bool:
        try:
            await self.helper.open()
        except Exception as exc:  # a JsException in the browser: storage refused or missing
            self.durable = False
            self.reason = str(exc) or type(exc).__name__
            return False
        self.durable = True
        return True

    async def restore(self) -> int:
        """Read every record back into the memory store; returns how many were loaded."""
        if not self.durable:
            return 0
        records = decode_records(str(await self.helper.loadAll()))
        self.memory.load(records)
        self.memory.drain_changes()
        return len(records)

    def start_flush(self) -> Any:
        """Hand what changed since the last flush to IndexedDB as ONE transaction, created now (so commits
        keep the engine's order), without waiting: returns the commit's promise, or None when there is
        nothing to write. The helper also folds it into `committed()`, which the service-worker door
        (boot.js `MP.serve`) awaits before it replies, so the reply still follows the commit."""
        changes = self.memory.drain_changes()
        if not changes or not self.durable:
            return None
        promise = self.helper.apply(encode_changes(changes))
        self.flushed_batches += 1
        self.flushed_records += len(changes)
        return promise

    async def flush(self) -> int:
        """Write what changed since the last flush in one IndexedDB transaction and wait for it to commit."""
        promise = self.start_flush()
        if promise is None:
            return 0
        await promise
        return 1

    async def clear(self) -> None:
        if self.durable:
            await self.helper.clear()
