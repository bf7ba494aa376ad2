"""ProtocolError: one refusal, with a code from the closed list, a sentence and the extras docs/protocol.md names."""

from __future__ import annotations

from typing import Any

from monitor_protocol.core.vocab import ERROR_STATUS, JSONRPC_CODE


class ProtocolError(Exception):
    """A refusal the protocol defines. `extras` travel in the error body beside code, error and done."""

    def __init__(self, code: str, message: str, *, http_status: int | None = None, **extras: Any) -> None:
        if code not in ERROR_STATUS:
            raise ValueError(f"unknown protocol error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.extras = extras
        # Only an internal failure overrides the table (UNAVAILABLE as 503, docs/protocol.md section 10).
        self.http_status = http_status

    @property
    def status(self) -> int:
        return self.http_status or ERROR_STATUS[self.code]

    @property
    def headers(self) -> dict[str, str]:
        """Transport headers the refusal asks for: Retry-After when the client should simply retry."""
        retry = self.extras.get("retry_after")
        return {"retry-after": str(retry)} if isinstance(retry, int) else {}

    @property
    def jsonrpc_code(self) -> int:
        return JSONRPC_CODE[self.code]

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "error": self.message, "done": []}
        out.update(self.extras)
        return out

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.message!r}, {self.extras!r})"


STORAGE_RETRY_AFTER_SECONDS = 1


def storage_unavailable(detail: str, *, outcome_unknown: bool = False) -> ProtocolError:
    """A storage failure (disk full, I/O error, a database that went away) is not bad input: 503
    UNAVAILABLE, retry later. `outcome_unknown`: the failure came during the commit itself (a connection
    to the database lost mid-COMMIT), so the request may have been written after all."""
    if outcome_unknown:
        said = (
            "the request may have been written before the connection was lost. Retry in a moment: a publish "
            "with the same idempotency_key (or Idempotency-Key) is then answered once, and an ack is the same"
        )
        extras = {"outcome": "unknown"}
    else:
        said, extras = "nothing of this request was written. Retry in a moment", {}
    return ProtocolError(
        "UNAVAILABLE",
        f"The server's storage failed ({detail}); {said}.",
        http_status=503,
        retry_after=STORAGE_RETRY_AFTER_SECONDS,
        storage=True,
        **extras,
    )


def internal_failure(incident: str) -> ProtocolError:
    """A bug in the server is not bad input either: 503 UNAVAILABLE naming the logged incident."""
    return ProtocolError(
        "UNAVAILABLE",
        f"The server failed while handling this request (incident {incident}, logged on the server); "
        "nothing of it was written. Retry, and report the incident if it keeps failing.",
        http_status=503,
        retry_after=STORAGE_RETRY_AFTER_SECONDS,
        incident=incident,
    )
