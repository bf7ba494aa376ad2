"""`mp migrate --from ./monitor-protocol.db --to postgresql://...`: move an embedded deployment (one SQLite
file, the store `mp serve` uses by default) into a PostgreSQL database that any number of servers may share.

What is copied, per monitor: the monitor record (definition, head, floor, counters, the owner's and the
subscribe token's hashes), every observation of its log (from its retention floor, with its seqs and the
event as served), every subject it published (leases may only name these), every publish idempotency key,
every subscription (cursor, high-water mark, token hash, state, filter, ack memo...) and every lease. Tokens
are stored as hashes in those records and are copied as they are: every owner's and reader's token keeps
working against the new store.

How: typed records through the two stores' API. The source is opened as `mp serve` opens it
(`SQLiteStore(path)`), so a file that a running server holds is refused with that store's own message (a
live database would keep changing under the copy). The target is opened as `mp serve` opens it
(`PostgresStore(url)`, which creates its schema) and written only with `PostgresStore.apply`, in
transactions of at most `--batch` records (1,000 by default); a monitor's own record is written last,
after its log, subjects, keys, subscriptions and leases.

The copy is verified: for each monitor a `Fingerprint` (counts of observations, subscriptions, leases,
publish keys and subjects; sha256 digests over the observations in seq order as canonical JSON, over the
subscriptions', leases', keys' and the monitor's records, and over the subjects) is computed on both sides
from the stores' read API, and any difference names the monitor and what differs (exit 1).

A target that already holds a monitor (a second run) is refused before anything is written (exit 2), and
so is one that holds subscriptions, leases or log rows of the source's monitors, or mp migrate's marker (an
interrupted run). The marker (`migrating` in mp_meta) is written before the first record and removed once
every monitor verified: while it is there, `mp serve` refuses the database (IncompleteCopy), so a run killed
half way never leaves a database that serves some monitors and fails on others.
`--verify-only` compares an existing copy with its source again and writes nothing (but for removing the
marker of a copy it finds whole).

Exit status: 0 copied and verified; 1 the copy differs, or a database could not be opened or written;
2 refused (bad arguments, a target that is not empty).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

# stdlib only at import (psycopg is imported when a store is opened), and not even the stores: they import
# sqlite3, which Pyodide lacks, and `mp` builds every subcommand's parser (the CLI runs in a browser worker).


def shown_url(url: str) -> str:
    from monitor_protocol.store.postgres import redacted

    return redacted(url)


def _scrub(text: str, url: str) -> str:
    from monitor_protocol.store.postgres import scrub

    return scrub(text, url)


HELP = "copy an embedded SQLite database (stopped) into PostgreSQL, then verify the copy"

EXIT_OK = 0
EXIT_FAILED = 1  # the copy differs, or a database could not be opened, read or written
EXIT_REFUSED = 2  # bad arguments, or a target that is not empty: nothing was written

BATCH = 1_000  # records per target transaction
MAX_SEQ = 2**63 - 1
SHOWN_DIFFERENCES = 5  # per kind of record, the first ones named; the rest are counted


class MigrateError(Exception):
    """A failure reported as one line, with the exit status it calls for."""

    def __init__(self, message: str, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


# ===================================================================================== arguments
def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Copy every monitor, observation, subject, publish key, subscription and lease of a SQLite "
        "database into an empty PostgreSQL database, then verify the copy monitor by monitor. Stop the "
        "mp serve that uses the SQLite file first: a file a server holds is refused."
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        required=True,
        help="the SQLite database file mp serve used (its --db; default of mp serve: ./monitor-protocol.db)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        metavar="URL",
        required=True,
        help="the PostgreSQL database, postgresql://user[:password]@host[:port]/dbname; it must hold no "
        "monitor (its schema is created if it has none). Prefer a password in ~/.pgpass or PGPASSWORD",
    )
    parser.add_argument(
        "--batch",
        type=_positive_int,
        default=BATCH,
        metavar="N",
        help=f"records per PostgreSQL transaction (default {BATCH:,})",
    )
    parser.add_argument(
        "--verify-only",
        action="store_true",
        help="copy nothing: compare an existing copy with its source again (exit 1 if they differ)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(name: str, args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(line, flush=True)

    def complain(line: str) -> None:
        print(f"mp migrate: {_one_line(_scrub(line, args.target))}", file=sys.stderr, flush=True)

    try:
        report = migrate(
            args.source,
            args.target,
            batch=args.batch,
            verify_only=args.verify_only,
            out=say,
            err=complain,
        )
    except MigrateError as exc:
        complain(str(exc))
        return exc.status
    except Exception as exc:  # a bug or an unforeseen driver error: one line, never a traceback
        complain(f"failed: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    return EXIT_OK if report.verified else EXIT_FAILED


# ===================================================================================== what is shown
def _one_line(text: str) -> str:
    return " ".join(text.split())


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


# ===================================================================================== fingerprints
def _canonical(value: Any) -> bytes:
    """Canonical JSON (sorted keys, no spaces, ASCII escapes: any string, even a lone surrogate, encodes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _observation_row(obs: Any) -> list[Any]:
    return [obs.seq, obs.type, obs.subject, obs.actor, obs.origin, obs.tier, obs.horizon, obs.event]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What one store holds of one monitor, as counts and sha256 digests (hex), from its read API:
    `observations` over [seq, type, subject, actor, origin, tier, horizon, event] of every row in seq
    order; `subscriptions`, `leases` and `publish_keys` over each record's `to_row()` in key order (a
    subscription's row holds its id, cursor, hwm, token_hash and state among the rest); `subjects` over the
    sorted names; `monitor` over the monitor record's `to_row()` (null when the store has none)."""

    monitor_id: str
    has_monitor: bool
    observations: int
    first_seq: int | None
    last_seq: int | None
    subscriptions: int
    leases: int
    publish_keys: int
    subjects: int
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """One digest over all of it."""
        h = hashlib.sha256()
        for kind in sorted(self.digests):
            h.update(f"{kind}:{self.digests[kind]}\n".encode())
        return h.hexdigest()


def fingerprint(store: Any, monitor_id: str) -> Fingerprint:
    """The Fingerprint of `monitor_id` in `store`, read in one transaction of that store (on PostgreSQL no
    round trip to end each read; at READ COMMITTED not one snapshot, which a stopped source does not need)."""
    with store.transaction():
        return _fingerprint(store, monitor_id)


def _fingerprint(store: Any, monitor_id: str) -> Fingerprint:
    monitor = store.get_monitor(monitor_id)
    digests = {
        "monitor": hashlib.sha256(_canonical(None if monitor is None else monitor.to_row())).hexdigest()
    }
    h = hashlib.sha256()
    count, first, last = 0, None, None
    for obs in store.scan(monitor_id, 0, MAX_SEQ):
        h.update(_canonical(_observation_row(obs)) + b"\n")
        count += 1
        first = obs.seq if first is None else first
        last = obs.seq
    digests["observations"] = h.hexdigest()
    subs = sorted(store.list_subscriptions(monitor_id), key=lambda s: s.id)
    digests["subscriptions"] = _digest_rows(s.to_row() for s in subs)
    leases = sorted(store.list_leases(monitor_id), key=lambda x: x.subject)
    digests["leases"] = _digest_rows(x.to_row() for x in leases)
    found_keys = stored_publish_keys(store, monitor_id)
    digests["publish_keys"] = _digest_rows(k.to_row() for k in found_keys)
    found_subjects = stored_subjects(store, monitor_id)
    digests["subjects"] = _digest_rows(found_subjects)
    return Fingerprint(
        monitor_id=monitor_id,
        has_monitor=monitor is not None,
        observations=count,
        first_seq=first,
        last_seq=last,
        subscriptions=len(subs),
        leases=len(leases),
        publish_keys=len(found_keys),
        subjects=len(found_subjects),
        digests=digests,
    )


def stored_publish_keys(store: Any, monitor_id: str) -> list[Any]:
    """The PublishKey records a store holds for a monitor, by key."""
    return sorted(store.list_publish_keys(monitor_id), key=lambda k: k.key)


def stored_subjects(store: Any, monitor_id: str) -> list[str]:
    """The subjects a store holds for a monitor, sorted."""
    return sorted(set(store.list_subjects(monitor_id)))


def _digest_rows(rows: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(_canonical(row) + b"\n")
    return h.hexdigest()


# ===================================================================================== verification
@dataclass(slots=True)
class MonitorCheck:
    """One monitor verified: both fingerprints and every difference found, as sentences."""

    monitor_id: str
    source: Fingerprint
    target: Fingerprint
    differences: list[str]

    @property
    def ok(self) -> bool:
        return not self.differences


def verify_monitor(
    source: Any,
    target: Any,
    monitor_id: str,
) -> MonitorCheck:
    """Compare what `target` holds of one monitor with what `source` holds: fingerprints from both stores'
    read API; when a digest differs, the records are compared to say which ones differ, and how."""
    src = fingerprint(source, monitor_id)
    tgt = fingerprint(target, monitor_id)
    differences: list[str] = []
    if src.digest != tgt.digest:
        differences = _differences(source, target, monitor_id, src, tgt)
        if not differences:  # the digests say they differ even if no comparison below found how
            differences = [f"the digests differ (source {src.digest[:16]}, target {tgt.digest[:16]})"]
    return MonitorCheck(monitor_id, src, tgt, differences)


def verify(source: Any, target: Any) -> dict[str, list[str]]:
    """Every monitor of the source compared with the target (and any monitor only the target holds):
    monitor id -> the differences found; an empty dict when the target is a faithful copy."""
    out: dict[str, list[str]] = {}
    source_ids = [m.id for m in source.list_monitors()]
    for monitor_id in source_ids:
        check = verify_monitor(source, target, monitor_id)
        if not check.ok:
            out[monitor_id] = check.differences
    for extra in sorted({m.id for m in target.list_monitors()} - set(source_ids)):
        out[extra] = ["the target holds this monitor and the source does not"]
    return out


def _differences(
    source: Any,
    target: Any,
    monitor_id: str,
    src: Fingerprint,
    tgt: Fingerprint,
) -> list[str]:
    out: list[str] = []
    d_src, d_tgt = src.digests, tgt.digests
    if d_src["monitor"] != d_tgt["monitor"]:
        out += _record_differences(
            "the monitor record",
            _monitor_row(source, monitor_id),
            _monitor_row(target, monitor_id),
        )
    if d_src["observations"] != d_tgt["observations"]:
        if src.observations != tgt.observations:
            out.append(
                f"observations: {src.observations:,} in the source, {tgt.observations:,} in the target"
            )
        out.append(_first_log_difference(source, target, monitor_id))
    if d_src["subscriptions"] != d_tgt["subscriptions"]:
        if src.subscriptions != tgt.subscriptions:
            out.append(
                f"subscriptions: {src.subscriptions:,} in the source, {tgt.subscriptions:,} in the target"
            )
        out += _keyed_differences(
            "subscription",
            {s.id: s.to_row() for s in source.list_subscriptions(monitor_id)},
            {s.id: s.to_row() for s in target.list_subscriptions(monitor_id)},
        )
    if d_src["leases"] != d_tgt["leases"]:
        if src.leases != tgt.leases:
            out.append(f"leases: {src.leases:,} in the source, {tgt.leases:,} in the target")
        out += _keyed_differences(
            "lease on subject",
            {x.subject: x.to_row() for x in source.list_leases(monitor_id)},
            {x.subject: x.to_row() for x in target.list_leases(monitor_id)},
        )
    if d_src["publish_keys"] != d_tgt["publish_keys"]:
        if src.publish_keys != tgt.publish_keys:
            out.append(
                f"publish keys: {src.publish_keys:,} in the source, {tgt.publish_keys:,} in the target"
            )
        out += _keyed_differences(
            "publish key",
            {k.key: k.to_row() for k in stored_publish_keys(source, monitor_id)},
            {k.key: k.to_row() for k in stored_publish_keys(target, monitor_id)},
        )
    if d_src["subjects"] != d_tgt["subjects"]:
        if src.subjects != tgt.subjects:
            out.append(f"subjects: {src.subjects:,} in the source, {tgt.subjects:,} in the target")
        out += _keyed_differences(
            "subject",
            dict.fromkeys(stored_subjects(source, monitor_id), True),
            dict.fromkeys(stored_subjects(target, monitor_id), True),
        )
    return out


def _monitor_row(store: Any, monitor_id: str) -> dict[str, Any] | None:
    rec = store.get_monitor(monitor_id)
    return None if rec is None else rec.to_row()


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _record_differences(what: str, a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    if a is None or b is None:
        return [f"{what}: missing in the {'source' if a is None else 'target'}"]
    a, b = _one_level(a), _one_level(b)  # counters.delivered, not a cut-off counters object
    fields = [k for k in sorted(set(a) | set(b)) if _canonical(a.get(k)) != _canonical(b.get(k))]
    return [
        f"{what}: {k} is {_shown(a.get(k))} in the source, {_shown(b.get(k))} in the target"
        for k in fields[:SHOWN_DIFFERENCES]
    ] + (
        [f"{what}: and {len(fields) - SHOWN_DIFFERENCES} more fields"]
        if len(fields) > SHOWN_DIFFERENCES
        else []
    )


def _one_level(record: dict[str, Any]) -> dict[str, Any]:
    """A record with its object fields' own fields named `field.key`, so a difference names the key."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict) and value:
            out.update((f"{key}.{sub}", item) for sub, item in value.items())
        else:
            out[key] = value
    return out


def _keyed_differences(what: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"{what} {key!r}: missing in the target")
        elif key not in a:
            out.append(f"{what} {key!r}: in the target only")
        elif _canonical(a[key]) != _canonical(b[key]):
            out += _record_differences(f"{what} {key!r}", a[key], b[key])
    if len(out) > SHOWN_DIFFERENCES:
        out = [*out[:SHOWN_DIFFERENCES], f"and {len(out) - SHOWN_DIFFERENCES} more differences of {what}s"]
    return out


def _first_log_difference(source: Any, target: Any, monitor_id: str) -> str:
    """Where the two logs part, found by reading both in seq order together."""
    a: Iterator[Any] = source.scan(monitor_id, 0, MAX_SEQ)
    b: Iterator[Any] = target.scan(monitor_id, 0, MAX_SEQ)
    x, y = next(a, None), next(b, None)
    while x is not None or y is not None:
        if y is None or (x is not None and x.seq < y.seq):
            assert x is not None
            return f"the log differs first at seq {x.seq:,}: missing in the target"
        if x is None or y.seq < x.seq:
            return f"the log differs first at seq {y.seq:,}: in the target only"
        if _canonical(_observation_row(x)) != _canonical(_observation_row(y)):
            return f"the log differs first at seq {x.seq:,}: the target's row is not the source's"
        x, y = next(a, None), next(b, None)
    return "the log's digests differ"


# ===================================================================================== the copy
def copy_monitor(
    source: Any,
    target: Any,
    monitor_id: str,
    *,
    batch: int = BATCH,
) -> None:
    """Copy one monitor from `source` to `target` as typed records: its log, subjects, publish keys,
    subscriptions and leases, then its own record, each target transaction holding at most `batch`."""
    from monitor_protocol.core.store_contract import Changes

    monitor = source.get_monitor(monitor_id)
    if monitor is None:
        raise MigrateError(f"the source holds no monitor {monitor_id!r}")
    pending = Changes()
    size = 0

    def flush() -> None:
        nonlocal pending, size
        if pending.empty():
            return
        with target.transaction():
            target.lock_monitor(monitor_id)
            target.apply(pending)
        pending, size = Changes(), 0

    def add(kind: str, record: Any) -> None:
        nonlocal size
        getattr(pending, kind).append(record)
        size += 1
        if size >= batch:
            flush()

    for obs in source.scan(monitor_id, 0, MAX_SEQ):
        add("observations", obs)
    for subject in stored_subjects(source, monitor_id):
        add("subjects", (monitor_id, subject))
    for key in stored_publish_keys(source, monitor_id):
        add("publish_keys", key)
    for sub in source.list_subscriptions(monitor_id):
        add("subscriptions", sub)
    for lease in source.list_leases(monitor_id):
        add("leases", lease)
    add("monitors", monitor)  # last: a monitor appears once all it refers to is there
    flush()


def refuse_unless_empty(source: Any, target: Any, shown: str) -> None:
    """Raise MigrateError (exit 2) if the target holds any monitor, or what an interrupted run left: the
    subscriptions, leases or log rows of the source's monitors."""
    refuse_a_used_target(target, shown)
    logs = [m.id for m in source.list_monitors() if target.count(m.id, 0, MAX_SEQ, cap=1)]
    if logs:
        raise MigrateError(
            f"The target {shown} holds no monitor but already holds log rows of {_n(len(logs), 'monitor')} "
            f"({', '.join(logs[:5])}), left by an interrupted migration most likely, so mp migrate refuses to "
            "copy into it and has written nothing: drop and recreate that database, then run mp migrate again.",
            EXIT_REFUSED,
        )


def refuse_a_used_target(target: Any, shown: str) -> None:
    """refuse_unless_empty's checks that need no source: an unfinished copy, monitors, subscriptions, leases."""
    copy = target.unfinished_copy()
    if copy is not None:
        raise MigrateError(
            f"The target {shown} holds an unfinished copy (mp migrate {copy} and did not finish), so mp "
            "migrate refuses to copy into it and has written nothing: drop and recreate that database, then "
            "run mp migrate again.",
            EXIT_REFUSED,
        )
    held = [m.id for m in target.list_monitors()]
    if held:
        names = ", ".join(held[:5]) + (f" and {len(held) - 5:,} more" if len(held) > 5 else "")
        raise MigrateError(
            f"The target {shown} already holds {_n(len(held), 'monitor')} ({names}), so mp migrate refuses "
            "to copy into it and has written nothing: point --to at a new, empty database (or drop this one "
            "first, if it is an earlier copy you mean to replace).",
            EXIT_REFUSED,
        )
    leftovers = []
    subs, leases = target.list_subscriptions(), target.list_leases()
    if subs:
        leftovers.append(_n(len(subs), "subscription"))
    if leases:
        leftovers.append(_n(len(leases), "lease"))
    if leftovers:
        raise MigrateError(
            f"The target {shown} holds no monitor but already holds {' and '.join(leftovers)}, left by an "
            "interrupted migration most likely, so mp migrate refuses to copy into it and has written "
            "nothing: drop and recreate that database, then run mp migrate again.",
            EXIT_REFUSED,
        )


# ===================================================================================== the command
@dataclass(slots=True)
class Report:
    """What a run did: one MonitorCheck per monitor, the seconds it took, and whether all verified."""

    checks: list[MonitorCheck] = field(default_factory=list)
    extra_monitors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verified(self) -> bool:
        return not self.extra_monitors and all(c.ok for c in self.checks)


def open_source(path: str) -> Any:
    """The SQLite file, opened as mp serve opens it (the one-writer lock included), or MigrateError."""
    from monitor_protocol.core.store_contract import StorageError
    from monitor_protocol.store.sqlite import SQLiteStore, StoreCorrupt, StoreLocked

    if path in ("", ":memory:"):
        raise MigrateError(f"--from must name a SQLite database file, not {path!r}", EXIT_REFUSED)
    if not os.path.exists(path):
        raise MigrateError(
            f"the source {path} does not exist: --from names the SQLite database file mp serve used "
            "(its --db, ./monitor-protocol.db by default)"
        )
    if not os.path.isfile(path):
        raise MigrateError(f"the source {path} is not a file: --from names a SQLite database file")
    if not _holds_a_log(path):
        # Opening it as mp serve does would write a fresh schema into it: the source is never written.
        raise MigrateError(
            f"the source {path} holds no Monitor Protocol database (no monitors, observations and "
            "subscriptions tables: an empty or another program's file); nothing was written to it. "
            "--from names the SQLite database file mp serve used (its --db, ./monitor-protocol.db by default)"
        )
    try:
        return SQLiteStore(path)
    except StoreLocked as exc:
        raise MigrateError(
            f"{exc.held} Stop that process first: mp migrate copies the database of a stopped server only "
            "(a live one would keep changing under the copy)."
        ) from None
    except (StoreCorrupt, StorageError) as exc:
        raise MigrateError(f"cannot open the source {path}: {exc}") from None
    except Exception as exc:
        raise MigrateError(f"cannot open the source {path}: {type(exc).__name__}: {exc}") from None


def _holds_a_log(path: str) -> bool:
    """Whether the file has mp serve's tables, read without writing (SQLite's read-only mode); a file
    SQLite cannot read at all is left to the store's own message (damaged, or not a database)."""
    found = _read_only(path, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return found is None or {"monitors", "observations", "subscriptions"} <= {r[0] for r in found}


def format_of(path: str) -> int | None:
    """The file's format version (PRAGMA user_version), read without writing; None if SQLite cannot read it."""
    found = _read_only(path, "PRAGMA user_version")
    return int(found[0][0]) if found else None


def _read_only(path: str, sql: str) -> list[Any] | None:
    import sqlite3
    from urllib.parse import quote

    try:
        con = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None


def check_target_url(url: str) -> None:
    """MigrateError (exit 2) unless `url` is a postgresql:// (or postgres://) URL."""
    from monitor_protocol.store.postgres import is_postgres_url

    if not is_postgres_url(url):
        raise MigrateError(
            "--to must be a postgresql:// URL such as postgresql://user@host:5432/dbname, "
            f"not {shown_url(url)!r}",
            EXIT_REFUSED,
        )


def open_target(url: str) -> Any:
    """The PostgreSQL database, opened as mp serve opens it (its schema created if absent), or MigrateError."""
    from monitor_protocol.store.postgres import PostgresStore

    check_target_url(url)
    shown = shown_url(url)
    try:
        return PostgresStore(url, migrating=True)
    except Exception as exc:  # StorageError (cannot connect), StoreVersionError, psycopg missing...
        text = getattr(exc, "detail", None) or str(exc) or type(exc).__name__  # an operator's detail
        if shown not in text:
            text = f"cannot open the target {shown}: {text}"
        raise MigrateError(text) from None


def migrate(
    source_path: str,
    target_url: str,
    *,
    batch: int = BATCH,
    verify_only: bool = False,
    out: Callable[[str], None] = print,
    err: Callable[[str], None] = print,
) -> Report:
    """The whole command: open both stores, refuse a target that is not empty, copy each monitor and
    verify it (`out` gets one line per monitor and a last line of totals; `err` each difference). Raises
    MigrateError for what stops it; a copy that differs is a Report whose `verified` is False."""
    started = time.monotonic()
    shown = shown_url(target_url)
    check_target_url(target_url)  # before the source is touched
    from monitor_protocol.store.sqlite import SCHEMA_VERSION

    older = os.path.isfile(source_path) and format_of(source_path) == 2
    # A format-2 source is brought to format 3 as it is opened: the target must answer first, so that a typo
    # in --to does not cost the file its way back to the build that wrote it. Any other source is opened
    # first, so that a held or foreign one is refused before the target is touched.
    target = open_target(target_url) if older else None
    try:
        if target is not None and not verify_only:  # and it is one this run may copy into
            refuse_a_used_target(target, shown)
        source = open_source(source_path)
    except BaseException:
        if target is not None:
            target.close()
        raise
    if getattr(source, "upgraded_from", None):
        out(
            f"the source {source_path} was brought from format {source.upgraded_from} to {SCHEMA_VERSION} as it "
            "was opened (as mp serve would): a build that reads only the older format cannot open it now"
        )
    try:
        if target is None:
            target = open_target(target_url)
        if not verify_only:
            refuse_unless_empty(source, target, shown)
            # Until every monitor is copied and verified, mp serve refuses this database (IncompleteCopy): a
            # run killed half way must not leave a database that serves some monitors and fails others.
            began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            target.mark_copying(f"from {source_path} began at {began}")
        report = Report()
        totals = dict.fromkeys(("observations", "subscriptions", "leases", "publish_keys", "subjects"), 0)
        for monitor in source.list_monitors():
            mid = monitor.id
            if not verify_only:
                try:
                    copy_monitor(source, target, mid, batch=batch)
                except MigrateError:
                    raise
                except Exception as exc:
                    raise MigrateError(
                        f"copying monitor {mid} failed: {type(exc).__name__}: {exc}. The target now holds "
                        "a partial copy: drop and recreate that database before running mp migrate again."
                    ) from None
            check = verify_monitor(source, target, mid)
            report.checks.append(check)
            fp = check.source
            for kind in totals:
                totals[kind] += getattr(fp, kind)
            line = f"monitor {mid}: {_summary(fp)}"
            if check.ok:
                out(f"{line}: verified")
            else:
                out(f"{line}: DIFFERS in the target ({_n(len(check.differences), 'difference')})")
                for difference in check.differences:
                    err(f"monitor {mid}: {difference}")
        known = {c.monitor_id for c in report.checks}
        report.extra_monitors = sorted({m.id for m in target.list_monitors()} - known)
        for extra in report.extra_monitors:
            err(f"monitor {extra}: the target holds it and the source does not")
        report.seconds = time.monotonic() - started
        verb = ("verified" if report.verified else "compared") if verify_only else "copied"
        summary = (
            f"{verb} {_n(len(report.checks), 'monitor')}: {_n(totals['observations'], 'observation')}, "
            f"{_n(totals['subscriptions'], 'subscription')}, {_n(totals['leases'], 'lease')}, "
            f"{_n(totals['publish_keys'], 'publish key')}, {_n(totals['subjects'], 'subject')} "
            f"from {source_path} to {shown} in {report.seconds:.2f} s"
        )
        if report.verified:
            # a finished copy removes the mark; so does a --verify-only run that finds the copy whole
            if not verify_only or target.unfinished_copy() is not None:
                target.copy_verified()
            out(f"{summary}; every monitor verified" if not verify_only else summary)
        else:
            failed = [c.monitor_id for c in report.checks if not c.ok] + report.extra_monitors
            out(summary)
            err(
                f"the target differs from the source in {_n(len(failed), 'monitor')} ({', '.join(failed[:5])}"
                + (f" and {len(failed) - 5:,} more)" if len(failed) > 5 else ")")
                + (
                    ""
                    if verify_only
                    else ": do not serve from it; drop and recreate it, then run mp migrate again"
                )
            )
        return report
    finally:
        if target is not None:
            target.close()
        source.close()


def _summary(fp: Fingerprint) -> str:
    seqs = "" if fp.first_seq is None else f" (seqs {fp.first_seq:,}-{fp.last_seq:,})"
    return (
        f"{_n(fp.observations, 'observation')}{seqs}, {_n(fp.subscriptions, 'subscription')}, "
        f"{_n(fp.leases, 'lease')}, {_n(fp.publish_keys, 'publish key')}, {_n(fp.subjects, 'subject')}"
    )
