"""One description of every route for both clients: each route builds a typed `Call[T]` (method, path, query, body, token, how to decode the reply); `Client` and `AsyncClient` turn each into a method (clients.py). Every route is an operation of the operations table (api/operations.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

from monitor_protocol.client.errors import (
    Invalid,
    MonitorProtocolError,
    UnexpectedResponse,
    error_for,
)
from monitor_protocol.client.results import (
    AckResult,
    BatchPublished,
    CompactReply,
    Discovery,
    LeaseDone,
    LeaseGranted,
    LogReply,
    Monitor,
    MonitorChanged,
    MonitorCreated,
    Published,
    PullResult,
    Renewed,
    RpcReply,
    SeekResult,
    SnapshotReply,
    State,
    Subscribed,
    Subscription,
    SubscriptionRetired,
    compact_reply,
    log_reply,
    monitor_list,
    raw_reply,
    snapshot_reply,
)
from monitor_protocol.core.vocab import ERROR_STATUS, EXT_ACK_PULL, EXT_PUBLISH_BATCH

if TYPE_CHECKING:
    pass  # imported where a client uses it: `import monitor_protocol.client` stays light

# In a browser (Pyodide) the browser sends (webhttp); keepalive needs sockets and `ssl`, which it lacks.


DEFAULT_BASE = "http://127.0.0.1:8130"
API_PREFIX = "/mp/v0"
DEFAULT_TIMEOUT = 10.0
LONG_POLL_MARGIN = 10.0
DEFAULT_RETRY_BACKOFF = 0.5  # seconds before the first retry; doubles per attempt
MAX_RETRY_DELAY = 30.0  # no single wait between retries is longer (Retry-After included)

T = TypeVar("T")
P = ParamSpec("P")


# ---------------------------------------------------------------------------------------------- routes


@dataclass(slots=True)
class Call(Generic[T]):
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
    # above (which is what the call sends where the extension is advertised). See `Plan`.
    plan: Callable[[], Plan[T]] | None = None


@dataclass(frozen=True)
class Ask:
    """A plan's question to its client: this server extension's entry in discover, or None."""

    extension: str


# A plan yields the `Call`s to perform (and `Ask`s) and receives each reply, or has the refusal thrown
# in; what it returns is the result. The sync and the async client drive the same plan.
Plan = Generator["Call[Any] | Ask", Any, T]


def _seg(value: str) -> str:
    """A path segment, percent-encoded; the ids a client uses are few and used again, so remembered."""
    found = _SEGMENTS.get(value)
    if found is None:
        if value == "":  # GET /monitors/ is the listing: an empty id would be answered as another route
            raise ValueError("an id is a non-empty string (a monitor's, a subscription's): got ''")
        found = quote(str(value), safe="")
        if isinstance(value, str):
            if len(_SEGMENTS) >= 1024:
                _SEGMENTS.clear()
            _SEGMENTS[value] = found
    return found


_SEGMENTS: dict[str, str] = {}


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
    c: ClientBase,
    subscription: str,
    ack: int,
    limit: int | None,
    wait: int | None,
    flt: Mapping[str, Any] | None,
    token: str | None,
) -> Call[PullResult]:
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
    call: Call[PullResult] = Call("POST", path, tok, PullResult.of, body, timeout=timeout)

    def plan() -> Plan[PullResult]:
        if (yield Ask(EXT_ACK_PULL)) is not None:
            both: PullResult = yield replace(call, plan=None)
            return both
        # Elsewhere: the protocol's two calls, the ack first (its refusal raises before anything is read).
        yield Call("POST", f"/subscriptions/{_seg(subscription)}/ack", tok, AckResult.of, {"cursor": ack})
        params = [(k, str(v)) for k, v in (("limit", limit), ("wait", body.get("wait"))) if v is not None]
        pulled: PullResult = yield Call(
            "GET", path, tok, PullResult.of, None, params + filter_params(flt), timeout
        )
        return pulled

    call.plan = plan
    return call


def _every_page(first: Call[list[Monitor]]) -> Plan[list[Monitor]]:
    found: list[Monitor] = []
    call: Call[Any] = replace(first, parse=_as_is, plan=None)
    while True:
        raw = yield call
        found.extend(monitor_list(raw))
        after = raw.get("next") if isinstance(raw, dict) else None
        if not isinstance(after, str) or any(after <= v for k, v in call.params if k == "after"):
            return found  # the whole listing (or a server whose `next` does not move on: what it gave)
        call = replace(call, params=[("after", after)])


def _as_is(raw: Any) -> Any:
    return raw


# A refusal of the whole call, not of one item: the batch request raises it too.
_WHOLE_CALL_REFUSALS = ("UNAUTHORIZED", "NOT_FOUND")


def _publish_many_plan(
    monitor_id: str, path: str, token: str | None, items: list[dict[str, Any]]
) -> Plan[BatchPublished]:
    info = yield Ask(EXT_PUBLISH_BATCH)
    results: list[dict[str, Any]] = []
    if info is not None:
        size = info.get("max_items") if isinstance(info, dict) else None
        size = size if isinstance(size, int) and size > 0 else 1
        # The chunks still to send, the next last: a chunk too large as a whole goes again as its halves.
        chunks = [(start, items[start : start + size]) for start in range(0, len(items), size)][::-1]
        while chunks:
            start, chunk = chunks.pop()
            try:
                reply = yield Call("POST", path, token, raw_reply, chunk)
            except MonitorProtocolError as err:
                if err.code in _WHOLE_CALL_REFUSALS and not results:
                    raise
                if err.status == 413 and len(chunk) > 1:
                    # Over a body limit (the server's, or a lower one of a proxy in between, whose 413 is a
                    # web page): nothing of it was taken, so its halves go instead, in order.
                    half = len(chunk) // 2
                    chunks += [(start + half, chunk[half:]), (start, chunk[:half])]
                    continue
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
                reply = yield Call("POST", path, token, raw_reply, item)
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


class ClientBase:
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


class Routes:
    """Every route of docs/protocol.md section 5, once. Each builds a `Call[T]` from a client `c` (for its token
    and timeout); `token=` on a call overrides the client's token. `Client` and `AsyncClient` expose each
    under the same name (see `_sync` / `_async`)."""

    @staticmethod
    def request(
        c: ClientBase,
        /,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> Call[Any]:
        """Any route under /mp/v0, returning the JSON reply as is (errors raise as for every route).
        `path` is relative to the prefix, e.g. "/monitors/ci/state"."""
        return Call(method.upper(), path, c._tok(token), raw_reply, body, list(params or []), timeout)

    # -- discovery and monitors ------------------------------------------------------------------

    @staticmethod
    def discover(c: ClientBase, /) -> Call[Discovery]:
        """GET /discover -> Discovery."""
        return Call("GET", "/discover", None, Discovery.of)

    @staticmethod
    def list_monitors(c: ClientBase, /, *, token: str | None = None) -> Call[list[Monitor]]:
        """GET /monitors -> list[Monitor] (what this token may see): every page, on a server that lists a
        page at a time (its reply's `next`); one reply elsewhere."""
        call = Call("GET", "/monitors", c._tok(token), monitor_list)
        call.plan = lambda: _every_page(call)
        return call

    @staticmethod
    def get_monitor(c: ClientBase, /, monitor_id: str, *, token: str | None = None) -> Call[Monitor]:
        """GET /monitors/{id} -> Monitor."""
        return Call("GET", f"/monitors/{_seg(monitor_id)}", c._tok(token), Monitor.of)

    @staticmethod
    def create_monitor(
        c: ClientBase, /, monitor_id: str, *, token: str | None = None, **fields: Any
    ) -> Call[MonitorCreated]:
        """POST /monitors -> MonitorCreated (the owner token is shown once). `token` is the server's
        registration token, needed only when the server requires one. `fields` are the Monitor's fields
        (name, types, capabilities, visibility, horizon, default_grant, ...)."""
        body = {"id": monitor_id, **_drop_none(fields)}
        return Call("POST", "/monitors", c._tok(token), MonitorCreated.of, body)

    @staticmethod
    def update_monitor(
        c: ClientBase,
        /,
        monitor_id: str,
        patch: Mapping[str, Any],
        *,
        reason: str | None = None,
        rule: str | None = None,
        token: str | None = None,
    ) -> Call[MonitorChanged]:
        """POST /monitors/{id}/update (owner) -> MonitorChanged."""
        body = _drop_none({"patch": dict(patch), "reason": reason, "rule": rule})
        return Call("POST", f"/monitors/{_seg(monitor_id)}/update", c._tok(token), MonitorChanged.of, body)

    @staticmethod
    def pause_monitor(
        c: ClientBase, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> Call[MonitorChanged]:
        """POST /monitors/{id}/pause (owner) -> MonitorChanged."""
        return _lifecycle(c, "pause", monitor_id, reason, token)

    @staticmethod
    def resume_monitor(
        c: ClientBase, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> Call[MonitorChanged]:
        """POST /monitors/{id}/resume (owner) -> MonitorChanged."""
        return _lifecycle(c, "resume", monitor_id, reason, token)

    @staticmethod
    def retire_monitor(
        c: ClientBase, /, monitor_id: str, reason: str | None = None, *, token: str | None = None
    ) -> Call[MonitorChanged]:
        """POST /monitors/{id}/retire (owner) -> MonitorChanged; its leases are released."""
        return _lifecycle(c, "retire", monitor_id, reason, token)

    @staticmethod
    def state(c: ClientBase, /, monitor_id: str, *, token: str | None = None) -> Call[State]:
        """GET /monitors/{id}/state -> State."""
        return Call("GET", f"/monitors/{_seg(monitor_id)}/state", c._tok(token), State.of)

    @staticmethod
    def publish(
        c: ClientBase,
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
    ) -> Call[Published]:
        """POST /monitors/{id}/observations (owner) -> Published. `fields`: tags, actor, origin, tier,
        verification, on_behalf_of, time, source_ref, rule, wasDerivedFrom, supersedes, idempotency_key
        (retrying with the same key after a lost reply appends nothing and returns the first reply).

        `retries=N` (default 0) makes up to N further attempts, safely: an `idempotency_key` is sent (a
        random UUID unless you pass one), and only `ConnectionFailed` or a 503 `Unavailable` is retried,
        after `retry_backoff` seconds doubling per attempt (with jitter; at least the server's Retry-After;
        each wait at most 30 s). Any other refusal raises at once; after the last attempt its error
        raises. A retry that finds the observation already appended returns the first reply, with
        `idempotent=True`."""
        if retries.__class__ is not int or retries < 0:  # the usual 0 without a call (the client's budget)
            retries = _check_retries(retries)
        if retries and fields.get("idempotency_key") is None:
            fields["idempotency_key"] = str(uuid.uuid4())
        body: dict[str, Any] = {}
        if type is not None:  # a missing type is the server's to refuse, in its words
            body["type"] = type
        if subject is not None:
            body["subject"] = subject
        if data is not None:
            body["data"] = data.copy() if data.__class__ is dict else dict(_mapping(data, "publish: data"))
        for name, value in fields.items():
            if value is not None:
                body[name] = value
        return Call(
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
        c: ClientBase,
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
    ) -> Call[Subscribed]:
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
        return Call("POST", "/subscriptions", c._tok(token), Subscribed.of, body)

    @staticmethod
    def get_subscription(
        c: ClientBase, /, subscription: str, *, token: str | None = None
    ) -> Call[Subscription]:
        """GET /subscriptions/{id} (reader) -> Subscription, with its lag (a retired one too)."""
        return Call("GET", f"/subscriptions/{_seg(subscription)}", c._tok(token), Subscription.of)

    @staticmethod
    def pull(
        c: ClientBase,
        /,
        subscription: str,
        *,
        cursor: int | None = None,
        limit: int | None = None,
        wait: int | None = None,
        filter: Mapping[str, Any] | None = None,
        ack: int | None = None,
        token: str | None = None,
    ) -> Call[PullResult]:
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
        return Call(
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
        c: ClientBase, /, monitor_id: str, items: Iterable[Mapping[str, Any]], *, token: str | None = None
    ) -> Call[BatchPublished]:
        """POST /monitors/{id}/observations with a JSON array (owner) -> BatchPublished: every item (the
        body `publish` sends: type, subject, data, tags, ..., idempotency_key) published in order, or refused
        and logged on its own; `.items` lists each item's seq or error. Where the server advertises the
        publish-batch extension, up to `max_items` items travel in one request and one commit (a longer
        list is split); elsewhere the client publishes them one by one (`batched` False). A request over a
        body limit (413: the server's, or a proxy's lower one) is sent again as two halves, down to one item.
        A refusal of the whole call (a wrong token, an unknown monitor) raises; a request of the batch
        refused whole (an item JSON cannot carry, one item over the body limit, a 503) gives each of its
        items that error, the rest stay reported. A `ConnectionFailed` raises: what was sent before it may
        be committed, so give items an `idempotency_key` to retry safely."""
        body = [dict(_mapping(item, f"publish_many: item {i}")) for i, item in enumerate(items)]
        if not body:
            raise ValueError("publish_many needs at least one observation")
        path = f"/monitors/{_seg(monitor_id)}/observations"
        tok = c._tok(token)
        call: Call[BatchPublished] = Call("POST", path, tok, BatchPublished.of, body)
        call.plan = lambda: _publish_many_plan(monitor_id, path, tok, body)
        return call

    @staticmethod
    def ack(c: ClientBase, /, subscription: str, cursor: int, *, token: str | None = None) -> Call[AckResult]:
        """POST /subscriptions/{id}/ack -> AckResult. Cumulative, never backwards; `cursor` is a pull's `next`."""
        return Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/ack",
            c._tok(token),
            AckResult.of,
            {"cursor": cursor},
        )

    @staticmethod
    def seek(
        c: ClientBase, /, subscription: str, cursor: int, reason: str, *, token: str | None = None
    ) -> Call[SeekResult]:
        """POST /subscriptions/{id}/seek -> SeekResult: the only way backwards, with a reason."""
        return Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/seek",
            c._tok(token),
            SeekResult.of,
            {"cursor": cursor, "reason": reason},
        )

    @staticmethod
    def renew(c: ClientBase, /, subscription: str, *, token: str | None = None) -> Call[Renewed]:
        """POST /subscriptions/{id}/renew -> Renewed: a new token, the old one dies at once."""
        return Call("POST", f"/subscriptions/{_seg(subscription)}/renew", c._tok(token), Renewed.of, {})

    @staticmethod
    def retire_subscription(
        c: ClientBase, /, subscription: str, reason: str | None = None, *, token: str | None = None
    ) -> Call[SubscriptionRetired]:
        """POST /subscriptions/{id}/retire -> SubscriptionRetired; its leases are released."""
        return Call(
            "POST",
            f"/subscriptions/{_seg(subscription)}/retire",
            c._tok(token),
            SubscriptionRetired.of,
            _drop_none({"reason": reason}),
        )

    # -- leases ----------------------------------------------------------------------------------

    @staticmethod
    def claim(
        c: ClientBase,
        /,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        note: str | None = None,
        token: str | None = None,
    ) -> Call[LeaseGranted]:
        """POST .../leases/claim (act) -> LeaseGranted (`idempotent` when the holder repeats its claim)."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds, "note": note}
        return _lease(c, "claim", subscription, body, token, LeaseGranted.of)

    @staticmethod
    def renew_lease(
        c: ClientBase,
        /,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        token: str | None = None,
    ) -> Call[LeaseGranted]:
        """POST .../leases/renew (act) -> LeaseGranted."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds}
        return _lease(c, "renew", subscription, body, token, LeaseGranted.of)

    @staticmethod
    def complete(
        c: ClientBase,
        /,
        subscription: str,
        subject: str,
        outcome: str,
        *,
        evidence: Any = None,
        note: str | None = None,
        token: str | None = None,
    ) -> Call[LeaseDone]:
        """POST .../leases/complete (act) -> LeaseDone."""
        body = {"subject": subject, "outcome": outcome, "evidence": evidence, "note": note}
        return _lease(c, "complete", subscription, body, token, LeaseDone.of)

    @staticmethod
    def release(
        c: ClientBase,
        /,
        subscription: str,
        subject: str,
        reason: str | None = None,
        *,
        token: str | None = None,
    ) -> Call[LeaseDone]:
        """POST .../leases/release (act) -> LeaseDone."""
        return _lease(c, "release", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of)

    @staticmethod
    def reject(
        c: ClientBase,
        /,
        subscription: str,
        subject: str,
        reason: str | None = None,
        *,
        token: str | None = None,
    ) -> Call[LeaseDone]:
        """POST .../leases/reject (act) -> LeaseDone (`dead_letter` once delivery_count_limit is reached)."""
        return _lease(c, "reject", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of)

    # -- admin and JSON-RPC -----------------------------------------------------------------------

    @staticmethod
    def admin_compact(
        c: ClientBase, /, upto_seq: int, monitor: str | None = None, *, token: str | None = None
    ) -> Call[CompactReply]:
        """POST /admin/compact (admin token) -> CompactReply `{ok, compacted: [{monitor, retention_floor,
        removed}]}`."""
        body = _drop_none({"monitor": monitor, "upto_seq": upto_seq})
        return Call("POST", "/admin/compact", c._tok(token), compact_reply, body)

    @staticmethod
    def admin_snapshot(c: ClientBase, /, *, token: str | None = None) -> Call[SnapshotReply]:
        """GET /admin/snapshot (admin token) -> SnapshotReply `{taken_at, monitors}`."""
        return Call("GET", "/admin/snapshot", c._tok(token), snapshot_reply)

    @staticmethod
    def admin_log(
        c: ClientBase,
        /,
        monitor: str,
        *,
        from_seq: int | None = None,
        limit: int | None = None,
        token: str | None = None,
    ) -> Call[LogReply]:
        """GET /admin/log (admin token) -> LogReply `{monitor, head, retention_floor, next, observations}`:
        the log from `from_seq` (default 1), without a subscription."""
        params = [("monitor", monitor)]
        if from_seq is not None:
            params.append(("from", str(from_seq)))
        if limit is not None:
            params.append(("limit", str(limit)))
        return Call("GET", "/admin/log", c._tok(token), log_reply, None, params)

    @staticmethod
    def rpc(
        c: ClientBase,
        /,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        id: int | str = 1,
        token: str | None = None,
    ) -> Call[dict[str, Any]]:
        """POST /rpc, one JSON-RPC 2.0 call -> its `result` (a JSON object); an `error` raises the
        MonitorProtocolError subclass built from `error.data` (the REST body)."""
        envelope = {
            "jsonrpc": "2.0",
            "id": id,
            "method": method,
            "params": dict(_mapping(params or {}, "rpc: params")),
        }
        return Call("POST", "/rpc", c._tok(token), _rpc_result, envelope)

    @staticmethod
    def rpc_batch(
        c: ClientBase, /, calls: list[tuple[str, Mapping[str, Any]]], *, token: str | None = None
    ) -> Call[list[RpcReply]]:
        """POST /rpc with a batch -> the list of replies (each `{jsonrpc, id, result|error}`), in call order."""
        envelopes = [
            {"jsonrpc": "2.0", "id": i + 1, "method": m, "params": dict(_mapping(p, "rpc_batch: params"))}
            for i, (m, p) in enumerate(calls)
        ]
        return Call("POST", "/rpc", c._tok(token), _rpc_batch, envelopes)


def _lifecycle(
    c: ClientBase, action: str, monitor_id: str, reason: str | None, token: str | None
) -> Call[MonitorChanged]:
    body = _drop_none({"reason": reason})
    return Call("POST", f"/monitors/{_seg(monitor_id)}/{action}", c._tok(token), MonitorChanged.of, body)


def _lease(
    c: ClientBase,
    action: str,
    subscription: str,
    body: dict[str, Any],
    token: str | None,
    parse: Callable[[dict[str, Any]], T],
) -> Call[T]:
    return Call(
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


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    """A JSON object's Python form, checked before anything is sent: dict() of a list of pairs would guess,
    and of a string or a number would fail with a sentence about sequences."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{what} must be a mapping (a JSON object such as {{'status': 'failed'}}), not {type(value).__name__}"
        )
    return value
