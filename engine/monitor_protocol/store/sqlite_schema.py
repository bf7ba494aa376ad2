"""The SQLite store's tables and indexes (store/sqlite.py creates them and brings an older file to
SCHEMA_VERSION): a columnar log indexed by type, subject and actor, the subscriptions with the columns a
reader's pull or ack changes, leases and publish idempotency keys. PostgreSQL keeps its own
(store/postgres_sql.py)."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.store.sql import ADDED_INDEXES, OBSERVATION_COLUMNS

PUT_OBSERVATION = (
    f"INSERT INTO observations (monitor, {', '.join(OBSERVATION_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (1 + len(OBSERVATION_COLUMNS)))})"
)
PUT_PUBLISH_KEY = "INSERT OR REPLACE INTO publish_keys (monitor, key, seq, at) VALUES (?, ?, ?, ?)"
SELECT_FROM = f"SELECT {', '.join(OBSERVATION_COLUMNS)} FROM"
SELECT_OBSERVATION = f"{SELECT_FROM} observations"
SELECT_RANGE = (
    f"{SELECT_OBSERVATION} WHERE monitor=? AND seq>=? AND seq<=? ORDER BY seq"  # (a LIMIT may follow)
)
# A range read only to be served (Store.read_range's `served`): each row's seq and stored text, nothing else.
SELECT_SERVED = "SELECT seq, event FROM observations WHERE monitor=? AND seq>=? AND seq<=? ORDER BY seq"

# Statements, not a script: `executescript` would commit the migration's open transaction first.
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS monitors (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, head INTEGER NOT NULL, floor INTEGER NOT NULL,
        rec TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS observations (
        monitor TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, subject TEXT, actor TEXT NOT NULL,
        origin TEXT NOT NULL, tier TEXT NOT NULL, horizon TEXT NOT NULL, event TEXT NOT NULL,
        PRIMARY KEY (monitor, seq)
    ) WITHOUT ROWID""",
    # A filtered read seeks one of these and walks it in seq order (the filters that name these columns).
    "CREATE INDEX IF NOT EXISTS observations_by_type ON observations (monitor, type, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_subject ON observations (monitor, subject, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_actor ON observations (monitor, actor, seq)",
    """CREATE TABLE IF NOT EXISTS subjects (
        monitor TEXT NOT NULL, subject TEXT NOT NULL, PRIMARY KEY (monitor, subject)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS subscriptions (
        id TEXT PRIMARY KEY, monitor TEXT NOT NULL, subscriber TEXT NOT NULL, token_hash TEXT NOT NULL,
        state TEXT NOT NULL, cursor INTEGER NOT NULL, hwm INTEGER NOT NULL, mute_since REAL NOT NULL,
        rec TEXT NOT NULL, last_pull REAL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_by_name ON subscriptions (monitor, subscriber)",
    "CREATE INDEX IF NOT EXISTS subscriptions_by_token ON subscriptions (token_hash)",
    "CREATE INDEX IF NOT EXISTS subscriptions_active ON subscriptions (monitor) WHERE state = 'active'",
    """CREATE TABLE IF NOT EXISTS leases (
        monitor TEXT NOT NULL, subject TEXT NOT NULL, state TEXT NOT NULL, holder TEXT, renewed REAL NOT NULL,
        duration INTEGER NOT NULL, rec TEXT NOT NULL, PRIMARY KEY (monitor, subject)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS publish_keys (
        monitor TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (monitor, key)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS publish_keys_by_at ON publish_keys (at)",
    *ADDED_INDEXES.values(),  # (added to this format version after its release: sqlite.py _add_missing)
)

# The active-subscription count is answered from the partial index alone (no row is read): the query must
# repeat the index's own WHERE term, literally, for SQLite to choose it.
COUNT_ACTIVE_SQL = "SELECT count(*) FROM subscriptions WHERE monitor=? AND state = 'active'"
# The monitors with an active subscription (Store.list_monitors_with_readers: the sweep's).
ACTIVE_MONITOR_IDS = "SELECT monitor FROM subscriptions WHERE state = 'active'"
# /metrics (Store.backlog_summary): each active subscription's backlog, counted in the database.
BACKLOG_SQL = (
    "SELECT max(0, m.head - max(s.cursor, 1, m.floor) + 1) AS backlog, s.monitor, s.id FROM subscriptions s "
    "JOIN monitors m ON m.id = s.monitor WHERE s.state = 'active'"
)
BACKLOG_TOTALS_SQL = (
    "SELECT (SELECT count(*) FROM monitors), (SELECT count(*) FROM subscriptions WHERE state = 'active'), "
    f"(SELECT coalesce(sum(backlog), 0) FROM ({BACKLOG_SQL}))"
)
BACKLOG_TOP_SQL = f"{BACKLOG_SQL} ORDER BY backlog DESC, s.monitor, s.id LIMIT ?"

# A file without a format version: the first builds' (monitors(id, rec), up to 7eaa620), or another's.
FORMAT_1 = (
    "The database %s was written by an early build of monitor-protocol (up to commit 7eaa620 of 2026-12-01: "
    "format 1, which this release no longer reads); it was left as it was, and nothing will be served from it. "
    "docs/serve.md (Upgrading in place) says how to carry it forward."
)
FOREIGN = (
    "The database %s has a `monitors` table this store did not write; nothing will be served from it. "
    "Start with another --db."
)


def upgrade_2_to_3(db: Any) -> None:
    """Version 2 kept a subscription's last pull in `rec`; version 3 keeps it in a column of its own (the
    caller's transaction, and its version number)."""
    db.execute("ALTER TABLE subscriptions ADD COLUMN last_pull REAL")
    moved = []
    for sub_id, text in db.execute("SELECT id, rec FROM subscriptions").fetchall():
        rest = wire.decode_trusted(text)
        moved.append((rest.pop("last_pull", None), wire.encode_text(rest), sub_id))
    db.executemany("UPDATE subscriptions SET last_pull=?, rec=? WHERE id=?", moved)
