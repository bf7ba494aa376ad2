"""What a remote server's reply must be before the page uses it (the Server console, web/remote_door.py).

A server the page is pointed at is not trusted: its replies are checked before anything is read from them,
and a reply that is not what the protocol serves is refused whole, with a sentence saying where it went
wrong, instead of half drawn or crashing the page. The checks are the project's own:

- the JSON: `monitor_protocol.core.wire.loads`, the strict RFC 8259 parser every door uses (no NaN, no integer
  beyond 2^53, at most 32 levels deep: a hostile nesting cannot exhaust the page's stack), after a bound on
  the reply's size;
- every object the protocol defines (monitor, state, subscription, lease, observation, error): its JSON
  Schema in `schemas/` (jsonschema, loaded from this site like the Conformance tab's), so a subscription's
  cursor is an integer >= 0, an id matches its pattern, an observation's seq is decimal digits;
- the envelopes around them (a pull's `next`, a snapshot's list of monitors), which have no schema of
  their own: checked here, field by field.

Whatever passes is still only data: every panel escapes what it draws (ui.esc), and the page's Content
Security Policy runs no script that is not a file of this site."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.wire import nests_too_deep

MAX_REPLY_BYTES = 16 * 1024 * 1024  # the largest reply the console reads (a log page of 200 big rows)
TOKEN = re.compile(r"^[\x21-\x7e]{1,512}$")  # what the page will put in an Authorization header
V: dict[str, Any] = {}  # schema name -> jsonschema validator, filled by `ready()`


class BadReply(ValueError):
    """A reply the page will not use; the message says what was wrong, in one sentence."""


async def ready() -> str | None:
    """Load jsonschema (from this site's Pyodide lock) and the project's validators once; a sentence
    saying why not, if it could not be loaded (then the console does not connect: it would be blind)."""
    if V:
        return None
    try:
        import pyodide_js
        from pyodide.ffi import to_js

        await pyodide_js.loadPackage(to_js(["jsonschema"]))
        from monitor_protocol.core import schemas

        V.update(schemas.validators())
    except Exception as exc:  # a missing wheel shows up here as ImportError (BROWSER.md: loadPackage)
        return f"The page could not load jsonschema to check the server's replies ({exc!r}): not connecting."
    return None


def decode(raw: bytes, where: str) -> Any:
    """The reply's JSON, parsed strictly, or BadReply."""
    if len(raw) > MAX_REPLY_BYTES:
        raise BadReply(
            f"{where}: the reply is {len(raw)} bytes; the console reads at most {MAX_REPLY_BYTES}."
        )
    if not raw:
        return None
    if nests_too_deep(raw):  # before parsing: in Pyodide a parser's recursion takes the page down
        raise BadReply(
            f"{where}: the reply nests deeper than {wire.MAX_JSON_DEPTH} levels (or its brackets do not "
            "match): not JSON the protocol allows"
        )
    try:
        return wire.loads(raw)
    except ProtocolError as err:
        raise BadReply(f"{where}: the reply is not JSON the protocol allows ({err.message})") from None


# ---------------------------------------------------------------------------------------- the pieces
def schema(name: str, value: Any, where: str) -> Any:
    """`value` valid against the project's schema `name`, or BadReply naming the first error."""
    errors = sorted(V[name].iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        e = errors[0]
        path = "/".join(str(p) for p in e.absolute_path)
        raise BadReply(f"{where}{'/' + path if path else ''}: {e.message[:200]} (schemas/{name}.json)")
    return value


def obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReply(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def integer(value: Any, where: str, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadReply(f"{where}: expected an integer >= 0, got {_kind(value)}")
    return value


def text(value: Any, where: str, optional: bool = False, limit: int = 256) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise BadReply(f"{where}: expected a string of at most {limit} characters, got {_kind(value)}")
    return value


def each(value: Any, where: str, check: Callable[[Any, str], Any]) -> list[Any]:
    if not isinstance(value, list):
        raise BadReply(f"{where}: expected a list, got {_kind(value)}")
    return [check(item, f"{where}/{i}") for i, item in enumerate(value)]


def token(value: Any, where: str) -> str:
    if not isinstance(value, str) or not TOKEN.match(value):
        raise BadReply(f"{where}: expected a token (1-512 printable ASCII characters, no spaces)")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)
    return type(value).__name__.replace("dict", "an object").replace("list", "a list")


# ---------------------------------------------------------------------------------------- the replies
def discovery(body: Any, where: str) -> dict[str, Any]:
    body = obj(body, where)
    each(body.get("supportedVersions"), f"{where}/supportedVersions", text)
    return body


def monitors(body: Any, where: str) -> dict[str, Any]:
    body = obj(body, where)
    each(body.get("monitors"), f"{where}/monitors", lambda m, w: schema("monitor", m, w))
    return body


def observations(value: Any, where: str) -> list[dict[str, Any]]:
    return each(value, where, lambda o, w: schema("observation", o, w))


def log(body: Any, where: str) -> dict[str, Any]:
    """A page of the log: GET /admin/log, or a pull (a replay) with its cursor."""
    body = obj(body, where)
    integer(body.get("head"), f"{where}/head")
    integer(body.get("next"), f"{where}/next")
    integer(body.get("retention_floor"), f"{where}/retention_floor", optional=True)
    if "cursor" in body:
        integer(body["cursor"], f"{where}/cursor")
    observations(body.get("observations"), f"{where}/observations")
    return body


def state(body: Any, where: str) -> dict[str, Any]:
    return schema("state", body, where)


def subscription(body: Any, where: str) -> dict[str, Any]:
    return schema("subscription", body, where)


def snapshot(body: Any, where: str) -> dict[str, Any]:
    """GET /admin/snapshot: {taken_at, monitors: [{monitor, state, subscriptions, leases}]}."""
    body = obj(body, where)
    text(body.get("taken_at"), f"{where}/taken_at", optional=True, limit=64)

    def entry(e: Any, w: str) -> dict[str, Any]:
        e = obj(e, w)
        schema("monitor", e.get("monitor"), f"{w}/monitor")
        if e.get("state") is not None:
            schema("state", e["state"], f"{w}/state")
        each(e.get("subscriptions") or [], f"{w}/subscriptions", lambda s, ws: schema("subscription", s, ws))
        each(e.get("leases") or [], f"{w}/leases", lambda x, wl: schema("lease", x, wl))
        return e

    each(body.get("monitors"), f"{where}/monitors", entry)
    return body


def error(body: Any, where: str) -> dict[str, Any]:
    """A refusal: the protocol's error body, and the extras the page reads from it typed."""
    body = schema("error", body, where)
    text(body.get("holder"), f"{where}/holder", optional=True)
    integer(body.get("retention_floor"), f"{where}/retention_floor", optional=True)
    text(body["error"], f"{where}/error", limit=4096)
    return body


# What the page reads from the answer to each of its calls (method, path below /mp/v0): checked before.
def _created(body: Any, where: str) -> Any:
    body = obj(body, where)
    schema("monitor", body.get("monitor"), f"{where}/monitor")
    token(body.get("owner_token"), f"{where}/owner_token")
    if body.get("subscribe_token") is not None:
        token(body["subscribe_token"], f"{where}/subscribe_token")
    return body


def _published(body: Any, where: str) -> Any:
    body = obj(body, where)
    integer(body.get("seq"), f"{where}/seq")
    schema("observation", body.get("observation"), f"{where}/observation")
    return body


def _subscribed(body: Any, where: str) -> Any:
    body = obj(body, where)
    schema("subscription", body.get("subscription"), f"{where}/subscription")
    token(body.get("token"), f"{where}/token")
    return body


def _acked(body: Any, where: str) -> Any:
    body = obj(body, where)
    integer(body.get("cursor"), f"{where}/cursor")
    return body


def _leased(body: Any, where: str) -> Any:
    body = obj(body, where)
    if body.get("lease") is not None:
        schema("lease", body["lease"], f"{where}/lease")
    if "dead_letter" in body and not isinstance(body["dead_letter"], bool):
        raise BadReply(f"{where}/dead_letter: expected true or false, got {_kind(body['dead_letter'])}")
    return body


SEG = r"[^/]+"
ROUTES: list[tuple[str, re.Pattern[str], Callable[[Any, str], Any]]] = [
    ("GET", re.compile(r"/discover"), discovery),
    ("GET", re.compile(r"/monitors"), monitors),
    ("POST", re.compile(r"/monitors"), _created),
    ("GET", re.compile(rf"/monitors/{SEG}/state"), state),
    ("POST", re.compile(rf"/monitors/{SEG}/observations"), _published),
    ("POST", re.compile(r"/subscriptions"), _subscribed),
    ("GET", re.compile(rf"/subscriptions/{SEG}"), subscription),
    ("GET", re.compile(rf"/subscriptions/{SEG}/pull"), log),
    ("POST", re.compile(rf"/subscriptions/{SEG}/ack"), _acked),
    ("POST", re.compile(rf"/subscriptions/{SEG}/leases/\w+"), _leased),
    ("GET", re.compile(r"/admin/snapshot"), snapshot),
    ("GET", re.compile(r"/admin/log"), log),
]


def answer(method: str, path: str, status: int, body: Any) -> Any:
    """The body of the server's answer to `method path`, checked for what the page reads from it (a
    refusal: the error body), or BadReply. Any other route's answer must at least be a JSON object."""
    # a place in the body is a JSON pointer after `#` ("GET /monitors (200) at #/monitors/1/head: ...")
    where = f"{method} {path} ({status}) at #"
    if not 200 <= status < 600:
        raise BadReply(f"{method} {path}: {status} is not an HTTP status the protocol answers with")
    if status >= 400:
        return error(body, where)
    for m, pattern, check in ROUTES:
        if m == method and pattern.fullmatch(path):
            return check(body, where)
    return obj(body, where) if body is not None else None
