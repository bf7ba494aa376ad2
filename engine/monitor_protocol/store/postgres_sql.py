"""What the PostgreSQL store sends: its schema and server-side functions, a LogQuery as a condition, and a
call's writes as one statement.

Text PostgreSQL cannot hold (U+0000) is written in a prefix code (`enc`/`dec`, see below). Statements use
libpq's `$n` placeholders (store/postgres_wire.py sends them prepared, parameters as text)."""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.store_contract import LOG_COLUMNS, Changes, LogQuery, Term
from monitor_protocol.store.sql import (
    ADDED_INDEXES,
    LEASE_COLUMNS,
    MONITOR_COLUMNS,
    OBSERVATION_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    monitor_row,
    next_prefix,
    row_values,
    storable,
)

SCHEMA_VERSION = 2
CHANNEL = "mp_append"
# Advisory lock classes: the first key of the two-key form for the leader and the schema's creation; the seed
# of a 64-bit hash for a monitor's lock and a subscription's (key spaces of their own: never the same key).
LOCK_MONITOR, LOCK_LEADER, LOCK_SCHEMA, LOCK_SUBSCRIPTION = 0x4D50, 0x4D51, 0x4D52, 0x4D53

# A monitor's lock taken with a check that its row is still what this server remembers (FUNCTIONS below): added
# to schema version 2 without a new version (a server that does not know it never calls it), created by a
# server that finds it missing.
AS_READ_FUNCTION = "mp2_lock_as_read"
# The same for a reader's call (a pull, an ack+pull): its monitor's lock shared and its subscription's taken,
# then both rows compared with this server's memory of them (added the same way).
READER_AS_READ_FUNCTION = "mp2_reader_as_read"
STALE_SQLSTATE = "MP001"

T = 'TEXT COLLATE "C"'
TABLES = (
    "CREATE TABLE IF NOT EXISTS mp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE IF NOT EXISTS monitors (
        id {T} PRIMARY KEY, status TEXT NOT NULL, head BIGINT NOT NULL, floor BIGINT NOT NULL, rec TEXT NOT NULL
    )""",
    f"""CREATE TABLE IF NOT EXISTS observations (
        monitor {T} NOT NULL, seq BIGINT NOT NULL, type {T} NOT NULL, subject {T}, actor {T} NOT NULL,
        origin {T} NOT NULL, tier {T} NOT NULL, horizon {T} NOT NULL, event TEXT NOT NULL,
        PRIMARY KEY (monitor, seq)
    )""",
    "CREATE INDEX IF NOT EXISTS observations_by_type ON observations (monitor, type, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_subject ON observations (monitor, subject, seq)",
    "CREATE INDEX IF NOT EXISTS observations_by_actor ON observations (monitor, actor, seq)",
    f"CREATE TABLE IF NOT EXISTS subjects (monitor {T} NOT NULL, subject {T} NOT NULL, PRIMARY KEY (monitor, subject))",
    f"""CREATE TABLE IF NOT EXISTS subscriptions (
        id {T} PRIMARY KEY, monitor {T} NOT NULL, subscriber {T} NOT NULL, token_hash TEXT NOT NULL,
        state TEXT NOT NULL, cursor BIGINT NOT NULL, hwm BIGINT NOT NULL, mute_since DOUBLE PRECISION NOT NULL,
        rec TEXT NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_by_name ON subscriptions (monitor, subscriber)",
    "CREATE INDEX IF NOT EXISTS subscriptions_by_token ON subscriptions (token_hash)",
    "CREATE INDEX IF NOT EXISTS subscriptions_active ON subscriptions (monitor) WHERE state = 'active'",
    f"""CREATE TABLE IF NOT EXISTS leases (
        monitor {T} NOT NULL, subject {T} NOT NULL, state TEXT NOT NULL, holder {T},
        renewed DOUBLE PRECISION NOT NULL, duration BIGINT NOT NULL, rec TEXT NOT NULL,
        PRIMARY KEY (monitor, subject)
    )""",
    f"""CREATE TABLE IF NOT EXISTS publish_keys (
        monitor {T} NOT NULL, key {T} NOT NULL, seq BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (monitor, key)
    )""",
    "CREATE INDEX IF NOT EXISTS publish_keys_by_at ON publish_keys (at)",
    *ADDED_INDEXES.values(),  # (added to version 2 after its release: postgres_meta.py)
)

_MON = ", ".join(f"m.{c}" for c in (*MONITOR_COLUMNS, "rec"))
_MON_OUT = "m_id TEXT, m_status TEXT, m_head BIGINT, m_floor BIGINT, m_rec TEXT"

# Server-side functions: a lock and the reads made under it, in one statement. PL/pgSQL, whose statements keep
# their plans for the session (an SQL-language function is planned again at every call), and whose every
# statement in a VOLATILE function takes a snapshot of its own at READ COMMITTED: the read after the lock sees
# the last commit of whoever held it (one plain statement with both would read a snapshot taken before its
# lock was granted).
_LOCK_BODY = f"""
      IF p_shared THEN PERFORM pg_advisory_xact_lock_shared(hashtextextended(v_monitor, {LOCK_MONITOR}));
      ELSE PERFORM pg_advisory_xact_lock(hashtextextended(v_monitor, {LOCK_MONITOR})); END IF;"""
FUNCTIONS = (
    f"""CREATE OR REPLACE FUNCTION mp2_lock(p_monitor TEXT, p_shared BOOLEAN) RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
    DECLARE v_monitor TEXT := p_monitor;
    BEGIN {_LOCK_BODY}
    END $$""",
    # The lock of a monitor this server read from its memory of the row (PostgresStore.get_monitor): taken,
    # then the row compared with that memory, column by column in their text form; a difference raises
    # STALE_SQLSTATE, which aborts the call's pipeline (its writes, sent behind this, run not at all). It
    # answers 0: sent with a call's writes, its answer is summed with theirs (the rows they deleted).
    f"""CREATE OR REPLACE FUNCTION {AS_READ_FUNCTION}(p_monitor TEXT, p_status TEXT, p_head TEXT, p_floor TEXT,
        p_rec TEXT) RETURNS INT
    LANGUAGE plpgsql VOLATILE AS $$
    DECLARE v_monitor TEXT := p_monitor;
    BEGIN
      PERFORM pg_advisory_xact_lock(hashtextextended(v_monitor, {LOCK_MONITOR}));
      PERFORM 1 FROM monitors m WHERE m.id = p_monitor AND m.status = p_status AND m.head::text = p_head
          AND m.floor::text = p_floor AND m.rec = p_rec;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'monitor % changed since this server last read it', p_monitor
            USING ERRCODE = '{STALE_SQLSTATE}';
      END IF;
      RETURN 0;
    END $$""",
    # A reader's call from memory (PostgresStore.locked_subscription): the locks mp2_subscription_by_id takes,
    # in its order, then the subscription's row and its monitor's compared with what this server remembers
    # (the numbers as numbers: a float's text is the writer's), and the last row of the log it served from
    # memory (p_seq 0: none) with the stored one, so that a log whose history was replaced under the same
    # seqs (a failover that lost commits, a restore) is never served from memory; a difference raises
    # STALE_SQLSTATE, as above.
    f"""CREATE OR REPLACE FUNCTION {READER_AS_READ_FUNCTION}(p_sub TEXT, p_monitor TEXT, p_subscriber TEXT,
        p_token TEXT, p_state TEXT, p_cursor TEXT, p_hwm TEXT, p_mute TEXT, p_rec TEXT, p_status TEXT,
        p_head TEXT, p_floor TEXT, p_mrec TEXT, p_seq BIGINT, p_event TEXT) RETURNS INT
    LANGUAGE plpgsql VOLATILE AS $$
    DECLARE v_monitor TEXT := p_monitor;
    BEGIN
      PERFORM pg_advisory_xact_lock_shared(hashtextextended(v_monitor, {LOCK_MONITOR}));
      PERFORM pg_advisory_xact_lock(hashtextextended(p_sub, {LOCK_SUBSCRIPTION}));
      PERFORM 1 FROM subscriptions s WHERE s.id = p_sub AND s.monitor = p_monitor AND s.subscriber = p_subscriber
          AND s.token_hash = p_token AND s.state = p_state AND s.cursor = p_cursor::bigint
          AND s.hwm = p_hwm::bigint AND s.mute_since = p_mute::float8 AND s.rec = p_rec;
      IF FOUND THEN
        PERFORM 1 FROM monitors m WHERE m.id = p_monitor AND m.status = p_status AND m.head = p_head::bigint
            AND m.floor = p_floor::bigint AND m.rec = p_mrec;
      END IF;
      IF FOUND AND p_seq > 0 THEN  -- the last row served from memory: the log's history is the same
        PERFORM 1 FROM observations o WHERE o.monitor = p_monitor AND o.seq = p_seq AND o.event = p_event;
      END IF;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'subscription % or its monitor changed since this server last read them', p_sub
            USING ERRCODE = '{STALE_SQLSTATE}';
      END IF;
      RETURN 0;
    END $$""",
    f"""CREATE OR REPLACE FUNCTION mp2_monitor(p_monitor TEXT, p_shared BOOLEAN) RETURNS TABLE ({_MON_OUT})
    LANGUAGE plpgsql VOLATILE AS $$
    #variable_conflict use_column
    DECLARE v_monitor TEXT := p_monitor;
    BEGIN {_LOCK_BODY}
      RETURN QUERY SELECT {_MON} FROM monitors m WHERE m.id = p_monitor;
    END $$""",
    # A subscription by id or by token hash: its monitor locked (shared: that lock shared, and the
    # subscription's own lock taken), then read under the locks: the subscription ('s', its columns), its
    # monitor ('m') and, for a pull to come, the first `p_page` rows of the log from its cursor ('o'). Every
    # value as text, one row each.
    *(
        f"""CREATE OR REPLACE FUNCTION mp2_subscription_by_{by}(p_key TEXT, p_shared BOOLEAN, p_page INT)
        RETURNS TABLE (k TEXT, c1 TEXT, c2 TEXT, c3 TEXT, c4 TEXT, c5 TEXT, c6 TEXT, c7 TEXT, c8 TEXT, c9 TEXT)
        LANGUAGE plpgsql VOLATILE AS $$
        #variable_conflict use_column
        DECLARE v_monitor TEXT; v_id TEXT; v_cursor BIGINT;
        BEGIN
          SELECT s.monitor, s.id INTO v_monitor, v_id FROM subscriptions s WHERE s.{column} = p_key;
          IF NOT FOUND THEN RETURN; END IF; {_LOCK_BODY}
          IF p_shared THEN PERFORM pg_advisory_xact_lock(hashtextextended(v_id, {LOCK_SUBSCRIPTION})); END IF;
          SELECT s.cursor INTO v_cursor FROM subscriptions s WHERE s.{column} = p_key;
          IF NOT FOUND THEN RETURN; END IF;
          RETURN QUERY SELECT 's', s.id, s.monitor, s.subscriber, s.token_hash, s.state, s.cursor::text,
              s.hwm::text, s.mute_since::text, s.rec FROM subscriptions s WHERE s.{column} = p_key;
          RETURN QUERY SELECT 'm', m.id, m.status, m.head::text, m.floor::text, m.rec, NULL, NULL, NULL, NULL
              FROM monitors m WHERE m.id = v_monitor;
          IF p_page > 0 THEN
            RETURN QUERY SELECT 'o', o.seq::text, o.type, o.subject, o.actor, o.origin, o.tier, o.horizon,
                o.event, NULL FROM observations o
                WHERE o.monitor = v_monitor AND o.seq >= GREATEST(v_cursor, 1) ORDER BY o.seq LIMIT p_page;
          END IF;
        END $$"""
        for by, column in (("id", "id"), ("token", "token_hash"))
    ),
)
SCHEMA = (*TABLES, *FUNCTIONS)

LOCK_MONITOR_SQL = "SELECT mp2_lock($1, $2)"
LOCK_AS_READ_SQL = f"SELECT {AS_READ_FUNCTION}($1, $2, $3, $4, $5)"
AS_READ_FUNCTION_SQL = next(f for f in FUNCTIONS if f"FUNCTION {AS_READ_FUNCTION}(" in f)
READER_AS_READ_SQL = (
    f"SELECT {READER_AS_READ_FUNCTION}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
)
READER_AS_READ_FUNCTION_SQL = next(f for f in FUNCTIONS if f"FUNCTION {READER_AS_READ_FUNCTION}(" in f)
LOCK_SUBSCRIPTION_SQL = f"SELECT pg_advisory_xact_lock(hashtextextended($1, {LOCK_SUBSCRIPTION}))"
MONITOR_SQL = "SELECT * FROM mp2_monitor($1, $2)"
SUBSCRIPTION_SQL = {by: f"SELECT * FROM mp2_subscription_by_{by}($1, $2, $3)" for by in ("id", "token")}
# Rows of the log read ahead with a reader's subscription: an ack+pull of one row (the ack moving the cursor up
# to the page the last pull handed out) is then answered without another round trip.
PAGE_AHEAD = 16
# The monitors with an active subscription (Store.list_monitors_with_readers: the sweep's).
ACTIVE_MONITOR_IDS = "SELECT monitor FROM subscriptions WHERE state = 'active'"
# /metrics (Store.backlog_summary): each active subscription's backlog, counted in the database.
BACKLOG_SQL = (
    "SELECT GREATEST(0, m.head - GREATEST(s.cursor, 1, m.floor) + 1) AS backlog, s.monitor, s.id "
    "FROM subscriptions s JOIN monitors m ON m.id = s.monitor WHERE s.state = 'active'"
)
BACKLOG_TOTALS_SQL = (
    "SELECT (SELECT count(*) FROM monitors), (SELECT count(*) FROM subscriptions WHERE state = 'active'), "
    f"(SELECT coalesce(sum(backlog), 0) FROM ({BACKLOG_SQL}) b)"
)
BACKLOG_TOP_SQL = f"{BACKLOG_SQL} ORDER BY backlog DESC, s.monitor, s.id LIMIT $1"
GET_MONITOR = f"SELECT {', '.join(MONITOR_COLUMNS)}, rec FROM monitors"
GET_SUBSCRIPTION = f"SELECT {', '.join(SUBSCRIPTION_COLUMNS)}, rec FROM subscriptions"
GET_LEASE = f"SELECT {', '.join(LEASE_COLUMNS)}, rec FROM leases"
SELECT_LOG = f"SELECT {', '.join(OBSERVATION_COLUMNS)} FROM observations"


# ===================================================================================== text PostgreSQL holds
# PostgreSQL text cannot hold U+0000, which a subject may contain. Column copies are written in a prefix code
# that keeps code point order and prefixes (U+0001 is an escape: U+0000 -> 01 01, U+0001 -> 01 02), so that
# equality, ranges and prefix ranges on the encoded text mean what they mean on the original. The event
# itself is JSON, where U+0000 is spelled \u0000.
def enc(value: str | None) -> str | None:
    if value is None or ("\x00" not in value and "\x01" not in value):
        return value
    return value.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")


_ESCAPED = re.compile("\x01([\x01\x02])")


def dec(value: str | None) -> str | None:
    if value is None or "\x01" not in value:
        return value
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "\x01" else "\x01", value)


# ===================================================================================== log queries
def numbered(sql: str) -> str:
    """`%s` placeholders as libpq's `$1`, `$2`, ... in order."""
    parts = sql.split("%s")
    return "".join(p + (f"${i}" if i < len(parts) else "") for i, p in enumerate(parts, start=1))


def _term_sql(term: Term, params: list[Any]) -> str:
    if term.column not in LOG_COLUMNS:  # a column name goes into SQL text: only the known ones
        raise ValueError(f"not an indexed log column: {term.column!r}")
    col = term.column
    parts: list[str] = []
    exact = [enc(v) for v in term.exact if storable(v)]
    if exact:
        parts.append(f"{col} = ANY(%s::text[])")
        params.append(exact)
    for prefix in term.prefixes:
        if not storable(prefix):
            continue
        low = enc(prefix) or ""
        upper = next_prefix(low)
        if upper is None:
            parts.append(f"{col} >= %s")
            params.append(low)
        else:
            parts.append(f"({col} >= %s AND {col} < %s)")
            params.extend((low, upper))
    return " OR ".join(parts) if parts else "FALSE"


def log_where(query: LogQuery | None) -> tuple[str, list[Any]]:
    """The query as a condition on the log's columns (`%s` placeholders; store/sqlite.py log_where in
    PostgreSQL's terms)."""
    if query is None or query.selects_all:
        return "TRUE", []
    params: list[Any] = []
    clauses: list[str] = []
    for clause in query.clauses:
        if any(not alt for alt in clause):
            continue
        alts = [" AND ".join(f"({_term_sql(t, params)})" for t in alt) for alt in clause]
        clauses.append(" OR ".join(f"({a})" for a in alts) if alts else "FALSE")
    return (" AND ".join(f"({c})" for c in clauses) or "TRUE"), params


# ===================================================================================== a call's writes
# One statement: each table's rows in a data-modifying WITH of its own (one row as VALUES, more as unnest of
# arrays, so that a statement's text depends only on which tables it writes and whether with one row or many:
# a handful of shapes, each prepared once per connection), the appends announced by pg_notify in the main
# SELECT (delivered at the commit), and what the deletes removed counted, since a delete that removes nothing
# is no write.
_OBS_COLS = ("monitor", *OBSERVATION_COLUMNS)
_TYPES = {
    "monitors": ("text", "text", "bigint", "bigint", "text"),
    "observations": ("text", "bigint", "text", "text", "text", "text", "text", "text", "text"),
    "subjects": ("text", "text"),
    "subscriptions": ("text", "text", "text", "text", "text", "bigint", "bigint", "float8", "text"),
    "leases": ("text", "text", "text", "text", "float8", "bigint", "text"),
    "publish_keys": ("text", "text", "bigint", "float8"),
}
_COLUMNS = {
    "monitors": (*MONITOR_COLUMNS, "rec"),
    "observations": _OBS_COLS,
    "subjects": ("monitor", "subject"),
    "subscriptions": (*SUBSCRIPTION_COLUMNS, "rec"),
    "leases": (*LEASE_COLUMNS, "rec"),
    "publish_keys": ("monitor", "key", "seq", "at"),
}
_CONFLICT = {
    "monitors": "(id)",
    "observations": None,
    "subjects": "DO NOTHING",
    "subscriptions": "(id)",
    "leases": "(monitor, subject)",
    "publish_keys": "(monitor, key)",
}


def _insert(table: str, many: bool, base: int) -> str:
    """The INSERT of one table's rows, its parameters numbered from base + 1: one row's values, or (many)
    one array per column."""
    cols = _COLUMNS[table]
    marks = [f"${base + i + 1}::{t}{'[]' if many else ''}" for i, t in enumerate(_TYPES[table])]
    source = f"SELECT * FROM unnest({', '.join(marks)})" if many else f"VALUES ({', '.join(marks)})"
    sql = f"INSERT INTO {table} ({', '.join(cols)}) {source}"
    conflict = _CONFLICT[table]
    if conflict == "DO NOTHING":
        sql += " ON CONFLICT DO NOTHING"
    elif conflict is not None:
        keys = conflict.strip("()").split(", ")
        sql += f" ON CONFLICT {conflict} DO UPDATE SET " + ", ".join(
            f"{c}=EXCLUDED.{c}" for c in cols if c not in keys
        )
    return sql


Shape = tuple[tuple[tuple[str, bool], ...], int, bool, bool]
_STATEMENTS: dict[Shape, str] = {}


def _statement(shape: Shape) -> str:
    """The text of a write statement of this shape: (which tables, each with one row or many), compactions,
    a purge of publish keys, appends to announce. Its one row: how many rows the deletes removed."""
    tables, compactions, purge, notify = shape
    parts: list[str] = []
    n = 0
    for table, many in tables:
        parts.append(f"w_{table} AS ({_insert(table, many, n)})")
        n += len(_TYPES[table])
    deletes: list[str] = []
    for i in range(compactions):
        parts.append(
            f"d{i} AS (DELETE FROM observations WHERE monitor=${n + 1} AND seq<${n + 2}::bigint RETURNING 1)"
        )
        deletes.append(f"(SELECT count(*) FROM d{i})")
        n += 2
    if purge:
        parts.append(f"dk AS (DELETE FROM publish_keys WHERE at<${n + 1}::float8 RETURNING 1)")
        deletes.append("(SELECT count(*) FROM dk)")
        n += 1
    deleted = " + ".join(deletes) or "0"
    main = f"SELECT {deleted}"
    if notify:  # every notification sent (count reads them all), delivered to the other servers at the commit
        main += (
            f", (SELECT count(*) FROM (SELECT pg_notify('{CHANNEL}', p) FROM unnest(${n + 1}::text[]) p) n)"
        )
    return ("WITH " + ", ".join(parts) + " " if parts else "") + main


def write_statement(
    changes: Changes, instance: str
) -> tuple[str, list[Any], dict[str, list[tuple[Any, ...]]]]:
    """(SQL, parameters, the rows written per table) of every write of `changes` in one statement, prepared
    once per shape: its one row's first value is how many rows the deletes removed."""
    params: list[Any] = []
    tables = _rows_of(changes)
    for rows in tables.values():
        if len(rows) == 1:
            params.extend(rows[0])
        elif rows:
            params.extend(list(column) for column in zip(*rows, strict=True))
    for monitor, below in changes.compactions:
        params.extend((monitor, below))
    if changes.purge_keys_before is not None:
        params.append(float(changes.purge_keys_before))
    heads: dict[str, int] = {}
    for o in changes.observations:
        heads[o.monitor] = max(o.seq, heads.get(o.monitor, 0))
    if heads:  # "<instance>\t<head>\t<monitor>"
        params.append([f"{instance}\t{head}\t{monitor}" for monitor, head in heads.items()])
    shape: Shape = (
        tuple((table, len(rows) > 1) for table, rows in tables.items() if rows),
        len(changes.compactions),
        changes.purge_keys_before is not None,
        bool(heads),
    )
    sql = _STATEMENTS.get(shape)
    if sql is None:
        sql = _STATEMENTS[shape] = _statement(shape)
    return sql, params, tables


def _last_versions(records: list[Any], key: Callable[[Any], Any]) -> list[Any] | None:
    """Each record's last version, in the order of those versions, when a Changes names one twice (else
    None): one upsert statement cannot touch a row twice."""
    if len(records) < 2:
        return None
    last = {key(r): i for i, r in enumerate(records)}
    if len(last) == len(records):
        return None
    return [r for i, r in enumerate(records) if last[key(r)] == i]


def last_versions(changes: Changes) -> Changes:
    """`changes` with one version of each monitor, subscription and lease, its last (the engine stages one;
    a store takes any Changes, and the last version named is the one kept, as on every store)."""
    fixed = {
        name: kept
        for name, records, key in (
            ("monitors", changes.monitors, operator.attrgetter("id")),
            ("subscriptions", changes.subscriptions, operator.attrgetter("id")),
            ("leases", changes.leases, operator.attrgetter("monitor", "subject")),
        )
        if (kept := _last_versions(records, key)) is not None
    }
    return dataclasses.replace(changes, **fixed) if fixed else changes


def _rows_of(changes: Changes) -> dict[str, list[tuple[Any, ...]]]:
    leases = []
    for x in changes.leases:
        values = list(row_values(x.to_row(), LEASE_COLUMNS))
        values[1], values[3] = enc(values[1]), enc(values[3])
        leases.append(tuple(values))
    return {
        "monitors": [monitor_row(m) for m in changes.monitors],
        "observations": [
            (
                o.monitor,
                o.seq,
                enc(o.type),
                enc(o.subject),
                enc(o.actor),
                enc(o.origin),
                enc(o.tier),
                enc(o.horizon),
                wire.encode_text(o.event),
            )  # fmt: skip
            for o in changes.observations
        ],
        "subjects": [(m, enc(s)) for m, s in changes.subjects],
        "subscriptions": [row_values(s.to_row(), SUBSCRIPTION_COLUMNS) for s in changes.subscriptions],
        "leases": leases,
        "publish_keys": [(k.monitor, k.key, k.seq, k.at) for k in changes.publish_keys],
    }


# The listing key (store/postgres.py _shared_listing_key): made once, by whichever server comes first.
LISTING_KEY_SQL = "INSERT INTO mp_meta (key, value) VALUES ('listing_key', $1) ON CONFLICT (key) DO NOTHING"
LISTING_KEY_READ = "SELECT value FROM mp_meta WHERE key='listing_key'"
