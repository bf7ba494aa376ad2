"""Transport-free HTTP messages shared by every door (the HTTP server, the browser shim, tests), and the one
way a refusal becomes an HTTP reply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError

# extras["needs"] -> how the credential is named in the sentence
CREDENTIAL_LABELS: dict[str, str] = {
    "owner_token": "owner token",
    "subscribe_token": "subscribe token",
    "reader_token": "reader token",
    "registration_token": "registration token",
    "admin_token": "admin token",
}


class Headers(dict[str, str]):
    """A request's headers as a door read them: names lower-cased, values text. The router takes them as they
    are; any other mapping an embedder passes is read and checked first (RestRouter.check_request)."""

    __slots__ = ()


@dataclass
class Request:
    method: str
    path: str  # e.g. "/mp/v0/monitors/ci/state", without the query string
    query: list[tuple[str, str]] = field(default_factory=list)  # decoded pairs, in order
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    body: bytes = b""
    # Set by a door that writes the reply with wire.encode and reads nothing of it (mp serve's HTTP door):
    # a pull's rows may then be their stored JSON text, as the codec's raw values (MonitorService.pull's
    # `raw`). A door that reads the rows (SSE, push, MCP) leaves it False.
    door_encodes: bool = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class LongPoll:
    """Set on an empty pull asked to wait: the door may wait for an append to `monitor`, then ask again."""

    monitor: str
    wait_seconds: float
    # the request that re-checks (the door sets its `wait` to what is left); None: the original request
    again: Request | None = None
    # The same pull again, without the router: the engine call with the arguments this request parsed,
    # and the headers its reply carries (a woken reader's re-check costs the rule, not the route). Its
    # reply says, with its own long_poll, whether the reader still waits.
    rerun: Callable[[], Response] | None = None
    # A pull's own arguments (subscription, token, cursor, limit, filter): a door that re-checks many woken
    # readers at once hands them to the engine together (MonitorService.pull_many). With them, what the
    # reply carries besides its body: the request's headers (CORS) and its route.
    pull: tuple[Any, ...] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    route: str | None = None
    # Where the door writes the final reply of a woken re-check at once, from the engine's answer (the HTTP
    # door's connection): the 1,000 readers one append woke get their replies in that one callback, not
    # each after its own chain of task steps. None: the reply comes back through the wait (parking.hold).
    reply_now: Callable[[Response], None] | None = None


@dataclass
class Response:
    status: int
    body: Any = None  # JSON-able; None means no body
    headers: dict[str, str] = field(default_factory=dict)
    long_poll: LongPoll | None = None
    route: str | None = None  # the route template that answered (/mp/v0/monitors/{id}), set by the router
    # Another reply whose body equals this one's but for its "subscription", with the same status (a woken
    # reader in the place of one answered before it, MonitorService.pull_many's `same`): a door may write
    # this reply from that one's encoded bytes. A hint only: a door that does checks the headers itself.
    like: Response | None = field(default=None, repr=False, compare=False)
    # What a door kept of this reply's encoded form for the replies `like` it (the HTTP door's, see
    # doors/http/protocol.py); never set by anything else.
    encoded: Any = field(default=None, init=False, repr=False, compare=False)

    def json_bytes(self) -> bytes:
        if self.body is None:
            return b""
        return wire.encode(self.body)


def pull_has_news(body: Any) -> bool:
    """Whether a pull's reply is answered at once rather than held by a long poll: it holds observations, or a
    bounded scan's `next` to read on from, or the cursor moved by the reset policy (said once, by this reply:
    a later re-check would not say it)."""
    return bool(body.get("observations") or body.get("scan_capped") or body.get("reset"))


def bearer_hint(message: str, needs: object) -> str:
    """`message` with the HTTP way to send the credential `needs`; unchanged when `needs` names none."""
    label = CREDENTIAL_LABELS.get(needs) if isinstance(needs, str) else None
    if label is None:
        return message
    return f"{message.rstrip()} Send Authorization: Bearer <{label}>."


def with_bearer_hint(err: ProtocolError) -> ProtocolError:
    """The same refusal, its sentence carrying the HTTP hint for a missing or wrong credential (a new error:
    the engine's sentence stays neutral, each door says how to send the credential its own way)."""
    if err.code != "UNAUTHORIZED":
        return err
    message = bearer_hint(err.message, err.extras.get("needs"))
    if message == err.message:
        return err
    # Not rebuilt through the constructor (whose signature is the engine's business): every attribute the
    # engine set is kept, only the sentence changes.
    hinted = type(err).__new__(type(err), message)
    hinted.__dict__.update(vars(err))
    hinted.message = message
    return hinted


def error_response(err: ProtocolError, headers: dict[str, str] | None = None) -> Response:
    """A refusal as an HTTP reply: its status, its body (the bearer hint added, text made safe to encode)
    and the transport headers it asks for (Retry-After on a 503), plus `headers`."""
    return Response(err.status, wire.scrub(with_bearer_hint(err).body()), {**err.headers, **(headers or {})})
