"""The store contract (core/store_contract.py), one module for every store: memory, SQLite, and memory restored from
its own change journal exactly as the browser's IndexedDB door encodes, persists and loads it back. Typed
records in and out, one `apply(Changes)` per call, all or nothing; LogQuery reads checked against
`query.holds` on every row (hypothesis), read-only calls that commit nothing, and SQLite's own duties
(durability, one writer, group commit, StorageError, index seeks)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest
from enginekit import as_format_2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus, SubscriptionState
from monitor_protocol.core.records import (
    AckMemo,
    Completion,
    Counters,
    LastSeen,
    Lease,
    Monitor,
    Observation,
    PublishKey,
    ServedRow,
    Subscription,
)
from monitor_protocol.core.store_contract import LOG_COLUMNS, Changes, LogQuery, Term
from monitor_protocol.core.tx import Tx
from monitor_protocol.store.indexeddb import decode_records, encode_changes, record_key
from monitor_protocol.store.memory import TABLES, MemoryStore, observation_key
from monitor_protocol.store.sql import next_prefix
from monitor_protocol.store.sqlite import COUNT_ACTIVE_SQL, SQLiteStore, StoreLocked, StoreVersionError

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

# A subscription taken by another id: SQLite's unique index raises IntegrityError, the memory store ValueError,
# PostgreSQL's unique index psycopg's IntegrityError (when psycopg is installed).
try:
    import psycopg as _psycopg

    Refused: tuple[type[BaseException], ...] = (ValueError, sqlite3.IntegrityError, _psycopg.IntegrityError)
except ImportError:  # the PostgreSQL cases are skipped then
    Refused = (ValueError, sqlite3.IntegrityError)


class JournalReplayStore(MemoryStore):
    """A MemoryStore whose every read, in `view()`, comes from a fresh store loaded from the persisted
    journal, so the contract holds for the IndexedDB door's drain_changes()/load() round trip too.
    `persisted` plays boot.js `MP.idb`: `apply()` stores each change under record_key(table, key) as JSON
    text, `loadAll()` returns `[[recordKey, valueJson], ...]`, which decode_records turns into load()'s input."""

    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[str, str] = {}

    def reload(self) -> MemoryStore:
        for table, key, value in json.loads(encode_changes(self.drain_changes())):
            assert table in TABLES, table
            if value is None:
                self.persisted.pop(record_key(table, key), None)
            else:
                self.persisted[record_key(table, key)] = json.dumps(value)
        fresh = MemoryStore()
        fresh.load(decode_records(json.dumps(sorted(self.persisted.items()))))
        return fresh


@pytest.fixture(params=["memory", "sqlite", "journal", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteStore(str(tmp_path / "contract.db"))
    elif request.param == "postgres":
        from monitor_protocol.store.postgres import PostgresStore

        s = PostgresStore(request.getfixturevalue("pg_url"))
    elif request.param == "journal":
        s = JournalReplayStore()
    else:
        s = MemoryStore()
    yield s
    s.close()


def view(store):
    """What a reader sees after the write: for the journal store, the state rebuilt from persistence."""
    return store.reload() if isinstance(store, JournalReplayStore) else store


def put(store, **changes) -> None:
    """One engine call that writes: a transaction and its one apply."""
    with store.transaction():
        store.apply(Changes(**changes))


# ===================================================================================== records
def monitor(mid: str = "m1", **kw) -> Monitor:
    return Monitor(id=mid, owner="agent:owner", owner_hash="oh", created=100.0, updated=100.0, name=mid, **kw)


def event(
    monitor_id: str, seq: int, type_: str = "com.example.x", subject: str | None = None, **attrs
) -> dict:
    ev = {"id": str(seq), "source": f"monitor:{monitor_id}", "type": type_, "subject": subject or f"s{seq}"}
    ev.update(attrs)
    return ev


def obs(
    monitor_id: str, seq: int, type_: str = "com.example.x", subject: str | None = None, **attrs
) -> Observation:
    return Observation.of(monitor_id, seq, event(monitor_id, seq, type_, subject, **attrs))


def sub(
    sid: str, monitor_id: str = "m1", subscriber: str = "agent:a", token_hash: str = "h1", active: bool = True
) -> Subscription:
    state = SubscriptionState.ACTIVE if active else SubscriptionState.RETIRED
    return Subscription(sid, monitor_id, subscriber, token_hash, created=100.0, mute_since=100.0, state=state)


def lease(monitor_id: str, subject: str, holder: str | None = None) -> Lease:
    state = LeaseState.HELD if holder else LeaseState.FREE
    return Lease(monitor_id, subject, duration=60, acquired=100.0, renewed=100.0, state=state, holder=holder)


# Every field away from its default, so a round trip that drops or renames one shows.
FULL_MONITOR = Monitor(
    id="m-full",
    owner="human:ana",
    owner_hash="oh",
    created=1790000000.25,
    updated=1790000100.5,
    name="Full ✓",
    description="naïve",
    source={"kind": "log", "x": [1, 2]},
    filter={"types": ["com.example.*"]},
    horizon="state",
    capabilities=["observe", "act"],
    cadence={"expect_every_seconds": 60},
    ttl_seconds=3600,
    retire_after_mute_seconds=600,
    budget={"observations_per_day": 5},
    visibility="shared",
    rules=[{"id": "r1", "when": {"type": "a"}, "then": "log"}],
    types=["com.example.a"],
    default_grant=["observe", "act"],
    limits={"observations_per_day": 1000},
    version=3,
    attested=True,
    status=MonitorStatus.PAUSED,
    subscribe_hash="sh",
    head=42,
    floor=7,
    counters=Counters(1, 2, 3, 4, 5, 6),
    last=LastSeen(41, 1790000099.0, "com.example.a"),
    actors=("agent:a", "agent:b"),
    source_contact=1790000098.0,
    last_pull=1790000097.0,
    budget_day="2026-09-21",
    budget_used=4,
)
FULL_SUBSCRIPTION = Subscription(
    id="sub-full",
    monitor="m-full",
    subscriber="agent:ü",
    token_hash="th",
    created=1790000000.0,
    mute_since=1790000050.5,
    filter={"types": ["a"], "subjects": ["b*"]},
    capabilities=["observe", "act"],
    cursor=12,
    reset_policy="earliest",
    protocol="push",
    sink="https://example.com/hook",
    retire_after_mute_seconds=900,
    last_pull=1790000060.0,
    state=SubscriptionState.RETIRED,
    hwm=15,
    last_ack=AckMemo(12, {"cursor": 12, "lag": 3}),
    relist=True,
    sink_secret="s3cret",
    grant="owner",
    revoked=True,
    scan_mark=(13, 20),
)
FULL_LEASE = Lease(
    monitor="m-full",
    subject="job ✓",
    duration=3600,
    acquired=1790000000.0,
    renewed=1790000030.0,
    state=LeaseState.DEAD_LETTERED,
    holder=None,
    transitions=2,
    attempts=5,
    delivery_count_limit=5,
    last_holder="sub:sub-full",
    completed=Completion("sub:sub-full", 40, "done"),
)
FULL_KEY = PublishKey("m-full", 'odd "key"/[1] ✓', 41, 1790000040.5)
FULL_OBS = Observation.of(
    "m-full",
    42,
    event(
        "m-full",
        42,
        "com.example.a",
        "job ✓",
        actor="agent:a",
        origin="agent",
        tier="unverified",
        horizon="event",
    ),
)


@pytest.mark.parametrize("rec", [FULL_MONITOR, FULL_SUBSCRIPTION, FULL_LEASE, FULL_KEY], ids=type)
def test_to_row_from_row_round_trips_through_json(rec):
    row = json.loads(json.dumps(rec.to_row()))
    assert type(rec).from_row(row) == rec


def test_every_record_type_round_trips_through_the_store(store):
    put(
        store,
        monitors=[FULL_MONITOR],
        observations=[FULL_OBS],
        subjects=[("m-full", "job ✓")],
        subscriptions=[FULL_SUBSCRIPTION],
        leases=[FULL_LEASE],
        publish_keys=[FULL_KEY],
    )
    v = view(store)
    assert v.get_monitor("m-full") == FULL_MONITOR and v.list_monitors() == [FULL_MONITOR]
    assert v.get_observation("m-full", 42) == FULL_OBS and list(v.scan("m-full", 1, 99)) == [FULL_OBS]
    assert v.get_subscription("sub-full") == FULL_SUBSCRIPTION
    assert v.find_subscription("m-full", "agent:ü") == FULL_SUBSCRIPTION
    assert v.find_subscription_by_token("th") == FULL_SUBSCRIPTION
    assert v.get_lease("m-full", "job ✓") == FULL_LEASE and v.list_leases("m-full") == [FULL_LEASE]
    assert v.get_publish_key("m-full", FULL_KEY.key) == FULL_KEY
    assert v.has_subject("m-full", "job ✓") and not v.has_subject("m-full", "job")
    assert isinstance(v.get_monitor("m-full").status, MonitorStatus)


def test_a_null_subject_and_empty_attributes_round_trip(store):
    bare = Observation.of("m1", 1, {"id": "1", "type": "t"})
    put(store, observations=[bare])
    got = view(store).get_observation("m1", 1)
    assert got == bare and got.subject is None and got.actor == "" and got.event == {"id": "1", "type": "t"}


# ===================================================================================== transactions
def test_commit_makes_every_write_visible(store):
    put(
        store,
        monitors=[monitor("m1")],
        observations=[obs("m1", s) for s in (1, 2, 3)],
        subjects=[("m1", "s1")],
        subscriptions=[sub("sub-1")],
        leases=[lease("m1", "s1", "sub:sub-1")],
    )
    v = view(store)
    assert v.get_monitor("m1") == monitor("m1")
    assert [o.seq for o in v.scan("m1", 1, 3)] == [1, 2, 3]
    assert v.has_subject("m1", "s1") and not v.has_subject("m1", "s2")
    assert v.get_subscription("sub-1").subscriber == "agent:a"
    assert v.get_lease("m1", "s1").holder == "sub:sub-1"


def test_a_transaction_that_fails_after_its_apply_leaves_nothing(store):
    put(store, monitors=[monitor("m1", head=1)], subscriptions=[sub("sub-1")])
    with pytest.raises(RuntimeError), store.transaction():
        store.apply(
            Changes(
                monitors=[monitor("m1", head=2)],
                observations=[obs("m1", 1)],
                subjects=[("m1", "s1")],
                subscriptions=[
                    sub("sub-1", token_hash="h2"),
                    sub("sub-2", subscriber="agent:b", token_hash="h3"),
                ],
                leases=[lease("m1", "s1")],
                publish_keys=[PublishKey("m1", "k", 1, 5.0)],
            )
        )
        raise RuntimeError("abort")
    v = view(store)
    assert v.get_monitor("m1").head == 1
    assert list(v.scan("m1", 1, 10)) == [] and not v.has_subject("m1", "s1")
    assert v.find_subscription_by_token("h1").id == "sub-1"
    assert v.find_subscription_by_token("h2") is None and v.get_subscription("sub-2") is None
    assert v.get_lease("m1", "s1") is None and v.get_publish_key("m1", "k") is None
    assert v.count_active_subscriptions("m1") == 1


@pytest.mark.parametrize("bad", ["duplicate seq", "taken subscriber"])
def test_apply_is_all_or_nothing_even_when_the_caller_commits(store, bad):
    put(store, monitors=[monitor("m1", head=1)], observations=[obs("m1", 1)], subscriptions=[sub("sub-1")])
    refused = (
        Changes(observations=[obs("m1", 2), obs("m1", 1)])
        if bad == "duplicate seq"
        else Changes(
            subscriptions=[sub("sub-2", subscriber="agent:b", token_hash="h2"), sub("sub-3", token_hash="h3")]
        )
    )
    refused.monitors = [monitor("m1", head=9)]
    refused.leases = [lease("m1", "s1")]
    # the call catches the refusal and commits: nothing of the refused apply may be in that commit. A store
    # that sends a call's writes with its commit (PostgreSQL: one round trip) refuses them at the commit,
    # and then nothing of that call is written.
    if getattr(store, "writes_at_commit", False):
        with pytest.raises(Refused), store.transaction():
            store.apply(refused)  # no answer yet: it comes with the commit
    else:
        with store.transaction(), pytest.raises(Refused):
            store.apply(refused)
    v = view(store)
    assert v.get_monitor("m1").head == 1 and v.get_lease("m1", "s1") is None
    assert [o.seq for o in v.scan("m1", 1, 10)] == [1]
    assert [s.id for s in v.list_subscriptions()] == ["sub-1"] and v.find_subscription_by_token("h2") is None


def test_apply_outside_a_transaction_is_a_transaction_of_its_own(store):
    store.apply(Changes(monitors=[monitor("m1")]))
    assert view(store).get_monitor("m1") == monitor("m1") and store.stats.commits == 1


def test_a_read_only_call_commits_nothing(store, tmp_path):
    put(
        store,
        monitors=[monitor("m1")],
        observations=[obs("m1", 1)],
        publish_keys=[PublishKey("m1", "k", 1, 50.0)],
    )
    assert (store.stats.commits, store.stats.read_only) == (1, 0)
    wal = tmp_path / "contract.db-wal"
    before = wal.stat().st_size if wal.exists() else None
    with store.transaction():  # an empty pull: reads only
        assert store.get_monitor("m1") is not None and store.count("m1", 1, 9) == 1
    with store.transaction():
        store.apply(Changes())  # an empty Changes is no write
    with store.transaction():
        store.apply(Changes(purge_keys_before=10.0, compactions=[("m1", 1)]))  # deletes nothing: no write
    assert (store.stats.commits, store.stats.read_only) == (1, 3)
    if isinstance(store, SQLiteStore):
        assert (wal.stat().st_size if wal.exists() else None) == before  # not a frame, so no fsync
        assert not store._db.in_transaction
    put(store, observations=[obs("m1", 2)])
    assert (store.stats.commits, store.stats.read_only) == (2, 3)


def test_nested_transactions_belong_to_the_outer_one(store):
    with pytest.raises(RuntimeError), store.transaction():
        with store.transaction():
            store.apply(Changes(monitors=[monitor("m1")]))
        raise RuntimeError
    assert view(store).get_monitor("m1") is None and store.stats.commits == 0


# ===================================================================================== the log
def test_scan_is_ordered_bounded_and_per_monitor(store):
    put(store, observations=[obs("m1", s) for s in range(1, 301)] + [obs("m2", 1)])
    v = view(store)
    assert [o.seq for o in v.scan("m1", 250, 260)] == list(range(250, 261))
    assert len(list(v.scan("m1", 1, 300))) == 300 and len(list(v.scan("m1", -5, 10**30))) == 300
    assert [o.monitor for o in v.scan("m2", 1, 5)] == ["m2"] and list(v.scan("m3", 1, 5)) == []
    assert v.get_observation("m1", 7).subject == "s7" and v.get_observation("m1", 301) is None
    assert v.count("m1", 1, 300) == 300 and v.count("m1", 10, 19) == 10 and v.count("m1", 1, 300, cap=7) == 7
    assert v.count("m1", 5, 4) == 0 and v.count("m1", 1, 300, cap=0) == 0 and v.count("m3", 1, 9) == 0


def test_read_range_is_the_scan_of_the_range_at_once(store):
    """Store.read_range (a page of unfiltered rows, one statement on SQLite) gives what scan gives, as a list;
    the transaction's rows staged above the stored head follow."""
    put(store, observations=[obs("m1", s) for s in range(1, 301)] + [obs("m2", 1)])
    v = view(store)
    for first, last in ((1, 100), (250, 260), (290, 400), (5, 4), (301, 310)):
        assert v.read_range("m1", first, last) == list(v.scan("m1", first, last)), (first, last)
    assert [o.seq for o in v.read_range("m1", 199, 201)] == [199, 200, 201]
    assert v.read_range("m3", 1, 5) == [] and [o.monitor for o in v.read_range("m2", 1, 9)] == ["m2"]
    with store.transaction():
        tx = Tx(store, 0.0)
        tx._appended["m1"] = [obs("m1", 301), obs("m1", 302)]  # what a call appended, not yet applied
        assert [o.seq for o in tx.read_range("m1", 299, 305)] == [299, 300, 301, 302]
        assert [o.seq for o in tx.read_range("m1", 302, 302)] == [302]


def test_read_range_served_serves_what_read_range_serves(store):
    """read_range(served=True), for a reply only encoded (a drain): each row's seq, size and what it serves
    are read_range's; SQLite and PostgreSQL read each row's seq and text alone (records.ServedRow), the
    others give their rows."""
    put(store, observations=[obs("m1", s) for s in range(1, 121)])
    v = view(store)
    for first, last in ((1, 100), (95, 130), (121, 125)):
        full, served = v.read_range("m1", first, last), v.read_range("m1", first, last, served=True)
        assert [(o.seq, o.size) for o in served] == [(o.seq, o.size) for o in full], (first, last)
        for a, b in zip(full, served, strict=True):
            for redelivered in (False, True):
                assert b.to_wire(redelivered=redelivered) == a.to_wire(redelivered=redelivered)
    kinds = {type(o) for o in v.read_range("m1", 1, 100, served=True)}
    reads_text = isinstance(store, SQLiteStore) or type(store).__name__ == "PostgresStore"
    assert kinds == ({ServedRow} if reads_text else {type(v.read_range("m1", 1, 1)[0])})
    # a text with more bytes than characters is measured as the store measures it (the page's byte budget)
    put(store, observations=[obs("m4", 1, subject="é€ 𝄞")])
    v = view(store)
    assert [o.size for o in v.read_range("m4", 1, 1, served=True)] == [v.read_range("m4", 1, 1)[0].size]


def test_duplicate_seq_is_refused(store):
    put(store, observations=[obs("m1", 1)])
    with pytest.raises(Refused), store.transaction():
        store.apply(Changes(observations=[obs("m1", 1)]))
    with pytest.raises(Refused), store.transaction():
        store.apply(Changes(observations=[obs("m1", 2), obs("m1", 2)]))
    assert [o.seq for o in view(store).scan("m1", 1, 5)] == [1]


def test_compaction_deletes_below_and_only_that_monitor(store):
    put(store, observations=[obs("m1", s) for s in range(1, 11)] + [obs("m2", s) for s in (1, 2)])
    put(store, compactions=[("m1", 6)])
    v = view(store)
    assert [o.seq for o in v.scan("m1", 1, 10)] == [6, 7, 8, 9, 10] and v.get_observation("m1", 5) is None
    assert v.count("m1", 1, 10) == 5 and [o.seq for o in v.scan("m2", 1, 9)] == [1, 2]
    put(store, observations=[obs("m1", 11)], compactions=[("m1", 11)])  # appended, then compacted to it
    assert [o.seq for o in view(store).scan("m1", 1, 99)] == [11]


def test_the_sweeps_listings_hold_the_active_readers_and_their_monitors_only(store):
    """The sweep reads every active subscription and their monitors each time it runs (every second on a
    shared store's leader): the retired, which accumulate, are not read. Each store's answer is the listing's
    filtered (Store's defaults), by id."""
    from monitor_protocol.core.store_contract import Store

    monitors = [monitor(m) for m in ("m1", "m2", "m3", "m4")]
    subs = [
        sub("s3", "m2", "agent:c", "h3"),
        sub("s1", "m1", "agent:a", "h1"),
        sub("s2", "m1", "agent:b", "h2", active=False),
        sub("s4", "m3", "agent:d", "h4", active=False),
        sub("s5", "gone", "agent:e", "h5"),  # a reader whose monitor is not stored
    ]
    put(store, monitors=monitors, subscriptions=subs)
    v = view(store)
    assert [s.id for s in v.list_active_subscriptions()] == ["s1", "s3", "s5"]
    assert v.list_active_subscriptions() == Store.list_active_subscriptions(v)
    assert [m.id for m in v.list_monitors_with_readers()] == ["m1", "m2"]
    assert v.list_monitors_with_readers() == Store.list_monitors_with_readers(v)
    put(store, leases=[lease("m2", "b", "s3"), lease("m1", "z"), lease("m1", "a", "s1"), lease("m3", "c")])
    v = view(store)
    assert [(x.monitor, x.subject) for x in v.list_held_leases()] == [("m1", "a"), ("m2", "b")]
    assert v.list_held_leases() == Store.list_held_leases(v)


def test_a_page_of_monitors_is_the_listing_cut_after_an_id(store):
    """GET /monitors reads a page at a time (Store.list_monitors_page): the first `limit` monitors whose id
    sorts after `after`, by id, as the whole listing would give them; the SQL stores read only the page."""
    from monitor_protocol.core.store_contract import Store

    ids = ["m-9", "m.1", "m10", "m2", "M3", "m_4", "a0", "zz"]  # written out of order; ASCII sorts - . digits
    put(store, monitors=[monitor(m) for m in ids])
    v = view(store)
    whole = [m.id for m in v.list_monitors()]
    assert whole == sorted(ids)
    for after in ("", "a0", "m.1", "m10", "m2", "m3", "zz", "zzz"):
        for limit in (1, 2, 3, 100):
            page = v.list_monitors_page(after, limit)
            assert [m.id for m in page] == [i for i in whole if i > after][:limit], (after, limit)
            assert page == Store.list_monitors_page(v, after, limit)
    with store.transaction():  # a monitor written by the call that reads is on its page too
        store.apply(Changes(monitors=[monitor("m0")]))
        assert [m.id for m in store.list_monitors_page("a0", 2)] == ["m-9", "m.1"]
        assert [m.id for m in store.list_monitors_page("m.1", 2)] == ["m0", "m10"]


def test_the_backlog_summary_counts_in_the_store_what_the_listing_counts(store):
    """/metrics' summary (Store.backlog_summary): the SQL stores count in the database what the default
    reads record by record, whatever the mix: monitors with a floor (compacted), cursors before the floor,
    at and past the head, retired readers (not counted), a reader of a monitor not stored (counted active, no
    backlog), ties ordered by monitor and id, and `top` cutting the list."""
    import dataclasses

    from monitor_protocol.core.store_contract import Store

    monitors = [monitor("m1", head=40, floor=1), monitor("m2", head=30, floor=21), monitor("m3", head=0)]
    subs = []
    for i, (mid, cursor, active) in enumerate(
        [
            ("m1", 0, True),
            ("m1", 11, True),
            ("m1", 41, True),
            ("m1", 3, False),
            ("m2", 5, True),
            ("m2", 25, True),
            ("m3", 0, True),
            ("gone", 0, True),
            ("m2", 5, True),
        ]  # fmt: skip
    ):
        subs.append(
            dataclasses.replace(sub(f"s{i}", mid, f"agent:r{i}", f"h{i}", active=active), cursor=cursor)
        )
    put(store, monitors=monitors, subscriptions=subs)
    v = view(store)
    for top in (0, 2, 50):
        got, listed = v.backlog_summary(top), Store.backlog_summary(v, top)
        assert got == listed, (top, got, listed)
    full = v.backlog_summary(50)
    assert full["monitors"] == 3 and full["active"] == 8 and full["total"] == 40 + 30 + 0 + 10 + 6 + 10
    assert full["top"][:3] == [(40, "m1", "s0"), (30, "m1", "s1"), (10, "m2", "s4")]
    assert [r[2] for r in v.backlog_summary(2)["top"]] == ["s0", "s1"]
    if type(v).backlog_summary is not Store.backlog_summary:  # the SQL stores: counted in the database

        def listing(*_a, **_k):
            raise AssertionError("a scrape must not list every record")

        v.list_subscriptions = v.list_monitors = listing
        assert v.backlog_summary(50) == full


def T(column: str, *exact: str, prefixes: tuple[str, ...] = ()) -> Term:
    return Term(column, tuple(exact), prefixes)


def Q(*clauses: tuple) -> LogQuery:
    return LogQuery(tuple(clauses))


def _log() -> list[Observation]:
    types = ["com.example.ci.run", "com.example.ci.deploy", "org.other.ping", "com.example.cï.ünï"]
    out = []
    for seq in range(1, 41):
        subject = None if seq % 10 == 0 else ["build-1", "build-2", "bäu-3", "日本-4"][seq % 4]
        actor = "agent:ci-bot" if seq % 3 else "agent:other"
        out.append(obs("m1", seq, types[seq % 4], subject, actor=actor, origin="agent", tier="unverified"))
        if subject is None:
            out[-1] = Observation.of("m1", seq, {k: v for k, v in out[-1].event.items() if k != "subject"})
    return out


QUERIES = {
    "exact": Q(((T("type", "com.example.ci.deploy"),),)),
    "two exact": Q(((T("type", "com.example.ci.deploy", "org.other.ping"),),)),
    "prefix": Q(((T("type", prefixes=("com.example.",)),),)),
    "non-ASCII prefix": Q(((T("type", prefixes=("com.example.cï",)),),)),
    "CJK prefix": Q(((T("subject", prefixes=("日",)),),)),
    "empty prefix skips NULL subjects": Q(((T("subject", prefixes=("",)),),)),
    "exact or prefix": Q(((T("subject", "build-1", prefixes=("bä",)),),)),
    "alternatives": Q(((T("type", "org.other.ping"),), (T("actor", "agent:other"),))),
    "alternative of two terms": Q(((T("type", "com.example.ci.run"), T("subject", "build-1")),)),
    "two clauses": Q(((T("type", prefixes=("com.",)),),), ((T("actor", "agent:other"),),)),
    "unindexed column": Q(((T("origin", "agent"),),), ((T("tier", "nope"),), (T("horizon", "event"),))),
    "a clause that lets all through": Q(((),), ((T("actor", "agent:ci-bot"),),)),
    "no match": Q(((T("type", "com.example.none"),),)),
    "an empty term": Q(((T("type"),),)),
    "an empty clause": Q(()),
}


@pytest.mark.parametrize("name", QUERIES)
def test_scan_and_count_honour_the_query(store, name):
    rows = _log()
    put(store, observations=rows)
    v, query = view(store), QUERIES[name]
    want = [o for o in rows if query.holds(o)]
    assert list(v.scan("m1", 1, 40, query)) == want
    assert list(v.scan("m1", 11, 30, query)) == [o for o in want if 11 <= o.seq <= 30]
    assert v.count("m1", 1, 40, query) == len(want)
    assert v.count("m1", 1, 40, query, cap=3) == min(3, len(want))
    assert v.count("m1", 11, 30, query, cap=100) == len([o for o in want if 11 <= o.seq <= 30])


def test_the_queries_above_mean_something():
    rows = _log()
    n = {name: sum(1 for o in rows if q.holds(o)) for name, q in QUERIES.items()}
    assert n["exact"] == 10 and n["prefix"] == 30 and n["non-ASCII prefix"] == 10 and n["no match"] == 0
    assert n["empty prefix skips NULL subjects"] == 36 and n["CJK prefix"] == 10
    assert 0 < n["two clauses"] < n["alternatives"] < 40 and n["an empty clause"] == 0


def test_a_long_filtered_scan_over_sparse_and_dense_stretches(store):
    """Long enough for the SQLite scan's chunks and windows to grow and shrink: a rare type, then a dense
    run of it, with a reader that stops early and one that reads it all."""
    rows = [obs("m1", s, "hit" if s % 997 == 0 or 2000 <= s < 2600 else "miss") for s in range(1, 5001)]
    put(store, observations=rows)
    q = Q(((T("type", "hit"),),))
    q2 = Q(((T("type", "hit", "other"),),))
    want = [o.seq for o in rows if q.holds(o)]
    v = view(store)
    for query in (q, q2, Q(((T("type", prefixes=("hi",)),),))):
        assert [o.seq for o in v.scan("m1", 1, 5000, query)] == want
        assert [o.seq for o in v.scan("m1", 1500, 2100, query)] == [s for s in want if 1500 <= s <= 2100]
        first = v.scan("m1", 1, 5000, query)
        assert next(first).seq == 997
        first.close()
        assert v.count("m1", 1, 5000, query) == len(want) and v.count("m1", 1, 5000, query, cap=50) == 50


# hypothesis: scan(query) is exactly the rows for which query.holds, on both stores
# Values near the edges a prefix range must get right (the code point after a prefix, U+10FFFF, the
# surrogate gap, NUL, multi-byte UTF-8), drawn often enough to collide, and other text now and then.
EDGES = ["", "a", "ab", "a\x00", "b", "ba", "é", "éa", "ê", "日", "日本", "\ud7ff", "\ud7ffa", "\ue000"]
EDGES += ["\U0010ffff", "a\U0010ffff", "b\U0010ffff", "\U0010ffff\U0010ffff", "\x00"]
CHARS = ["a", "b", "é", "日", "\x00", "\ud7ff", "\ue000", "\U0010ffff"]
text = st.one_of(st.sampled_from(EDGES), st.text(alphabet=st.sampled_from(CHARS), max_size=3))
query_text = st.one_of(text, st.just("\ud800"))  # a lone surrogate, as JSON can spell it: matches nothing
row_strategy = st.tuples(text, st.one_of(st.none(), text), text, text, text, text)

term_strategy = st.builds(
    Term,
    st.sampled_from(LOG_COLUMNS),
    st.lists(query_text, max_size=2).map(tuple),
    st.lists(query_text, max_size=2).map(tuple),
)
alternative = st.lists(term_strategy, max_size=2).map(tuple)
# Mostly one or two clauses of non-empty alternatives: the rows a wrong condition lets through (or keeps
# out) then show, rather than being filtered away by some other clause.
query_strategy = st.builds(
    LogQuery,
    st.one_of(
        st.lists(st.lists(alternative, min_size=1, max_size=2).map(tuple), min_size=1, max_size=2).map(tuple),
        st.lists(st.lists(alternative, max_size=3).map(tuple), max_size=3).map(tuple),
    ),
)


def test_every_edge_value_as_a_prefix_and_as_a_value(store):
    """Each edge value as the whole column of a row and as a prefix, alone, beside an exact value, and in
    one of two alternatives: the prefix range must take the value equal to the prefix and nothing past it."""
    rows = [obs("m1", i + 1, type_=v, subject=EDGES[-1 - i] or "z", actor=v) for i, v in enumerate(EDGES)]
    put(store, observations=rows)
    v = view(store)
    for prefix in [*EDGES, "\ud800", "c"]:
        for query in (
            Q(((T("type", prefixes=(prefix,)),),)),
            Q(((T("type", "ab", prefixes=(prefix,)),),)),
            Q(((T("subject", prefixes=(prefix, "b")),),)),
            Q(((T("type", prefixes=(prefix,)),), (T("actor", "b"),))),
            Q(((T("origin", ""), T("actor", prefixes=(prefix,))),)),
        ):
            want = [o.seq for o in rows if query.holds(o)]
            assert [o.seq for o in v.scan("m1", 1, 99, query)] == want, (prefix, query)
            assert v.count("m1", 1, 99, query) == len(want), (prefix, query)


def _row_obs(seq: int, cols: tuple) -> Observation:
    type_, subject, actor, origin, tier, horizon = cols
    ev = {"id": str(seq), "type": type_, "actor": actor, "origin": origin, "tier": tier, "horizon": horizon}
    if subject is not None:
        ev["subject"] = subject
    return Observation("m", seq, type_, subject, actor, origin, tier, horizon, ev)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 40), row_strategy), max_size=30),
    st.lists(query_strategy, min_size=1, max_size=4),
    st.integers(-2, 60),
    st.integers(-2, 1500),
    st.one_of(st.none(), st.integers(0, 10)),
)
def test_property_scan_is_the_rows_the_query_holds_for(rows, queries, from_seq, to_seq, cap):
    seq, log = 0, []
    for gap, cols in rows:  # gaps between seqs, some wide: the windows of a SQLite scan get exercised
        seq += gap if gap < 35 else gap * 25
        log.append(_row_obs(seq, cols))
    for s in (MemoryStore(), SQLiteStore(":memory:")):
        if log:
            s.apply(Changes(observations=log))
        for query in queries:
            want = [o for o in log if from_seq <= o.seq <= to_seq and query.holds(o)]
            assert list(s.scan("m", from_seq, to_seq, query)) == want, (type(s).__name__, query)
            assert s.count("m", from_seq, to_seq, query, cap) == (
                len(want) if cap is None else min(cap, len(want))
            )
        s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_strategy, min_size=1, max_size=25), st.data())
def test_property_one_term_drawn_from_the_rows_values(rows, data):
    """One term whose values are drawn from the rows' own (so that prefixes equal values, end where
    others begin, and so on), alone or beside a clause that lets all through."""
    log = [_row_obs(i + 1, cols) for i, cols in enumerate(rows)]
    pool = sorted({v for o in log for v in (o.type, o.subject, o.actor) if v is not None}) + ["\U0010ffff"]
    values = st.lists(st.sampled_from(pool), max_size=2).map(tuple)
    stores = (MemoryStore(), SQLiteStore(":memory:"))
    for s in stores:
        s.apply(Changes(observations=log))
    for _ in range(4):
        term = Term(
            data.draw(st.sampled_from(["type", "subject", "actor"])), data.draw(values), data.draw(values)
        )
        query = Q(((term,),), ((),)) if data.draw(st.booleans()) else Q(((term,),))
        want = [o for o in log if query.holds(o)]
        for s in stores:
            assert list(s.scan("m", 1, 99, query)) == want, (type(s).__name__, query)
            assert s.count("m", 1, 99, query) == len(want)
    for s in stores:
        s.close()


storable = st.text(
    alphabet=st.one_of(
        st.sampled_from(["\ud7ff", "\ue000", "\U0010ffff", "\x00"]), st.characters(exclude_categories=("Cs",))
    ),
    max_size=4,
)


def test_next_prefix_examples():
    assert next_prefix("a") == "b" and next_prefix("é") == "ê" and next_prefix("a\U0010ffff") == "b"
    assert next_prefix("\ud7ff") == "\ue000" and next_prefix("") is None and next_prefix("\U0010ffff") is None


@given(storable, storable, storable)
@example("a", "", "b")
@example("a\U0010ffff", "\U0010ffff", "b")
@example("\ud7ff", "", "\ue000")
@example("é", "z", "ê")
def test_property_next_prefix_bounds_exactly_the_strings_with_that_prefix(prefix, rest, other):
    upper = next_prefix(prefix)
    assert prefix <= prefix + rest and (upper is None or prefix + rest < upper)
    assert (other >= prefix and (upper is None or other < upper)) == other.startswith(prefix)


# ===================================================================================== subscriptions
def test_subscription_indexes_follow_rekeying(store):
    put(store, subscriptions=[sub("sub-1", token_hash="old")])
    put(store, subscriptions=[sub("sub-1", token_hash="new")])
    v = view(store)
    assert v.find_subscription_by_token("old") is None and v.find_subscription_by_token("new").id == "sub-1"
    assert v.find_subscription("m1", "agent:a").id == "sub-1" and v.find_subscription("m1", "agent:b") is None
    assert [s.id for s in v.list_subscriptions("m1")] == ["sub-1"] and v.list_subscriptions("m2") == []


def test_a_subscription_never_replaces_another(store):
    put(
        store,
        subscriptions=[
            sub("sub-1", subscriber="agent:a"),
            sub("sub-2", subscriber="agent:b", token_hash="h2"),
        ],
    )
    # a new id under a name that another subscription holds
    with pytest.raises(Refused), store.transaction():
        store.apply(Changes(subscriptions=[sub("sub-3", subscriber="agent:a", token_hash="h3")]))
    # an existing id renamed onto a name that another subscription holds
    with pytest.raises(Refused), store.transaction():
        store.apply(Changes(subscriptions=[sub("sub-2", subscriber="agent:a", token_hash="h2")]))
    # a name taken before its holder moves away, in the same Changes (SQLite checks statement by statement)
    with pytest.raises(Refused), store.transaction():
        store.apply(
            Changes(
                subscriptions=[
                    sub("sub-3", subscriber="agent:a", token_hash="h3"),
                    sub("sub-1", subscriber="agent:z"),
                ]
            )
        )
    v = view(store)
    assert [s.id for s in v.list_subscriptions("m1")] == ["sub-1", "sub-2"]
    assert (
        v.find_subscription("m1", "agent:a").id == "sub-1"
        and v.find_subscription("m1", "agent:b").id == "sub-2"
    )
    assert v.get_subscription("sub-3") is None and v.find_subscription_by_token("h3") is None
    # the same name on another monitor, an update under its own name, a rename to a free name, and a name
    # taken once its holder has moved away earlier in the same Changes, are all fine
    put(
        store,
        subscriptions=[
            sub("sub-4", monitor_id="m2", subscriber="agent:a", token_hash="h4"),
            sub("sub-1", subscriber="agent:a", token_hash="h1b"),
            sub("sub-2", subscriber="agent:c", token_hash="h2"),
            sub("sub-5", subscriber="agent:b", token_hash="h5"),
        ],
    )
    v = view(store)
    assert v.find_subscription("m2", "agent:a").id == "sub-4"
    assert v.find_subscription_by_token("h1b").id == "sub-1" and v.find_subscription_by_token("h1") is None
    assert (
        v.find_subscription("m1", "agent:c").id == "sub-2"
        and v.find_subscription("m1", "agent:b").id == "sub-5"
    )


def test_two_versions_of_a_subscription_in_one_apply_the_last_wins(store):
    """The engine stages one version per subscription, but a store takes any Changes: with two versions of
    one subscription in one apply, the last is what is stored, its identity indexed and the other's not."""
    first = sub("sub-1", token_hash="t0")
    put(store, subscriptions=[first])
    renamed = replace(first, token_hash="t1", cursor=5)
    back = replace(first, cursor=7)
    put(store, subscriptions=[renamed, back])
    v = view(store)
    assert v.find_subscription_by_token("t1") is None  # a read of the table, not of a cache
    assert v.find_subscription_by_token("t0") == back and v.get_subscription("sub-1") == back


def test_count_active_subscriptions(store):
    assert store.count_active_subscriptions("m1") == 0
    put(
        store,
        subscriptions=[
            sub(f"sub-{i}", subscriber=f"agent:{i}", token_hash=f"h{i}", active=i != 3) for i in range(5)
        ]
        + [sub("other", monitor_id="m2", subscriber="agent:0", token_hash="hx")],
    )
    assert view(store).count_active_subscriptions("m1") == 4
    put(
        store,
        subscriptions=[
            sub("sub-0", subscriber="agent:0", token_hash="h0", active=False),
            sub("sub-3", subscriber="agent:3", token_hash="h3", active=True),
            sub("sub-4", subscriber="agent:4", token_hash="h4", active=False),
        ],
    )
    with pytest.raises(RuntimeError), store.transaction():
        store.apply(
            Changes(
                subscriptions=[
                    sub("sub-1", subscriber="agent:1", token_hash="h1", active=False),
                    sub("sub-9", subscriber="agent:9", token_hash="h9"),
                ]
            )
        )
        raise RuntimeError("abort")
    v = view(store)
    assert v.count_active_subscriptions("m1") == 3
    assert v.count_active_subscriptions("m1") == sum(1 for s in v.list_subscriptions("m1") if s.active)
    assert v.count_active_subscriptions("m2") == 1 and v.count_active_subscriptions("nope") == 0


# ===================================================================================== leases, keys
def test_leases_are_scoped_per_monitor(store):
    put(store, leases=[lease("m1", "job", "sub:a"), lease("m2", "job", "sub:b"), lease("m1", "a-job")])
    v = view(store)
    assert v.get_lease("m1", "job").holder == "sub:a" and v.get_lease("m2", "job").holder == "sub:b"
    assert [x.subject for x in v.list_leases("m1")] == ["a-job", "job"] and len(v.list_leases()) == 3
    put(store, leases=[replace(lease("m1", "job"), attempts=1)])
    assert (
        view(store).get_lease("m1", "job").holder is None and view(store).get_lease("m1", "job").attempts == 1
    )


def test_publish_keys_are_kept_per_monitor(store):
    assert store.get_publish_key("m1", "k1") is None
    odd = 'odd "key"/[1] ✓'
    put(
        store,
        publish_keys=[PublishKey("m1", "k1", 12, 1764000000.5), PublishKey("m2", "k1", 3, 1764000001.0)]
        + [PublishKey("m1", odd, 13, 1764000002.0)],
    )
    v = view(store)
    assert v.get_publish_key("m1", "k1") == PublishKey("m1", "k1", 12, 1764000000.5)
    assert v.get_publish_key("m2", "k1").seq == 3 and v.get_publish_key("m1", odd).seq == 13
    assert v.get_publish_key("m1", "k2") is None and v.get_publish_key("m3", "k1") is None


def test_publish_key_purge_is_strictly_before_and_rolls_back(store):
    put(store, publish_keys=[PublishKey("m1", "old", 1, 100.0), PublishKey("m1", "edge", 2, 200.0)])
    put(store, publish_keys=[PublishKey("m2", "new", 1, 300.0)])
    with pytest.raises(RuntimeError), store.transaction():
        store.apply(Changes(publish_keys=[PublishKey("m1", "lost", 8, 999.0)], purge_keys_before=1000.0))
        raise RuntimeError("abort")
    v = view(store)
    assert v.get_publish_key("m1", "old").seq == 1 and v.get_publish_key("m1", "lost") is None
    put(store, purge_keys_before=200.0)  # strictly before: "edge" (at 200.0) stays
    v = view(store)
    assert v.get_publish_key("m1", "old") is None
    assert v.get_publish_key("m1", "edge").seq == 2 and v.get_publish_key("m2", "new").seq == 1
    put(
        store, publish_keys=[PublishKey("m1", "fresh", 3, 2e12)], purge_keys_before=1e12
    )  # written, then purged
    v = view(store)
    assert v.get_publish_key("m1", "edge") is None and v.get_publish_key("m2", "new") is None
    assert v.get_publish_key("m1", "fresh").seq == 3


# ===================================================================================== the browser journal
def test_the_journal_keeps_the_indexeddb_layout():
    """Keys as the previous version wrote them (boot.js readLog walks the observation keys), values as
    to_row() writes them, and the event itself for an observation."""
    s = MemoryStore()
    put(
        s,
        monitors=[FULL_MONITOR],
        observations=[FULL_OBS],
        subjects=[("m-full", "job ✓")],
        subscriptions=[FULL_SUBSCRIPTION],
        leases=[FULL_LEASE],
        publish_keys=[FULL_KEY],
    )
    with pytest.raises(RuntimeError), s.transaction():
        s.apply(Changes(monitors=[monitor("lost")]))
        raise RuntimeError
    assert s.drain_changes() == [
        ("monitors", "m-full", FULL_MONITOR.to_row()),
        ("observations", "m-full/00000000000000000042", FULL_OBS.event),
        ("subjects", json.dumps(["m-full", "job ✓"]), {"monitor": "m-full"}),
        ("subscriptions", "sub-full", FULL_SUBSCRIPTION.to_row()),
        ("leases", json.dumps(["m-full", "job ✓"]), FULL_LEASE.to_row()),
        ("idempotency", json.dumps(["m-full", FULL_KEY.key]), FULL_KEY.to_row()),
    ]
    assert observation_key("m", 7) == "m/00000000000000000007" and s.drain_changes() == []
    put(s, compactions=[("m-full", 43)], purge_keys_before=2e9)
    assert s.drain_changes() == [
        ("observations", "m-full/00000000000000000042", None),
        ("idempotency", json.dumps(["m-full", FULL_KEY.key]), None),
    ]


# ===================================================================================== SQLite's own duties
def test_sqlite_commit_survives_reopen_and_rollback_does_not(tmp_path):
    path = str(tmp_path / "durable.db")
    s = SQLiteStore(path)
    put(s, monitors=[monitor("kept")], observations=[obs("kept", 1)])
    with pytest.raises(RuntimeError), s.transaction():
        s.apply(Changes(monitors=[monitor("lost")]))
        raise RuntimeError
    s.close()
    again = SQLiteStore(path)
    assert [m.id for m in again.list_monitors()] == ["kept"] and again.get_observation("kept", 1) == obs(
        "kept", 1
    )
    assert again._db.execute("PRAGMA user_version").fetchone()[0] == 3
    assert again._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert again._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    again.close()


def test_subjects_and_publish_keys_are_listed_per_monitor_in_order(store):
    put(
        store,
        monitors=[monitor("m1"), monitor("m2")],
        subjects=[("m1", "zeta"), ("m1", "alpha"), ("m2", "other"), ("m1", "a\x00b")],
        publish_keys=[
            PublishKey("m1", "k2", 2, 60.0),
            PublishKey("m1", "k1", 1, 50.0),
            PublishKey("m2", "k", 3, 1.0),
        ],
    )
    s = view(store)
    assert s.list_subjects("m1") == ["a\x00b", "alpha", "zeta"]  # Python's order, every character kept
    assert s.list_subjects("m2") == ["other"] and s.list_subjects("nobody") == []
    assert s.list_publish_keys("m1") == [PublishKey("m1", "k1", 1, 50.0), PublishKey("m1", "k2", 2, 60.0)]
    assert s.list_publish_keys("nobody") == []


def test_sqlite_one_writer_per_file(tmp_path):
    path = str(tmp_path / "locked.db")
    first = SQLiteStore(path)
    with pytest.raises(StoreLocked, match=r"pid \d+"):
        SQLiteStore(path)
    first.close()
    SQLiteStore(path).close()  # control: once the first closes, the file opens


def test_sqlite_group_commit_is_one_commit(tmp_path):
    s = SQLiteStore(str(tmp_path / "batch.db"))
    with s.batch():
        for i in range(1, 4):
            put(s, observations=[obs("m1", i)])
        with s.transaction():  # a read-only call inside the group
            s.get_monitor("m1")
        with pytest.raises(RuntimeError), s.transaction():
            s.apply(Changes(observations=[obs("m1", 4)]))
            raise RuntimeError  # one failed call inside a batch rolls back alone
    assert [o.seq for o in s.scan("m1", 1, 10)] == [1, 2, 3]
    assert (s.stats.commits, s.stats.read_only) == (1, 1)
    with s.batch(), s.transaction():  # a group of read-only calls commits nothing
        s.get_monitor("m1")
    assert (s.stats.commits, s.stats.read_only) == (1, 2) and not s._db.in_transaction
    s.close()


def test_sqlite_columns_are_the_records_fields(tmp_path):
    s = SQLiteStore(str(tmp_path / "cols.db"))
    put(
        s,
        monitors=[FULL_MONITOR],
        subscriptions=[FULL_SUBSCRIPTION],
        leases=[FULL_LEASE],
        observations=[FULL_OBS],
    )
    db = s._db
    assert db.execute("SELECT status, head, floor FROM monitors").fetchone() == ("paused", 42, 7)
    assert db.execute(
        "SELECT state, cursor, hwm, mute_since, token_hash, last_pull FROM subscriptions"
    ).fetchone() == ("retired", 12, 15, 1790000050.5, "th", 1790000060.0)
    sub_rest = json.loads(db.execute("SELECT rec FROM subscriptions").fetchone()[0])
    assert "last_pull" not in sub_rest and "hwm" not in sub_rest and sub_rest["grant"] == "owner"
    assert db.execute("SELECT state, holder, renewed, duration FROM leases").fetchone() == (
        "dead_lettered",
        None,
        1790000030.0,
        3600,
    )
    rest = json.loads(db.execute("SELECT rec FROM monitors").fetchone()[0])
    assert "head" not in rest and "status" not in rest and rest["owner_hash"] == "oh"  # each fact once
    assert db.execute("SELECT type, subject, actor FROM observations").fetchone() == (
        "com.example.a",
        "job ✓",
        "agent:a",
    )
    s.close()


def test_sqlite_a_version_2_file_is_brought_to_version_3_with_its_last_pulls(tmp_path):
    """Version 2 kept a subscription's last pull in its JSON rest; opening such a file moves it to the column
    (one transaction) and every record reads back as it was. Control: a file of an unknown version is still
    refused, and left as it was."""
    path = tmp_path / "v2.db"
    s = SQLiteStore(str(path))
    put(s, monitors=[FULL_MONITOR], subscriptions=[FULL_SUBSCRIPTION, sub("sub-never")])
    s.close()
    as_format_2(path)  # the same file as version 2 wrote it
    again = SQLiteStore(str(path))
    assert again._db.execute("PRAGMA user_version").fetchone()[0] == 3
    assert again.get_subscription("sub-full") == FULL_SUBSCRIPTION
    assert again.get_subscription("sub-never") == sub("sub-never")  # never pulled: None, as before
    assert again._db.execute("SELECT last_pull FROM subscriptions WHERE id='sub-full'").fetchone() == (
        1790000060.0,
    )
    assert "last_pull" not in json.loads(again._db.execute("SELECT rec FROM subscriptions").fetchone()[0])
    again.close()
    # control: a version this store does not know is refused, and the file keeps its version
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version=9")
    raw.commit()
    raw.close()
    with pytest.raises(StoreVersionError, match="version 9"):
        SQLiteStore(str(path))
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 9
    raw.close()


def v2_file(path) -> None:
    """A database as format 2 wrote it (a subscription's last pull in its JSON rest)."""
    s = SQLiteStore(str(path))
    put(s, monitors=[FULL_MONITOR], subscriptions=[FULL_SUBSCRIPTION])
    s.close()
    as_format_2(path)


def test_sqlite_an_upgrade_is_known_to_its_opener(tmp_path):
    """The store says which format it brought the file from (mp serve prints it once); a file already in the
    current format says nothing."""
    path = tmp_path / "v2.db"
    v2_file(path)
    upgraded = SQLiteStore(str(path))
    assert upgraded.upgraded_from == 2
    upgraded.close()
    again = SQLiteStore(str(path))
    assert again.upgraded_from is None  # control: opened as it is
    again.close()


def test_sqlite_the_first_builds_format_is_named_and_a_foreign_table_is_not(tmp_path):
    """Found by an operator upgrading in place: a file of the first builds (up to 7eaa620 of 2026-12-01: no format
    version, monitors(id, rec)) was called a table "this store did not write". It is named for what it is,
    with where the way forward is written; another program's `monitors` table keeps the plain refusal. The
    file's tables are left as they were."""
    first = tmp_path / "first.db"
    raw = sqlite3.connect(first)
    raw.execute("CREATE TABLE monitors (id TEXT PRIMARY KEY, rec TEXT NOT NULL)")
    raw.execute("CREATE TABLE observations (monitor TEXT, seq INTEGER, rec TEXT)")
    raw.execute("INSERT INTO monitors VALUES ('ci', '{}')")
    raw.commit()
    raw.close()
    with pytest.raises(
        StoreVersionError,
        match=r"early build of monitor-protocol \(up to commit 7eaa620 of 2026-12-01: format 1",
    ):
        SQLiteStore(str(first))
    raw = sqlite3.connect(first)  # its tables and rows as they were (nothing created beside them)
    names = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    assert names == ["monitors", "observations"]
    assert raw.execute("SELECT * FROM monitors").fetchall() == [("ci", "{}")]
    raw.close()
    other = tmp_path / "other.db"
    raw = sqlite3.connect(other)
    raw.execute("CREATE TABLE monitors (name TEXT, cpu REAL)")
    raw.commit()
    raw.close()
    with pytest.raises(StoreVersionError, match="this store did not write") as refused:
        SQLiteStore(str(other))
    assert "early build" not in str(refused.value)  # control


# A subscription's next version: a pull's delivery (its own columns only, every other field the same
# object), an ack (its reply memo, in the JSON rest, too), or a change of another part of the rest; made to
# one of two subscriptions or to both in one apply, alone or as two calls of one group commit, kept or
# rolled back.
SUB_STEP = st.tuples(
    st.sampled_from(["deliver", "ack", "rest"]),
    st.integers(0, 50),
    st.floats(1e9, 2e9),
    st.sampled_from(["relist", "scan_mark", "filter", "revoked"]),
    st.sampled_from([("sub-1",), ("sub-2",), ("sub-1", "sub-2")]),
    st.sampled_from(["alone", "grouped", "rolled back"]),
)


def _next_version(current: Subscription, kind: str, a: int, b: float, part: str) -> Subscription:
    if kind == "deliver":
        return replace(current, cursor=a, hwm=a + 1, mute_since=b, last_pull=b)
    if kind == "ack":
        return replace(current, cursor=a, last_ack=AckMemo(a, {"cursor": a, "lag": 0}), mute_since=b)
    return replace(
        current,
        relist=not current.relist if part == "relist" else current.relist,
        scan_mark=(1, a + 1) if part == "scan_mark" else current.scan_mark,
        filter={"types": [f"t{a}"]} if part == "filter" else current.filter,
        revoked=not current.revoked if part == "revoked" else current.revoked,
    )


def _rows_on_file(path) -> dict[str, Subscription]:
    """The subscriptions as another reader of the file sees them (never this store's cache)."""
    from monitor_protocol.store.sql import row_of
    from monitor_protocol.store.sqlite import SUBSCRIPTION_ROW

    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = reader.execute(f"SELECT {', '.join(SUBSCRIPTION_ROW)}, rec FROM subscriptions").fetchall()
    finally:
        reader.close()
    return {r[0]: Subscription.from_row(row_of(r, SUBSCRIPTION_ROW)) for r in rows}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(SUB_STEP, min_size=1, max_size=10))
def test_sqlite_a_subscriptions_row_reads_back_as_its_last_version_whatever_wrote_it(tmp_path, steps):
    """Whether a version is written as its columns alone (a delivery: no JSON), with its JSON rest (an ack,
    another change), among others in one apply or one group commit, or rolled back, the file holds the last
    version committed, field for field: read by another connection after every step, and opened again."""
    path = tmp_path / f"steps-{abs(hash(tuple(steps)))}.db"
    s = SQLiteStore(str(path), synchronous="OFF")
    current = {"sub-1": sub("sub-1"), "sub-2": sub("sub-2", subscriber="agent:b", token_hash="h2")}
    put(s, subscriptions=list(current.values()))
    for kind, a, b, part, which, how in steps:
        nxt = {sid: _next_version(current[sid], kind, a, b, part) for sid in which}
        if how == "rolled back":
            with pytest.raises(RuntimeError), s.transaction():
                s.apply(Changes(subscriptions=list(nxt.values())))
                raise RuntimeError
        elif how == "grouped":
            with s.batch():
                for version in nxt.values():
                    put(s, subscriptions=[version])
            current.update(nxt)
        else:
            put(s, subscriptions=list(nxt.values()))
            current.update(nxt)
        assert _rows_on_file(path) == current
        assert {sid: s.get_subscription(sid) for sid in current} == current  # and what the store remembers
    s.close()
    again = SQLiteStore(str(path))
    assert {sid: again.get_subscription(sid) for sid in current} == current
    again.close()


def test_sqlite_a_delivery_writes_the_readers_columns_and_no_json(tmp_path):
    """A pull's delivery changes the reader's cursor columns alone: its write is the UPDATE of those columns,
    with no `rec`. Control: an ack changes the reply memo in the JSON rest, and its write carries `rec`."""
    s = SQLiteStore(str(tmp_path / "step.db"))
    first = sub("sub-1")
    put(s, subscriptions=[first])
    statements: list[str] = []
    s._db.set_trace_callback(statements.append)
    delivered = replace(first, hwm=3, last_pull=1790000001.0, mute_since=1790000001.0)
    put(s, subscriptions=[delivered])
    writes = [x for x in statements if "subscriptions" in x and x.startswith(("INSERT", "UPDATE"))]
    assert (
        len(writes) == 1
        and writes[0].startswith("UPDATE subscriptions SET cursor=")
        and "rec=" not in writes[0]
    )
    statements.clear()
    acked = replace(delivered, cursor=4, last_ack=AckMemo(4, {"cursor": 4, "lag": 0}))
    put(s, subscriptions=[acked])
    s._db.set_trace_callback(None)
    writes = [x for x in statements if "subscriptions" in x and x.startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 1 and "rec=" in writes[0]
    s.close()
    again = SQLiteStore(str(tmp_path / "step.db"))
    assert again.get_subscription("sub-1") == acked
    again.close()


def _plan(s: SQLiteStore, sql: str, args: tuple) -> str:
    return " | ".join(r[-1] for r in s._db.execute("EXPLAIN QUERY PLAN " + sql, args))


def test_sqlite_reads_seek_their_indexes(tmp_path):
    s = SQLiteStore(str(tmp_path / "plan.db"))
    assert "subscriptions_active" in _plan(s, COUNT_ACTIVE_SQL, ("m1",))
    put(s, observations=[obs("m1", i, "rare" if i == 3000 else "common") for i in range(1, 3001)])
    statements: list[str] = []
    s._db.set_trace_callback(statements.append)
    rows = s.scan("m1", 1, 3000, Q(((T("type", "rare"),),)))
    assert [o.seq for o in rows] == [3000]
    plans = [_plan(s, q, ()) for q in statements if q.startswith("SELECT seq")]
    assert plans and all("observations_by_type" in p for p in plans), plans
    assert len(statements) < 20  # seeks over windows that double, not 3000 rows in chunks of 256
    statements.clear()
    assert s.count("m1", 1, 3000, Q(((T("type", "rare"),),)), cap=5) == 1
    assert "observations_by_type" in _plan(s, statements[-1], ())
    s._db.set_trace_callback(None)
    s.close()


def test_sqlite_scan_is_lazy(tmp_path):
    s = SQLiteStore(str(tmp_path / "lazy.db"))
    put(s, observations=[obs("m1", i) for i in range(1, 2001)])
    statements: list[str] = []
    s._db.set_trace_callback(statements.append)
    for query in (None, Q(((T("type", "com.example.x"),),))):
        statements.clear()
        it = s.scan("m1", 1, 2000, query)
        assert next(it).seq == 1
        it.close()
        assert len([q for q in statements if q.startswith("SELECT seq")]) == 1
    s._db.set_trace_callback(None)
    s.close()


# StorageError on a full disk, a read-only file, a failed commit, and bugs that are not storage errors:
# tests/test_sqlite_safety.py.


# ===================================================================================== threads
def test_calls_from_several_threads_lose_nothing(store) -> None:
    """Found by an embedder: a producer thread and a reader thread on one MonitorService (memory or SQLite)
    lost publishes already confirmed with a seq, gave two publishers one seq, and left SQLite's connection in
    a transaction for good: a second thread's call joined the first's open transaction. Each call is now its
    own transaction whichever thread makes it. Three publishers and a reader at once: every confirmed seq is
    in the log once, the reader gets each, and the store still works after (the control)."""
    import threading

    from monitor_protocol.core.service import MonitorService

    service = MonitorService(store)
    owner = service.create_monitor({"id": "threads", "types": ["com.example.x"]}, None)["owner_token"]
    sub = service.subscribe(
        {"monitor": "threads", "subscriber": "agent:r", "filter": {"types": ["com.example.x"]}}, owner
    )
    sub_id, reader = sub["subscription"]["id"], sub["token"]
    confirmed: list[int] = []
    failures: list[BaseException] = []
    per_thread = 300

    def publisher(k: int) -> None:
        try:
            for i in range(per_thread):
                got = service.publish("threads", {"type": "com.example.x", "data": {"k": k, "i": i}}, owner)
                confirmed.append(got["seq"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    received: list[int] = []

    def read() -> None:
        try:
            while len(received) < 3 * per_thread and not failures:
                batch = service.pull(sub_id, reader, limit=25)
                received.extend(
                    int(o["sequence"]) for o in batch["observations"] if o["type"] == "com.example.x"
                )
                service.ack(sub_id, reader, {"cursor": batch["next"]})
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=publisher, args=(k,)) for k in range(3)] + [
        threading.Thread(target=read)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    assert len(confirmed) == len(set(confirmed)) == 3 * per_thread
    logged = [int(o["sequence"]) for o in service.export_log("threads") if o.get("type") == "com.example.x"]
    assert sorted(logged) == sorted(confirmed)
    assert sorted(received) == sorted(confirmed)  # at least once, and here exactly once: acked as read
    assert service.publish("threads", {"type": "com.example.x"}, owner)["seq"] > max(confirmed)


def test_an_apply_from_another_thread_is_not_taken_back_with_an_open_transaction(store) -> None:
    """A reviewer's: a store's `apply` outside a call checked only the "in a transaction" flag, so another
    thread's apply wrote into the open transaction of this one, and was taken back when it rolled back. It
    now waits for that transaction and is its own; the control: the rolled-back call's write is gone."""
    import threading

    entered, release = threading.Event(), threading.Event()

    def rolled_back() -> None:
        try:
            with store.transaction():
                store.apply(Changes(monitors=[monitor("m-rolled-back")]))
                entered.set()
                release.wait(30)
                raise RuntimeError("this call fails")
        except RuntimeError:
            pass

    first = threading.Thread(target=rolled_back)
    first.start()
    assert entered.wait(30)
    second = threading.Thread(target=lambda: store.apply(Changes(monitors=[monitor("m-other-thread")])))
    second.start()
    second.join(0.2)  # it waits for the open transaction (PostgreSQL: a session of its own, it does not)
    release.set()
    first.join(30)
    second.join(30)
    seen = view(store)
    assert seen.get_monitor("m-other-thread") is not None
    assert seen.get_monitor("m-rolled-back") is None  # control


def test_a_page_of_unfiltered_rows_is_one_fetch_and_an_open_read_starts_small():
    """A drain's page of 100 unfiltered rows (dense seqs, the read bounded to them) is one fetch of 100, not
    chunks of 8, 16, 32 and 64; an open-ended read still starts with 8 rows, so that a reader stopping early
    never loads the rest (the control)."""
    from monitor_protocol.core.store_contract import chunked_rows

    asked: list[tuple[int, int, int]] = []

    def fetch(start: int, end: int, limit: int) -> list[tuple[int]]:
        asked.append((start, end, limit))
        return [(seq,) for seq in range(start, min(end, start + limit - 1) + 1)]

    assert [r[0] for r in chunked_rows(fetch, 501, 600, windowed=False)] == list(range(501, 601))
    assert asked == [(501, 600, 100)]
    asked.clear()
    rows = chunked_rows(fetch, 1, 1_000_000, windowed=False)
    assert [next(rows)[0] for _ in range(3)] == [1, 2, 3] and asked == [(1, 1_000_000, 8)]
    asked.clear()
    assert len(list(chunked_rows(fetch, 1, 5, windowed=False))) == 5 and asked == [(1, 5, 8)]
