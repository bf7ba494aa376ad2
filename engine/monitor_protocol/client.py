"""Python client for the Monitor Protocol REST binding (PROTOCOL.md section 5), sync and async, on httpx.

    from monitor_protocol.client import Client

    with Client("http://127.0.0.1:8130") as mp:
        created = mp.create_monitor("ci", types=["com.example.ci.run"])
        mp.publish("ci", "com.example.ci.run", subject="build-1", token=created.owner_token)

Every route returns a small dataclass with the fields PROTOCOL.md names and the whole JSON reply in `.raw`.
A refusal the protocol defines raises `MonitorProtocolError(code, message, status, extras)`; a network
failure (refused connection, reset, timeout) raises `ConnectionFailed`. Every request has a timeout; a long
poll gets its `wait` plus a margin on top.

`Client` and `AsyncClient` share one description of the routes (`_Routes`): each route method builds a
`_Call` and hands it to `_run`, which the sync client performs at once and the async client returns as an
awaitable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from .vocab import ERROR_STATUS

DEFAULT_BASE = "http://127.0.0.1:8130"
API_PREFIX = "/mp/v0"
DEFAULT_TIMEOUT = 10.0
LONG_POLL_MARGIN = 10.0

__all__ = [
    "DEFAULT_BASE",
    "AckResult",
    "AsyncClient",
    "Client",
    "ConnectionFailed",
    "Discovery",
    "LeaseDone",
    "LeaseGranted",
    "Monitor",
    "MonitorCreated",
    "MonitorChanged",
    "MonitorProtocolError",
    "Published",
    "PullResult",
    "Renewed",
    "Result",
    "SeekResult",
    "State",
    "Subscribed",
    "Subscription",
    "SubscriptionRetired",
]


# ---------------------------------------------------------------------------------------------- errors


class MonitorProtocolError(Exception):
    """A refusal the server reported: `code` from the closed list (section 3), the server's sentence,
    the HTTP status and the rest of the error body (`extras`, e.g. `retention_floor`, `rejected_seq`)."""

    def __init__(self, code: str, message: str, status: int, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.extras: dict[str, Any] = dict(extras or {})

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

    def __repr__(self) -> str:
        return f"MonitorProtocolError({self.code!r}, {self.message!r}, {self.status}, {self.extras!r})"


class ConnectionFailed(Exception):
    """The server could not be reached or did not answer in time (nothing is known about the outcome)."""

    def __init__(self, reason: str, url: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.url = url


def _error_from_body(status: int, body: Any, text: str) -> MonitorProtocolError:
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        extras = {k: v for k, v in body.items() if k not in ("code", "error")}
        return MonitorProtocolError(body["code"], str(body.get("error", "")), status, extras)
    sentence = text.strip()[:200] or "no body"
    return MonitorProtocolError(
        "UNEXPECTED_RESPONSE", f"HTTP {status} without a protocol error: {sentence}", status
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
    protocol: Any
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
    notice: Any

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
    notice: Any
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
    expires: Any
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


def _raw(raw: Any) -> Any:
    return raw


def _monitor_list(raw: dict[str, Any]) -> list[Monitor]:
    return [Monitor.of(m) for m in raw.get("monitors") or []]


# ---------------------------------------------------------------------------------------------- routes


@dataclass
class _Call:
    method: str
    path: str
    token: str | None
    parse: Callable[[Any], Any]
    body: Any = None
    params: list[tuple[str, str]] = field(default_factory=list)
    timeout: float | None = None


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


class _Routes:
    """Every route of PROTOCOL.md section 5, once. `token=` on a call overrides the client's token."""

    token: str | None
    timeout: float
    # Performs a call: `Client` returns the parsed result, `AsyncClient` an awaitable of it.
    _run: Callable[[_Call], Any]

    def _tok(self, token: str | None) -> str | None:
        return token if token is not None else self.token

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: list[tuple[str, str]] | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Any route under /mp/v0, returning the JSON reply as is (errors raise as for every route).
        `path` is relative to the prefix, e.g. "/monitors/ci/state"."""
        return self._run(
            _Call(method.upper(), path, self._tok(token), _raw, body, list(params or []), timeout)
        )

    # -- discovery and monitors ------------------------------------------------------------------

    def discover(self) -> Any:
        """GET /discover -> Discovery."""
        return self._run(_Call("GET", "/discover", None, Discovery.of))

    def list_monitors(self, *, token: str | None = None) -> Any:
        """GET /monitors -> list[Monitor] (what this token may see)."""
        return self._run(_Call("GET", "/monitors", self._tok(token), _monitor_list))

    def get_monitor(self, monitor_id: str, *, token: str | None = None) -> Any:
        """GET /monitors/{id} -> Monitor."""
        return self._run(_Call("GET", f"/monitors/{_seg(monitor_id)}", self._tok(token), Monitor.of))

    def create_monitor(self, monitor_id: str, *, token: str | None = None, **fields: Any) -> Any:
        """POST /monitors -> MonitorCreated (the owner token is shown once). `token` is the server's
        registration token, needed only when the server requires one. `fields` are the Monitor's fields
        (name, types, capabilities, visibility, horizon, default_grant, ...)."""
        body = {"id": monitor_id, **_drop_none(fields)}
        return self._run(_Call("POST", "/monitors", self._tok(token), MonitorCreated.of, body))

    def update_monitor(
        self,
        monitor_id: str,
        patch: Mapping[str, Any],
        *,
        reason: str | None = None,
        rule: str | None = None,
        token: str | None = None,
    ) -> Any:
        """POST /monitors/{id}/update (owner) -> MonitorChanged."""
        body = _drop_none({"patch": dict(patch), "reason": reason, "rule": rule})
        return self._run(
            _Call("POST", f"/monitors/{_seg(monitor_id)}/update", self._tok(token), MonitorChanged.of, body)
        )

    def _lifecycle(self, action: str, monitor_id: str, reason: str | None, token: str | None) -> Any:
        body = _drop_none({"reason": reason})
        return self._run(
            _Call("POST", f"/monitors/{_seg(monitor_id)}/{action}", self._tok(token), MonitorChanged.of, body)
        )

    def pause_monitor(self, monitor_id: str, reason: str | None = None, *, token: str | None = None) -> Any:
        """POST /monitors/{id}/pause (owner) -> MonitorChanged."""
        return self._lifecycle("pause", monitor_id, reason, token)

    def resume_monitor(self, monitor_id: str, reason: str | None = None, *, token: str | None = None) -> Any:
        """POST /monitors/{id}/resume (owner) -> MonitorChanged."""
        return self._lifecycle("resume", monitor_id, reason, token)

    def retire_monitor(self, monitor_id: str, reason: str | None = None, *, token: str | None = None) -> Any:
        """POST /monitors/{id}/retire (owner) -> MonitorChanged; its leases are released."""
        return self._lifecycle("retire", monitor_id, reason, token)

    def state(self, monitor_id: str, *, token: str | None = None) -> Any:
        """GET /monitors/{id}/state -> State."""
        return self._run(_Call("GET", f"/monitors/{_seg(monitor_id)}/state", self._tok(token), State.of))

    def publish(
        self,
        monitor_id: str,
        type: str,
        *,
        subject: str | None = None,
        data: Mapping[str, Any] | None = None,
        token: str | None = None,
        **fields: Any,
    ) -> Any:
        """POST /monitors/{id}/observations (owner) -> Published. `fields`: tags, actor, origin, tier,
        verification, on_behalf_of, time, source_ref, rule, wasDerivedFrom, supersedes, idempotency_key
        (retrying with the same key after a lost reply appends nothing and returns the first reply)."""
        body = _drop_none(
            {"type": type, "subject": subject, "data": dict(data) if data is not None else None, **fields}
        )
        return self._run(
            _Call("POST", f"/monitors/{_seg(monitor_id)}/observations", self._tok(token), Published.of, body)
        )

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(
        self,
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
    ) -> Any:
        """POST /subscriptions -> Subscribed (the reader token is shown once). `token` is the owner's or the
        monitor's subscribe token, or the subscription's own token when re-subscribing."""
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
        return self._run(_Call("POST", "/subscriptions", self._tok(token), Subscribed.of, body))

    def pull(
        self,
        subscription: str,
        *,
        cursor: int | None = None,
        limit: int | None = None,
        wait: float | None = None,
        filter: Mapping[str, Any] | None = None,
        token: str | None = None,
    ) -> Any:
        """GET /subscriptions/{id}/pull -> PullResult. Never commits. `cursor` is a read-only replay, `wait`
        a long poll (0..50 s; the request timeout grows by it), `filter` an inline filter that narrows."""
        params: list[tuple[str, str]] = []
        if cursor is not None:
            params.append(("cursor", str(cursor)))
        if limit is not None:
            params.append(("limit", str(limit)))
        if wait is not None:
            params.append(("wait", _num(wait)))
        params.extend(filter_params(filter))
        timeout = self.timeout + (float(wait) if wait else 0.0) + (LONG_POLL_MARGIN if wait else 0.0)
        return self._run(
            _Call(
                "GET",
                f"/subscriptions/{_seg(subscription)}/pull",
                self._tok(token),
                PullResult.of,
                None,
                params,
                timeout,
            )
        )

    def ack(self, subscription: str, cursor: int, *, token: str | None = None) -> Any:
        """POST /subscriptions/{id}/ack -> AckResult. Cumulative, never backwards; `cursor` is a pull's `next`."""
        return self._run(
            _Call(
                "POST",
                f"/subscriptions/{_seg(subscription)}/ack",
                self._tok(token),
                AckResult.of,
                {"cursor": cursor},
            )
        )

    def seek(self, subscription: str, cursor: int, reason: str, *, token: str | None = None) -> Any:
        """POST /subscriptions/{id}/seek -> SeekResult: the only way backwards, with a reason."""
        return self._run(
            _Call(
                "POST",
                f"/subscriptions/{_seg(subscription)}/seek",
                self._tok(token),
                SeekResult.of,
                {"cursor": cursor, "reason": reason},
            )
        )

    def renew(self, subscription: str, *, token: str | None = None) -> Any:
        """POST /subscriptions/{id}/renew -> Renewed: a new token, the old one dies at once."""
        return self._run(
            _Call("POST", f"/subscriptions/{_seg(subscription)}/renew", self._tok(token), Renewed.of, {})
        )

    def retire_subscription(
        self, subscription: str, reason: str | None = None, *, token: str | None = None
    ) -> Any:
        """POST /subscriptions/{id}/retire -> SubscriptionRetired; its leases are released."""
        return self._run(
            _Call(
                "POST",
                f"/subscriptions/{_seg(subscription)}/retire",
                self._tok(token),
                SubscriptionRetired.of,
                _drop_none({"reason": reason}),
            )
        )

    # -- leases ----------------------------------------------------------------------------------

    def _lease(
        self, action: str, subscription: str, body: dict[str, Any], token: str | None, parse: Any
    ) -> Any:
        return self._run(
            _Call(
                "POST",
                f"/subscriptions/{_seg(subscription)}/leases/{action}",
                self._tok(token),
                parse,
                _drop_none(body),
            )
        )

    def claim(
        self,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        note: str | None = None,
        token: str | None = None,
    ) -> Any:
        """POST .../leases/claim (act) -> LeaseGranted (`idempotent` when the holder repeats its claim)."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds, "note": note}
        return self._lease("claim", subscription, body, token, LeaseGranted.of)

    def renew_lease(
        self,
        subscription: str,
        subject: str,
        *,
        lease_duration_seconds: int | None = None,
        token: str | None = None,
    ) -> Any:
        """POST .../leases/renew (act) -> LeaseGranted."""
        body = {"subject": subject, "lease_duration_seconds": lease_duration_seconds}
        return self._lease("renew", subscription, body, token, LeaseGranted.of)

    def complete(
        self,
        subscription: str,
        subject: str,
        outcome: str,
        *,
        evidence: Any = None,
        note: str | None = None,
        token: str | None = None,
    ) -> Any:
        """POST .../leases/complete (act) -> LeaseDone."""
        body = {"subject": subject, "outcome": outcome, "evidence": evidence, "note": note}
        return self._lease("complete", subscription, body, token, LeaseDone.of)

    def release(
        self, subscription: str, subject: str, reason: str | None = None, *, token: str | None = None
    ) -> Any:
        """POST .../leases/release (act) -> LeaseDone."""
        return self._lease(
            "release", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of
        )

    def reject(
        self, subscription: str, subject: str, reason: str | None = None, *, token: str | None = None
    ) -> Any:
        """POST .../leases/reject (act) -> LeaseDone (`dead_letter` once delivery_count_limit is reached)."""
        return self._lease(
            "reject", subscription, {"subject": subject, "reason": reason}, token, LeaseDone.of
        )

    # -- admin and JSON-RPC -----------------------------------------------------------------------

    def admin_compact(self, upto_seq: int, monitor: str | None = None, *, token: str | None = None) -> Any:
        """POST /admin/compact (admin token) -> the server's reply as a dict."""
        body = _drop_none({"monitor": monitor, "upto_seq": upto_seq})
        return self._run(_Call("POST", "/admin/compact", self._tok(token), _raw, body))

    def admin_snapshot(self, *, token: str | None = None) -> Any:
        """GET /admin/snapshot (admin token) -> the server's reply as a dict."""
        return self._run(_Call("GET", "/admin/snapshot", self._tok(token), _raw))

    def rpc(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        id: int | str = 1,
        token: str | None = None,
    ) -> Any:
        """POST /rpc, one JSON-RPC 2.0 call -> its `result`; an `error` raises MonitorProtocolError built from
        `error.data` (the REST body)."""
        envelope = {"jsonrpc": "2.0", "id": id, "method": method, "params": dict(params or {})}
        return self._run(_Call("POST", "/rpc", self._tok(token), _rpc_result, envelope))

    def rpc_batch(self, calls: list[tuple[str, Mapping[str, Any]]], *, token: str | None = None) -> Any:
        """POST /rpc with a batch -> the list of replies (each `{jsonrpc, id, result|error}`), in call order."""
        envelopes = [
            {"jsonrpc": "2.0", "id": i + 1, "method": m, "params": dict(p)} for i, (m, p) in enumerate(calls)
        ]
        return self._run(_Call("POST", "/rpc", self._tok(token), _rpc_batch, envelopes))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _rpc_error(error: Mapping[str, Any]) -> MonitorProtocolError:
    data = error.get("data")
    if isinstance(data, dict) and isinstance(data.get("code"), str):
        extras = {k: v for k, v in data.items() if k not in ("code", "error")}
        return MonitorProtocolError(
            data["code"],
            str(data.get("error", error.get("message", ""))),
            ERROR_STATUS.get(data["code"], 400),
            extras,
        )
    return MonitorProtocolError(
        "INVALID", str(error.get("message", "JSON-RPC error")), 400, {"jsonrpc_code": error.get("code")}
    )


def _rpc_result(raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise MonitorProtocolError("UNEXPECTED_RESPONSE", "JSON-RPC reply is not an object", 200)
    if raw.get("error") is not None:
        raise _rpc_error(raw["error"])
    return raw.get("result")


def _rpc_batch(raw: Any) -> Any:
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


def _decode(response: httpx.Response, call: _Call) -> Any:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise _error_from_body(response.status_code, body, response.text)
    if body is None and call.parse is not _raw:
        raise MonitorProtocolError(
            "UNEXPECTED_RESPONSE", f"HTTP {response.status_code} with no JSON body", response.status_code
        )
    return call.parse(body if body is not None else {})


def _network_reason(exc: httpx.HTTPError) -> str:
    kind = type(exc).__name__
    detail = str(exc) or kind
    return f"{kind}: {detail}" if detail != kind else kind


# ---------------------------------------------------------------------------------------------- clients


class Client(_Routes):
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
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def _run(self, call: _Call) -> Any:
        try:
            response = self._http.request(
                call.method,
                self.base + call.path,
                params=call.params or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise ConnectionFailed(_network_reason(exc), self.base + call.path) from exc
        return _decode(response, call)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Routes):
    """Asynchronous client: the same methods as `Client`, each returning an awaitable."""

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
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def _perform(self, call: _Call) -> Any:
        try:
            response = await self._http.request(
                call.method,
                self.base + call.path,
                params=call.params or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise ConnectionFailed(_network_reason(exc), self.base + call.path) from exc
        return _decode(response, call)

    def _run(self, call: _Call) -> Any:
        return self._perform(call)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
