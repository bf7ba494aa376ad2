"""Reading what the store format before typed records (version 1, commit 00e022d) wrote, once.

Two media hold version 1 records:
- a browser's IndexedDB: the MemoryStore journal's rows, `(table, key, dict record)`, which
  `MemoryStore.load` accepts in either version (`journal_from_v1` converts the old ones);
- a SQLite file with `PRAGMA user_version` 0 and the tables `monitors(id, rec)`, `observations(monitor,
  seq, event)`, `subscriptions(..., rec)`, `leases(..., rec)`, `idempotency(monitor, key, at, rec)` and
  `subjects`, which `migrate_sqlite` rewrites in place, inside the caller's transaction.

Records are converted by records.*_from_v1; this module knows only where version 1 kept them. It imports
no sqlite3 (the memory half runs in Pyodide, which may lack it): the SQLite half takes a connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from monitor_protocol.core.records import (
    Lease,
    Monitor,
    Observation,
    PublishKey,
    Subscription,
    lease_from_v1,
    monitor_from_v1,
    subscription_from_v1,
)
from monitor_protocol.core.store_contract import Changes

V1_VERSION = 0  # what `PRAGMA user_version` reads in a version 1 file (it never set one)


class MigrationError(Exception):
    """A version 1 record could not be converted; names the table and the record's key."""


def publish_key_from_v1(monitor: str, key: str, rec: dict[str, Any]) -> PublishKey:
    """A v1 idempotency record, `{"seq", "at"}` kept under (monitor, key)."""
    return PublishKey(monitor, key, int(rec["seq"]), float(rec["at"]))


# ===================================================================================== IndexedDB rows
# What tells a version 2 journal row from a version 1 one: a field that to_row() always writes and v1
# never did (v1 kept the same facts under "_owner_hash", "active", "lease_duration_seconds", and no key).
V2_MARKERS = {"monitors": "owner_hash", "subscriptions": "state", "leases": "duration", "idempotency": "key"}


def is_v1_row(table: str, row: dict[str, Any]) -> bool:
    marker = V2_MARKERS.get(table)
    return marker is not None and marker not in row


def journal_from_v1(table: str, key: str, row: dict[str, Any]) -> Monitor | Subscription | Lease | PublishKey:
    """A version 1 journal row of `table` as its record (observations and subjects did not change)."""
    if table == "monitors":
        return monitor_from_v1(row)
    if table == "subscriptions":
        return subscription_from_v1(row)
    if table == "leases":
        return lease_from_v1(row)
    if table == "idempotency":
        monitor, idem_key = json.loads(key)
        return publish_key_from_v1(monitor, idem_key, row)
    raise ValueError(f"no version 1 conversion for table {table!r}")


# ===================================================================================== SQLite files
# The v1 tables that change shape (subjects keeps its shape and stays where it is), and the v1 indexes,
# which keep their names when their table is renamed and would clash with version 2's.
V1_TABLES = ("monitors", "observations", "subscriptions", "leases", "idempotency")
V1_INDEXES = ("subscriptions_by_name", "subscriptions_by_token", "subscriptions_active", "idempotency_by_at")
BATCH = 1000  # records converted per write: bounded memory however long the log is


def is_v1_database(db: Any) -> bool:
    """A version 1 file: its `monitors` table is `(id, rec)`."""
    cols = [r[1] for r in db.execute("PRAGMA table_info(monitors)")]
    return cols == ["id", "rec"]


def _rows(db: Any, sql: str) -> Iterator[tuple[Any, ...]]:
    cur = db.execute(sql)
    while rows := cur.fetchmany(BATCH):
        yield from rows


def _convert(table: str, key: Any, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise MigrationError(f"{table} record {key!r}: {type(exc).__name__}: {exc}") from exc


# (v1 table, the SELECT that reads it in key order, row -> (Changes field, record))
def _monitor(r: tuple[Any, ...]) -> Monitor:
    return _convert("monitors", r[0], lambda: monitor_from_v1(json.loads(r[1])))


def _observation(r: tuple[Any, ...]) -> Observation:
    return _convert("observations", (r[0], r[1]), lambda: Observation.of(r[0], int(r[1]), json.loads(r[2])))


def _subscription(r: tuple[Any, ...]) -> Subscription:
    return _convert("subscriptions", r[0], lambda: subscription_from_v1(json.loads(r[1])))


def _lease(r: tuple[Any, ...]) -> Lease:
    return _convert("leases", (r[0], r[1]), lambda: lease_from_v1(json.loads(r[2])))


def _publish_key(r: tuple[Any, ...]) -> PublishKey:
    return _convert("idempotency", (r[0], r[1]), lambda: publish_key_from_v1(r[0], r[1], json.loads(r[2])))


_COPIES: tuple[tuple[str, str, str, Callable[[tuple[Any, ...]], Any]], ...] = (
    ("monitors", "monitors", "SELECT id, rec FROM v1_monitors ORDER BY id", _monitor),
    (
        "observations",
        "observations",
        "SELECT monitor, seq, event FROM v1_observations ORDER BY monitor, seq",
        _observation,
    ),
    ("subscriptions", "subscriptions", "SELECT id, rec FROM v1_subscriptions ORDER BY id", _subscription),
    ("leases", "leases", "SELECT monitor, subject, rec FROM v1_leases ORDER BY monitor, subject", _lease),
    (
        "idempotency",
        "publish_keys",
        "SELECT monitor, key, rec FROM v1_idempotency ORDER BY monitor, key",
        _publish_key,
    ),
)


def migrate_sqlite(
    db: Any, create_schema: Callable[[], None], write: Callable[[Changes], None]
) -> dict[str, int]:
    """Rewrite a version 1 file as the current schema, inside the caller's open transaction (the caller
    sets the new user_version and commits; a failure anywhere leaves the file as it was once rolled back).
    `create_schema` makes the current tables, `write` is the store's apply body. Returns how many records
    of each v1 table were copied."""
    for index in V1_INDEXES:
        db.execute(f"DROP INDEX IF EXISTS {index}")
    for table in V1_TABLES:
        db.execute(f"ALTER TABLE {table} RENAME TO v1_{table}")
    create_schema()
    copied: dict[str, int] = {}
    for v1_table, field_name, select, convert in _COPIES:
        n = 0
        batch: list[Any] = []
        for row in _rows(db, select):
            batch.append(convert(row))
            if len(batch) >= BATCH:
                write(Changes(**{field_name: batch}))
                n, batch = n + len(batch), []
        if batch:
            write(Changes(**{field_name: batch}))
            n += len(batch)
        copied[v1_table] = n
    for table in V1_TABLES:
        db.execute(f"DROP TABLE v1_{table}")
    return copied
