"""What `mp mcp` reads on stdio, line by line, before the MCP SDK does. The SDK's stdio reader drops a line it
cannot parse without a reply, so the client waits for its own timeout: a line that is not JSON, or a
request holding a lone surrogate (JSON can spell one, `"\\ud800"`; the SDK's parser refuses it). This screen
hands the SDK every line it can read and answers the others as JSON-RPC 2.0 says: not JSON is -32700 with
a null id (so is a line nested deeper than 32 levels, or holding a number of more than 4,300 digits); a
request with a lone surrogate is -32602 naming the rule (docs/protocol.md section 10); any other request the
SDK cannot read is -32600, with a null id when its id cannot be read (a JSON value that is not an object, an
id that is an object), and a batch (MCP has none) gets -32600 for each id in it. A notification gets no reply
(JSON-RPC), a line on stderr.

Reading stdin here means the SDK does not point fd 0 at /dev/null while it serves; nothing `mp mcp` starts
reads it (a source's processes get /dev/null: doors/sources/processes.py)."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

from monitor_protocol.core import wire
from monitor_protocol.core.vocab import MAX_JSON_DEPTH

log = logging.getLogger("monitor_protocol.mcp")


def readable(line: str) -> bool:
    """Whether the SDK's reader parses this line (it drops one it cannot, without a reply). The SDK parses it
    again: a second parse per message, tens of µs for an agent's call, against a client left hanging."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:
        return False
    if isinstance(message, types.JSONRPCNotification) and '"id"' in line:
        # A request whose id is not a string or an integer passes as a notification, which gets no reply.
        try:
            return "id" not in json.loads(line)
        except (ValueError, RecursionError):
            return False
    return True


def refusals_for(line: str) -> list[types.JSONRPCError]:
    """The error replies to a line the SDK cannot read; none for a blank line or a notification."""
    if not line.strip():
        return []
    if wire.nests_too_deep(line.encode("utf-8", "surrogatepass")):  # before a recursive parser goes in
        return [
            _error(
                None, types.PARSE_ERROR, f"Parse error: the line nests deeper than {MAX_JSON_DEPTH} levels."
            )
        ]
    try:
        value: Any = json.loads(line)
    except (ValueError, RecursionError) as exc:
        why = (
            "a number in it has more than 4,300 digits"
            if "integer string conversion" in str(exc)
            else f"the line is not JSON ({exc})"
        )
        return [_error(None, types.PARSE_ERROR, f"Parse error: {why}; send one JSON-RPC message per line.")]
    if isinstance(value, list):
        # A batch: MCP has none (one message a line). Each id is told so, never left waiting.
        told = [
            _error(i, types.INVALID_REQUEST, BATCH) for i in (_usable_id(m) for m in value) if i is not None
        ]
        return told or [_error(None, types.INVALID_REQUEST, BATCH)]
    if isinstance(value, dict) and "id" not in value:
        log.warning(
            "a notification on stdin was not read: %s", wire.problem(value) or "not one this server reads"
        )
        return []  # a notification is not answered (JSON-RPC 2.0), even when wrong
    ident = _usable_id(value)
    if ident is None:  # JSON-RPC 2.0: an error whose request's id cannot be read carries a null id
        return [_error(None, types.INVALID_REQUEST, f"Invalid request: {NOT_READ}")]
    problem = wire.problem(value)
    if problem is not None:
        return [_error(ident, types.INVALID_PARAMS, f"Invalid params: {problem}")]
    return [_error(ident, types.INVALID_REQUEST, f"Invalid request: {NOT_READ}")]


NOT_READ = (
    'not a JSON-RPC 2.0 message this server can read (an object with jsonrpc "2.0", a string method, params an '
    "object, and an id that is a string or an integer)."
)
BATCH = "Invalid request: a batch (a JSON array) is not read here; MCP sends one message a line."


def _usable_id(value: Any) -> int | str | None:
    ident = value.get("id") if isinstance(value, dict) else None
    if isinstance(ident, str) and wire.problem(ident) is not None:
        return None  # an id that cannot be written back as UTF-8 is not echoed
    if isinstance(ident, bool) or not isinstance(ident, int | str):
        return None
    return ident


def _error(ident: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=ident, error=types.ErrorData(code=code, message=message))


class ScreenedStdin:
    """Stdin's lines for `stdio_server(stdin=...)`; answers the unreadable ones on the SDK's write stream,
    given by `answer_on` once the server has it (a line that comes before waits for it)."""

    def __init__(self) -> None:
        # A duplicate of fd 0, so closing this reader never closes the process's own stdin.
        raw = os.fdopen(os.dup(0), "rb", buffering=0)
        self._source = anyio.wrap_file(
            io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace")
        )
        self._replies: Any = None
        self._ready = anyio.Event()

    def answer_on(self, write_stream: Any) -> None:
        self._replies = write_stream
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        try:
            async for line in self._source:
                if readable(line):
                    yield line
                    continue
                refusals = refusals_for(line)
                if refusals:
                    await self._ready.wait()
                for refusal in refusals:
                    await self._replies.send(SessionMessage(refusal))
        finally:
            await self._source.aclose()
