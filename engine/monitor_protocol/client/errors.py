"""What the client raises: a subclass of `MonitorProtocolError` per error code of the protocol (`ERROR_CLASSES`), `UnexpectedResponse` for a reply that is not the protocol's, and `ConnectionFailed` when the server could not be reached or did not answer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from monitor_protocol.client import httpreply

if TYPE_CHECKING:
    import httpx  # imported where a client uses it: `import monitor_protocol.client` stays light

# In a browser (Pyodide) the browser sends (webhttp); keepalive needs sockets and `ssl`, which it lacks.


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
    only what is safe to repeat (`publish` with an `idempotency_key`, ack, pull).

    `retryable` is False when trying again cannot help and nothing left this process: the client is closed, or
    the request is not HTTP (a token with a line break). `retries=` does not retry those."""

    def __init__(self, reason: str, url: str = "", *, sent: bool = True, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.url = url
        self.sent = sent
        self.retryable = retryable

    @property
    def outcome_unknown(self) -> bool:
        """The same as `sent`: the request may have been applied."""
        return self.sent

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_connection_failed, (self.reason, self.url, self.sent, self.retryable))

    def __repr__(self) -> str:
        return f"ConnectionFailed({self.reason!r}, {self.url!r}, sent={self.sent})"


def _rebuild_connection_failed(reason: str, url: str, sent: bool, retryable: bool = True) -> ConnectionFailed:
    return ConnectionFailed(reason, url, sent=sent, retryable=retryable)


def not_sent_errors() -> tuple[type[Exception], ...]:
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


def retry_after_of(response: httpx.Response | httpreply.Reply) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing for a retry hint
    return seconds if seconds >= 0 else None


def error_from_body(
    status: int, body: Any, text: str, retry_after: float | None = None
) -> MonitorProtocolError:
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        extras = {k: v for k, v in body.items() if k not in ("code", "error")}
        return error_for(body["code"], str(body.get("error", "")), status, extras, retry_after=retry_after)
    sentence = text.strip()[:200] or "no body"
    if sentence[:1] == "<":  # a web page: another server (or a proxy) answered, not a Monitor Protocol one
        said = " ".join(re.sub(r"<[^>]*>", " ", text[:2000]).split())[:80]  # its words, without the markup
        sentence = (
            f"an HTML page ({said!r}): a proxy in front of the server refused the request as too large (its "
            "body limit, nginx's client_max_body_size, is below the server's --max-body); send less at once, "
            "or raise the proxy's limit"
            if status == 413
            else f"an HTML page ({said!r}), not a Monitor Protocol reply: is the base URL the address of an mp "
            "serve (its API is under /mp/v0), and does nothing in between answer for it?"
        )
    return UnexpectedResponse(
        "UNEXPECTED_RESPONSE",
        f"HTTP {status} without a protocol error: {sentence}",
        status,
        retry_after=retry_after,
    )
