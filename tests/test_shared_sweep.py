"""The sweep on a store several servers share: what is listed without a lock decides only what is not due
(renewals and signs of life only move deadlines later); what looks due is locked, read again and decided on
what is committed. So a sweep over many subscriptions with nothing due locks nothing and writes nothing, and
a lease renewed or a reader heard elsewhere since the listing is not expired or retired."""

from __future__ import annotations

import pytest
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.memory import MemoryStore
from waiting import eventually_async

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick


class SharedMemoryStore(MemoryStore):
    """The memory store, declared shared, counting the monitor locks the engine takes. `stale` plays
    another server's commit landing between a listing and a lock: while set, the listings return these
    old versions, and point reads (what the engine reads under the lock) the committed ones."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.locks: list[str] = []
        self.stale: dict[str, list] = {}

    def lock_monitor(self, monitor_id: str, *, shared: bool = False) -> None:
        self.locks.append(monitor_id)

    def list_subscriptions(self, monitor_id=None):
        return self.stale.get("subscriptions") or super().list_subscriptions(monitor_id)

    def list_leases(self, monitor_id=None):
        return self.stale.get("leases") or super().list_leases(monitor_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def setup(readers: int) -> tuple[SharedMemoryStore, MonitorService, Clock, list[dict], str]:
    store, clock = SharedMemoryStore(), Clock()
    service = MonitorService(store, clock=clock)
    created = service.create_monitor(
        {"id": "ci", "visibility": "public", "types": ["com.example.x"], "capabilities": ["observe", "act"]},
        None,
    )
    owner = created["owner_token"]
    subs = [
        service.subscribe(
            {
                "monitor": "ci",
                "subscriber": f"agent:r{i}",
                "retire_after_mute_seconds": 60,
                "capabilities": ["observe", "act"],
            },
            owner,
        )  # fmt: skip
        for i in range(readers)
    ]
    return store, service, clock, subs, owner


def test_a_sweep_with_nothing_due_locks_nothing_and_writes_nothing():
    store, service, clock, _subs, _owner = setup(50)
    clock.now += 30  # every reader is 30 s into its 60 s window
    store.locks.clear()
    writes = len(store.drain_changes())
    assert service.sweep() == 0
    assert store.locks == [] and len(store.drain_changes()) == 0, (store.locks, writes)
    clock.now += 31  # positive control: now every one of them is due, and each is locked and retired
    assert service.sweep() == 50
    assert store.locks.count("ci") == 1  # one lock for the monitor, held by the sweep's one transaction


def test_a_reader_heard_since_the_listing_is_not_retired():
    store, service, clock, subs, _owner = setup(1)
    sub, token = subs[0]["subscription"]["id"], subs[0]["token"]
    before = store.get_subscription(sub)
    clock.now += 59
    service.pull(sub, token)  # a sign of life at 59 s, through "another server"
    assert store.get_subscription(sub).mute_since > before.mute_since  # written at once (a 60 s window)
    clock.now += 2  # 61 s after subscribing, 2 s after the pull
    store.stale["subscriptions"] = [before]  # the sweep lists the version from before the pull
    assert service.sweep() == 0 and store.get_subscription(sub).active  # decided on the committed one
    store.stale.clear()
    clock.now += 60  # positive control: silent for a whole window now, it is retired
    assert service.sweep() == 1 and not store.get_subscription(sub).active


def test_a_lease_renewed_since_the_listing_does_not_expire():
    store, service, clock, subs, owner = setup(1)
    sub, token = subs[0]["subscription"]["id"], subs[0]["token"]
    service.publish("ci", {"type": "com.example.x", "subject": "job-1", "data": {}}, owner)
    service.lease(sub, token, "claim", {"subject": "job-1", "lease_duration_seconds": 10})
    before = store.get_lease("ci", "job-1")
    clock.now += 8
    service.lease(sub, token, "renew", {"subject": "job-1"})  # through "another server"
    clock.now += 4  # 12 s after the claim, 4 s after the renewal
    store.stale["leases"] = [before]
    assert service.sweep() == 0 and store.get_lease("ci", "job-1").holder is not None
    store.stale.clear()
    clock.now += 10  # positive control: 14 s after the renewal, it expires
    assert service.sweep() == 1 and store.get_lease("ci", "job-1").holder is None


# -- push on a shared store: one pusher, and no append left behind ----------------------------------------
class PushService:
    """What push.Pusher needs of MonitorService: one push subscription, its pulls counted, and whether this
    server leads (sweeps_here), which a test flips."""

    push_epoch = 0

    def __init__(self) -> None:
        self.leading = True
        self.pulls = 0

    def add_listener(self, fn) -> None:
        pass

    def remove_listener(self, fn) -> None:
        pass

    def sweeps_here(self) -> bool:
        return self.leading

    def push_targets(self):
        return [
            {
                "id": "sub-1",
                "monitor": "ci",
                "sink": "https://sink.example/hook",
                "sink_secret": "",
                "cursor": 1,
            }
        ]

    def pull_as_system(self, sub_id, limit=None):
        self.pulls += 1
        return {"observations": [], "next": 1}  # nothing new: the worker goes idle


def run_pusher(service: PushService, scenario) -> None:
    import asyncio

    from monitor_protocol.doors.push import Pusher

    async def call(fn, *args):
        return fn(*args)

    async def main() -> None:
        pusher = Pusher(call, service, rescan_seconds=0.05)
        task = asyncio.create_task(pusher.run())
        try:
            await scenario(pusher)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_each_rescan_looks_at_idle_push_subscriptions_so_a_lost_notification_only_delays():

    service = PushService()

    async def scenario(pusher) -> None:
        await eventually_async(lambda: service.pulls >= 1, what="the backlog pull at start")
        first = service.pulls
        # Rescans every 0.05 s, and no append heard at all: the idle subscription is looked at again anyway.
        await eventually_async(lambda: service.pulls >= first + 2, what="two more pulls, by rescans alone")

    run_pusher(service, scenario)


def test_a_server_that_stops_leading_stops_pushing_before_its_next_rescan():
    import asyncio

    service = PushService()

    async def scenario(pusher) -> None:
        await eventually_async(lambda: service.pulls >= 1, what="the backlog pull at start")
        # One loop turn: the worker goes idle, waiting for a wake (no assertion depends on it).
        await asyncio.sleep(0)
        stopped = service.pulls
        service.leading = False  # the leader lock moved to another server
        pusher.wakes["sub-1"].set()  # an append arrives for it before this server's next rescan
        await eventually_async(lambda: not pusher.workers, what="the next rescan ends the worker")
        await asyncio.sleep(0.3)  # the point: about six rescans pass, and none may pull
        assert service.pulls == stopped and not pusher.workers, (service.pulls, pusher.workers)
        service.leading = True  # positive control: leading again, it pushes again
        await eventually_async(lambda: service.pulls > stopped, what="a pull once leading again")

    run_pusher(service, scenario)


def test_a_long_mute_window_is_never_retired_early_by_a_server_that_did_not_see_the_pull():
    """A window of 600 s or more may keep a sign of life in the memory of the server that served the pull
    (up to 30 s, as on one server). Another server's sweep cannot see it, so it waits that long more."""
    store, clock = SharedMemoryStore(), Clock()
    serving, sweeping = MonitorService(store, clock=clock), MonitorService(store, clock=clock)
    serving.create_monitor({"id": "ci", "visibility": "public"}, None)
    sub = serving.subscribe(
        {"monitor": "ci", "subscriber": "agent:r", "retire_after_mute_seconds": 3600}, None
    )
    sid = sub["subscription"]["id"]
    caught_up = serving.pull(sid, sub["token"])  # delivers the monitor's own rows: a write, at `start`
    serving.ack(sid, sub["token"], {"cursor": caught_up["next"]})
    start = store.get_subscription(sid).mute_since
    clock.now = start + 20
    assert serving.pull(sid, sub["token"])["observations"] == []  # an empty pull 20 s later:
    # its sign of life is remembered by `serving`, not written (20 s < the 30 s flush window)
    assert store.get_subscription(sid).mute_since == start  # what `sweeping` can see
    clock.now = start + 3610  # 3,590 s after the pull: not mute yet, whatever the store says
    assert sweeping.sweep() == 0 and store.get_subscription(sid).active
    clock.now = start + 3631  # positive control: past the window and the grace, it is retired
    assert sweeping.sweep() == 1 and not store.get_subscription(sid).active
