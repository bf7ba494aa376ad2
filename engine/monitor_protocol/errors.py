"""ProtocolError: one refusal, with a code from the closed list, a sentence and the extras PROTOCOL.md names."""

from __future__ import annotations

from typing import Any

from .vocab import ERROR_STATUS, JSONRPC_CODE


class ProtocolError(Exception):
    """A refusal the protocol defines. `extras` travel in the error body beside code, error and done."""

    def __init__(self, code: str, message: str, **extras: Any) -> None:
        if code not in ERROR_STATUS:
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.extras = extras

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.code]

    @property
    def jsonrpc_code(self) -> int:
        return JSONRPC_CODE[self.code]

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "error": self.message, "done": []}
        out.update(self.extras)
        return out

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, {self.extras!r})"
