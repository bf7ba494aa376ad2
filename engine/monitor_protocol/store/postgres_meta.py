"""What PostgresStore reads and writes in `mp_meta` beyond its schema version, and whether the database
accepts writes: `mp migrate`'s marker of an unfinished copy (written before its first record, removed once
every monitor verified; a marked database is served by nobody), the read-only check of /readyz, and what
schema version 2 gained after its release (created when missing)."""

from __future__ import annotations

import logging
from typing import Any

from monitor_protocol.core.store_contract import StorageError
from monitor_protocol.store.postgres_link import redacted, scrub
from monitor_protocol.store.postgres_sql import (
    AS_READ_FUNCTION,
    AS_READ_FUNCTION_SQL,
    READER_AS_READ_FUNCTION,
    READER_AS_READ_FUNCTION_SQL,
)
from monitor_protocol.store.sql import ADDED_INDEXES

log = logging.getLogger("monitor_protocol.store.postgres")

MIGRATING_KEY = "migrating"


class IncompleteCopy(RuntimeError):
    """`mp migrate` began copying into this database and did not finish (killed, failed, or its copy differed
    from the source): its marker in mp_meta is still there, so nothing is served from it."""


class ForeignTables(RuntimeError):
    """The database has no mp_meta but holds tables with this store's names: another program's. Nothing is
    created or written in it."""


OWN_TABLES = ("monitors", "observations", "subjects", "subscriptions", "leases", "publish_keys")


class MetaRows:
    """PostgresStore's part that reads and writes these rows (its `transaction` and `_rows`)."""

    url: str
    migrating: bool  # opened by mp migrate, which may find its own unfinished copy here
    psycopg: Any
    believe_memory: bool
    transaction: Any
    _rows: Any
    _s: Any

    def _add_what_came_later(self) -> None:
        """The checks of remembered rows (LOCK_AS_READ_SQL, READER_AS_READ_SQL) and the indexes of
        ADDED_INDEXES were added to schema version 2 after it was first released: created here when missing,
        alone (nothing else of the schema is touched). A server that cannot create them (a read-only standby, a
        role without CREATE) reads every row with its lock instead of believing its memory, as before (and
        its sweep reads every lease)."""
        s = self._s
        functions = {
            AS_READ_FUNCTION: AS_READ_FUNCTION_SQL,
            READER_AS_READ_FUNCTION: READER_AS_READ_FUNCTION_SQL,
        }
        asked = [f"to_regproc('{name}') IS NOT NULL" for name in functions]
        asked += [f"to_regclass('{name}') IS NOT NULL" for name in ADDED_INDEXES]
        found = self._rows("SELECT " + ", ".join(asked), prepare=False)[0]
        wanted = {**functions, **ADDED_INDEXES}
        missing = [name for name, there in zip(wanted, found, strict=True) if there != b"t"]
        if not missing:
            return
        try:  # the last statements of the schema's transaction: a refusal aborts nothing else
            s.run([(wanted[name], ()) for name in missing], prepare=False)
            s.wrote = True
        except (self.psycopg.Error, StorageError) as exc:
            if any(name in functions for name in missing):
                self.believe_memory = False
            log.warning(
                "cannot create %s (%s): this server reads each row with its lock (and every lease in a sweep)",
                " and ".join(missing),
                scrub(f"{type(exc).__name__}: {exc}", self.url),
            )

    def unfinished_copy(self) -> str | None:
        """What mp migrate said when it began copying into this database ("from X began at T"), while its
        copy is not finished and verified; None otherwise."""
        row = self._rows("SELECT value FROM mp_meta WHERE key=$1", (MIGRATING_KEY,), prepare=False)
        return row[0][0].decode() if row else None

    def refuse_foreign_tables(self) -> None:
        """Before the schema is created in a database without mp_meta: none of its tables may be there."""
        names = ", ".join(f"'{name}'" for name in OWN_TABLES)
        found = self._rows(
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p', 'v', 'm', 'f') AND pg_table_is_visible(oid) "
            f"AND relname IN ({names}) ORDER BY relname",
            prepare=False,
        )
        if found:
            tables = ", ".join(row[0].decode() for row in found)
            raise ForeignTables(
                f"The database {redacted(self.url)} holds no Monitor Protocol schema (no mp_meta) but already "
                f"has tables named {tables}, another program's: nothing was created or written in it. Give "
                "the server a database of its own (CREATE DATABASE mp OWNER mp)."
            )

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
