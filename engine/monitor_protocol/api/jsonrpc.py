"""JSON-RPC 2.0 at /mp/v0/rpc (single and batch): the same methods as REST, errors numbered -32000..-32018."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from monitor_protocol.api import operations
from monitor_protocol.api.messages import Response, with_bearer_hint
from monitor_protocol.api.operations import Operation, Param
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError, internal_failure
from monitor_protocol.core.rules.page_bytes import shared_page_bytes
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.store_contract import GroupConflict, StorageError
from monitor_protocol.core.validation import as_int, json_kind
from monitor_protocol.core.vocab import JSONRPC_CODE, MAX_RPC_BATCH

log = logging.getLogger("monitor_protocol.jsonrpc")

Params = dict[str, Any]


def _strip(params: Params, *names: str) -> Params:
    return {k: v for k, v in params.items() if k not in names}


def _need(params: Params, name: str) -> Any:
    if name not in params:
        raise ProtocolError("INVALID", f"params.{name} is required for this method.")
    return params[name]


def _path_value(params: Params, param: Param) -> Any:
    """A path parameter from params: the first alias present (`id`, else `monitor`), else the last one is
    required."""
    for name in param.aliases[:-1]:
        if name in params:
            return params[name]
    return _need(params, param.aliases[-1])


Method = Callable[[MonitorService, Params, str | None], Any]
# Params that a GET reads from its query as text, and a JSON-RPC call receives as JSON (so integers only)
JSON_INTEGERS = frozenset(("cursor", "limit"))


def _method(op: Operation) -> Method:
    """The JSON-RPC method of one table operation: params are the REST body plus the path ids (under
    their aliases), which are taken out of the body."""
    ids = tuple(name for p in op.path_params for name in p.aliases)
    # A method whose params are read by name (no body handed to the engine, which judges its own): a name
    # it does not read is refused, never dropped (a `wait` ignored would answer at once as if it waited).
    named = (
        None
        if "body" in op.call
        else {*ids, *(p.name for p in op.params if p.where != "path" and "jsonrpc" in p.doors)}
    )

    def run(service: MonitorService, params: Params, token: str | None) -> Any:
        if named is not None and not params.keys() <= named:
            raise _unread(op, params.keys() - named, named)
        for name in JSON_INTEGERS & params.keys():
            if isinstance(params[name], str):  # params are JSON, as a body is: "5" is not 5 (REST's rule)
                as_int(params[name], name, text=False)
        path = {p.name: _path_value(params, p) for p in op.path_params}
        return operations.invoke(service, op, path, _strip(params, *ids), token, params)

    return run


def _unread(op: Operation, unknown: set[str], known: set[str]) -> ProtocolError:
    names = sorted(name[:64] for name in unknown)[:10]
    if op.name == "pull" and "wait" in unknown:
        text = (
            f"{op.jsonrpc} does not wait: a JSON-RPC call is answered at once. Long-poll with POST "
            '/mp/v0/subscriptions/{id}/pull {"wait": <seconds>} (or GET ...?wait=), or stream with SSE.'
        )
    else:
        text = f"Unknown params {names} for {op.jsonrpc}; it reads {sorted(known) or 'none'} (and token)."
    return ProtocolError("INVALID", text, invalid=names)


METHODS: dict[str, Method] = {name: _method(op) for name, op in operations.BY_JSONRPC.items()}


def too_large(err: ProtocolError) -> Response:
    """413 with a JSON-RPC error (-32016, id null): a batch of too many calls, or a body over the cap sent to
    the JSON-RPC endpoint (the HTTP door refuses that one before the body is read, doors/http/app.py)."""
    return Response(413, _error(None, JSONRPC_CODE["TOO_LARGE"], err.message, err.body()))


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
    if not (id_ is None or type(id_) in (str, int, float)):  # JSON-RPC 2.0: a string, a number or null
        text = f"The id must be a string, a number or null, not {json_kind(id_)}."
        return _error(None, -32600, text, _invalid_body(text))
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
    given = params.get("token")
    if given is not None and not isinstance(given, str):
        text = f"params.token must be a string (a bearer token), not {json_kind(given)}; or leave it out."
        return None if is_notification else _error(id_, -32602, text, _invalid_body(text))
    token = given if isinstance(given, str) else bearer
    params = _strip(params, "token")
    try:
        result = method(service, params, token)
    except ProtocolError as refused:
        err = with_bearer_hint(refused)
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
            return too_large(err)
        # One batch, one group commit where the store has one (each call still rolls back alone).
        group = getattr(service.store, "batch", None)
        try:
            with group() if group is not None else contextlib.nullcontext(), shared_page_bytes():
                replies = [r for r in (call_one(service, m, bearer) for m in payload) if r is not None]
        except GroupConflict:
            # Rolled back, nothing of it kept (a shared store found a row it remembered changed, or refused
            # one call's statement): every call once more, each in a transaction of its own.
            service.drop_appends()
            with shared_page_bytes():
                replies = [r for r in (call_one(service, m, bearer) for m in payload) if r is not None]
        except StorageError as exc:  # the group commit itself failed: nothing of the batch was written
            from monitor_protocol.core.errors import storage_unavailable

            service.drop_appends()
            err = storage_unavailable(str(exc) or type(exc).__name__)
            return Response(503, err.body(), dict(err.headers))
        else:
            service.release_appends()  # a shared store's group holds its appends for after its commit
        return Response(200, replies) if replies else Response(204, None)
    reply = call_one(service, payload, bearer)
    return Response(200, reply) if reply is not None else Response(204, None)
