"""The core every rule builds on: configuration, the clock, one transaction per call (a Tx staged by the
rule, applied once), listeners told after the commit, the sweep deadline, and the lazily stored mute
clock. Rules are plain functions `rule(core, tx, ...)`; this class holds no rule."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time as _time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from monitor_protocol import __version__
from monitor_protocol.core import listing_seal
from monitor_protocol.core.errors import ProtocolError, storage_unavailable
from monitor_protocol.core.lanes import lane_local
from monitor_protocol.core.lifecycles import MonitorStatus
from monitor_protocol.core.records import Monitor, Subscription, copier
from monitor_protocol.core.store_contract import StaleRead, StorageError, Store
from monitor_protocol.core.tx import ExclusiveNeeded, Tx
from monitor_protocol.core.vocab import (
    ANONYMOUS_ROWS_PER_MINUTE,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LIMIT,
    DEFAULT_RETIRE_AFTER_MUTE_SECONDS,
    DELIVERY_COUNT_LIMIT,
    EXT_ACK_PULL,
    EXT_MONITOR_PAGES,
    EXT_PUBLISH_BATCH,
    EXTENSION_ID,
    IDEMPOTENCY_KEY_MAX_CHARS,
    IDEMPOTENCY_WINDOW_SECONDS,
    LAG_COUNT_CAP,
    LOGGED_ACTIONS_PER_MINUTE,
    LOGGED_TRACKED_MAX,
    MAX_ACTIVE_SUBSCRIPTIONS,
    MAX_FILTER_BYTES,
    MAX_FILTER_TEXT_CHARS,
    MAX_FUTURE_SECONDS,
    MAX_INTEGER,
    MAX_JSON_DEPTH,
    MAX_LEASE_SECONDS,
    MAX_LIMIT,
    MAX_NAME_CHARS,
    MAX_PUBLISH_BATCH,
    MAX_REASON_BYTES,
    MAX_RPC_BATCH,
    MAX_WAIT_SECONDS,
    MONITORS_PAGE_MAX,
    PROTOCOL_VERSION,
    SCAN_BUDGET,
)

log = logging.getLogger("monitor_protocol.core.runtime")


def _batch_ended(engine: weakref.ref[ServiceCore], committed: bool) -> None:
    """A store's group-commit end hook (MonitorService.batch_ended), for as long as that engine lives; it never
    raises into the store's commit (a group that committed stays committed)."""
    service = engine()
    if service is None:
        return
    try:
        service.batch_ended(committed)
    except Exception:
        log.exception("the engine's group-commit end hook failed")


SERVER_NAME = "monitor-protocol-python"
SERVER_VERSION = __version__

# The mute clock (P6) of a reader that only pulls is stored lazily: a pull that delivers nothing new
# writes nothing, and the stored clock may lag the last pull by at most this, or half the subscription's
# own mute window if that is shorter. This engine's own sweep always uses the exact time it remembers.
MUTE_FLUSH_SECONDS = 30.0
# On a shared store (several servers), mute windows shorter than this are kept exactly (every sign of life
# written); longer ones may be retired up to MUTE_FLUSH_SECONDS late (never early): docs/scale-out.md.
SHARED_EXACT_MUTE_SECONDS = 600.0

Listener = Callable[[str, int], None]
T = TypeVar("T")


_alive = copier(Subscription, ("mute_since", "last_pull"))  # a pending sign of life, applied


def _life_stored(sub: Subscription, seen: float) -> bool:
    """Whether a remembered sign of life no longer matters: the store's clock is as late, or retired."""
    return seen <= sub.mute_since or not sub.active


def _last_pull_stored(monitor: Monitor, seen: float) -> bool:
    return (
        monitor.last_pull is not None and monitor.last_pull >= seen
    ) or monitor.status is MonitorStatus.RETIRED


# Signs of life (and monitors' last pulls) remembered unwritten. Past this, the oldest REMEMBERED_CHECKED are
# read from the store: those it holds (a clock as late), or of a reader or monitor retired or gone, are
# forgotten. On a store several servers share, another server may write or retire a reader this one only
# remembers (it never hears of it), and the entry stayed for the process's life.
REMEMBERED_MAX = 50_000
REMEMBERED_CHECKED = 1_000
REMEMBERED_CHECK_SECONDS = 1.0  # how often a group commit's end checks them (MonitorService.batch_ended)


@dataclass(frozen=True, slots=True)
class Feeds:
    """What the door in front of the engine offers (discover's capabilities.feeds): the engine itself
    only pulls; SSE, HTTP push and MCP are the doors'."""

    pull: bool = True
    http: bool = False
    mcp: bool = False
    sse: bool = False

    def to_wire(self) -> dict[str, bool]:
        return {"pull": self.pull, "http": self.http, "mcp": self.mcp, "sse": self.sse}


SERVER_FEEDS = Feeds(pull=True, http=True, mcp=True, sse=True)


class ServiceCore(ABC):
    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = _time.time,
        registration_token: str | None = None,
        retire_after_mute_seconds: int | None = None,
        allowed_sinks: tuple[str, ...] | list[str] = (),
        feeds: Feeds | None = None,
        lazy_life: bool = True,
    ) -> None:
        self.store = store
        # Whether a pull's sign of life may stay unwritten for a while (_life_window). A host whose engine
        # restarts often and shows the last pull's time (the browser page, on every reload) writes each.
        self.lazy_life = lazy_life
        # Push sinks the operator allowed although they are internal addresses (--allow-sink).
        self.allowed_sinks = tuple(allowed_sinks)
        # What the door in front offers (discover's feeds); mp serve's by default.
        self.feeds = SERVER_FEEDS if feeds is None else feeds
        self.clock = clock
        self.registration_token = registration_token
        # seals a monitors listing's `next` that names a monitor the caller may not see (core/listing_seal.py):
        # the store's own when it keeps one for every server on it, else this process's
        self.listing_key: bytes = getattr(store, "listing_key", None) or listing_seal.new_key()
        self.default_retire_after_mute = retire_after_mute_seconds or DEFAULT_RETIRE_AFTER_MUTE_SECONDS
        self._listeners: list[Listener] = []
        # Observations this engine committed, every door (GET /metrics); engine lanes add to it in turn.
        self.observations_appended = 0
        self._appended_lock = threading.Lock()
        self._next_deadline: float | None = None  # recomputed by sweep(); None = nothing is due
        self._deadline_known = False
        self.last_idempotency_purge = float("-inf")
        # When each subscription last wrote a row of its own (a seek, a re-subscribe): bounded per minute.
        self._logged: dict[str, list[float]] = {}
        self._logged_pruned = 0.0  # when the counts of keys silent for a minute were last dropped
        # Signs of life not yet stored (the lazy mute clock): subscription id -> time, monitor id -> time.
        self._life: dict[str, float] = {}
        self._monitor_pulls: dict[str, float] = {}
        # Signs of life a subscription's write inside a group commit holds (SQLite's `in_batch`), by id: forgotten
        # when that group has committed (the store tells, `batch_ended`), kept when it failed.
        self._life_pending: dict[str, float] = {}
        self._pulls_pending: dict[str, float] = {}  # the same for monitors' last pulls
        # Calls may run on several threads at once on a store that keeps them apart (doors/engines.py
        # EngineLanes): a newer sign of life is never overwritten by an older one.
        self._life_lock = threading.Lock()
        # HTTP push targets as the last push_targets() saw them, kept current by every commit:
        # push_epoch moves only when that set changes, so the push door re-reads it only then.
        self.push_epoch = 0
        self._push_targets: dict[str, tuple[Any, ...]] | None = None
        # Reads the calls of one group commit share (see group_memo), and the group they belong to.
        self._memo: dict[Any, Any] = {}
        self._memo_group: int | None = None
        # Appends of calls run inside a shared store's group commit (PostgresStore.batch), per engine lane:
        # told to the listeners once the group has committed (release_appends), or dropped with it.
        self._held_appends = lane_local()
        # A store with group commits of its own (SQLite) says when each ends: the signs of life a group wrote
        # are held until then (_life_pending). Through a weak reference: the store outlives an engine on it.
        hooks = getattr(store, "batch_end_hooks", None)
        self._hears_batch_end = hooks is not None
        if hooks is not None:
            hooks.append(functools.partial(_batch_ended, weakref.ref(self)))
        self._remembered_checked = float("-inf")  # (monotonic) when batch_ended last checked the oldest

    # ================================================================================ infrastructure
    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _notify(self, appended: dict[str, int], count: int = 0) -> None:
        """Listeners hear each monitor's new head; `count` observations were committed."""
        if count:
            with self._appended_lock:
                self.observations_appended += count
        for monitor_id, head in appended.items():
            for fn in list(self._listeners):
                try:
                    fn(monitor_id, head)
                except Exception:  # a broken listener must never undo a committed append
                    pass

    def _call(self, fn: Callable[[Tx], T], *, lazy_sweep: bool = True, reader: bool = False) -> T:
        """One engine call = one store transaction: the rule stages its changes in a Tx, the applier writes
        them once, and listeners hear about appends after the commit. `reader`: the call writes only the
        subscriptions it reads (core/tx.py reader mode); when it turns out to write more, nothing was written
        and it runs again as an ordinary call."""
        if lazy_sweep:
            self._maybe_sweep()
            if len(self._life) > REMEMBERED_MAX or len(self._monitor_pulls) > REMEMBERED_MAX:
                self._check_remembered()
        deferred: ProtocolError | None = None
        try:
            with self.store.transaction():
                tx = Tx(self.store, self._now(), reader=reader)
                try:
                    result = fn(tx)
                except LoggedRefusal as refusal:  # the rejected row commits, then the error is raised
                    deferred = refusal.error
                    result = None  # type: ignore[assignment]
                changes = tx.changes()
                if not changes.empty():
                    self.store.apply(changes)
        except ExclusiveNeeded:  # rolled back before anything was written: again, its monitor's lock whole
            return self._call(fn, lazy_sweep=False)
        except StaleRead:  # a row the store remembered had changed: nothing written, again, reading it
            return self._call(fn, lazy_sweep=False, reader=reader)
        except StorageError as exc:  # rolled back: nothing half-written, and the client should retry
            detail = str(exc) or type(exc).__name__
            raise storage_unavailable(
                detail, outcome_unknown=getattr(exc, "outcome_unknown", False)
            ) from None
        self._remember_life(tx, changes.subscriptions, changes.monitors)
        if self._push_targets is not None and changes.subscriptions:
            self._track_push_targets(changes.subscriptions)
        if tx.appended and getattr(self.store, "grouping", False):
            held = getattr(self._held_appends, "appends", None)
            if held is None:
                held = self._held_appends.appends = []
            held.append((dict(tx.appended), len(changes.observations)))  # told by release_appends
        else:
            self._notify(tx.appended, len(changes.observations))
        if deferred is not None:
            raise deferred
        return result

    def lane_locals(self) -> list[Any]:
        """What this service keeps per engine lane (core/lanes.py; green lanes check it is per greenlet)."""
        return [self._held_appends]

    def release_appends(self) -> None:
        """The group commit this thread ran has committed: tell the listeners what its calls appended."""
        held = getattr(self._held_appends, "appends", None)
        self._held_appends.appends = []
        for appended, count in held or ():
            self._notify(appended, count)

    def drop_appends(self) -> None:
        """The group commit this thread ran was rolled back: what its calls appended never was."""
        self._held_appends.appends = []

    def _now(self) -> float:
        return float(self.clock())

    def group_memo(self) -> dict[Any, Any] | None:
        """A memo for reads the calls of one group commit share (the page and the lag every reader an append
        woke would read alike), or None outside a group. It lives exactly as long as the group: what it
        holds was read under the group's transaction, and nothing of the group is kept if it fails."""
        store = self.store
        if not getattr(store, "in_batch", False):
            return None
        group = store.batch_number  # type: ignore[attr-defined]
        if self._memo_group != group:
            self._memo = {}
            self._memo_group = group
        return self._memo

    def _track_push_targets(self, subs: list[Subscription]) -> None:
        known = self._push_targets
        assert known is not None
        for sub in subs:
            now = (
                (sub.monitor, sub.sink, sub.sink_secret)
                if sub.active and sub.protocol == "http" and sub.sink
                else None
            )
            if known.get(sub.id) != now:
                if now is None:
                    known.pop(sub.id, None)
                else:
                    known[sub.id] = now
                self.push_epoch += 1

    def push_targets_seen(self, targets: list[dict[str, Any]]) -> None:
        """What push_targets() returned: from now on push_epoch moves when that set changes."""
        self._push_targets = {t["id"]: (t["monitor"], t["sink"], t["sink_secret"]) for t in targets}

    # ================================================================================ the sweep deadline
    def logged_action(self, sub_id: str, now: float, monitor_id: str, anonymous: bool) -> None:
        """A subscription's own row (a subscribe, a seek, a re-subscribe, a retire) carries its caller's
        words in a row of the server's own measurement. At most LOGGED_ACTIONS_PER_MINUTE a minute per
        subscription, and, for subscriptions granted without a token (anonymous readers of a public
        monitor, who may make new ones at will), ANONYMOUS_ROWS_PER_MINUTE a minute per monitor between
        them: past either, 429 OVER_BUDGET with Retry-After. Counted by this process (each server of a
        shared store counts its own)."""
        keys = [(sub_id, LOGGED_ACTIONS_PER_MINUTE, f"Subscription {sub_id}")]
        if anonymous:
            keys.append(
                (
                    f"monitor {monitor_id}",
                    ANONYMOUS_ROWS_PER_MINUTE,
                    f"Subscribers without a token of {monitor_id}",
                )
            )
        with self._life_lock:
            kept = []
            for key, limit, who in keys:
                times = [t for t in self._logged.get(key, ()) if now - t < 60.0]
                if len(times) >= limit:
                    wait = max(1, int(60.0 - (now - times[0])) + 1)
                    raise ProtocolError(
                        "OVER_BUDGET",
                        f"{who} wrote {limit} rows of the log in the last minute (subscribes, seeks, "
                        f"re-subscribes, retires), the most allowed; try again in {wait} s.",
                        limit=limit,
                        window="minute",
                        retry_after=wait,
                    )
                kept.append((key, times))
            if now - self._logged_pruned >= 60.0:  # a key silent for a minute counts nothing: dropped
                self._logged = {k: v for k, v in self._logged.items() if v and now - v[-1] < 60.0}
                self._logged_pruned = now
            if len(self._logged) >= LOGGED_TRACKED_MAX:
                self._logged.clear()  # a bound on memory; losing the counts only lets a minute start again
            for key, times in kept:
                times.append(now)
                self._logged[key] = times

    def schedule(self, deadline: float) -> None:
        if self._deadline_known and (self._next_deadline is None or deadline < self._next_deadline):
            self._next_deadline = deadline

    def deadlines_moved(self) -> None:
        """Deadlines may now fall earlier than any schedule() said (a monitor's mute window shortened): the
        next sweep_due sweeps and learns them again."""
        self._deadline_known = False

    def next_deadline(self) -> float | None:
        return self._next_deadline if self._deadline_known else self._now()

    def sweeps_here(self) -> bool:
        """Whether this engine runs the sweeps: always, unless its store is shared by several servers, where
        the one holding the store's leader lock does (store/postgres.py)."""
        leading = getattr(self.store, "leading", None)
        return True if leading is None else bool(leading())

    def heard_append(self, monitor_id: str, head: int) -> None:
        """Another server committed an append to a store this engine shares: wake this server's readers."""
        self._notify({monitor_id: head})

    def _maybe_sweep(self) -> None:
        if not self.sweeps_here() or getattr(self.store, "grouping", False):
            return  # not this engine's; or a call of a group commit, which takes no lock it did not start with
        if not self._deadline_known or (
            self._next_deadline is not None and self._now() >= self._next_deadline
        ):
            self.sweep()

    def sweep_due(self) -> int:
        """The timer's sweep: only when this engine runs the sweeps and something is due by the deadlines it
        knows (a sweep reads every subscription; one a second for nothing would cost a large server its
        loop). On a store several servers share, others set deadlines this engine does not hear about, so
        the leader sweeps on every tick."""
        if not self.sweeps_here():
            return 0
        if getattr(self.store, "shared", False):
            return self.sweep()
        if self._deadline_known and (self._next_deadline is None or self._now() < self._next_deadline):
            return 0
        return self.sweep()

    @abstractmethod
    def sweep(self, now: float | None = None) -> int:
        """Retire mute subscriptions and expire leases now due (upkeep.sweep, through MonitorService)."""

    def sweep_done(self, nearest: float | None) -> None:
        self._next_deadline = nearest
        self._deadline_known = True

    # ================================================================================ the mute clock
    def mute_seconds(self, monitor: Monitor, sub: Subscription) -> int:
        return int(
            sub.retire_after_mute_seconds
            or monitor.retire_after_mute_seconds
            or self.default_retire_after_mute
        )

    def alive(self, sub: Subscription) -> Subscription:
        """The subscription with the latest sign of life this engine knows, stored or not yet."""
        seen = self._life.get(sub.id)
        if seen is None or seen <= sub.mute_since:
            return sub
        # Pending signs of life come from pulls only (touch and subscribe store theirs at once).
        last = seen if sub.last_pull is None else max(seen, sub.last_pull)
        return _alive(sub, seen, last)

    def last_pull_of(self, monitor: Monitor) -> float | None:
        seen = self._monitor_pulls.get(monitor.id)
        if seen is None or (monitor.last_pull is not None and monitor.last_pull >= seen):
            return monitor.last_pull
        return seen

    def _life_window(self, monitor: Monitor, stored: Subscription) -> float:
        """How long a sign of life may stay unwritten: the shorter of MUTE_FLUSH_SECONDS and half the mute
        window. On a store several servers share, the others cannot see what this engine remembers, so a
        short mute window (under SHARED_EXACT_MUTE_SECONDS) gets every sign of life written at once."""
        if not self.lazy_life:
            return 0.0
        mute = self.mute_seconds(monitor, stored)
        if getattr(self.store, "shared", False) and mute < SHARED_EXACT_MUTE_SECONDS:
            return 0.0
        return min(MUTE_FLUSH_SECONDS, mute / 2)

    def mute_grace(self, monitor: Monitor, stored: Subscription) -> float:
        """How late the mute sweep allows for: on a shared store another server may hold a sign of life it
        has not written yet (at most the window above), so a retirement waits that long more and is never
        early. On a store of its own this engine knows every sign of life (`alive`)."""
        if not getattr(self.store, "shared", False):
            return 0.0
        return self._life_window(monitor, stored)

    def must_store_life(self, monitor: Monitor, stored: Subscription, now: float) -> bool:
        """Whether a sign of life at `now` must be written now (else it is remembered, see above): `stored`
        is the subscription as the store holds it, not as `alive` sees it."""
        return now - stored.mute_since >= self._life_window(monitor, stored)

    def _remember_life(self, tx: Tx, written: list[Subscription], monitors: list[Monitor]) -> None:
        # What it wrote is checked only where remembered (here or by this call), so a publish, which writes its
        # monitor, takes the lock only when a pull of that monitor is remembered. (Read without the lock: an
        # entry another lane adds meanwhile is a later sign, kept anyway.)
        life, pulls_of = self._life, self._monitor_pulls
        subs = any(sub.id in life or sub.id in tx.life for sub in written)
        pulls = any(mon.id in pulls_of or mon.id in tx.monitor_pulls for mon in monitors)
        if not tx.life and not tx.monitor_pulls and not subs and not pulls:
            return
        with self._life_lock:
            self._remember_life_locked(tx)
            in_batch = self._hears_batch_end and getattr(self.store, "in_batch", False)
            if subs:
                self._forget_stored(
                    self._life, written, _life_stored, self._life_pending if in_batch else None
                )
            if pulls:
                pending = self._pulls_pending if in_batch else None
                self._forget_stored(self._monitor_pulls, monitors, _last_pull_stored, pending)

    @staticmethod
    def _forget_stored(
        remembered: dict[str, float],
        written: list[Any],
        stored: Callable[[Any, float], bool],
        pending: dict[str, float] | None,
    ) -> None:
        """A sign of life (a reader's) or last pull (a monitor's) the store now holds (a clock as late) or that no
        longer matters (retired) is forgotten: kept, one entry per reader and monitor that ever pulled stayed
        for the process's life. Inside a group commit the write is not stored yet: `pending`, forgotten when
        the group has committed (batch_ended)."""
        for record in written:
            seen = remembered.get(record.id)
            if seen is not None and stored(record, seen):
                if pending is None:
                    del remembered[record.id]
                else:
                    pending[record.id] = seen

    def batch_ended(self, committed: bool) -> None:
        """The store's group commit is over (SQLite's batch; its `batch_end_hooks`), outside any transaction:
        the signs of life and last pulls its writes hold are forgotten if it committed, and the oldest
        remembered ones are checked when there are too many. While a reader is parked every call runs in a group (the HTTP door
        joins its re-check to it), and both waited for a call outside one: one entry per reader and monitor
        that ever pulled stayed for the process's life (a tester's soak)."""
        with self._life_lock:
            held = ((self._life, self._life_pending), (self._monitor_pulls, self._pulls_pending))
            self._life_pending, self._pulls_pending = {}, {}
            for remembered, pending in held if committed else ():
                for key, seen in pending.items():
                    if remembered.get(key) == seen:  # (a later sign remembered since is kept)
                        del remembered[key]
        if len(self._life) <= REMEMBERED_MAX and len(self._monitor_pulls) <= REMEMBERED_MAX:
            return
        now = _time.monotonic()  # not at every group: readers legitimately ahead of the store stay
        if committed and now - self._remembered_checked >= REMEMBERED_CHECK_SECONDS:
            self._remembered_checked = now
            try:
                self._check_remembered()
            except Exception as exc:  # the store failed: checked again at a later group's end
                log.warning("the remembered signs of life could not be checked now: %s", exc)

    def _check_remembered(self) -> None:
        """The oldest remembered signs of life and last pulls, checked against the store (see REMEMBERED_MAX):
        forgotten when the store holds them or they no longer matter, else moved to the end (still ahead of
        the store: they are what this engine's sweep and state use). Not inside a group commit."""
        store = self.store
        if getattr(store, "in_batch", False) or getattr(store, "grouping", False):
            return
        for remembered, read, stored in (
            (self._life, store.get_subscription, _life_stored),
            (self._monitor_pulls, store.get_monitor, _last_pull_stored),
        ):
            if len(remembered) <= REMEMBERED_MAX:
                continue
            with self._life_lock:
                oldest = list(itertools.islice(remembered.items(), REMEMBERED_CHECKED))
            found = [(key, seen, read(key)) for key, seen in oldest]
            with self._life_lock:
                for key, seen, record in found:
                    if remembered.get(key) != seen:
                        continue  # remembered again meanwhile: a later sign, kept
                    del remembered[key]
                    if record is not None and not stored(record, seen):
                        remembered[key] = seen  # still ahead of the store: kept, at the end

    def _remember_life_locked(self, tx: Tx) -> None:
        for sub_id, when in tx.life.items():
            if when > self._life.get(sub_id, float("-inf")):
                self._life[sub_id] = when
        for monitor_id, when in tx.monitor_pulls.items():
            if when > self._monitor_pulls.get(monitor_id, float("-inf")):
                self._monitor_pulls[monitor_id] = when

    # ================================================================================ discovery
    def discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": [PROTOCOL_VERSION],
            "protocol": "monitor-protocol",
            "capabilities": {
                "monitors": True,
                "feeds": self.feeds.to_wire(),
                "leases": {"delivery_count_limit": DELIVERY_COUNT_LIMIT},
                "extensions": {
                    EXTENSION_ID: {"version": PROTOCOL_VERSION},
                    EXT_ACK_PULL: {
                        "version": "1",
                        "rest": "POST /subscriptions/{id}/pull",
                        "jsonrpc": "feeds/pull",
                    },
                    EXT_PUBLISH_BATCH: {
                        "version": "1",
                        "rest": "POST /monitors/{id}/observations",
                        "max_items": MAX_PUBLISH_BATCH,
                    },
                    EXT_MONITOR_PAGES: {
                        "version": "1",
                        "rest": "GET /monitors?limit=&after=",
                        "jsonrpc": "monitors/list",
                        "max_items": MONITORS_PAGE_MAX,
                    },
                },
            },
            "limits": {
                "max_limit": MAX_LIMIT,
                "default_limit": DEFAULT_LIMIT,
                "max_wait_seconds": MAX_WAIT_SECONDS,
                "lease_duration_seconds": {
                    "default": DEFAULT_LEASE_SECONDS,
                    "min": 1,
                    "max": MAX_LEASE_SECONDS,
                },
                "delivery_count_limit": DELIVERY_COUNT_LIMIT,
                "retire_after_mute_seconds": self.default_retire_after_mute,
                "lag_count_cap": LAG_COUNT_CAP,
                "registration_required": self.registration_token is not None,
                "max_name_chars": MAX_NAME_CHARS,
                "max_json_depth": MAX_JSON_DEPTH,
                "max_filter_bytes": MAX_FILTER_BYTES,
                "max_filter_text_chars": MAX_FILTER_TEXT_CHARS,
                "max_reason_bytes": MAX_REASON_BYTES,
                "max_rpc_batch": MAX_RPC_BATCH,
                "max_publish_batch": MAX_PUBLISH_BATCH,
                "max_active_subscriptions": MAX_ACTIVE_SUBSCRIPTIONS,
                "max_future_seconds": MAX_FUTURE_SECONDS,
                "max_integer": MAX_INTEGER,
                "scan_budget": SCAN_BUDGET,
                "idempotency_key_max_chars": IDEMPOTENCY_KEY_MAX_CHARS,
                "idempotency_window_seconds": IDEMPOTENCY_WINDOW_SECONDS,
                "mute_clock_lag_seconds": MUTE_FLUSH_SECONDS if self.lazy_life else 0,
            },
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION, "implementation": "python"},
            "ttlMs": 60000,
            "cacheScope": "public",
        }


class LoggedRefusal(Exception):
    """Carries a refusal out of a rule whose staged changes must still commit (its rejected row is
    evidence, P2)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(error.message)
        self.error = error
