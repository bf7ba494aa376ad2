"""JSON-RPC 2.0 at /mp/v0/rpc (single and batch): the same methods as REST, errors numbered -32000..-32018."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from .. import wire
from ..errors import ProtocolError, internal_failure
from ..service import MonitorService
from ..store.base import StorageError
from ..vocab import JSONRPC_CODE, MAX_RPC_BATCH
from .messages import Response

log = logging.getLogger("monitor_protocol.jsonrpc")

Params = dict[str, Any]


def _strip(params: Params, *names: str) -> Params:
    return {k: v for k, v in params.items() if k not in names}


def _need(params: Params, name: str) -> Any:
    if name not in params:
        raise ProtocolError("INVALID", f"params.{name} is required for this method.")
    return params[name]


def _monitor_id(params: Params) -> Any:
    return params["id"] if "id" in params else _need(params, "monitor")


METHODS: dict[str, Callable[[MonitorService, Params, str | None], Any]] = {
    "monitors/discover": lambda s, p, t: s.discover(),
    "monitors/list": lambda s, p, t: s.list_monitors(t),
    "monitors/get": lambda s, p, t: s.get_monitor(_monitor_id(p), t),
    "monitors/create": lambda s, p, t: s.create_monitor(p, t),
    "monitors/state": lambda s, p, t: s.state(_monitor_id(p), t),
    "monitors/update": lambda s, p, t: s.configure(_monitor_id(p), "update", _strip(p, "id", "monitor"), t),
    "monitors/pause": lambda s, p, t: s.configure(_monitor_id(p), "pause", _strip(p, "id", "monitor"), t),
    "monitors/resume": lambda s, p, t: s.configure(_monitor_id(p), "resume", _strip(p, "id", "monitor"), t),
    "monitors/retire": lambda s, p, t: s.configure(_monitor_id(p), "retire", _strip(p, "id", "monitor"), t),
    "monitors/publish": lambda s, p, t: s.publish(_monitor_id(p), _strip(p, "id", "monitor"), t),
    "feeds/subscribe": lambda s, p, t: s.subscribe(p, t),
    "feeds/pull": lambda s, p, t: s.pull(
        _need(p, "subscription"), t, cursor=p.get("cursor"), limit=p.get("limit"), filter=p.get("filter")
    ),
    "feeds/ack": lambda s, p, t: s.ack(_need(p, "subscription"), t, _strip(p, "subscription")),
    "feeds/seek": lambda s, p, t: s.seek(_need(p, "subscription"), t, _strip(p, "subscription")),
    "feeds/renew": lambda s, p, t: s.renew(_need(p, "subscription"), t),
    "feeds/retire": lambda s, p, t: s.retire_subscription(
        _need(p, "subscription"), t, _strip(p, "subscription")
    ),
}
for _action in ("claim", "renew", "complete", "release", "reject"):
    METHODS[f"leases/{_action}"] = lambda s, p, t, a=_action: s.lease(
        _need(p, "subscription"), t, a, _strip(p, "subscription")
    )


def _error(id_: Any, code: int, message: str, data: dict[str, Any]) -> dict[str, Any]:
    error = {"code": code, "message": message, "data": data}
    return {"jsonrpc": "2.0", "id": wire.scrub(id_), "error": wire.scrub(error)}


def _invalid_body(message: str) -> dict[str, Any]:
    return {"code": "INVALID", "error": message, "done": []}


def call_one(service: MonitorService, msg: Any, bearer: str | None) -> dict[str, Any] | None:
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
        text = 'A JSON-RPC request is {"jsonrpc": "2.0", "method": "...", "params": {...}, "id": 1}.'
        return _error(msg.get("id") if isinstance(msg, dict) else None, -32600, text, _invalid_body(text))
    id_ = msg.get("id")
    is_notification = "id" not in msg
    method = METHODS.get(msg["method"])
    if method is None:
        text = f"No method {msg['method']!r}; methods: {', '.join(sorted(METHODS))}."
        body = {"code": "NOT_FOUND", "error": text, "done": []}
        return None if is_notification else _error(id_, -32601, text, body)
    params = msg.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        text = "params must be an object (named parameters)."
        return None if is_notification else _error(id_, -32602, text, _invalid_body(text))
    token = params.get("token") if isinstance(params.get("token"), str) else bearer
    params = _strip(params, "token")
    try:
        result = method(service, params, token)
    except ProtocolError as err:
        return None if is_notification else _error(id_, err.jsonrpc_code, err.message, err.body())
    except Exception:  # never a transport-level failure for one bad call; a bug is not bad input
        incident = uuid.uuid4().hex[:12]
        log.exception("incident %s: unexpected error in JSON-RPC %s", incident, msg["method"])
        err = internal_failure(incident)
        return None if is_notification else _error(id_, err.jsonrpc_code, err.message, err.body())
    return None if is_notification else {"jsonrpc": "2.0", "id": id_, "result": result}


def handle(service: MonitorService, raw: bytes, bearer: str | None) -> Response:
    try:
        payload = wire.loads(raw) if raw and raw.strip() else None
    except ProtocolError as err:
        return Response(200, _error(None, -32700, err.message, err.body()))
    if isinstance(payload, list):
        if not payload:
            text = "An empty batch is not a request."
            return Response(200, _error(None, -32600, text, _invalid_body(text)))
        if len(payload) > MAX_RPC_BATCH:
            err = ProtocolError(
                "TOO_LARGE",
                f"A JSON-RPC batch holds at most {MAX_RPC_BATCH} calls (this one {len(payload)}); "
                "split it into several batches.",
                limit=MAX_RPC_BATCH,
            )
            return Response(413, _error(None, JSONRPC_CODE["TOO_LARGE"], err.message, err.body()))
        # One batch, one group commit where the store has one (each call still rolls back alone).
        group = getattr(service.store, "batch", None)
        try:
            with group() if group is not None else contextlib.nullcontext():
                replies = [r for r in (call_one(service, m, bearer) for m in payload) if r is not None]
        except StorageError as exc:  # the group commit itself failed: nothing of the batch was written
            from ..errors import storage_unavailable

            err = storage_unavailable(str(exc) or type(exc).__name__)
            return Response(503, err.body(), dict(err.headers))
        return Response(200, replies) if replies else Response(204, None)
    reply = call_one(service, payload, bearer)
    return Response(200, reply) if reply is not None else Response(204, None)
