"""What `mp mcp` reads on stdio, line by line, before the MCP SDK does. The SDK's stdio reader drops a line it
cannot parse without a reply, so the client waits for its own timeout: a line that is not JSON, or a
request holding a lone surrogate (JSON can spell one, `"\\ud800"`; the SDK's parser refuses it). This screen
hands the SDK every line it can read and answers the others as JSON-RPC 2.0 says: not JSON is -32700 with
a null id; a request with a lone surrogate is -32602 naming the rule (docs/protocol.md section 10); any
other request the SDK cannot read is -32600. A notification gets no reply (JSON-RPC), a line on stderr.

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

log = logging.getLogger("monitor_protocol.mcp")


def readable(line: str) -> bool:
    """Whether the SDK's reader parses this line (it drops one it cannot, without a reply). The SDK parses it
    again: a second parse per message, tens of µs for an agent's call, against a client left hanging."""
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:
        return False
    return True


def refusal_for(line: str) -> types.JSONRPCError | None:
    """The error reply to a line the SDK cannot read; None when nothing is answered (a blank line, a
    notification, a message with no usable id)."""
    if not line.strip():
        return None
    try:
        value: Any = json.loads(line)
    except ValueError as exc:
        return _error(
            None,
            types.PARSE_ERROR,
            f"Parse error: the line is not JSON ({exc}); send one JSON-RPC message per line.",
        )
    ident = value.get("id") if isinstance(value, dict) else None
    if isinstance(ident, str) and wire.problem(ident) is not None:
        ident = None  # an id that cannot be written back as UTF-8 is not echoed
    if isinstance(ident, bool) or not isinstance(ident, int | str):
        log.warning(
            "a line on stdin with no usable id was not read: %s", wire.problem(value) or "not a request"
        )
        return None
    problem = wire.problem(value)
    if problem is not None:
        return _error(ident, types.INVALID_PARAMS, f"Invalid params: {problem}")
    return _error(
        ident,
        types.INVALID_REQUEST,
        'Invalid request: not a JSON-RPC 2.0 message this server can read (jsonrpc "2.0", a string method, '
        "params an object).",
    )


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
                refusal = refusal_for(line)
                if refusal is not None:
                    await self._ready.wait()
                    await self._replies.send(SessionMessage(refusal))
        finally:
            await self._source.aclose()
