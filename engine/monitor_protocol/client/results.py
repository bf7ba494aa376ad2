"""The typed results of the client's routes: small dataclasses with the fields docs/protocol.md names and the whole JSON reply in `.raw` (the admin routes return TypedDicts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, ParamSpec, TypedDict, TypeVar

from monitor_protocol.client.errors import (
    MonitorProtocolError,
    UnexpectedResponse,
    error_from_body,
)

if TYPE_CHECKING:
    pass  # imported where a client uses it: `import monitor_protocol.client` stays light

# In a browser (Pyodide) the browser sends (webhttp); keepalive needs sockets and `ssl`, which it lacks.


T = TypeVar("T")
P = ParamSpec("P")


# ---------------------------------------------------------------------------------------------- results


@dataclass
class Result:
    """Base of every typed result: the whole JSON reply stays in `raw` (and `result["key"]` reads it)."""

    raw: dict[str, Any] = field(repr=False)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


@dataclass
class Discovery(Result):
    supported_versions: list[str]
    protocol: str | None
    capabilities: dict[str, Any]
    limits: dict[str, Any]
    server_info: dict[str, Any]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Discovery:
        return cls(
            raw,
            list(raw.get("supportedVersions") or []),
            raw.get("protocol"),
            dict(raw.get("capabilities") or {}),
            dict(raw.get("limits") or {}),
            dict(raw.get("serverInfo") or {}),
        )


@dataclass
class Monitor(Result):
    id: str
    name: str
    owner: str
    version: int
    active: bool
    head: int
    visibility: str
    capabilities: list[str]
    types: list[str]
    horizon: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Monitor:
        return cls(
            raw,
            raw.get("id", ""),
            raw.get("name", ""),
            raw.get("owner", ""),
            int(raw.get("version") or 0),
            bool(raw.get("active")),
            int(raw.get("head") or 0),
            raw.get("visibility", ""),
            list(raw.get("capabilities") or []),
            list(raw.get("types") or []),
            raw.get("horizon", ""),
        )


@dataclass
class MonitorCreated(Result):
    monitor: Monitor
    owner_token: str
    subscribe_token: str | None
    notice: str | None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> MonitorCreated:
        return cls(
            raw,
            Monitor.of(raw.get("monitor") or {}),
            raw.get("owner_token", ""),
            raw.get("subscribe_token"),
            raw.get("notice"),
        )


@dataclass
class MonitorChanged(Result):
    """Reply of update, pause, resume and retire: the monitor after the change and the configured seq."""

    monitor: Monitor
    seq: int

    @classmethod
    def of(cls, raw: dict[str, Any]) -> MonitorChanged:
        return cls(raw, Monitor.of(raw.get("monitor") or {}), int(raw.get("seq") or 0))


@dataclass
class Published(Result):
    observation: dict[str, Any]
    seq: int
    idempotent: bool = False  # True: a repeated idempotency_key; this is the first reply, nothing appended

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Published:
        return cls(
            raw, dict(raw.get("observation") or {}), int(raw.get("seq") or 0), bool(raw.get("idempotent"))
        )


@dataclass
class BatchItem:
    """One item of a batch publish, in the order sent: its seq and id, or the refusal it got (logged by the
    server as a rejected row, like a refused single publish)."""

    index: int
    seq: int | None = None
    id: str | None = None
    idempotent: bool | None = None  # with an idempotency_key: True when it repeated an earlier publish
    error: MonitorProtocolError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class BatchPublished(Result):
    """`publish_many`: every item's outcome in order. `batched` is True when the server's batch call was
    used (one commit per request of up to `max_items`), False when the client fell back to one publish per
    item because the server does not advertise the extension."""

    monitor: str
    items: list[BatchItem]
    batched: bool

    @property
    def published(self) -> int:
        return sum(1 for item in self.items if item.ok)

    @property
    def refused(self) -> list[BatchItem]:
        return [item for item in self.items if not item.ok]

    @property
    def seqs(self) -> list[int | None]:
        return [item.seq for item in self.items]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> BatchPublished:
        items = []
        for one in raw.get("results") or []:
            err = one.get("error")
            items.append(
                BatchItem(
                    int(one.get("index") or 0),
                    one.get("seq"),
                    one.get("id"),
                    one.get("idempotent"),
                    error_from_body(int(one.get("status") or 400), err, "") if err is not None else None,
                )
            )
        return cls(raw, str(raw.get("monitor") or ""), items, bool(raw.get("batched")))


@dataclass
class State(Result):
    monitor: str
    head: int
    as_of_seq: int | None
    retention_floor: int | None
    live: dict[str, Any]
    counters: dict[str, Any]
    confidence: dict[str, Any]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> State:
        return cls(
            raw,
            raw.get("monitor", ""),
            int(raw.get("head") or 0),
            raw.get("as_of_seq"),
            raw.get("retention_floor"),
            dict(raw.get("live") or {}),
            dict(raw.get("counters") or {}),
            dict(raw.get("confidence") or {}),
        )


@dataclass
class Subscription(Result):
    id: str
    monitor: str
    subscriber: str
    cursor: int
    capabilities: list[str]
    reset_policy: str | None
    protocol: str | None
    sink: str | None
    active: bool
    lag: int | None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Subscription:
        return cls(
            raw,
            raw.get("id", ""),
            raw.get("monitor", ""),
            raw.get("subscriber", ""),
            int(raw.get("cursor") or 0),
            list(raw.get("capabilities") or []),
            raw.get("reset_policy"),
            raw.get("protocol"),
            raw.get("sink"),
            bool(raw.get("active", True)),
            raw.get("lag"),
        )


@dataclass
class Subscribed(Result):
    """Reply of subscribe: the subscription, its reader token (shown once) and, for protocol http, the
    webhook signing secret `sink_secret` (shown once too)."""

    subscription: Subscription
    token: str
    notice: str | None
    sink_secret: str | None = None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Subscribed:
        return cls(
            raw,
            Subscription.of(raw.get("subscription") or {}),
            raw.get("token", ""),
            raw.get("notice"),
            raw.get("sink_secret"),
        )


@dataclass
class PullResult(Result):
    subscription: str
    monitor: str
    cursor: int
    head: int
    lag: int | None
    retention_floor: int | None
    next: int
    redelivered: int
    observations: list[dict[str, Any]]

    @classmethod
    def of(cls, raw: dict[str, Any]) -> PullResult:
        # A 200 that is not a pull's reply (another JSON API at the base URL, a gateway's JSON) is said: read
        # as an empty page it made a follow loop ask again at once, forever (found by a tester of mp watch).
        ints = [raw.get(k) for k in ("cursor", "head", "next")] if isinstance(raw, dict) else []
        if not ints or not isinstance(raw.get("observations"), list) or not all(_is_int(v) for v in ints):
            shown = ", ".join(sorted(map(str, raw))[:6]) if isinstance(raw, dict) else type(raw).__name__
            raise UnexpectedResponse(
                "UNEXPECTED_RESPONSE",
                f"HTTP 200 whose JSON is not a pull's reply (it has {shown or 'nothing'}, not observations, "
                "cursor, head and next): is the base URL this protocol's server?",
                200,
            )
        return cls(
            raw,
            raw.get("subscription", ""),
            raw.get("monitor", ""),
            int(raw.get("cursor") or 0),
            int(raw.get("head") or 0),
            raw.get("lag"),
            raw.get("retention_floor"),
            int(raw.get("next") or 0),
            int(raw.get("redelivered") or 0),
            list(raw.get("observations") or []),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class AckResult(Result):
    subscription: str
    cursor: int
    head: int
    lag: int | None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> AckResult:
        return cls(
            raw,
            raw.get("subscription", ""),
            int(raw.get("cursor") or 0),
            int(raw.get("head") or 0),
            raw.get("lag"),
        )


@dataclass
class SeekResult(Result):
    subscription: str
    cursor: int

    @classmethod
    def of(cls, raw: dict[str, Any]) -> SeekResult:
        return cls(raw, raw.get("subscription", ""), int(raw.get("cursor") or 0))


@dataclass
class Renewed(Result):
    subscription: str
    token: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Renewed:
        sub = raw.get("subscription")
        sub_id = sub.get("id", "") if isinstance(sub, dict) else (sub or "")
        return cls(raw, sub_id, raw.get("token", ""))


@dataclass
class SubscriptionRetired(Result):
    ok: bool
    seq: int
    cursor_kept: int | None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> SubscriptionRetired:
        return cls(raw, bool(raw.get("ok")), int(raw.get("seq") or 0), raw.get("cursor_kept"))


@dataclass
class LeaseGranted(Result):
    """Reply of claim and renew: the lease, when it expires and whether the claim repeated a held one."""

    lease: dict[str, Any]
    expires: str | None
    idempotent: bool

    @classmethod
    def of(cls, raw: dict[str, Any]) -> LeaseGranted:
        return cls(raw, dict(raw.get("lease") or {}), raw.get("expires"), bool(raw.get("idempotent")))


@dataclass
class LeaseDone(Result):
    """Reply of complete, release and reject."""

    ok: bool
    seq: int
    dead_letter: bool

    @classmethod
    def of(cls, raw: dict[str, Any]) -> LeaseDone:
        return cls(raw, bool(raw.get("ok")), int(raw.get("seq") or 0), bool(raw.get("dead_letter")))


class CompactedLog(TypedDict):
    """One monitor's log after /admin/compact."""

    monitor: str
    retention_floor: int
    removed: int


class CompactReply(TypedDict):
    """Reply of POST /admin/compact."""

    ok: bool
    compacted: list[CompactedLog]


class SnapshotReply(TypedDict):
    """Reply of GET /admin/snapshot: every monitor with its log and subscriptions, as JSON objects."""

    taken_at: str
    monitors: list[dict[str, Any]]


class LogReply(TypedDict):
    """Reply of GET /admin/log: a page of a monitor's log, read without a subscription."""

    monitor: str
    head: int
    retention_floor: int
    next: int
    observations: list[dict[str, Any]]


class RpcError(TypedDict):
    """A JSON-RPC error object; `data` is the REST error body."""

    code: int
    message: str
    data: NotRequired[dict[str, Any]]


class RpcReply(TypedDict):
    """One reply of a JSON-RPC batch: `result` or `error`."""

    jsonrpc: str
    id: int | str | None
    result: NotRequired[Any]
    error: NotRequired[RpcError]


def raw_reply(raw: Any) -> Any:
    return raw


def monitor_list(raw: dict[str, Any]) -> list[Monitor]:
    return [Monitor.of(m) for m in raw.get("monitors") or []]


def compact_reply(raw: Any) -> CompactReply:
    return raw  # type: ignore[no-any-return]


def snapshot_reply(raw: Any) -> SnapshotReply:
    return raw  # type: ignore[no-any-return]


def log_reply(raw: Any) -> LogReply:
    return raw  # type: ignore[no-any-return]
