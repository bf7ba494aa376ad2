"""What the two SQL stores (SQLite, PostgreSQL) share: the columns each table keeps out of a record, the
upsert statement, a record's row as column values and back, and the helpers of indexed log reads."""

from __future__ import annotations

import operator
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.records import MONITOR_FIXED_FIELDS, Monitor
from monitor_protocol.core.store_contract import LOG_COLUMNS

# The columns each table keeps out of a record's to_row(); the rest of the row is its `rec` JSON.
MONITOR_COLUMNS = ("id", "status", "head", "floor")  # monitor_row's order
SUBSCRIPTION_COLUMNS = ("id", "monitor", "subscriber", "token_hash", "state", "cursor", "hwm", "mute_since")
LEASE_COLUMNS = ("monitor", "subject", "state", "holder", "renewed", "duration")
OBSERVATION_COLUMNS = ("seq", *LOG_COLUMNS, "event")

# Indexes added to both SQL stores' schemas after their release (each store creates what it finds missing):
# the held leases the sweep reads, without walking the free ones every subject once leased leaves behind.
ADDED_INDEXES = {
    "leases_held": "CREATE INDEX IF NOT EXISTS leases_held ON leases (monitor, subject) WHERE holder IS NOT NULL",
}


def upsert_sql(table: str, columns: tuple[str, ...], key: str, mark: str = "?") -> str:
    """An upsert on the key (SQLite's and PostgreSQL's common syntax; `mark` is the driver's placeholder),
    never INSERT OR REPLACE: for subscriptions, a (monitor, subscriber) that belongs to ANOTHER row must
    violate the unique index (REPLACE would silently delete that other row)."""
    cols = (*columns, "rec")
    updates = ", ".join(f"{c}=excluded.{c}" for c in cols if c not in key.split(", "))
    marks = ", ".join([mark] * len(cols))
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks}) ON CONFLICT({key}) DO UPDATE SET {updates}"
    )


def row_values(row: dict[str, Any], columns: tuple[str, ...]) -> tuple[Any, ...]:
    """A record's to_row() as its table's column values, then the JSON of what is left."""
    return (*map(row.pop, columns), wire.encode_text(row))  # (map: no generator frame per column)


# Each monitor's fixed part (Monitor.fixed_row) as the field values it was encoded from and its JSON text
# without the closing brace. A publish or a pull makes a new record with the same field objects (records are
# immutable and `evolve` passes them on), so the check is one identity test per field, and only a changed
# definition, owner or subscribe token encodes that part again. Any number of stores and threads may share
# it: a stale entry is never used (identity), a race only encodes twice.
_FIXED_TEXT: dict[str, tuple[tuple[Any, ...], str]] = {}
_FIXED_TEXT_MAX = 4096
_fixed_values = operator.attrgetter(*MONITOR_FIXED_FIELDS)


def monitor_row(m: Monitor) -> tuple[Any, ...]:
    """row_values(m.to_row(), MONITOR_COLUMNS), the same columns and a `rec` that decodes to the same, with
    the fixed part encoded once per version of it (about 4 of a publish's 9 µs)."""
    values = _fixed_values(m)
    held = _FIXED_TEXT.get(m.id)
    if held is None or not all(map(operator.is_, held[0], values)):
        if len(_FIXED_TEXT) >= _FIXED_TEXT_MAX:
            _FIXED_TEXT.clear()
        held = _FIXED_TEXT[m.id] = (values, wire.encode_text(m.fixed_row())[:-1])
    state = m.state_row()
    status, head, floor = state.pop("status"), state.pop("head"), state.pop("floor")
    return (m.id, status, head, floor, f"{held[1]},{wire.encode_text(state)[1:]}")


def row_of(values: tuple[Any, ...], columns: tuple[str, ...]) -> dict[str, Any]:
    """The inverse of row_values: the JSON rest with the column values put back."""
    row = wire.decode_trusted(values[len(columns)])
    row.update(zip(columns, values, strict=False))
    return row


def capped_count_sql(source: str, cond: str, mark: str) -> str:
    """How many log rows hold `cond` in a seq range, with the driver's placeholder `mark`; the LIMIT inside
    bounds the work: a capped count stops at the cap (SQLite's -1 and PostgreSQL's NULL: no limit)."""
    return (
        f"SELECT count(*) FROM (SELECT 1 FROM {source} WHERE monitor={mark} AND seq>={mark} AND seq<={mark} "
        f"AND ({cond}) LIMIT {mark}) AS capped"
    )


def next_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (None: there is none, so a prefix
    range has no upper bound). Increment the last code point, skipping the surrogates (no stored text holds
    one); a last code point of U+10FFFF is dropped and the one before it incremented. SQLite compares
    text as UTF-8 bytes, whose order is code point order, the order Python compares strings in."""
    chars = list(prefix)
    while chars:
        code = ord(chars.pop()) + 1
        if code <= 0x10FFFF:
            if 0xD800 <= code <= 0xDFFF:
                code = 0xE000
            return "".join(chars) + chr(code)
    return None


def storable(text: str) -> bool:
    """Text SQLite can hold (UTF-8). A lone surrogate, which JSON can spell, can match no stored value."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
