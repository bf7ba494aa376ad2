"""What an engine call writes, the lazily stored mute clock, typed records and their lifecycle tables, and what
each door says it offers. Every test has its positive control."""

from __future__ import annotations

import dataclasses

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from monitor_protocol.core import lifecycles as states
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus, SubscriptionState
from monitor_protocol.core.records import (
    Counters,
    Monitor,
    Observation,
    builder,
    copier,
    evolve,
    new_observation,
)
from monitor_protocol.core.runtime import MUTE_FLUSH_SECONDS
from monitor_protocol.core.store_contract import Store
from monitor_protocol.doors.browser import EngineHost

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick

A = "com.example.ci.run"


@pytest.fixture(params=STORE_KINDS)
def h(request, tmp_path):
    store = make_store(request.param, tmp_path)
    yield Harness(store)
    getattr(store, "close", lambda: None)()


def test_an_empty_pull_and_a_read_write_nothing_a_delivery_and_a_publish_write_once(h):
    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok)
    page = h.pull(sid, rtok).body
    assert h.ack(sid, rtok, page["next"]).status == 200
    before = h.store.stats.commits
    for _ in range(5):
        assert h.pull(sid, rtok).body["observations"] == []  # empty pulls, as a long-poll re-check does
    h.call("GET", "/monitors/ci/state", token=tok)
    h.call("GET", f"/subscriptions/{sid}", token=rtok)
    assert h.store.stats.commits == before  # nothing durable
    assert h.publish("ci", tok).status == 201
    assert h.store.stats.commits == before + 1  # positive control: a publish is one commit
    assert len(h.pull(sid, rtok).body["observations"]) == 1
    assert h.store.stats.commits == before + 2  # a delivery moves the high-water mark: one commit
    again = h.pull(sid, rtok).body  # redelivered, nothing new: no write
    assert again["observations"][0]["redelivered"] is True and h.store.stats.commits == before + 2


def test_the_mute_clock_of_a_reader_that_only_pulls_is_exact_here_and_stored_within_its_bound(h):
    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok, retire_after_mute_seconds=60)
    first = h.pull(sid, rtok).body
    h.ack(sid, rtok, first["next"])
    for _ in range(12):  # two minutes of empty pulls every 10 s: never silent for 60 s
        h.clock.advance(10)
        assert h.pull(sid, rtok).status == 200
        h.service.sweep()
        stored = h.store.get_subscription(sid)
        assert stored.active
        assert h.clock.t - stored.mute_since < min(MUTE_FLUSH_SECONDS, 60 / 2)  # the stored lag bound
    h.clock.advance(61)  # positive control: silence past the window retires it
    h.service.sweep()
    assert h.store.get_subscription(sid).state is SubscriptionState.RETIRED


def test_signs_of_life_are_forgotten_once_stored_or_retired(h):
    """The engine remembers a reader's unwritten sign of life (the lazy mute clock); it kept every one for the
    process's life, one entry per reader that ever pulled, so a churn of readers grew it for good. Forgotten
    once its subscription is written with a clock at least that late, or retired."""
    tok = h.monitor("ci")
    for i in range(20):
        sid, rtok = h.subscribe("ci", tok, subscriber=f"agent:r{i}")
        h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
        h.clock.advance(1)
        h.pull(sid, rtok)  # empty: remembered, not written
        assert sid in h.service._life  # positive control: the pending sign of life is there
        assert h.call("POST", f"/subscriptions/{sid}/retire", {}, token=rtok).status == 200
        assert sid not in h.service._life
    sid, rtok = h.subscribe("ci", tok, subscriber="agent:kept")
    h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
    h.clock.advance(1)
    h.pull(sid, rtok)
    assert sid in h.service._life
    h.clock.advance(MUTE_FLUSH_SECONDS + 1)
    h.pull(sid, rtok)  # past the window: written now, so nothing is left to remember
    assert h.store.get_subscription(sid).mute_since == h.clock.t and sid not in h.service._life


def test_signs_of_life_another_server_stored_or_retired_are_forgotten_past_the_bound(h, monkeypatch):
    """On a store several servers share, another server may write or retire a reader (or a monitor) this one
    only remembers a pull of: it never hears of it, and the entry stayed for the process's life (a soak
    of two servers saw it grow). Past REMEMBERED_MAX the oldest entries are read from the store and the ones
    that no longer matter are forgotten; one still ahead of the store is kept (control)."""
    from monitor_protocol.core import runtime
    from monitor_protocol.core.service import MonitorService

    monkeypatch.setattr(runtime, "REMEMBERED_MAX", 4)
    monkeypatch.setattr(runtime, "REMEMBERED_CHECKED", 100)
    other = MonitorService(h.store, clock=h.clock)  # another server on the same store
    tok = h.monitor("keep")
    kept, ktok = h.subscribe("keep", tok, subscriber="agent:kept")
    h.ack(kept, ktok, h.pull(kept, ktok).body["next"])
    gone = []
    for i in range(6):
        mid = f"m{i}"
        owner = h.monitor(mid)
        sid, rtok = h.subscribe(mid, owner)
        h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
        gone.append((mid, owner, sid, rtok))
    h.clock.advance(1)
    h.pull(kept, ktok)  # empty, within the window: remembered, and still ahead of the store
    for _mid, _owner, sid, rtok in gone:
        h.pull(sid, rtok)  # remembered here (checked past the bound: all still ahead of the store, kept)
    life, pulls = h.service._life, h.service._monitor_pulls
    assert kept in life and all(g[2] in life for g in gone) and all(g[0] in pulls for g in gone)  # control
    for mid, owner, sid, rtok in gone:  # retired by the other server: this one never hears of it
        other.retire_subscription(sid, rtok, {"reason": "elsewhere"})
        other.configure(mid, "retire", {"reason": "elsewhere"}, owner)
    assert len(life) == 7
    h.call("GET", "/monitors/keep/state", token=tok)  # any engine call past the bound checks the oldest
    assert life.keys() == {kept}, life  # retired elsewhere: forgotten; still ahead of the store: kept
    assert not any(g[0] in pulls for g in gone), pulls


def test_the_sweep_reads_no_retired_reader_nor_free_lease_and_still_does_its_work(h):
    """Retired readers and free leases accumulate; the sweep, every second on a shared store's leader, read
    all of them each time. It reads the active readers, their monitors and the held leases only, and still
    retires a reader past its mute window and expires a lease past its time (controls), and leaves a live
    reader and a fresh lease."""
    tok = h.monitor("ci", capabilities=["observe", "act"])
    for subject in ("b-1", "b-2", "b-3"):
        h.publish("ci", tok, actor="probe:ci", subject=subject)
    for i in range(5):
        sid, rtok = h.subscribe("ci", tok, subscriber=f"agent:old{i}")
        assert h.call("POST", f"/subscriptions/{sid}/retire", {}, token=rtok).status == 200
    mute, _ = h.subscribe("ci", tok, subscriber="agent:mute", retire_after_mute_seconds=60)
    live, ltok = h.subscribe(
        "ci", tok, subscriber="agent:live", retire_after_mute_seconds=600, capabilities=["observe", "act"]
    )
    leases = f"/subscriptions/{live}/leases"
    for subject, seconds in (("b-1", 30), ("b-2", 30), ("b-3", 300)):
        assert (
            h.call(
                "POST", f"{leases}/claim", {"subject": subject, "lease_duration_seconds": seconds}, ltok
            ).status
            == 201
        )
    assert h.call("POST", f"{leases}/release", {"subject": "b-2"}, ltok).status == 200  # a free lease now
    store = h.store
    listed_all = []
    original_subs, original_monitors = store.list_subscriptions, store.list_monitors
    original_leases = store.list_leases

    def whole(kind, original):  # records a listing of every row (not one monitor's)
        return lambda monitor_id=None: (
            (monitor_id is None and listed_all.append(kind)) or original(monitor_id)
        )

    store.list_subscriptions = whole("subscriptions", original_subs)
    store.list_leases = whole("leases", original_leases)
    store.list_monitors = lambda: listed_all.append("monitors") or original_monitors()
    h.clock.advance(40)
    h.pull(live, ltok)
    h.clock.advance(40)
    h.service.sweep()
    assert h.store.get_subscription(mute).state is SubscriptionState.RETIRED  # control: the sweep ran
    assert h.store.get_subscription(live).active
    assert h.store.get_lease("ci", "b-1").holder is None  # expired by the sweep
    assert h.store.get_lease("ci", "b-3").holder == f"sub:{live}"  # not yet due
    if type(store).list_active_subscriptions is not Store.list_active_subscriptions:
        assert listed_all == [], listed_all  # no reader, monitor or lease was listed whole


def test_a_sign_of_life_written_in_a_group_commit_is_forgotten_only_once_stored(tmp_path):
    """A write inside a group commit is not stored until the group commits: a failed group keeps the old
    clock, so the sign of life it would have stored stays remembered (the sweep never retires early); a group
    that commits forgets it as it ends. Control: another reader's write leaves it."""
    h = Harness(make_store("sqlite", tmp_path))
    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok)
    other, otok = h.subscribe("ci", tok, subscriber="agent:other")
    h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
    h.clock.advance(MUTE_FLUSH_SECONDS + 1)
    h.ack(sid, rtok, h.pull(sid, rtok).body["next"])  # past the window: stored
    h.clock.advance(1)
    h.pull(sid, rtok)  # empty, within the window: remembered, not written
    remembered = h.service._life[sid]
    h.ack(other, otok, h.pull(other, otok).body["next"])  # another reader's write: sid's entry stays
    assert h.service._life[sid] == remembered
    h.clock.advance(MUTE_FLUSH_SECONDS + 1)
    assert h.publish("ci", tok).status == 201
    with pytest.raises(RuntimeError), h.store.batch():  # the group fails after sid's delivery was written
        assert len(h.service.pull(sid, rtok)["observations"]) == 1
        raise RuntimeError("the group's commit fails")
    h.clock.advance(1)
    h.ack(other, otok, h.pull(other, otok).body["next"])  # a call outside a group checks what it stored
    assert h.service._life.get(sid) == remembered  # the failed group stored nothing: still remembered
    with h.store.batch():  # the same delivery, committed this time
        assert len(h.service.pull(sid, rtok)["observations"]) == 1
        assert h.service._life.get(sid) == remembered  # not stored yet: still remembered inside the group
    assert sid not in h.service._life and h.store.get_subscription(sid).mute_since > remembered
    getattr(h.store, "close", lambda: None)()


def test_signs_of_life_are_forgotten_when_every_call_runs_in_a_group_commit(tmp_path, monkeypatch):
    """While a long poll is parked every engine call runs in a group commit (the HTTP door joins its re-check
    to it), and a group's signs of life were forgotten only by a later call outside one, the remembered last
    pulls checked only outside one: a churn of readers and monitors grew both for good (a tester's soak: one
    entry per subscription and monitor that ever pulled). Control: inside the group they are there."""
    h = Harness(make_store("sqlite", tmp_path))
    service, store = h.service, h.store
    seen_inside = 0
    for i in range(30):
        with store.batch():
            tok = h.monitor(f"m{i}")
            sid, rtok = h.subscribe(f"m{i}", tok)
            h.publish(f"m{i}", tok)
        with store.batch():
            h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
        h.clock.advance(1)
        with store.batch():
            h.pull(sid, rtok)  # empty: remembered, not written
            seen_inside += sid in service._life and f"m{i}" in service._monitor_pulls
        with store.batch():
            assert h.call("POST", f"/subscriptions/{sid}/retire", {}, token=rtok).status == 200
            assert h.call("POST", f"/monitors/m{i}/retire", {"reason": "churn"}, token=tok).status == 200
    assert seen_inside == 30  # control: each was remembered
    assert service._life == {}, service._life  # retired, and stored as such: nothing left to remember
    assert service._monitor_pulls == {}, service._monitor_pulls
    store.close()


def test_last_pulls_another_server_retired_are_checked_past_the_bound_when_a_group_ends(
    tmp_path, monkeypatch
):
    """What another server retired this one never hears of: past REMEMBERED_MAX the oldest entries are read
    from the store, and with every call in a group commit that happens as a group ends (at most once every
    REMEMBERED_CHECK_SECONDS). Control: before any group ends, they are all there."""
    from monitor_protocol.core import runtime
    from monitor_protocol.core.service import MonitorService

    monkeypatch.setattr(runtime, "REMEMBERED_MAX", 4)
    monkeypatch.setattr(runtime, "REMEMBERED_CHECKED", 100)
    monkeypatch.setattr(runtime, "REMEMBERED_CHECK_SECONDS", 0.0)
    h = Harness(make_store("sqlite", tmp_path))
    other = MonitorService(h.store, clock=h.clock)  # another engine on the same file, as a second server is
    gone = []
    for i in range(6):
        owner = h.monitor(f"m{i}")
        sid, rtok = h.subscribe(f"m{i}", owner)
        h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
        gone.append((f"m{i}", owner, sid, rtok))
    h.clock.advance(1)
    with h.store.batch():
        for _mid, _owner, sid, rtok in gone:
            h.pull(sid, rtok)  # empty: the monitor's last pull remembered, not written
    pulls = h.service._monitor_pulls
    for mid, owner, _sid, _rtok in gone:
        other.configure(mid, "retire", {"reason": "elsewhere"}, owner)  # this engine never hears of it
    assert len(pulls) == 6  # control
    with h.store.batch():
        h.call("GET", "/discover")
    assert pulls == {}, pulls
    h.store.close()


def test_served_last_pull_is_the_latest_pull_even_when_not_yet_stored(h):
    from monitor_protocol.core import timefmt

    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok)
    h.ack(sid, rtok, h.pull(sid, rtok).body["next"])
    h.clock.advance(3)
    h.pull(sid, rtok)  # empty: remembered, not written
    assert h.store.get_subscription(sid).last_pull < h.clock.t
    served = h.call("GET", f"/subscriptions/{sid}", token=rtok).body
    assert served["last_pull"] == timefmt.iso(h.clock.t)
    state = h.call("GET", "/monitors/ci/state", token=tok).body
    assert state["ages"]["since_last_pull_s"] == 0


def test_state_after_compaction_says_its_counters_cover_the_whole_history(h):
    tok = h.monitor("ci")
    for _ in range(5):
        h.publish("ci", tok)
    assert (
        h.call("POST", "/admin/compact", {"monitor": "ci", "upto_seq": 4}, token="admin-token").status == 200
    )
    state = h.call("GET", "/monitors/ci/state", token=tok).body
    assert state["retention_floor"] == 5 and state["counters"]["observations"] == 5
    assert state["computed_from"] == {"seq_from": 1, "seq_to": state["head"]}


def test_an_engine_gone_leaves_no_hook_alive_on_its_store(tmp_path):
    """The store calls its engines' group-commit end hooks through a weak reference: an engine dropped (a
    test's, an embedder's second one) is freed, and the store's groups go on (control: one alive is heard)."""
    import gc
    import weakref

    from monitor_protocol.core.service import MonitorService

    store = make_store("sqlite", tmp_path)
    heard: list[bool] = []
    kept = MonitorService(store)
    kept.batch_ended = heard.append  # type: ignore[method-assign]
    gone = weakref.ref(MonitorService(store))
    gc.collect()
    assert gone() is None
    with store.batch():
        pass  # an empty group ends too
    assert heard == [True]
    store.close()


def test_a_seek_below_the_retention_floor_is_taken_and_the_next_pull_names_the_floor(h):
    """docs/protocol.md (Seek): a seek answers with the cursor it set, below the floor too; the pull after it
    meets the floor as any cursor below it does (410 CURSOR_EXPIRED naming it), and a seek to the floor
    replays what is kept. Control: a reader with reset_policy earliest is moved to the floor instead."""
    tok = h.monitor("ci")
    sid, rtok = h.subscribe("ci", tok, **{"from": "earliest"})
    moved, mtok = h.subscribe(
        "ci", tok, subscriber="agent:moved", reset_policy="earliest", **{"from": "earliest"}
    )
    for _ in range(6):
        h.publish("ci", tok)
    h.ack(sid, rtok, h.pull(sid, rtok, limit=200).body["next"])
    compacted = h.call("POST", "/admin/compact", {"monitor": "ci", "upto_seq": 5}, token="admin-token")
    assert compacted.status == 200
    floor = h.call("GET", "/monitors/ci/state", token=tok).body["retention_floor"]
    assert floor == 6
    for reader, token in ((sid, rtok), (moved, mtok)):
        sought = h.call(
            "POST", f"/subscriptions/{reader}/seek", {"cursor": 2, "reason": "replay"}, token=token
        )
        assert sought.status == 200 and sought.body["cursor"] == 2, sought.body
    refused = h.pull(sid, rtok)
    assert refused.status == 410 and refused.body["code"] == "CURSOR_EXPIRED", refused.body
    assert refused.body["retention_floor"] == floor and refused.body["requested"] == 2
    assert h.pull(moved, mtok).body["observations"][0]["id"] == str(floor)  # control: moved to the floor
    again = h.call("POST", f"/subscriptions/{sid}/seek", {"cursor": floor, "reason": "kept"}, token=rtok)
    assert again.status == 200
    assert h.pull(sid, rtok).body["observations"][0]["id"] == str(floor)


def test_records_are_frozen_and_evolve_checks_its_fields():
    m = Monitor(id="ci", owner="agent:o", owner_hash="h", created=1.0, updated=1.0, name="ci")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.head = 3  # type: ignore[misc]
    n = evolve(m, head=3, status=MonitorStatus.PAUSED)
    assert (n.head, n.status, m.head, m.status) == (3, MonitorStatus.PAUSED, 0, MonitorStatus.ACTIVE)
    assert n == dataclasses.replace(m, head=3, status=MonitorStatus.PAUSED)  # same as replace
    with pytest.raises(TypeError, match="no field"):
        evolve(m, _head=3)
    assert not hasattr(n, "__dict__")  # slots: no stray attribute can hide a private field
    # Every field is copied, whichever were changed (the copier sets each through its slot's setter).
    full = dataclasses.replace(m, description="d", types=["com.example.x"], head=7, actors=("agent:a",))
    again = evolve(full, version=2)
    assert again == dataclasses.replace(full, version=2) and again.types is full.types


def test_evolve_copies_a_frozen_record_without_slots_too():
    """The copier falls back to object.__setattr__ for a field with no slot of its own (a frozen dataclass
    without __slots__), so a record class written without them still evolves whole."""

    @dataclasses.dataclass(frozen=True)
    class Plain:
        a: int
        b: str = "b"

    p = Plain(1)
    q = evolve(p, a=2)
    assert (q, p) == (Plain(2, "b"), Plain(1, "b"))


def test_a_record_built_positionally_is_the_record_its_constructor_makes():
    """builder(cls): every field in order, set through the slots, for values already valid (stored rows,
    a rule's own results). It makes what the dataclass's __init__ makes, frozen and slotted, for each record
    class the hot paths build this way, and for a class without slots."""
    event = {
        "type": "com.example.x",
        "subject": "s",
        "actor": "agent:a",
        "origin": "agent",
        "tier": "measured",
    }
    built = new_observation("ci", 4, "com.example.x", "s", "agent:a", "agent", "measured", "", event, 120)
    assert built == Observation("ci", 4, "com.example.x", "s", "agent:a", "agent", "measured", "", event)
    assert built.size == 120  # the stored size: known to the budgets, not part of what it is (equal above)
    assert Observation.of("ci", 4, event) == built and Observation.of("ci", 4, event).event is event
    assert Observation.of("ci", 4, {"type": "t"}) == Observation(
        "ci", 4, "t", None, "", "", "", "", {"type": "t"}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.seq = 5  # type: ignore[misc]
    assert not hasattr(built, "__dict__")
    c = Counters(
        observations=2, delivered=3, acted=4, rejected=5, contradictions=6, contradictions_resolved=7
    )
    assert c.observed() == c.bump(observations=1) == dataclasses.replace(c, observations=3)
    assert builder(Counters)(1, 2, 3, 4, 5, 6) == Counters(1, 2, 3, 4, 5, 6)
    assert builder(Counters)(1, 2, 3, 4, 5, 6) != Counters(
        1, 2, 3, 4, 5, 7
    )  # the control: every field counts

    @dataclasses.dataclass(frozen=True)
    class Plain:
        a: int
        b: str = "b"

    assert builder(Plain)(1, "c") == Plain(1, "c")
    with pytest.raises(TypeError):
        builder(Plain)(1)  # positional and whole: no defaults are filled in

    @dataclasses.dataclass(frozen=True, slots=True)
    class Clash:
        new: int

    with pytest.raises(TypeError, match="cannot write Clash"):
        builder(Clash)  # a field named like the written function's own local is refused, not shadowed

    @dataclasses.dataclass(frozen=True, slots=True)
    class Fine:
        set_at: float

    assert builder(Fine)(1.5) == Fine(1.5)  # only set_<n> is the written function's own


def test_a_record_copied_positionally_is_the_record_evolve_makes():
    """copier(cls, names): a copy with `names` set from its arguments in that order (not the fields'
    order), every other field as it was; what evolve makes with the same changes."""
    m = Monitor(id="ci", owner="agent:o", owner_hash="h", created=1.0, updated=2.0, name="ci", head=3)
    publish = copier(Monitor, ("head", "counters", "actors", "budget_used"))
    changed = publish(m, 4, Counters(observations=4), ("agent:a",), 9)
    assert changed == evolve(m, head=4, counters=Counters(observations=4), actors=("agent:a",), budget_used=9)
    assert changed != evolve(m, head=4, counters=Counters(observations=4), actors=("agent:a",), budget_used=8)
    assert (changed.name, changed.created, changed.updated, m.head) == ("ci", 1.0, 2.0, 3)  # m untouched
    swapped = copier(Monitor, ("budget_used", "head"))(m, 4, 9)  # the names' order, not the fields'
    assert (swapped.budget_used, swapped.head) == (4, 9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.head = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field"):
        copier(Monitor, ("heads",))
    with pytest.raises(TypeError, match="named twice"):
        copier(Monitor, ("head", "head"))  # its second value would be dropped


def test_a_pending_sign_of_life_moves_the_mute_clock_and_never_back_the_last_pull():
    """ServiceCore.alive applies a pull's remembered sign of life (the lazy mute clock): mute_since moves
    to it; last_pull to it too, unless the stored last_pull is later (it never goes back)."""
    from monitor_protocol.core.records import Subscription
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.memory import MemoryStore

    core = MonitorService(MemoryStore())
    sub = Subscription(
        id="s", monitor="ci", subscriber="agent:a", token_hash="h", created=0.0, mute_since=1.0
    )
    core._life["s"] = 5.0
    assert (core.alive(sub).mute_since, core.alive(sub).last_pull) == (5.0, 5.0)
    later = evolve(sub, last_pull=9.0)
    assert (core.alive(later).mute_since, core.alive(later).last_pull) == (5.0, 9.0)
    core._life["s"] = 0.5  # control: a sign of life older than the stored clock changes nothing
    assert core.alive(later) is later


def test_the_positional_builders_callers_name_the_fields_in_their_order():
    """new_observation and Counters.observed pass every field by position (records.builder): a field
    added or two swapped would put a value in the wrong field, so the order they are written for is held
    here."""
    observation = ("monitor", "seq", "type", "subject", "actor", "origin", "tier", "horizon", "event", "size")
    assert tuple(f.name for f in dataclasses.fields(Observation)) == observation
    counters = ("observations", "delivered", "acted", "rejected", "contradictions", "contradictions_resolved")
    assert tuple(f.name for f in dataclasses.fields(Counters)) == counters


def test_the_lifecycle_tables():
    assert states.monitor_next(MonitorStatus.ACTIVE, "pause") is MonitorStatus.PAUSED
    assert states.monitor_next(MonitorStatus.PAUSED, "resume") is MonitorStatus.ACTIVE
    for action in states.MONITOR_ACTIONS:
        assert states.monitor_next(MonitorStatus.RETIRED, action) is None  # retired takes nothing
    assert states.lease_next(LeaseState.HELD, "reject", attempts_after=4, limit=5) is LeaseState.FREE
    assert states.lease_next(LeaseState.HELD, "reject", attempts_after=5, limit=5) is LeaseState.DEAD_LETTERED
    assert (
        states.lease_next(LeaseState.HELD, "expired", attempts_after=5, limit=5) is LeaseState.DEAD_LETTERED
    )
    assert states.lease_next(LeaseState.HELD, "release", attempts_after=5, limit=5) is LeaseState.FREE
    assert states.lease_next(LeaseState.FREE, "complete", attempts_after=0, limit=5) is None
    assert states.subscription_next(SubscriptionState.RETIRED, "subscribe") is SubscriptionState.ACTIVE
    assert states.subscription_next(SubscriptionState.RETIRED, "mute") is None


def test_a_retired_monitor_refuses_every_action_through_the_table(h):
    tok = h.monitor("ci")
    assert h.call("POST", "/monitors/ci/retire", {}, token=tok).status == 200
    for action in ("pause", "resume", "retire"):
        r = h.call("POST", f"/monitors/ci/{action}", {}, token=tok)
        assert r.status == 409 and r.body["code"] == "UNAVAILABLE", action


async def test_each_door_advertises_the_feeds_it_offers():
    browser = (await EngineHost().call("GET", "/discover")).body["capabilities"]["feeds"]
    assert browser == {"pull": True, "http": False, "mcp": False, "sse": False}
    h = Harness(make_store("memory", None))
    server = h.call("GET", "/discover").body["capabilities"]["feeds"]
    assert server == {"pull": True, "http": True, "mcp": True, "sse": True}  # positive control


def test_an_unauthorized_refusal_names_the_credential_and_the_rest_door_says_how(h):
    tok = h.monitor("ci")
    r = h.publish("ci", "wrong")
    assert r.status == 401 and r.body["needs"] == "owner_token"
    assert r.body["error"].count("Authorization: Bearer") == 1
    assert h.publish("ci", tok).status == 201


def test_push_epoch_moves_only_when_the_push_targets_change():
    from monitor_protocol.core.service import MonitorService
    from monitor_protocol.store.memory import MemoryStore

    svc = MonitorService(MemoryStore(), allowed_sinks=("127.0.0.0/8",))
    tok = svc.create_monitor({"id": "ci", "visibility": "shared"}, None)["owner_token"]
    assert svc.push_targets() == [] and svc.push_epoch == 0
    for _ in range(3):
        svc.publish("ci", {"type": "com.example.ci.run"}, tok)
    pull_only = svc.subscribe({"monitor": "ci", "subscriber": "agent:puller"}, tok)
    svc.ack(pull_only["subscription"]["id"], pull_only["token"], {"cursor": 2})
    assert svc.push_epoch == 0  # appends, a pull subscription and an ack change no push target
    sink = "http://127.0.0.1:9/hook"
    pushed = svc.subscribe(
        {"monitor": "ci", "subscriber": "agent:hook", "protocol": "http", "sink": sink}, tok
    )
    assert svc.push_epoch == 1  # positive control: a new push subscription
    sid = pushed["subscription"]["id"]
    svc.ack_as_system(sid, 3)
    assert svc.push_epoch == 1  # its cursor moving is not a new target
    svc.retire_subscription(sid, pushed["token"], {"reason": "done"})
    assert svc.push_epoch == 2 and svc.push_targets() == []


def test_the_counts_of_logged_rows_forget_readers_silent_for_a_minute():
    """The per-minute counts of a subscription's own rows (subscribe, seek, re-subscribe, retire) kept one key
    per subscription ever counted until LOGGED_TRACKED_MAX (100,000), then dropped them all at once; a churn
    of readers grew them for a day (found by a soak's tracemalloc). A key silent for a minute counts nothing
    and is dropped; one still inside its minute is kept, and its budget still holds."""
    from monitor_protocol.store.memory import MemoryStore

    h = Harness(MemoryStore())
    tok = h.monitor("ci", visibility="public")
    for i in range(
        30
    ):  # thirty readers, each subscribing once: thirty keys (and the monitor's anonymous one)
        h.subscribe("ci", None, subscriber=f"agent:r{i}")
    assert len(h.service._logged) >= 30
    h.clock.advance(61)
    recent, reader = h.subscribe("ci", tok, subscriber="agent:late")
    assert set(h.service._logged) == {recent}  # only the key counted within the last minute
    for _ in range(59):  # positive control: the budget of the key kept still counts (60 a minute)
        assert (
            h.call("POST", f"/subscriptions/{recent}/seek", {"cursor": 1, "reason": "again"}, reader).status
            == 200
        )
    over = h.call("POST", f"/subscriptions/{recent}/seek", {"cursor": 1, "reason": "again"}, reader)
    assert over.status == 429 and over.body["code"] == "OVER_BUDGET"
