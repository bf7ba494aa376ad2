"""Typed records: what the engine keeps about monitors, observations, subscriptions, leases and publish
keys. Frozen (a rule computes a new record with `evolve`, the transaction stages it), with
slots, each fact stored once (times as float seconds, formatted only at the edge by `to_wire()`).

One other shape lives here, and only here: `to_row()` / `from_row()`, a record as plain JSON values, for
stores that keep JSON (IndexedDB, the JSON columns of SQLite). Private fields are ordinary fields: nothing
is hidden by a naming convention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from monitor_protocol.core import timefmt, wire
from monitor_protocol.core.lifecycles import LeaseState, MonitorStatus, SubscriptionState

Json = Any
R = TypeVar("R")
_EVOLVERS: dict[tuple[type, tuple[str, ...]], Any] = {}


def _evolver(cls: type, changed: tuple[str, ...]) -> Any:
    """A copier written once per record class and set of changed fields: one line per field, no loop, no
    `__init__` (the values come from a record that was already valid, or are the changes)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(changed) - set(names))
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}")
    values = [f"changes[{n!r}]" if n in changed else f"rec.{n}" for n in names]
    return _written(cls, "rec, changes", values)


def builder(cls: type[R]) -> Any:
    """A constructor for values already known valid (a stored row, what a rule just computed): every
    field in declaration order, positionally, no checks and no defaults. The hot paths (an append, a
    stored row read) build a record per observation."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    taken = [n for n in names if n in ("new", "new_", "cls") or re.fullmatch(r"set_\d+", n)]
    if taken:  # the written function's own names: a field called so would be shadowed
        raise TypeError(f"builder cannot write {cls.__name__}: field(s) {taken}")
    return _written(cls, ", ".join(names), names)


def copier(cls: type[R], changed: tuple[str, ...]) -> Any:
    """`make(rec, *values)`: a copy of `rec` with the fields `changed` set, in that order, positionally. The
    evolver's work without its keyword dict, for a rule that makes the same change on every call (a
    publish's new version of its monitor). Fields appear only as `rec.<name>`: no name can shadow."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(changed) - set(names))
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}")
    if len(set(changed)) != len(changed):  # the second value of a name given twice would be dropped
        raise TypeError(f"copier of {cls.__name__}: a field named twice in {changed}")
    params = [f"v_{i}" for i in range(len(changed))]
    values = [params[changed.index(n)] if n in changed else f"rec.{n}" for n in names]
    return _written(cls, ", ".join(["rec", *params]), values)


def _written(cls: type, params: str, values: list[str]) -> Any:
    """`def make(params)`: a new `cls` whose i-th field is the expression values[i], set through its
    slot's own setter. The frozen class refuses `setattr`, its `__init__` and `object.__setattr__` look
    the slot up again for every field (a third slower on a Monitor's 36 fields)."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    body = "\n".join(f"    set_{i}(new, {v})" for i, v in enumerate(values))
    src = f"def make({params}):\n    new = new_(cls)\n{body}\n    return new\n"
    scope: dict[str, Any] = {"new_": object.__new__, "cls": cls}
    for i, n in enumerate(names):
        slot = cls.__dict__.get(n)
        scope[f"set_{i}"] = (
            slot.__set__ if slot is not None and hasattr(slot, "__set__") else _setter(n)  # type: ignore[union-attr]
        )
    exec(src, scope)  # noqa: S102 - generated from the dataclass's own field names
    return scope["make"]


def _setter(name: str) -> Any:
    """A field without a slot of its own (a class without __slots__): set through object.__setattr__."""
    return lambda obj, value: object.__setattr__(obj, name, value)


def evolve(rec: R, **changes: Any) -> R:
    """`dataclasses.replace` for these records, without re-running `__init__`: a copy with `changes` set.
    A rule makes new versions on every call, and replace() costs ~20 us on a Monitor."""
    key = (type(rec), tuple(changes))
    fn = _EVOLVERS.get(key)
    if fn is None:
        fn = _EVOLVERS[key] = _evolver(type(rec), key[1])
    return fn(rec, changes)  # type: ignore[no-any-return]


def _iso(ts: float | None) -> str | None:
    return None if ts is None else timefmt.iso(ts)


# ===================================================================================== monitors
@dataclass(frozen=True, slots=True)
class Counters:
    observations: int = 0
    delivered: int = 0
    acted: int = 0
    rejected: int = 0
    contradictions: int = 0
    contradictions_resolved: int = 0

    def observed(self) -> Counters:
        """One more accepted observation: every publish's bump, without bump's keyword dispatch."""
        return new_counters(
            self.observations + 1, self.delivered, self.acted, self.rejected, self.contradictions,
            self.contradictions_resolved,
        )  # fmt: skip

    def bump(self, **by: int) -> Counters:
        if len(by) == 1:  # the usual call (one publish, one pull's deliveries): no comprehension
            ((name, n),) = by.items()
            return evolve(self, **{name: getattr(self, name) + n})
        return evolve(self, **{name: getattr(self, name) + n for name, n in by.items()})

    def to_row(self) -> dict[str, int]:
        return {
            "observations": self.observations,
            "delivered": self.delivered,
            "acted": self.acted,
            "rejected": self.rejected,
            "contradictions": self.contradictions,
            "contradictions_resolved": self.contradictions_resolved,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Counters:
        return cls(**{k: int(row.get(k, 0)) for k in cls.__dataclass_fields__})


# A new Counters from every field, positionally (a publish run folds its counts into one)
new_counters = builder(Counters)


@dataclass(frozen=True, slots=True)
class LastSeen:
    """The newest accepted observation, by the server's clock (freshness is the server's, never a claim)."""

    seq: int
    ts: float
    type: str


# The definition: what an owner sets (create, update) and what a reader sees of a monitor.
DEFINITION_FIELDS = (
    "name",
    "description",
    "source",
    "filter",
    "horizon",
    "capabilities",
    "cadence",
    "ttl_seconds",
    "retire_after_mute_seconds",
    "budget",
    "visibility",
    "rules",
    "types",
    "default_grant",
    "limits",
)


# The fields of a monitor's stored row that change only with its definition, its owner or its subscribe token
# (Monitor.fixed_row): a store may encode them once per version of these (store/sql.py monitor_row).
MONITOR_FIXED_FIELDS = (
    *DEFINITION_FIELDS,
    "owner",
    "owner_hash",
    "created",
    "version",
    "attested",
    "subscribe_hash",
)


@dataclass(frozen=True, slots=True)
class Monitor:
    id: str
    owner: str
    owner_hash: str
    created: float
    updated: float
    # the definition (DEFINITION_FIELDS)
    name: str
    description: str | None = None
    source: dict[str, Any] = field(default_factory=lambda: {"kind": "log"})
    filter: Json = field(default_factory=dict)
    horizon: str = "event"
    capabilities: list[str] = field(default_factory=lambda: ["observe"])
    cadence: dict[str, Any] = field(default_factory=dict)
    ttl_seconds: int | None = None
    retire_after_mute_seconds: int | None = None
    budget: dict[str, Any] | None = None
    visibility: str = "private"
    rules: list[dict[str, Any]] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    default_grant: list[str] = field(default_factory=lambda: ["observe"])
    limits: dict[str, Any] = field(default_factory=dict)
    # what the server keeps about it
    version: int = 1
    attested: bool = False
    status: MonitorStatus = MonitorStatus.ACTIVE
    subscribe_hash: str | None = None
    head: int = 0
    floor: int = 1
    counters: Counters = field(default_factory=Counters)
    last: LastSeen | None = None
    actors: tuple[str, ...] = ()
    source_contact: float | None = None  # when the source last answered (section 12: never a non-answer)
    quiet_since: float | None = None  # since when its source has not answered (None while it answers)
    # What the server's own run of the source says (sources that watch): {status, reason, action, since}.
    source_status: dict[str, Any] | None = None
    # Where the server's run of the source stands (file offset, feed seq, last result), committed with
    # what it published, so a restart resumes there.
    source_checkpoint: dict[str, Any] | None = None
    last_pull: float | None = None
    budget_day: str | None = None  # the UTC day observations_per_day counts, and how many it has used
    budget_used: int = 0

    @property
    def active(self) -> bool:
        return self.status is MonitorStatus.ACTIVE

    def definition(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in DEFINITION_FIELDS}

    def to_wire(self) -> dict[str, Any]:
        """The monitor as served (section 4)."""
        out: dict[str, Any] = {"id": self.id, **self.definition()}
        out.update(
            {
                "version": self.version,
                "owner": self.owner,
                "attested": self.attested,
                "created": timefmt.iso(self.created),
                "updated": timefmt.iso(self.updated),
                "active": self.active,
                "head": self.head,
            }
        )
        return out

    def to_row(self) -> dict[str, Any]:
        return {"id": self.id, **self.fixed_row(), **self.state_row()}

    def fixed_row(self) -> dict[str, Any]:
        """What of the stored row changes only with the definition, the owner or the subscribe token (not
        with a publish or a pull): every field of MONITOR_FIXED_FIELDS, as it is."""
        return {k: getattr(self, k) for k in MONITOR_FIXED_FIELDS}

    def state_row(self) -> dict[str, Any]:
        """The rest of the stored row but the id: what publishes, pulls and the lifecycle change."""
        return {
            "updated": self.updated,
            "status": self.status.value,
            "head": self.head,
            "floor": self.floor,
            "counters": self.counters.to_row(),
            "last": None
            if self.last is None
            else {"seq": self.last.seq, "ts": self.last.ts, "type": self.last.type},
            "actors": list(self.actors),
            "source_contact": self.source_contact,
            "quiet_since": self.quiet_since,
            "source_status": self.source_status,
            "source_checkpoint": self.source_checkpoint,
            "last_pull": self.last_pull,
            "budget_day": self.budget_day,
            "budget_used": self.budget_used,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Monitor:
        last = row.get("last")
        return cls(
            **{k: row[k] for k in DEFINITION_FIELDS if k in row},
            id=row["id"],
            owner=row["owner"],
            owner_hash=row["owner_hash"],
            created=float(row["created"]),
            updated=float(row["updated"]),
            version=int(row.get("version", 1)),
            attested=bool(row.get("attested", False)),
            status=MonitorStatus(row.get("status", "active")),
            subscribe_hash=row.get("subscribe_hash"),
            head=int(row.get("head", 0)),
            floor=int(row.get("floor", 1)),
            counters=Counters.from_row(row.get("counters") or {}),
            last=None if not last else LastSeen(int(last["seq"]), float(last["ts"]), str(last["type"])),
            actors=tuple(row.get("actors") or ()),
            source_contact=row.get("source_contact"),
            quiet_since=row.get("quiet_since"),
            source_status=row.get("source_status"),
            source_checkpoint=row.get("source_checkpoint"),
            last_pull=row.get("last_pull"),
            budget_day=row.get("budget_day"),
            budget_used=int(row.get("budget_used", 0)),
        )


# ===================================================================================== observations
@dataclass(frozen=True, slots=True)
class Observation:
    """One row of a monitor's log: the CloudEvent as served (built once, at append), and the columns a
    store indexes for filters and lag (copies of the event's own attributes)."""

    monitor: str
    seq: int
    type: str
    subject: str | None
    actor: str
    origin: str
    tier: str
    horizon: str
    event: dict[str, Any]
    # The event's size as stored (its JSON text's length), for the byte budgets of a page; 0 where it is not
    # known without encoding it (an append, an import): not part of what the observation is.
    size: int = field(default=0, compare=False)

    @staticmethod
    def of(monitor: str, seq: int, event: dict[str, Any]) -> Observation:
        get = event.get
        return new_observation(
            monitor, seq, event["type"], get("subject"), get("actor") or "", get("origin") or "",
            get("tier") or "", get("horizon") or "", event, 0,
        )  # fmt: skip

    def to_wire(self, *, redelivered: bool = False, raw: bool = False) -> Any:
        """The observation as served. `raw` (a reply only encoded, never read: MonitorService.pull's) lets
        a stored row give its JSON text as the codec's raw value instead (StoredObservation)."""
        if redelivered:
            return {**self.event, "redelivered": True}
        return dict(self.event)


# The stores build one per row they read, the ledger one per append: positional, every field, no checks.
new_observation = builder(Observation)
_EVENT = Observation.__dict__["event"]  # the event's slot: StoredObservation keeps it empty until asked


class StoredObservation(Observation):
    """A row read from a store that keeps each event as its JSON text (SQLite, PostgreSQL): the event is
    decoded on first use, and a pull reply that is only encoded (to_wire's `raw`) carries the text as the
    codec's raw value, never decoded at all: a drain's rows cost their bytes, not a parse and an encode.
    Equal to an Observation with the same fields; pickles, repr and `evolve` see the decoded event."""

    __slots__ = ("text",)

    @property  # type: ignore[override]
    def event(self) -> dict[str, Any]:
        event = _EVENT.__get__(self)
        if event is None:
            event = wire.decode_trusted(self.text)
            _EVENT.__set__(self, event)
        return event  # type: ignore[no-any-return]

    @event.setter
    def event(self, value: dict[str, Any]) -> None:  # the dataclass's own __init__ and unpickling
        _EVENT.__set__(self, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Observation):
            return NotImplemented
        return _compared(self) == _compared(other)

    __hash__ = None  # type: ignore[assignment]  # (an event is a dict: no observation hashes)

    def to_wire(self, *, redelivered: bool = False, raw: bool = False) -> Any:
        if raw and _EVENT.__get__(self) is None:
            text = wire.raw_json(self.text, redelivered)
            if text is not None:
                return text
        return Observation.to_wire(self, redelivered=redelivered)


class ServedRow:
    """A log row read only to be served as it is stored (a pull whose reply a door only encodes: pull's
    `raw`, Store.read_range's `served`): its seq, its event's stored JSON text and that text's size, and
    nothing else read or built. What `to_wire` gives is what the row's StoredObservation gives."""

    __slots__ = ("seq", "text", "size")

    def __init__(self, seq: int, text: str, size: int | None = None) -> None:
        self.seq = seq
        self.text = text
        # as the store's StoredObservation measures it: SQLite the text's length, PostgreSQL its bytes'
        self.size = len(text) if size is None else size

    def to_wire(self, *, redelivered: bool = False, raw: bool = False) -> Any:
        if raw:
            served = wire.raw_json(self.text, redelivered)
            if served is not None:
                return served
        event: dict[str, Any] = wire.decode_trusted(self.text)
        if redelivered:
            event["redelivered"] = True  # ({**event, "redelivered": True}, as Observation.to_wire: same keys)
        return event

    def __repr__(self) -> str:
        return f"ServedRow(seq={self.seq!r}, size={self.size!r})"


def _compared(obs: Observation) -> tuple[Any, ...]:
    """The fields an Observation's equality compares (size is not part of what it is)."""
    return (
        obs.monitor,
        obs.seq,
        obs.type,
        obs.subject,
        obs.actor,
        obs.origin,
        obs.tier,
        obs.horizon,
        obs.event,
    )


def _stored_maker() -> Any:
    """`stored_observation(monitor, seq, type, subject, actor, origin, tier, horizon, text, size=None)`: a
    row as a store read it (its size: the text's length unless given, as the store measures it), each field
    set through its slot's own setter (written once, like `builder`'s)."""
    names = [f.name for f in fields(Observation)]
    if names[-2:] != ["event", "size"]:
        raise TypeError("stored_observation expects Observation's last fields to be event and size")
    columns = names[:-2]
    scope: dict[str, Any] = {"new_": object.__new__, "cls": StoredObservation}
    scope.update({f"set_{n}": Observation.__dict__[n].__set__ for n in names})
    scope["set_text"] = StoredObservation.__dict__["text"].__set__
    body = "".join(f"    set_{n}(obs, v_{i})\n" for i, n in enumerate(columns))
    params = ", ".join(f"v_{i}" for i in range(len(columns)))
    src = (
        f"def stored_observation({params}, text, size=None):\n    obs = new_(cls)\n{body}"
        "    set_event(obs, None)\n    set_size(obs, len(text) if size is None else size)\n"
        "    set_text(obs, text)\n    return obs\n"
    )
    exec(src, scope)  # noqa: S102 - generated from the dataclass's own field names
    return scope["stored_observation"]


stored_observation = _stored_maker()


# ===================================================================================== subscriptions
@dataclass(frozen=True, slots=True)
class AckMemo:
    """The reply to the last ack, returned again for an identical ack (C20)."""

    cursor: int
    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Subscription:
    id: str
    monitor: str
    subscriber: str
    token_hash: str
    created: float
    mute_since: float  # the mute clock (P6): the last sign of life, as stored (see ServiceCore's lazy flush)
    filter: Json = field(default_factory=dict)
    capabilities: list[str] = field(default_factory=lambda: ["observe"])
    cursor: int = 0
    reset_policy: str = "none"
    protocol: str = "pull"
    sink: str | None = None
    retire_after_mute_seconds: int | None = None
    last_pull: float | None = None
    state: SubscriptionState = SubscriptionState.ACTIVE
    hwm: int = 0  # the delivered high-water mark: rows at or below it come back marked redelivered
    last_ack: AckMemo | None = None
    relist: bool = False
    sink_secret: str | None = None
    grant: str = "default"  # what the grant rests on: "owner", "subscribe" or "default" (section 8)
    revoked: bool = False
    scan_mark: tuple[int, int] | None = None  # [from, to]: rows a bounded pull examined in vain

    @property
    def active(self) -> bool:
        return self.state is SubscriptionState.ACTIVE

    def to_wire(self, lag: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "monitor": self.monitor,
            "subscriber": self.subscriber,
            "filter": self.filter,
            "capabilities": list(self.capabilities),
            "cursor": self.cursor,
            "reset_policy": self.reset_policy,
            "protocol": self.protocol,
            "sink": self.sink,
            "retire_after_mute_seconds": self.retire_after_mute_seconds,
            "created": timefmt.iso(self.created),
            "last_pull": _iso(self.last_pull),
            "active": self.active,
        }
        if lag is not None:
            out["lag"] = lag
        return out

    def to_row(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "monitor": self.monitor,
            "subscriber": self.subscriber,
            "token_hash": self.token_hash,
            "created": self.created,
            "mute_since": self.mute_since,
            "filter": self.filter,
            "capabilities": list(self.capabilities),
            "cursor": self.cursor,
            "reset_policy": self.reset_policy,
            "protocol": self.protocol,
            "sink": self.sink,
            "retire_after_mute_seconds": self.retire_after_mute_seconds,
            "last_pull": self.last_pull,
            "state": self.state.value,
            "hwm": self.hwm,
            "last_ack": None
            if self.last_ack is None
            else {"cursor": self.last_ack.cursor, "reply": self.last_ack.reply},
            "relist": self.relist,
            "sink_secret": self.sink_secret,
            "grant": self.grant,
            "revoked": self.revoked,
            "scan_mark": None if self.scan_mark is None else list(self.scan_mark),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Subscription:
        ack = row.get("last_ack")
        mark = row.get("scan_mark")
        return cls(
            id=row["id"],
            monitor=row["monitor"],
            subscriber=row["subscriber"],
            token_hash=row["token_hash"],
            created=float(row["created"]),
            mute_since=float(row["mute_since"]),
            filter=row.get("filter", {}),
            capabilities=list(row.get("capabilities") or []),
            cursor=int(row.get("cursor", 0)),
            reset_policy=row.get("reset_policy", "none"),
            protocol=row.get("protocol", "pull"),
            sink=row.get("sink"),
            retire_after_mute_seconds=row.get("retire_after_mute_seconds"),
            last_pull=row.get("last_pull"),
            state=SubscriptionState(row.get("state", "active")),
            hwm=int(row.get("hwm", 0)),
            last_ack=None if not ack else AckMemo(int(ack["cursor"]), dict(ack["reply"])),
            relist=bool(row.get("relist", False)),
            sink_secret=row.get("sink_secret"),
            grant=row.get("grant", "default"),
            revoked=bool(row.get("revoked", False)),
            scan_mark=None if not mark else (int(mark[0]), int(mark[1])),
        )


# ===================================================================================== leases
@dataclass(frozen=True, slots=True)
class Completion:
    """Who completed the lease last and with which row, so a repeated complete is idempotent."""

    by: str
    seq: int
    outcome: str


@dataclass(frozen=True, slots=True)
class Lease:
    monitor: str
    subject: str
    duration: int
    acquired: float
    renewed: float
    state: LeaseState = LeaseState.FREE
    holder: str | None = None
    transitions: int = 0
    attempts: int = 0
    delivery_count_limit: int = 5
    last_holder: str | None = None
    completed: Completion | None = None

    @property
    def dead_letter(self) -> bool:
        return self.state is LeaseState.DEAD_LETTERED

    @property
    def expires(self) -> float:
        return self.renewed + self.duration

    def to_wire(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "holder": self.holder,
            "lease_duration_seconds": self.duration,
            "acquire_time": timefmt.iso(self.acquired),
            "renew_time": timefmt.iso(self.renewed),
            "lease_transitions": self.transitions,
            "attempts": self.attempts,
            "delivery_count_limit": self.delivery_count_limit,
            "dead_letter": self.dead_letter,
        }

    def to_row(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "subject": self.subject,
            "duration": self.duration,
            "acquired": self.acquired,
            "renewed": self.renewed,
            "state": self.state.value,
            "holder": self.holder,
            "transitions": self.transitions,
            "attempts": self.attempts,
            "delivery_count_limit": self.delivery_count_limit,
            "last_holder": self.last_holder,
            "completed": None
            if self.completed is None
            else {"by": self.completed.by, "seq": self.completed.seq, "outcome": self.completed.outcome},
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Lease:
        done = row.get("completed")
        return cls(
            monitor=row["monitor"],
            subject=row["subject"],
            duration=int(row["duration"]),
            acquired=float(row["acquired"]),
            renewed=float(row["renewed"]),
            state=LeaseState(row.get("state", "free")),
            holder=row.get("holder"),
            transitions=int(row.get("transitions", 0)),
            attempts=int(row.get("attempts", 0)),
            delivery_count_limit=int(row.get("delivery_count_limit", 5)),
            last_holder=row.get("last_holder"),
            completed=None if not done else Completion(done["by"], int(done["seq"]), done["outcome"]),
        )


# ===================================================================================== publish keys
@dataclass(frozen=True, slots=True)
class PublishKey:
    """An idempotency key (section 8): the seq its first publish got, at server time `at`."""

    monitor: str
    key: str
    seq: int
    at: float

    def to_row(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "key": self.key, "seq": self.seq, "at": self.at}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PublishKey:
        return cls(row["monitor"], row["key"], int(row["seq"]), float(row["at"]))
