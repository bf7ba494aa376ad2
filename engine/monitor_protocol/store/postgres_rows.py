"""The PostgreSQL store's rows as records: each column arrives as its text (libpq's text format, bytes), and
what a row decodes to is kept while its text is the same (`Decoded`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from monitor_protocol.core.records import (
    Lease,
    Monitor,
    Observation,
    ServedRow,
    Subscription,
    stored_observation,
)
from monitor_protocol.store.postgres_sql import dec
from monitor_protocol.store.postgres_wire import Row, encode, text
from monitor_protocol.store.sql import LEASE_COLUMNS, MONITOR_COLUMNS, SUBSCRIPTION_COLUMNS, row_of


def _int(v: bytes | None) -> int | None:
    return None if v is None else int(v)


def _float(v: bytes | None) -> float | None:
    return None if v is None else float(v)


class Decoded:
    """Records decoded from rows, kept by key and used again while the row's text is the same: a call still
    reads every row it needs under its lock (nothing is believed without the database saying it), but a
    monitor or a subscription whose stored text has not changed since this server last read or wrote it
    costs no JSON decoding. Equal text is an equal record, since decoding is a function of the text."""

    def __init__(self, decode: Callable[[Row], Any], limit: int = 10_000) -> None:
        self._decode = decode
        self._limit = limit
        self._seen: dict[bytes | None, tuple[Row, Any]] = {}

    def __call__(self, r: Row) -> Any:
        r = tuple(r)
        hit = self._seen.get(r[0])
        if hit is not None and hit[0] == r:
            return hit[1]
        rec = self._decode(r)
        self.remember(r, rec)
        return rec

    def remember(self, r: Row, rec: Any) -> None:
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen[r[0]] = (r, rec)

    def known(self, key: bytes) -> tuple[Row, Any] | None:
        """The row last read or written under `key` (its first column's text) and its record, if any."""
        return self._seen.get(key)

    def forget(self, key: bytes) -> None:
        self._seen.pop(key, None)


def as_text(values: tuple[Any, ...]) -> Row:
    """Written column values as the database's text form of them (what a read of the row returns)."""
    return tuple(encode(v) for v in values)


def monitor(r: Row) -> Monitor:
    return Monitor.from_row(
        row_of((text(r[0]), text(r[1]), _int(r[2]), _int(r[3]), text(r[4])), MONITOR_COLUMNS)
    )


def subscription(r: Row) -> Subscription:
    values = (
        text(r[0]), text(r[1]), text(r[2]), text(r[3]), text(r[4]), _int(r[5]), _int(r[6]), _float(r[7]),
        text(r[8]),
    )  # fmt: skip
    return Subscription.from_row(row_of(values, SUBSCRIPTION_COLUMNS))


def lease(r: Row) -> Lease:
    values = (
        text(r[0]), dec(text(r[1])), text(r[2]), dec(text(r[3])), _float(r[4]), _int(r[5]), text(r[6]),
    )  # fmt: skip
    return Lease.from_row(row_of(values, LEASE_COLUMNS))


def observation(monitor: str, r: Row) -> Observation:  # its event decoded when first read
    return stored_observation(
        monitor, int(r[0]), dec(text(r[1])), dec(text(r[2])), dec(text(r[3])), dec(text(r[4])), dec(text(r[5])),
        dec(text(r[6])), r[7].decode(), len(r[7]),
    )  # fmt: skip


def served(seq: int, event: bytes) -> ServedRow:
    """A log row read only to be served (Store.read_range's `served`): its seq and its event's stored text,
    measured in bytes as `observation` measures it."""
    return ServedRow(seq, event.decode(), len(event))


class PageRow:
    """A row of the log read ahead with a subscription ('o', seq, type, ..., event): its values are read
    from the result only when the row is used (a pull of one row uses one of them)."""

    __slots__ = ("_res", "_i", "seq")

    def __init__(self, res: Any, i: int) -> None:
        self._res, self._i = res, i
        self.seq = int(res.get_value(i, 1))

    def __getitem__(self, column: int) -> Any:
        return self.seq if column == 0 else self._res.get_value(self._i, column + 1)
