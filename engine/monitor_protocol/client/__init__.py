"""Python client for the Monitor Protocol REST binding (docs/protocol.md section 5), sync and async.

`Client` sends over keep-alive connections of the standard library's http.client (keepalive.py: chosen by
measurement), or httpx where a proxy applies or a transport is given; `AsyncClient` under asyncio on
keep-alive asyncio streams with h11 (keepalive.AsyncPool), else on httpx. httpx is imported only where it is
used. On Pyodide (sys.platform "emscripten") the browser sends instead (webhttp.py): `Client` with a
synchronous XMLHttpRequest (in a Web Worker), `AsyncClient` with fetch.

    from monitor_protocol.client import Client

    with Client("http://127.0.0.1:8130") as mp:
        created = mp.create_monitor("ci", types=["com.example.ci.run"])
        mp.publish("ci", "com.example.ci.run", subject="build-1", token=created.owner_token)

Every route returns a small typed dataclass with the fields docs/protocol.md names and the whole JSON reply in
`.raw` (the admin routes return TypedDicts); the package ships a `py.typed` marker, so mypy and pyright check
calls and results.

A refusal the protocol defines raises a subclass of `MonitorProtocolError` named after its code
(`CursorBackwards` for CURSOR_BACKWARDS, `LeaseHeld`, `Unauthorized`, `NotFound`, ... see `ERROR_CLASSES`),
each with `.code`, `.message`, `.status`, `.extras` and `.retry_after`; `except MonitorProtocolError` catches
them all. A network failure raises `ConnectionFailed`, whose `sent` says whether the request may have reached
the server (`False`: it was certainly never sent, e.g. connection refused; `True`: the outcome is unknown,
e.g. a timeout or a reset after sending). Every request has a timeout; a long poll gets its `wait` plus a
margin on top.

`publish(..., retries=N)` retries safely: it sends an `idempotency_key` (a random one unless given) and
retries only on `ConnectionFailed` or a 503 `Unavailable` (storage trouble, with `Retry-After`), with
exponential backoff; a retry that finds the first attempt applied returns the first reply with
`idempotent=True`.

`Client` and `AsyncClient` share one description of the routes (`_Routes`): each route builds a typed
`_Call[T]`; `_sync` turns it into a `Client` method returning `T`, `_async` into an `AsyncClient` coroutine
method returning `T`, with the same parameters and docstring. Every route here is an operation of the
operations table (`monitor_protocol.api.operations`, each operation naming its client methods) and every
operation has its method here: tests/test_operations.py checks both ways, method and route.
"""

from __future__ import annotations

import functools
import inspect
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Generator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Concatenate, Generic, NotRequired, ParamSpec, TypedDict, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from monitor_protocol.client import httpreply, webhttp
from monitor_protocol.core.vocab import ERROR_STATUS, EXT_ACK_PULL, EXT_PUBLISH_BATCH

if TYPE_CHECKING:
    import httpx  # imported where a client uses it: `import monitor_protocol.client` stays light

# In a browser (Pyodide) the browser sends (webhttp); keepalive needs sockets and `ssl`, which it lacks.
IN_BROWSER = sys.platform == "emscripten"
if sys.platform != "emscripten":
    from monitor_protocol.client import keepalive

# Replies decode faster with orjson when it is installed (the `server` extra): the same values.
_loads: Callable[[bytes], Any] = json.loads
try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - the standard library's decoder
    pass

DEFAULT_BASE = "http://127.0.0.1:8130"
API_PREFIX = "/mp/v0"
DEFAULT_TIMEOUT = 10.0
LONG_POLL_MARGIN = 10.0
DEFAULT_RETRY_BACKOFF = 0.5  # seconds before the first retry; doubles per attempt
MAX_RETRY_DELAY = 30.0  # no single wait between retries is longer (Retry-After included)

__all__ = [
    "DEFAULT_BASE",
    "ERROR_CLASSES",
    "AckResult",
    "BatchItem",
    "BatchPublished",
    "AsyncClient",
    "CapabilityMissing",
    "Client",
    "CompactReply",
    "CompactedLog",
    "ConnectionFailed",
    "CursorBackwards",
    "CursorExpired",
    "DeadLettered",
    "Discovery",
    "Duplicate",
    "EvidenceRequired",
    "Invalid",
    "InvalidFilter",
    "LeaseDone",
    "LeaseGranted",
    "LeaseHeld",
    "LeaseLost",
    "LogReply",
    "Monitor",
    "MonitorChanged",
    "MonitorCreated",
    "MonitorProtocolError",
    "NotFound",
    "OriginRefused",
    "OverBudget",
    "ProvenanceCeiling",
    "Published",
    "PullResult",
    "Renewed",
    "Result",
    "RpcError",
    "RpcReply",
    "SeekResult",
    "SnapshotReply",
    "State",
    "Subscribed",
    "Subscription",
    "SubscriptionRetired",
    "TierNotAssertable",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
    "UnknownVocabulary",
    "error_for",
]

T = TypeVar("T")
P = ParamSpec("P")


# ---------------------------------------------------------------------------------------------- errors


class MonitorProtocolError(Exception):
    """A refusal the server reported: `code` from the closed list (section 3), the server's sentence,
    the HTTP status and the rest of the error body (`extras`, e.g. `retention_floor`, `rejected_seq`).

    The client raises the subclass named after the code (`CursorBackwards`, `LeaseHeld`, ...; see
    `ERROR_CLASSES`), or this class itself for a code it does not know. `retry_after` is the reply's
    `Retry-After` in seconds, when it had one (a 503 UNAVAILABLE does)."""

    code: str
    message: str
    status: int
    extras: dict[str, Any]
    retry_after: float | None

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        extras: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.extras = dict(extras or {})
        self.retry_after = retry_after

    @property
    def body(self) -> dict[str, Any]:
        """The error body as served: `{code, error, done, ...extras}`."""
        out: dict[str, Any] = {"code": self.code, "error": self.message}
        out.update(self.extras)
        out.setdefault("done", [])
        return out

    @property
    def retired(self) -> bool:
        """True when a pull found its subscription retired (404 `{retired: true, cursor}`)."""
        return bool(self.extras.get("retired"))

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_error,
            (type(self), self.code, self.message, self.status, self.extras, self.retry_after),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, {self.status}, {self.extras!r})"


def _rebuild_error(
    cls: type[MonitorProtocolError],
    code: str,
    message: str,
    status: int,
    extras: dict[str, Any],
    retry_after: float | None,
) -> MonitorProtocolError:
    return cls(code, message, status, extras, retry_after=retry_after)


class InvalidFilter(MonitorProtocolError):
    """INVALID_FILTER (400): the filter is malformed."""


class UnknownVocabulary(MonitorProtocolError):
    """UNKNOWN_VOCABULARY (400): a value outside a closed vocabulary (tier, origin, type pattern, ...)."""


class TierNotAssertable(MonitorProtocolError):
    """TIER_NOT_ASSERTABLE (400): the publisher may not assert that tier."""


class Invalid(MonitorProtocolError):
    """INVALID (400): a malformed request; the sentence says what to send instead."""


class Unauthorized(MonitorProtocolError):
    """UNAUTHORIZED (401): a wrong or missing token."""


class CapabilityMissing(MonitorProtocolError):
    """CAPABILITY_MISSING (403): the token's grant lacks the capability (extras: `granted`, ...)."""


class ProvenanceCeiling(MonitorProtocolError):
    """PROVENANCE_CEILING (403): the provenance claimed is above what this publisher may claim."""


class OriginRefused(MonitorProtocolError):
    """ORIGIN_REFUSED (403): a browser Origin (or Host) the operator did not allow."""


class NotFound(MonitorProtocolError):
    """NOT_FOUND (404): missing or invisible; a retired subscription's pull has `retired` set."""


class Duplicate(MonitorProtocolError):
    """DUPLICATE (409): the id exists already."""


class CursorBackwards(MonitorProtocolError):
    """CURSOR_BACKWARDS (409): an ack below the committed cursor (only seek goes backwards)."""


class LeaseHeld(MonitorProtocolError):
    """LEASE_HELD (409): another holder has the subject's lease."""


class LeaseLost(MonitorProtocolError):
    """LEASE_LOST (409): the lease expired or passed to another holder."""


class EvidenceRequired(MonitorProtocolError):
    """EVIDENCE_REQUIRED (409): a rule requires evidence to complete."""


class Unavailable(MonitorProtocolError):
    """UNAVAILABLE: 409 when the monitor is paused or retired (`rejected_seq`, `live`; retrying does not
    help), 503 with `retry_after` when the server's storage failed (retrying does)."""


class DeadLettered(MonitorProtocolError):
    """DEAD_LETTERED (409): the subject reached the delivery count limit."""


class CursorExpired(MonitorProtocolError):
    """CURSOR_EXPIRED (410): the cursor fell below the retention floor (extras: `retention_floor`, ...)."""


class TooLarge(MonitorProtocolError):
    """TOO_LARGE (413): the body or a value exceeds a limit."""


class OverBudget(MonitorProtocolError):
    """OVER_BUDGET (429): a budget or a count limit is exhausted."""


class UnexpectedResponse(MonitorProtocolError):
    """Not a protocol reply (client-side code UNEXPECTED_RESPONSE): e.g. a proxy's HTML 502, or no JSON."""


# Every error code of docs/protocol.md section 3 -> the exception the client raises for it.
ERROR_CLASSES: dict[str, type[MonitorProtocolError]] = {
    "INVALID_FILTER": InvalidFilter,
    "UNKNOWN_VOCABULARY": UnknownVocabulary,
    "TIER_NOT_ASSERTABLE": TierNotAssertable,
    "INVALID": Invalid,
    "UNAUTHORIZED": Unauthorized,
    "CAPABILITY_MISSING": CapabilityMissing,
    "PROVENANCE_CEILING": ProvenanceCeiling,
    "ORIGIN_REFUSED": OriginRefused,
    "NOT_FOUND": NotFound,
    "DUPLICATE": Duplicate,
    "CURSOR_BACKWARDS": CursorBackwards,
    "LEASE_HELD": LeaseHeld,
    "LEASE_LOST": LeaseLost,
    "EVIDENCE_REQUIRED": EvidenceRequired,
    "UNAVAILABLE": Unavailable,
    "DEAD_LETTERED": DeadLettered,
    "CURSOR_EXPIRED": CursorExpired,
    "TOO_LARGE": TooLarge,
    "OVER_BUDGET": OverBudget,
    "UNEXPECTED_RESPONSE": UnexpectedResponse,
}


def error_for(
    code: str,
    message: str,
    status: int,
    extras: Mapping[str, Any] | None = None,
    *,
    retry_after: float | None = None,
) -> MonitorProtocolError:
    """The exception for `code`: its class from `ERROR_CLASSES`, else `MonitorProtocolError` itself."""
    cls = ERROR_CLASSES.get(code, MonitorProtocolError)
    return cls(code, message, status, extras, retry_after=retry_after)


class ConnectionFailed(Exception):
    """The server could not be reached or did not answer in time.

    `sent` is False when the request certainly never left (connection refused, DNS failure, connect
    timeout): nothing happened on the server. It is True when the request may have been sent (a timeout
    while waiting for the reply, a reset or a disconnect after sending): the outcome is unknown, so retry
    only what is safe to repeat (`publish` with an `idempotency_key`, ack, pull)."""

    def __init__(self, reason: str, url: str = "", *, sent: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.url = url
        self.sent = sent

    @property
    def outcome_unknown(self) -> bool:
        """The same as `sent`: the request may have been applied."""
        return self.sent

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_connection_failed, (self.reason, self.url, self.sent))

    def __repr__(self) -> str:
        return f"ConnectionFailed({self.reason!r}, {self.url!r}, sent={self.sent})"


def _rebuild_connection_failed(reason: str, url: str, sent: bool) -> ConnectionFailed:
    return ConnectionFailed(reason, url, sent=sent)


def _not_sent() -> tuple[type[Exception], ...]:
    """httpx errors raised before any byte of the request could have reached the server."""
    import httpx

    return (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        httpx.UnsupportedProtocol,
        httpx.LocalProtocolError,
        httpx.ProxyError,
    )


def _pooled_request(prefix: str, call: _Call[Any]) -> tuple[str, bytes | None, dict[str, str]]:
    """The request target, body and headers the client's own layers send for `call` (both clients): a
    keep-alive pool takes the base's path as `prefix`, the browser (webhttp) the whole base URL."""
    target = prefix + call.path
    if call.params:
        target += "?" + urlencode(call.params, quote_via=quote)
    headers = _headers(call.token)
    body = None
    if call.body is not None:
        body = _json_body(call.body)
        headers["content-type"] = "application/json"
    return target, body, headers


def _json_body(body: Any) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: sent escaped, so the server refuses it in its own words
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def _retry_after(response: httpx.Response | httpreply.Reply) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing for a retry hint
    return seconds if seconds >= 0 else None


def _error_from_body(
    status: int, body: Any, text: str, retry_after: float | None = None
) -> MonitorProtocolError:
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        extras = {k: v for k, v in body.items() if k not in ("code", "error")}
        return error_for(body["code"], str(body.get("error", "")), status, extras, retry_after=retry_after)
    sentence = text.strip()[:200] or "no body"
    return UnexpectedResponse(
        "UNEXPECTED_RESPONSE",
        f"HTTP {status} without a protocol error: {sentence}",
        status,
        retry_after=retry_after,
    )


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
                    _error_from_body(int(one.get("status") or 400), err, "") if err is not None else None,
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


def _raw(raw: Any) -> Any:
    return raw


def _monitor_list(raw: dict[str, Any]) -> list[Monitor]:
    return [Monitor.of(m) for m in raw.get("monitors") or []]


def _compact_reply(raw: Any) -> CompactReply:
    return raw  # type: ignore[no-any-return]


def _snapshot_reply(raw: Any) -> SnapshotReply:
    return raw  # type: ignore[no-any-return]


def _log_reply(raw: Any) -> LogReply:
    return raw  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------- routes


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    token: str | None
    parse: Callable[[Any], T]
    body: Any = None
    params: list[tuple[str, str]] = field(default_factory=list)
    timeout: float | None = None
    retries: int = 0  # further attempts on ConnectionFailed or 503 UNAVAILABLE (only for safe calls)
    backoff: float = DEFAULT_RETRY_BACKOFF
    # Set for a call that depends on a server extension: the client runs this plan instead of the request
    # above (which is what the call sends where the extension is advertised). See `_Plan`.
    plan: Callable[[], _Plan[T]] | None = None


@dataclass(frozen=True)
class _Ask:
    """A plan's question to its client: this server extension's entry in discover, or None."""

    extension: str


# A plan yields the `_Call`s to perform (and `_Ask`s) and receives each reply, or has the refusal thrown
# in; what it returns is the result. The sync and the async client drive the same plan.
_Plan = Generator["_Call[Any] | _Ask", Any, T]


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def filter_params(flt: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """An inline pull filter as query pairs: a list value repeats its key, a scalar is sent as is."""
    pairs: list[tuple[str, str]] = []
    for key, value in (flt or {}).items():
        if value is None:
            continue
        values: Iterable[Any] = value if isinstance(value, list | tuple) else [value]
        for v in values:
            pairs.append((key, v if isinstance(v, str) else json.dumps(v)))
    return pairs


def _ack_pull(
    c: _Base,
    subscription: str,
    ack: int,
    limit: int | None,
    wait: int | None,
    flt: Mapping[str, Any] | None,
    token: str | None,
) -> _Call[PullResult]:
    path = f"/subscriptions/{_seg(subscription)}/pull"
    body = _drop_none(
        {
            "ack": ack,
            "limit": limit,
            "wait": _whole_seconds(wait) if wait is not None else None,
            "filter": dict(flt) if flt else None,
        }
    )
    timeout = c.timeout + (wait + LONG_POLL_MARGIN if wait else 0.0)
    tok = c._tok(token)
    call: _Call[PullResult] = _Call("POST", path, tok, PullResult.of, body, timeout=timeout)

    def plan() -> _Plan[PullResult]:
        if (yield _Ask(EXT_ACK_PULL)) is not None:
            both: PullResult = yield replace(call, plan=None)
            return both
        # Elsewhere: the protocol's two calls, the ack first (its refusal raises before anything is read).
        yield _Call("POST", f"/subscriptions/{_seg(subscription)}/ack", tok, AckResult.of, {"cursor": ack})
        params = [(k, str(v)) for k, v in (("limit", limit), ("wait", body.get("wait"))) if v is not None]
        pulled: PullResult = yield _Call(
            "GET", path, tok, PullResult.of, None, params + filter_params(flt), timeout
        )
        return pulled

    call.plan = plan
    return call


# A refusal of the whole call, not of one item: the batch request raises it too.
_WHOLE_CALL_REFUSALS = ("UNAUTHORIZED", "NOT_FOUND")


def _publish_many_plan(
    monitor_id: str, path: str, token: str | None, items: list[dict[str, Any]]
) -> _Plan[BatchPublished]:
    info = yield _Ask(EXT_PUBLISH_BATCH)
    results: list[dict[str, Any]] = []
    if info is not None:
        size = info.get("max_items") if isinstance(info, dict) else None
        size = size if isinstance(size, int) and size > 0 else 1
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            try:
                reply = yield _Call("POST", path, token, _raw, chunk)
            except MonitorProtocolError as err:
                if err.code in _WHOLE_CALL_REFUSALS and not results:
                    raise
                # The whole chunk was refused (a value JSON cannot carry, over the body limit, a 503):
                # each of its items carries that refusal; the chunks before it stay reported as published.
                results.extend(
                    {"index": start + i, "status": err.status, "error": err.body} for i in range(len(chunk))
                )
                continue
            for one in reply.get("results") or []:
                results.append({**one, "index": start + int(one.get("index") or 0)})
    else:
        for index, item in enumerate(items):
            try:
                reply = yield _Call("POST", path, token, _raw, item)
            except MonitorProtocolError as err:
                if err.code in _WHOLE_CALL_REFUSALS:
                    raise
                results.append({"index": index, "status": err.status, "error": err.body})
                continue
            one = {"index": index, "seq": reply.get("seq"), "id": (reply.get("observation") or {}).get("id")}
            if "idempotent" in reply:
                one["idempotent"] = reply["idempotent"]
            results.append(one)
    return BatchPublished.of({"monitor": monitor_id, "results": results, "batched": info is not None})


def _whole_seconds(wait: int) -> int:
    """`wait` is whole seconds on the wire; anything but an int is refused before a request is made."""
    if isinstance(wait, bool) or not isinstance(wait, int):
        raise TypeError(
            f"wait is whole seconds, an int (0..50), not {wait!r}: the protocol refuses fractions; "
            "round it yourself, e.g. wait=math.ceil(seconds)"
        )
    return wait


def _check_retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries is a count of further attempts (an int >= 0), not {retries!r}")
    return retries


class _Base:
    """What the route builders read from a client: its token and timeout."""

    base: str
    token: str | None
    timeout: float
    _extensions: dict[str, Any] | None = None  # discover's capabilities.extensions, read once when needed

    def _tok(self, token: str | None) -> str | None:
        return token if token is not None else self.token

    def _learn_extensions(self, discovered: Discovery | None) -> dict[str, Any]:
        caps = discovered.raw.get("capabilities") if discovered is not None else None
        found = caps.get("extensions") if isinstance(caps, dict) else None
        self._extensions = dict(found) if isinstance(found, dict) else {}
        return self._extensions


class _Routes:
    """Every route of docs/protocol.md section 5, once. Each builds a `_Call[T]` from a client `c` (for its token
    and timeout); `token=` on a call overrides the client's token. `Client` and `AsyncClient` expose each
    under the same name (see `_sync` / `_async`)."""

    @staticmethod
    def request(
        c: _Base,
        /,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> _Call[Any]:
        """Any route under /mp/v0, returning the JSON reply as is (errors raise as for every route).
        `path` is relative to the prefix, e.g. "/monitors/ci/state"."""
        return _Call(method.upper(), path, c._tok(token), _raw, body, list(params or []), timeout)

    # -- discovery and monitors ------------------------------------------------------------------

    @staticmethod
    def discover(c: _Base, /) -> _Call[Discovery]:
        """GET /discover -> Discovery."""
        return _Call("GET", "/discover", None, Discovery.of)

    @staticmethod
    def list_monitors(c: _Base, /, *, token: str | None = None) -> _Call[list[Monitor]]:
        """GET /monitors -> list[Monitor] (what this token may see)."""
        return _Call("GET", "/monitors", c._tok(token), _monitor_list)

    @staticmethod
    def get_monitor(c: _Base, /, monitor_id: str, *, token: str | None = None) -> _Call[Monitor]:
        """GET /monitors/{id} -> Monitor."""
        return _Call("GET", f"/monitors/{_seg(monitor_id)}", c._tok(token), Monitor.of)

    @staticmethod
    def create_monitor(
        c: _Base, /, monitor_id: str, *, token: str | None = None, **fields: Any
    ) -> _Call[MonitorCreated]:
        """POST /monitors -> MonitorCreated (the owner token is shown once). `token` is the server's
        registration token, needed only when the server requires one. `fields` are the Monitor's fields
        (name, types, capabilities, visibility, horizon, default_grant, ...)."""
        body = {"id": monitor_id, **_drop_none(fields)}
        return _Call("POST", "/monitors", c._tok(token), MonitorCreated.of, body)

    @staticmethod
    def update_monitor(
        c: _Base,
        /,
        monitor_id: str,
        patch: Mapping[str, Any],
        *,
        reason: str | None = None,
        rule: str | None = None,
        token: str | None = None,
    ) -> _Call[MonitorChanged]:
        """POST /monitors/{id}/update (owner) -> MonitorChanged."""
        body = _drop_none({"patch": dict(patch), "reason": reason, "rule": rule})
        return _Call("POST", f"/monitors/{_seg(monitor_id)}/update", c._tok(token), MonitorChanged.of, body)

    @staticmethod
    def pause_monitor(
        c: _Base, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[MonitorChanged]:
        """POST /monitors/{id}/pause (owner) -> MonitorChanged."""
        return _lifecycle(c, "pause", monitor_id, reason, token)

    @staticmethod
    def resume_monitor(
        c: _Base, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[MonitorChanged]:
        """POST /monitors/{id}/resume (owner) -> MonitorChanged."""
        return _lifecycle(c, "resume", monitor_id, reason, token)

    @staticmethod
    def retire_monitor(
        c: _Base, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[MonitorChanged]:
        """POST /monitors/{id}/retire (owner) -> MonitorChanged; its leases are released."""
        return _lifecycle(c, "retire", monitor_id, reason, token)

    @staticmethod
    def state(c: _Base, /, monitor_id: str, *, token: str | None = None) -> _Call[State]:
        """GET /monitors/{id}/state -> State."""
        return _Call("GET", f"/monitors/{_seg(monitor_id)}/state", c._tok(token), State.of)

    @staticmethod
    def publish(
        c: _Base,
        /,
        monitor_id: str,
        type: str,
        *,
        subject: str | None = None,
        data: Mapping[str, Any] | None = None,
        token: str | None = None,
        retries: int = 0,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF,
        **fields: Any,
    ) -> _Call[Published]:
        """POST /monitors/{id}/observations (owner) -> Published. `fields`: tags, actor, origin, tier,
        verification, on_behalf_of, time, source_ref, rule, wasDerivedFrom, supersedes, idempotency_key
        (retrying with the same key after a lost reply appends nothing and returns the first reply).

        `retries=N` (default 0) makes up to N further attempts, safely: an `idempotency_key` is sent (a
        random UUID unless you pass one), and only `ConnectionFailed` or a 503 `Unavailable` is retried,
        after `retry_backoff` seconds doubling per attempt (with jitter; at least the server's Retry-After;
        each wait at most 30 s). Any other refusal raises at once; after the last attempt its error
        raises. A retry that finds the observation already appended returns the first reply, with
        `idempotent=True`."""
        retries = _check_retries(retries)
        if retries and fields.get("idempotency_key") is None:
            fields["idempotency_key"] = str(uuid.uuid4())
        body = _drop_none(
            {"type": type, "subject": subject, "data": dict(data) if data is not None else None, **fields}
        )
        return _Call(
            "POST",
            f"/monitors/{_seg(monitor_id)}/observations",
            c._tok(token),
            Published.of,
            body,
            retries=retries,
            backoff=retry_backoff,
        )

    # -- subscriptions ---------------------------------------------------------------------------

    @staticmethod
    def subscribe(
        c: _Base,
        /,
        monitor: str,
        subscriber: str,
        *,
        capabilities: list[str] | None = None,
        filter: Mapping[str, Any] | None = None,
        from_: str | int | None = None,
        protocol: str | None = None,
        reset_policy: str | None = None,
        sink: str | None = None,
        retire_after_mute_seconds: int | None = None,
        token: str | None = None,
        **fields: Any,
    ) -> _Call[Subscribed]:
        """POST /subscriptions -> Subscribed (the reader token is shown once). `token` is the owner's or the
        monitor's subscribe token, or the subscription's own token when re-subscribing. `fields`: e.g.
        sink_secret for protocol http."""
        body = _drop_none(
            {
                "monitor": monitor,
                "subscriber": subscriber,
                "capabilities": capabilities,
                "filter": dict(filter) if filter is not None else None,
                "from": from_,
                "protocol": protocol,
                "reset_policy": reset_policy,
                "sink": sink,
                "retire_after_mute_seconds": retire_after_mute_seconds,
                **fields,
            }
        )
        return _Call("POST", "/subscriptions", c._tok(token), Subscribed.of, body)

    @staticmethod
    def get_subscription(c: _Base, /, subscription: str, *, token: str | None = None) -> _Call[Subscription]:
        """GET /subscriptions/{id} (reader) -> Subscription, with its lag (a retired one too)."""
        return _Call("GET", f"/subscriptions/{_seg(subscription)}", c._tok(token), Subscription.of)

    @staticmethod
    def pull(
        c: _Base,
        /,
        subscription: str,
        *,
        cursor: int | None = None,
        limit: int | None = None,
        wait: int | None = None,
        filter: Mapping[str, Any] | None = None,
        ack: int | None = None,
        token: str | None = None,
    ) -> _Call[PullResult]:
        """GET /subscriptions/{id}/pull -> PullResult. Never commits. `cursor` is a read-only replay, `filter`
        an inline filter that narrows. `wait` is a long poll in whole seconds, an `int` 0..50 (the request
        timeout grows by it); a float such as 2.5 raises TypeError before anything is sent.

        `ack=n` acknowledges `n` (a previous pull's `next`, with /ack's rules) and then pulls: one request
        and one transaction (POST /subscriptions/{id}/pull) where the server advertises the ack-pull
        extension, else /ack then the GET pull. It cannot be combined with `cursor` (a read-only replay)."""
        if ack is not None:
            if cursor is not None:
                raise ValueError(
                    "ack commits and cursor is a read-only replay: call ack() then pull(cursor=...)"
                )
            return _ack_pull(c, subscription, ack, limit, wait, filter, token)
        params: list[tuple[str, str]] = []
        if cursor is not None:
            params.append(("cursor", str(cursor)))
        if limit is not None:
            params.append(("limit", str(limit)))
        if wait is not None:
            params.append(("wait", str(_whole_seconds(wait))))
        params.extend(filter_params(filter))
        timeout = c.timeout + (wait + LONG_POLL_MARGIN if wait else 0.0)
        return _Call(
            "GET",
            f"/subscriptions/{_seg(subscription)}/pull",
            c._tok(token),
            PullResult.of,
            None,
            params,
            timeout,
        )

    @staticmethod
    def publish_many(
        c: _Base, /, monitor_id: str, items: Iterable[Mapping[str, Any]], *, token: str | None = None
    ) -> _Call[BatchPublished]:
        """POST /monitors/{id}/observations with a JSON array (owner) -> BatchPublished: every item (the
        body `publish` sends: type, subject, data, tags, ..., idempotency_key) published in order, or refused
        and logged on its own; `.items` lists each item's seq or error. Where the server advertises the
        publish-batch extension, up to `max_items` items travel in one request and one commit (a longer
        list is split); elsewhere the client publishes them one by one (`batched` False). A refusal of the
        whole call (a wrong token, an unknown monitor) raises; a request of the batch refused whole (an item
        JSON cannot carry, a body over the server's limit, a 503) gives each of its items that error, the
        rest stay reported. A `ConnectionFailed` raises: what was sent before it may be committed, so give
        items an `idempotency_key` to retry safely."""
        body = [dict(item) for item in items]
        if not body:
            raise ValueError("publish_many needs at least one observation")
        path = f"/monitors/{_seg(monitor_id)}/observations"
        tok = c._tok(token)
        call: _Call[BatchPublished] = _Call("POST", path, tok, BatchPublished.of, body)
        call.plan = lambda: _publish_many_plan(monitor_id, path, tok, body)
        return call

    @staticmethod
    def ack(c: _Base, /, subscription: str, cursor: int, *, token: str | None = None) -> _Call[AckResult]:
        """POST /subscriptions/{id}/ack -> AckResult. Cumulative, never backwards; `cursor` is a pull's `next`."""
        return _Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/ack",
            c._tok(token),
            AckResult.of,
            {"cursor": cursor},
        )

    @staticmethod
    def seek(
        c: _Base, /, subscription: str, cursor: int, reason: str, *, token: str | None = None
    ) -> _Call[SeekResult]:
        """POST /subscriptions/{id}/seek -> SeekResult: the only way backwards, with a reason."""
        return _Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/seek",
            c._tok(token),
            SeekResult.of,
            {"cursor": cursor, "reason": reason},
        )

    @staticmethod
    def renew(c: _Base, /, subscription: str, *, token: str | None = None) -> _Call[Renewed]:
        """POST /subscriptions/{id}/renew -> Renewed: a new token, the old one dies at once."""
        return _Call("POST", f"/subscriptions/{_seg(subscription)}/renew", c._tok(token), Renewed.of, {})

    @staticmethod
    def retire_subscription(
        c: _Base, /, subscription: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[SubscriptionRetired]:
        """POST /subscriptions/{id}/retire -> SubscriptionRetired; its leases are released."""
        return _Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/retire",
            c._tok(token),
            SubscriptionRetired.of,
            _drop_none({"reason": reason}),
        )

    # -- leases ----------------------------------------------------------------------------------

    @staticmethod
    def claim(
        c: _Base,
        /,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        note: str | None = None,
        token: str | None = None,
    ) -> _Call[LeaseGranted]:
        """POST .../leases/claim (act) -> LeaseGranted (`idempotent` when the holder repeats its claim)."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds, "note": note}
        return _lease(c, "claim", subscription, body, token, LeaseGranted.of)

    @staticmethod
    def renew_lease(
        c: _Base,
        /,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        token: str | None = None,
    ) -> _Call[LeaseGranted]:
        """POST .../leases/renew (act) -> LeaseGranted."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds}
        return _lease(c, "renew", subscription, body, token, LeaseGranted.of)

    @staticmethod
    def complete(
        c: _Base,
        /,
        subscription: str,
        subject: str,
        outcome: str,
        *,
        evidence: Any = None,
        note: str | None = None,
        token: str | None = None,
    ) -> _Call[LeaseDone]:
        """POST .../leases/complete (act) -> LeaseDone."""
        body = {"subject": subject, "outcome": outcome, "evidence": evidence, "note": note}
        return _lease(c, "complete", subscription, body, token, LeaseDone.of)

    @staticmethod
    def release(
        c: _Base, /, subscription: str, subject: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[LeaseDone]:
        """POST .../leases/release (act) -> LeaseDone."""
        return _lease(c, "release", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of)

    @staticmethod
    def reject(
        c: _Base, /, subscription: str, subject: str, reason: str | None = None, *, token: str | None = None
    ) -> _Call[LeaseDone]:
        """POST .../leases/reject (act) -> LeaseDone (`dead_letter` once delivery_count_limit is reached)."""
        return _lease(c, "reject", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of)

    # -- admin and JSON-RPC -----------------------------------------------------------------------

    @staticmethod
    def admin_compact(
        c: _Base, /, upto_seq: int, monitor: str | None = None, *, token: str | None = None
    ) -> _Call[CompactReply]:
        """POST /admin/compact (admin token) -> CompactReply `{ok, compacted: [{monitor, retention_floor,
        removed}]}`."""
        body = _drop_none({"monitor": monitor, "upto_seq": upto_seq})
        return _Call("POST", "/admin/compact", c._tok(token), _compact_reply, body)

    @staticmethod
    def admin_snapshot(c: _Base, /, *, token: str | None = None) -> _Call[SnapshotReply]:
        """GET /admin/snapshot (admin token) -> SnapshotReply `{taken_at, monitors}`."""
        return _Call("GET", "/admin/snapshot", c._tok(token), _snapshot_reply)

    @staticmethod
    def admin_log(
        c: _Base,
        /,
        monitor: str,
        *,
        from_seq: int | None = None,
        limit: int | None = None,
        token: str | None = None,
    ) -> _Call[LogReply]:
        """GET /admin/log (admin token) -> LogReply `{monitor, head, retention_floor, next, observations}`:
        the log from `from_seq` (default 1), without a subscription."""
        params = [("monitor", monitor)]
        if from_seq is not None:
            params.append(("from", str(from_seq)))
        if limit is not None:
            params.append(("limit", str(limit)))
        return _Call("GET", "/admin/log", c._tok(token), _log_reply, None, params)

    @staticmethod
    def rpc(
        c: _Base,
        /,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        id: int | str = 1,
        token: str | None = None,
    ) -> _Call[dict[str, Any]]:
        """POST /rpc, one JSON-RPC 2.0 call -> its `result` (a JSON object); an `error` raises the
        MonitorProtocolError subclass built from `error.data` (the REST body)."""
        envelope = {"jsonrpc": "2.0", "id": id, "method": method, "params": dict(params or {})}
        return _Call("POST", "/rpc", c._tok(token), _rpc_result, envelope)

    @staticmethod
    def rpc_batch(
        c: _Base, /, calls: list[tuple[str, Mapping[str, Any]]], *, token: str | None = None
    ) -> _Call[list[RpcReply]]:
        """POST /rpc with a batch -> the list of replies (each `{jsonrpc, id, result|error}`), in call order."""
        envelopes = [
            {"jsonrpc": "2.0", "id": i + 1, "method": m, "params": dict(p)} for i, (m, p) in enumerate(calls)
        ]
        return _Call("POST", "/rpc", c._tok(token), _rpc_batch, envelopes)


def _lifecycle(
    c: _Base, action: str, monitor_id: str, reason: str | None, token: str | None
) -> _Call[MonitorChanged]:
    body = _drop_none({"reason": reason})
    return _Call("POST", f"/monitors/{_seg(monitor_id)}/{action}", c._tok(token), MonitorChanged.of, body)


def _lease(
    c: _Base,
    action: str,
    subscription: str,
    body: dict[str, Any],
    token: str | None,
    parse: Callable[[dict[str, Any]], T],
) -> _Call[T]:
    return _Call(
        "POST",
        f"/subscriptions/{_seg(subscription)}/leases/{action}",
        c._tok(token),
        parse,
        _drop_none(body),
    )


def _rpc_error(error: Mapping[str, Any]) -> MonitorProtocolError:
    data = error.get("data")
    if isinstance(data, dict) and isinstance(data.get("code"), str):
        extras = {k: v for k, v in data.items() if k not in ("code", "error")}
        return error_for(
            data["code"],
            str(data.get("error", error.get("message", ""))),
            ERROR_STATUS.get(data["code"], 400),
            extras,
        )
    return Invalid(
        "INVALID", str(error.get("message", "JSON-RPC error")), 400, {"jsonrpc_code": error.get("code")}
    )


def _rpc_result(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise UnexpectedResponse("UNEXPECTED_RESPONSE", "JSON-RPC reply is not an object", 200)
    if raw.get("error") is not None:
        raise _rpc_error(raw["error"])
    result = raw.get("result")
    if not isinstance(result, dict):
        raise UnexpectedResponse("UNEXPECTED_RESPONSE", "JSON-RPC result is not an object", 200)
    return result


def _rpc_batch(raw: Any) -> list[RpcReply]:
    if not isinstance(raw, list):
        return [raw]
    return sorted(
        raw, key=lambda r: (r.get("id") is None, r.get("id") if isinstance(r.get("id"), int) else 0)
    )


def _url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith(API_PREFIX) else base + API_PREFIX


def _headers(token: str | None) -> dict[str, str]:
    headers = {"accept": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _decode(response: httpx.Response | httpreply.Reply, call: _Call[T]) -> T:
    try:
        body = _loads(response.content) if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise _error_from_body(response.status_code, body, response.text, _retry_after(response))
    if body is None and call.parse is not _raw:
        raise UnexpectedResponse(
            "UNEXPECTED_RESPONSE", f"HTTP {response.status_code} with no JSON body", response.status_code
        )
    return call.parse(body if body is not None else {})


def _network_reason(exc: httpx.HTTPError) -> str:
    kind = type(exc).__name__
    detail = str(exc) or kind
    return f"{kind}: {detail}" if detail != kind else kind


def _connection_failed(exc: httpx.HTTPError, url: str) -> ConnectionFailed:
    return ConnectionFailed(_network_reason(exc), url, sent=not isinstance(exc, _not_sent()))


def _retry_delay(call: _Call[Any], attempt: int, exc: Exception) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None when `exc` must raise now."""
    if attempt >= call.retries:
        return None
    if isinstance(exc, MonitorProtocolError):
        if exc.code != "UNAVAILABLE" or exc.status != 503:
            return None  # a paused monitor (409) or any other refusal: retrying cannot help
    elif not isinstance(exc, ConnectionFailed):
        return None
    delay = call.backoff * (2.0**attempt) * random.uniform(0.5, 1.0)
    if isinstance(exc, MonitorProtocolError) and exc.retry_after is not None:
        delay = max(delay, exc.retry_after)
    return min(delay, MAX_RETRY_DELAY)


def _signature(build: Callable[..., Any], returns: str) -> inspect.Signature:
    sig = inspect.signature(build)
    params = list(sig.parameters.values())
    params[0] = params[0].replace(name="self", annotation=inspect.Parameter.empty)
    return sig.replace(parameters=params, return_annotation=returns)


def _returned(build: Callable[..., Any]) -> str:
    text = str(inspect.signature(build).return_annotation)
    return text[len("_Call[") : -1] if text.startswith("_Call[") else text


def _sync(build: Callable[Concatenate[_Base, P], _Call[T]]) -> Callable[Concatenate[Client, P], T]:
    """A `Client` method performing the route `build` describes."""

    @functools.wraps(build)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._perform(build(self, *args, **kwargs))

    method.__signature__ = _signature(build, _returned(build))  # type: ignore[attr-defined]
    return method


def _async(
    build: Callable[Concatenate[_Base, P], _Call[T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """An `AsyncClient` coroutine method performing the route `build` describes."""

    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._perform(build(self, *args, **kwargs))

    method.__signature__ = _signature(build, _returned(build))  # type: ignore[attr-defined]
    return method


# ---------------------------------------------------------------------------------------------- clients


class Client(_Base):
    """Synchronous client. `token` is used for every call that does not pass its own."""

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base = _url(base)
        self.token = token
        self.timeout = timeout
        # The HTTP layer, chosen by measurement (keepalive.py): the standard library's keep-alive
        # connections, or httpx where a proxy applies or the caller brings an httpx transport. In a browser,
        # a synchronous XMLHttpRequest (webhttp.Client: use it in a Web Worker).
        # The client's own layers take the same request (`_pooled_request` with `_prefix`).
        self._pool: keepalive.Pool | webhttp.Client | None = None
        self._http: httpx.Client | None = None
        if transport is None and IN_BROWSER:
            self._pool, self._prefix = webhttp.Client(), self.base  # the browser takes absolute URLs
        elif transport is None and not keepalive.proxied(self.base):
            self._pool, self._prefix = keepalive.Pool(self.base), urlsplit(self.base).path
        else:
            import httpx

            self._http = httpx.Client(timeout=timeout, transport=transport)

    @property
    def http_layer(self) -> str:
        """Which HTTP layer this client uses: "http.client" (keep-alive pool), "httpx", or in a browser
        "xhr" (a synchronous XMLHttpRequest)."""
        if isinstance(self._pool, webhttp.Client):
            return self._pool.http_layer
        return "http.client" if self._pool is not None else "httpx"

    def _once(self, call: _Call[T]) -> T:
        if self._pool is not None:
            return self._once_pooled(self._pool, call)
        import httpx

        assert self._http is not None
        url = self.base + call.path
        try:
            response = self._http.request(
                call.method,
                url,
                params=tuple(call.params) or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise _connection_failed(exc, url) from exc
        return _decode(response, call)

    def _once_pooled(self, pool: keepalive.Pool | webhttp.Client, call: _Call[T]) -> T:
        target, body, headers = _pooled_request(self._prefix, call)
        try:
            reply = pool.request(call.method, target, body, headers, call.timeout or self.timeout)
        except httpreply.SendFailed as exc:
            raise ConnectionFailed(exc.reason, self.base + call.path, sent=exc.sent) from exc
        return _decode(reply, call)

    def _perform(self, call: _Call[T]) -> T:
        if call.plan is not None:
            return self._drive(call.plan())
        attempt = 0
        while True:
            try:
                return self._once(call)
            except (ConnectionFailed, MonitorProtocolError) as exc:
                delay = _retry_delay(call, attempt, exc)
                if delay is None:
                    raise
            time.sleep(delay)
            attempt += 1

    def _drive(self, plan: _Plan[T]) -> T:
        reply: Any = None
        refusal: MonitorProtocolError | None = None
        while True:
            try:
                step = plan.throw(refusal) if refusal is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            refusal = None
            try:
                reply = self._extension(step.extension) if isinstance(step, _Ask) else self._perform(step)
            except MonitorProtocolError as err:
                refusal = err

    def _extension(self, name: str) -> Any:
        known = self._extensions
        if known is None:
            try:
                found: Discovery = self._perform(_Routes.discover(self))
                known = self._learn_extensions(found)
            except MonitorProtocolError:
                known = self._learn_extensions(None)
        return known.get(name)

    request = _sync(_Routes.request)
    discover = _sync(_Routes.discover)
    list_monitors = _sync(_Routes.list_monitors)
    get_monitor = _sync(_Routes.get_monitor)
    create_monitor = _sync(_Routes.create_monitor)
    update_monitor = _sync(_Routes.update_monitor)
    pause_monitor = _sync(_Routes.pause_monitor)
    resume_monitor = _sync(_Routes.resume_monitor)
    retire_monitor = _sync(_Routes.retire_monitor)
    state = _sync(_Routes.state)
    publish = _sync(_Routes.publish)
    publish_many = _sync(_Routes.publish_many)
    subscribe = _sync(_Routes.subscribe)
    get_subscription = _sync(_Routes.get_subscription)
    pull = _sync(_Routes.pull)
    ack = _sync(_Routes.ack)
    seek = _sync(_Routes.seek)
    renew = _sync(_Routes.renew)
    retire_subscription = _sync(_Routes.retire_subscription)
    claim = _sync(_Routes.claim)
    renew_lease = _sync(_Routes.renew_lease)
    complete = _sync(_Routes.complete)
    release = _sync(_Routes.release)
    reject = _sync(_Routes.reject)
    admin_compact = _sync(_Routes.admin_compact)
    admin_snapshot = _sync(_Routes.admin_snapshot)
    admin_log = _sync(_Routes.admin_log)
    rpc = _sync(_Routes.rpc)
    rpc_batch = _sync(_Routes.rpc_batch)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """Asynchronous client: the same methods as `Client`, each a coroutine (await it)."""

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base = _url(base)
        self.token = token
        self.timeout = timeout
        # Under asyncio, keep-alive connections on asyncio streams (keepalive.AsyncPool, h11); httpx under
        # trio, where a proxy applies, or with a caller's transport (created when first needed). In a
        # browser, the browser's fetch (webhttp.AsyncClient).
        self._transport = transport
        self._pool: keepalive.AsyncPool | webhttp.AsyncClient | None = None
        if transport is None and IN_BROWSER:
            self._pool, self._prefix = webhttp.AsyncClient(), self.base  # the browser takes absolute URLs
        elif transport is None and not keepalive.proxied(self.base):
            self._pool, self._prefix = keepalive.AsyncPool(self.base), urlsplit(self.base).path
        self._http: httpx.AsyncClient | None = None

    @property
    def http_layer(self) -> str:
        """Which HTTP layer this client uses under asyncio: "asyncio+h11" (keep-alive pool) or "httpx"
        (always httpx under trio), or in a browser "fetch"."""
        if isinstance(self._pool, webhttp.AsyncClient):
            return self._pool.http_layer
        return "asyncio+h11" if self._pool is not None else "httpx"

    async def _once(self, call: _Call[T]) -> T:
        if isinstance(self._pool, webhttp.AsyncClient) or (
            self._pool is not None and keepalive.running_asyncio()
        ):
            return await self._once_pooled(self._pool, call)
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout, transport=self._transport)
        url = self.base + call.path
        try:
            response = await self._http.request(
                call.method,
                url,
                params=tuple(call.params) or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise _connection_failed(exc, url) from exc
        return _decode(response, call)

    async def _once_pooled(self, pool: keepalive.AsyncPool | webhttp.AsyncClient, call: _Call[T]) -> T:
        target, body, headers = _pooled_request(self._prefix, call)
        try:
            reply = await pool.request(call.method, target, body, headers, call.timeout or self.timeout)
        except httpreply.SendFailed as exc:
            raise ConnectionFailed(exc.reason, self.base + call.path, sent=exc.sent) from exc
        return _decode(reply, call)

    async def _sleep(self, delay: float) -> None:
        if isinstance(
            self._pool, webhttp.AsyncClient
        ):  # Pyodide's event loop is asyncio's, and anyio is not installed there
            import asyncio

            await asyncio.sleep(delay)
            return
        import anyio  # httpx depends on it; works under asyncio and trio

        await anyio.sleep(delay)

    async def _perform(self, call: _Call[T]) -> T:
        if call.plan is not None:
            return await self._drive(call.plan())
        attempt = 0
        while True:
            try:
                return await self._once(call)
            except (ConnectionFailed, MonitorProtocolError) as exc:
                delay = _retry_delay(call, attempt, exc)
                if delay is None:
                    raise
            await self._sleep(delay)
            attempt += 1

    async def _drive(self, plan: _Plan[T]) -> T:
        reply: Any = None
        refusal: MonitorProtocolError | None = None
        while True:
            try:
                step = plan.throw(refusal) if refusal is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            refusal = None
            try:
                if isinstance(step, _Ask):
                    reply = await self._extension(step.extension)
                else:
                    reply = await self._perform(step)
            except MonitorProtocolError as err:
                refusal = err

    async def _extension(self, name: str) -> Any:
        known = self._extensions
        if known is None:
            try:
                found: Discovery = await self._perform(_Routes.discover(self))
                known = self._learn_extensions(found)
            except MonitorProtocolError:
                known = self._learn_extensions(None)
        return known.get(name)

    request = _async(_Routes.request)
    discover = _async(_Routes.discover)
    list_monitors = _async(_Routes.list_monitors)
    get_monitor = _async(_Routes.get_monitor)
    create_monitor = _async(_Routes.create_monitor)
    update_monitor = _async(_Routes.update_monitor)
    pause_monitor = _async(_Routes.pause_monitor)
    resume_monitor = _async(_Routes.resume_monitor)
    retire_monitor = _async(_Routes.retire_monitor)
    state = _async(_Routes.state)
    publish = _async(_Routes.publish)
    publish_many = _async(_Routes.publish_many)
    subscribe = _async(_Routes.subscribe)
    get_subscription = _async(_Routes.get_subscription)
    pull = _async(_Routes.pull)
    ack = _async(_Routes.ack)
    seek = _async(_Routes.seek)
    renew = _async(_Routes.renew)
    retire_subscription = _async(_Routes.retire_subscription)
    claim = _async(_Routes.claim)
    renew_lease = _async(_Routes.renew_lease)
    complete = _async(_Routes.complete)
    release = _async(_Routes.release)
    reject = _async(_Routes.reject)
    admin_compact = _async(_Routes.admin_compact)
    admin_snapshot = _async(_Routes.admin_snapshot)
    admin_log = _async(_Routes.admin_log)
    rpc = _async(_Routes.rpc)
    rpc_batch = _async(_Routes.rpc_batch)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
