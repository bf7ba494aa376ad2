"""What PostgresStore reads and writes in `mp_meta` beyond its schema version, and whether the database
accepts writes: `mp migrate`'s marker of an unfinished copy (written before its first record, removed once
every monitor verified; a marked database is served by nobody), and the read-only check of /readyz."""

from __future__ import annotations

from typing import Any

from monitor_protocol.store.postgres_link import redacted

MIGRATING_KEY = "migrating"


class IncompleteCopy(RuntimeError):
    """`mp migrate` began copying into this database and did not finish (killed, failed, or its copy differed
    from the source): its marker in mp_meta is still there, so nothing is served from it."""


class MetaRows:
    """PostgresStore's part that reads and writes these rows (its `transaction` and `_rows`)."""

    url: str
    migrating: bool  # opened by mp migrate, which may find its own unfinished copy here
    transaction: Any
    _rows: Any
    _s: Any

    def unfinished_copy(self) -> str | None:
        """What mp migrate said when it began copying into this database ("from X began at T"), while its
        copy is not finished and verified; None otherwise."""
        row = self._rows("SELECT value FROM mp_meta WHERE key=$1", (MIGRATING_KEY,), prepare=False)
        return row[0][0].decode() if row else None

    def refuse_unfinished_copy(self) -> None:
        copy = self.unfinished_copy()
        if copy is not None and not self.migrating:
            raise IncompleteCopy(
                f"The database {redacted(self.url)} holds an unfinished copy: mp migrate {copy} and did not "
                "finish (stopped, failed, or the copy differed from its source). Nothing will be served from "
                "it: drop and recreate the database, then run mp migrate again."
            )

    def mark_copying(self, note: str) -> None:
        self._meta(
            "INSERT INTO mp_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value=$2", note
        )

    def copy_verified(self) -> None:
        self._meta("DELETE FROM mp_meta WHERE key=$1")

    def _meta(self, sql: str, *values: str) -> None:
        with self.transaction():
            self._rows(sql, (MIGRATING_KEY, *values), prepare=False)
            self._s.wrote = True

    def read_only(self) -> bool:
        """Whether the database accepts no writes (a standby, or default_transaction_read_only): /readyz says
        not ready, since every publish, pull and ack would fail here."""
        with self.transaction():
            row = self._rows("SELECT current_setting('transaction_read_only')", prepare=False)
        return bool(row) and row[0][0] == b"on"
