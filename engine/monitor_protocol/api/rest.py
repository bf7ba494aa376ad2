"""The transport-free REST binding (docs/protocol.md section 5): Request -> Response, onto MonitorService.

Every door (the ASGI server, the browser's service-worker shim, the tests) shares this one router. It never
raises: malformed input of any kind is a 4xx with a code from the closed list and a sentence."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

from monitor_protocol.api import jsonrpc, operations
from monitor_protocol.api.messages import Headers, LongPoll, Request, Response, error_response, pull_has_news
from monitor_protocol.api.operations import Operation
from monitor_protocol.core import tokens, wire
from monitor_protocol.core.errors import ProtocolError, internal_failure
from monitor_protocol.core.filters import LIST_KEYS
from monitor_protocol.core.rules import publishing, refusals
from monitor_protocol.core.service import MonitorService
from monitor_protocol.core.validation import as_int
from monitor_protocol.core.vocab import (
    DEFAULT_MAX_BODY,
    FILTER_KEYS,
    MAX_LIMIT,
    MAX_WAIT_SECONDS,
    TAG_KEY_PATTERN,
)

log = logging.getLogger("monitor_protocol.rest")

PREFIX = "/mp/v0"
CORS_METHODS = "GET, POST, OPTIONS"
# Idempotency-Key: a browser producer retries a publish safely with it (docs/protocol.md section 6)
CORS_HEADERS = "Authorization, Content-Type, Idempotency-Key, Last-Event-ID"

Handler = Callable[["RestRouter", Request, dict[str, str]], Response]
_ROUTES: list[tuple[str, re.Pattern[str], Handler]] = []
_LABELS: dict[
    re.Pattern[str], str
] = {}  # each route's template, e.g. /mp/v0/monitors/{id} (the metrics' label)


_GROUPS: dict[tuple[int, str], list[tuple[str, re.Pattern[str], Handler]]] = {}
# The same, per method too: a request is matched only against its own method's routes (the others' regexes
# are tried only to say which methods a path has, when none of its own matched).
_BY_METHOD: dict[tuple[int, str, str], list[tuple[str, re.Pattern[str], Handler]]] = {}


def _shape(path: str) -> tuple[int, str]:
    """How many segments a path below /mp/v0 has, and its first one: a route's parameters never hold a
    slash and no route begins with a parameter, so only routes of the same shape can match."""
    first = path.split("/", 2)[1] if path.startswith("/") else ""
    return path.count("/"), first


def _candidates(path: str, method: str | None = None) -> list[tuple[str, re.Pattern[str], Handler]]:
    """The routes a path may match (of `method` only, when given), in table order (the same first match as
    trying them all)."""
    if not _GROUPS:
        for entry in _ROUTES:
            shape = _shape(_LABELS[entry[1]][len(PREFIX) :])
            _GROUPS.setdefault(shape, []).append(entry)
            _BY_METHOD.setdefault((*shape, entry[0]), []).append(entry)
    if method is None:
        return _GROUPS.get(_shape(path), [])
    return _BY_METHOD.get((*_shape(path), method), [])


def route_table() -> list[tuple[str, re.Pattern[str], Handler]]:
    """Every route as (method, regex on the path below /mp/v0, handler), in matching order."""
    return list(_ROUTES)


def route(method: str, pattern: str) -> Callable[[Handler], Handler]:
    regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$")
    _LABELS[regex] = PREFIX + pattern

    def register(fn: Handler) -> Handler:
        _ROUTES.append((method, regex, fn))
        return fn

    return register


_PUBLISH_LABEL = PREFIX + operations.BY_NAME["publish"].route
_PUBLISH_HEAD, _PUBLISH_TAIL = _PUBLISH_LABEL.split("{id}")  # /mp/v0/monitors/, /observations


# The monitor a POST to a path publishes to, or None when the route `_handle` would take for it is another:
# a publisher sends to the same path again and again. Only a publish path of a plausible length is kept
# (an id is at most 256 characters; a request line may be 64 KiB), at most 1,024 of them (emptied when full).
_PUBLISH_TARGETS: dict[str, str | None] = {}
_PUBLISH_TARGETS_MAX = 1024
_PUBLISH_PATH_KEPT = 320


def _publish_target(raw_path: str) -> str | None:
    try:
        return _PUBLISH_TARGETS[raw_path]
    except KeyError:
        pass
    if not (raw_path.startswith(_PUBLISH_HEAD) and raw_path.endswith(_PUBLISH_TAIL)):
        return None
    target = None
    path = raw_path[len(PREFIX) :].rstrip("/") or "/"
    for _m, regex, _fn in _candidates(path, "POST"):  # the route `_handle` would take, in its order
        match = regex.match(path)
        if match is not None:
            target = match["id"] if _LABELS[regex] == _PUBLISH_LABEL else None
            break
    if len(raw_path) <= _PUBLISH_PATH_KEPT:
        if len(_PUBLISH_TARGETS) >= _PUBLISH_TARGETS_MAX:
            _PUBLISH_TARGETS.clear()
        _PUBLISH_TARGETS[raw_path] = target
    return target


class _Routed(Exception):
    """A refusal from a route's handler, carrying the route it came from (for the metrics' label)."""

    def __init__(self, error: ProtocolError, label: str) -> None:
        self.error = error
        self.label = label


def bearer(req: Request) -> str | None:
    value = req.header("authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def parse_json_body(req: Request) -> Any:
    if not req.body or not req.body.strip():
        return None
    return wire.loads(req.body)  # RFC 8259 only: no NaN, no lone surrogates, bounded depth


def _as_doors_pass(headers: Any) -> bool:
    """Whether an embedder's headers are as the doors pass them: a dict of lower-cased text names to text
    values (two joins at C speed; the HTTP door's `Headers` are not asked)."""
    if headers.__class__ is not dict:
        return False
    try:
        "".join(headers.values())  # a value that is not text: TypeError
        return "".join(headers).islower() or not headers
    except TypeError:
        return False


def _names_lowered(headers: Any) -> dict[str, str]:
    """An embedder's headers as the checks and routes read them: text (bytes read as latin-1, as HTTP/1.1 and
    ASGI carry them), names lower-cased (a framework's "Origin" is the Origin the policy judges), pairs read
    as the dict they make. Anything else is INVALID."""
    out: dict[str, str] = {}
    try:
        for name, value in dict(headers).items():
            name = name.decode("latin-1") if isinstance(name, bytes | bytearray) else name
            value = value.decode("latin-1") if isinstance(value, bytes | bytearray) else value
            if not (isinstance(name, str) and isinstance(value, str)):
                raise TypeError(type(name if not isinstance(name, str) else value).__name__)
            out[name.lower()] = value
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(
            "INVALID",
            "Request.headers must be a dict (or pairs) of header names to values, text or bytes; got "
            f"{type(headers).__name__} ({exc}).",
        ) from None
    return out


# A Host header as RFC 9112 3.2 has it: one host (a bracketed IPv6 literal, or a name or IPv4 address of
# RFC 3986's reg-name characters) and an optional port. Two Host lines (joined with ", " by the HTTP door),
# userinfo (`127.0.0.1:80@evil.com`) or a broken literal (`[::1`) are not one.
_HOST = re.compile(r"(?:\[[0-9A-Za-z:.%~_-]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")


def host_name(host: str) -> str:
    """A Host header's name: lower case, without its port, and without the root's dot (`example.org.` is
    `example.org`, as DNS reads it)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).removesuffix(".")


class RestRouter:
    def __init__(
        self,
        service: MonitorService,
        *,
        admin_token: str | None = None,
        allowed_origins: tuple[str, ...] | list[str] | set[str] = (),
        allowed_hosts: set[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.service = service
        self.admin_token = admin_token
        self.allowed_origins = {o.rstrip("/") for o in allowed_origins}
        self.allowed_hosts = {h.lower() for h in allowed_hosts} if allowed_hosts is not None else None
        self.max_body = max_body

    # ------------------------------------------------------------------------------------------ entry
    def handle(self, req: Request) -> Response:
        try:
            resp = self._handle(req)
        except _Routed as routed:
            resp = error_response(routed.error)
            resp.route = routed.label
        except ProtocolError as err:
            resp = error_response(err)
        except Exception:  # a bug is not bad input: 503 naming a logged incident, never a 500 or a 400
            incident = uuid.uuid4().hex[:12]
            log.exception("incident %s: unexpected error handling %s %s", incident, req.method, req.path)
            resp = error_response(internal_failure(incident))
        return self._dressed(req, resp)

    def lone_publish(self, req: Request) -> publishing.Lone | None:
        """What `handle` would hand `MonitorService.publish` for this request (monitor id, body, token,
        Idempotency-Key header) when it is one REST publish of a JSON object that passes the request's
        checks; None for any other request (a batch, a body that does not parse, a refused Origin), which
        `handle` answers whole. Nothing is written or logged here."""
        if req.method.upper() != "POST":
            return None
        monitor_id = _publish_target(req.path)
        if monitor_id is None:
            return None
        try:
            self.check_request(req)
            body = parse_json_body(req)
        except ProtocolError:
            return None
        if not isinstance(body, dict):
            return None
        return monitor_id, body, bearer(req), req.header("idempotency-key")

    def handle_publishes(self, reqs: list[Request]) -> list[Response]:
        """Several requests in order, each answered as `handle` answers it: each run of lone publishes among
        them through one engine call (`MonitorService.publish_each`), any other request by itself."""
        answers: list[Response] = []
        run: list[tuple[Request, publishing.Lone]] = []
        for req in reqs:
            parts = self.lone_publish(req)
            if parts is not None:
                run.append((req, parts))
                continue
            answers += self._publish_each(run)
            run = []
            answers.append(self.handle(req))
        return answers + self._publish_each(run)

    def _publish_each(self, run: list[tuple[Request, publishing.Lone]]) -> list[Response]:
        if not run:
            return []
        try:
            outcomes = self.service.publish_each([parts for _req, parts in run])
        except ProtocolError as err:  # the call failed whole (its store): each of them hears it
            outcomes = [(False, err)] * len(run)
        except Exception:  # a bug is not bad input: 503 naming the logged incident, never a 500 or a 400
            incident = uuid.uuid4().hex[:12]
            log.exception("incident %s: unexpected error handling %d publishes", incident, len(run))
            outcomes = [(False, internal_failure(incident))] * len(run)
        status_for = operations.BY_NAME["publish"].result.status_for
        answers = []
        for (req, _parts), (ok, value) in zip(run, outcomes, strict=True):
            resp = Response(status_for(value), value) if ok else error_response(value)
            resp.route = _PUBLISH_LABEL
            answers.append(self._dressed(req, resp))
        return answers

    def _dressed(self, req: Request, resp: Response) -> Response:
        """A response as every route's leaves: CORS for an allowed Origin, a parked poll's rerun dressed alike."""
        headers = req.headers  # an embedder's that check_request refused (None, a value not text): no CORS
        origin = headers.get("origin") if isinstance(headers, dict) else None
        if origin.__class__ is str and origin and origin.rstrip("/") in self.allowed_origins:
            resp.headers.update(self._cors(origin))
        parked = resp.long_poll
        if parked is not None and parked.rerun is not None:
            parked.rerun = _Dressed(parked.rerun, dict(resp.headers), resp.route)
            parked.headers, parked.route = dict(resp.headers), resp.route
        return resp

    def _cors(self, origin: str) -> dict[str, str]:
        return {
            "access-control-allow-origin": origin,
            "access-control-allow-methods": CORS_METHODS,
            "access-control-allow-headers": CORS_HEADERS,
            "access-control-max-age": "600",
            "vary": "Origin",
        }

    def check_request(self, req: Request) -> None:
        """Section 10 checks that come before routing: Origin, Host, body size."""
        headers = req.headers  # the HTTP door's Headers are as they must be; an embedder's are checked
        if headers.__class__ is not Headers and not _as_doors_pass(headers):  # "Origin", bytes, pairs
            req.headers = _names_lowered(headers)  # or INVALID, the Request left as it was
        origin = req.header("origin")
        if origin is not None and origin.rstrip("/") not in self.allowed_origins:
            raise ProtocolError(
                "ORIGIN_REFUSED",
                f"Requests from origin {origin} are not allowed here; the operator can allow it with --allow-origin.",
                origin=origin,
            )
        host = req.header("host")
        if host is not None and not _HOST.fullmatch(host.strip()):
            raise ProtocolError(
                "INVALID",
                f"The Host header {host[:200]!r} is not one host and an optional port (RFC 9112 3.2: exactly "
                "one Host line, no user info); send one, such as Host: 127.0.0.1:<port>.",
            )
        if self.allowed_hosts is not None:
            # HTTP/1.1 requires a Host (RFC 9112 3.2), and the DNS rebinding guard cannot judge without one
            if host is None:
                raise ProtocolError(
                    "INVALID",
                    "The request has no Host header; send one (Host: 127.0.0.1:<port>, or a name the operator "
                    "allowed with --allow-host).",
                )
            if host_name(host) not in self.allowed_hosts:
                names = sorted(self.allowed_hosts)
                said = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                raise ProtocolError(
                    "ORIGIN_REFUSED",
                    f"Host {host!r} is not a name this server answers to (DNS rebinding guard); send one of "
                    f"{said} as the Host, or have the operator add it with --allow-host.",
                    host=host,
                )
        if req.body.__class__ is not bytes:  # an embedder's Request: the doors pass bytes
            if not isinstance(req.body, bytes | bytearray | memoryview | None):
                raise ProtocolError("INVALID", f"Request.body must be bytes, not {type(req.body).__name__}.")
            req.body = bytes(req.body or b"")
        if len(req.body) > self.max_body:
            raise ProtocolError(
                "TOO_LARGE", f"The body exceeds {self.max_body} bytes; send less.", max_body=self.max_body
            )

    def _handle(self, req: Request) -> Response:
        self.check_request(req)
        method = req.method.upper()
        if method == "OPTIONS":
            return Response(204, None)
        head = method == "HEAD"  # the GET's reply; the door sends its head only (RFC 9110 9.3.2)
        if head:
            method = "GET"
        if not (req.path == PREFIX or req.path.startswith(PREFIX + "/")):
            raise ProtocolError(
                "NOT_FOUND",
                f"No route {req.path}: the Monitor Protocol lives under /mp/v0 (start with GET /mp/v0/discover).",
            )
        path = req.path[len(PREFIX) :].rstrip("/") or "/"
        for _m, regex, fn in _candidates(path, method):
            match = regex.match(path)
            if match:
                if head and _LABELS[regex].endswith(_DELIVERING):  # a HEAD must change nothing
                    raise ProtocolError(
                        "NOT_FOUND",
                        f"HEAD is not a method of {req.path}: it delivers what it answers (and marks it "
                        "delivered); use GET.",
                    )
                try:
                    resp = fn(self, req, match.groupdict())
                except ProtocolError as err:
                    raise _Routed(err, _LABELS[regex]) from None
                resp.route = _LABELS[regex]
                return resp
        allowed = [m for m, regex, _fn in _candidates(path) if regex.match(path)]
        if allowed:
            raise ProtocolError(
                "NOT_FOUND",
                f"{method} is not a method of {req.path}; use {' or '.join(sorted(set(allowed)))}.",
            )
        raise ProtocolError(
            "NOT_FOUND",
            f"No route {method} {req.path} in /mp/v0; see docs/protocol.md section 5 (start with GET /mp/v0/discover).",
        )

    def require_admin(self, req: Request) -> None:
        if self.admin_token is None:
            raise ProtocolError(
                "NOT_FOUND",
                "No route: /mp/v0/admin/* exists only when the server is started with --allow-admin.",
            )
        token = bearer(req)
        if not token or not tokens.matches(token, tokens.digest(self.admin_token)):
            raise ProtocolError(
                "UNAUTHORIZED", "Admin routes need the admin token: Authorization: Bearer <admin token>."
            )


_DELIVERING = ("/pull", "/stream")  # the routes whose GET delivers: no HEAD for them


def _inline_filter(query: list[tuple[str, str]]) -> dict[str, Any] | None:
    flt: dict[str, Any] = {}
    for key, value in query:
        if key in ("cursor", "limit", "wait"):
            continue
        if key == "ack":  # a GET never commits: ack-and-pull is the POST form
            raise ProtocolError(
                "INVALID",
                'A GET pull never commits: send the ack in a POST /pull body, {"ack": <next>}, or POST /ack.',
            )
        if key == "filter":
            try:
                extra = wire.loads(value)
            except ProtocolError as err:  # the wire rule's own sentence: not JSON, too deep, a name twice...
                raise ProtocolError(
                    "INVALID_FILTER", f"The filter query parameter must be a JSON object: {err.message}"
                ) from None
            if not isinstance(extra, dict):
                raise ProtocolError("INVALID_FILTER", "The filter query parameter must be a JSON object.")
            for k, v in extra.items():  # merged with the other filter keys, whatever their order
                if isinstance(flt.get(k), list) and isinstance(v, list):
                    flt[k].extend(v)
                else:
                    flt[k] = v
        elif key in LIST_KEYS or TAG_KEY_PATTERN.match(key):
            values = [v for v in value.split(",") if v] if key in LIST_KEYS else [value]
            existing = flt.get(key)  # from a filter= parameter, of any shape: the filter grammar judges it
            if isinstance(existing, list):
                existing.extend(values)
            else:
                flt[key] = ([] if existing is None else [existing]) + values
        elif key in FILTER_KEYS:
            flt[key] = value
        else:
            raise ProtocolError(
                "INVALID_FILTER",
                f"Unknown pull parameter {key[:64]!r}: use cursor, limit, wait or a filter key.",
                invalid=key[:64],
                known_keys=list(
                    dict.fromkeys(["cursor", "limit", "wait", *FILTER_KEYS, "#<tag>"])
                ),  # limit is both
            )
    return flt or None


def _single(query: list[tuple[str, str]], name: str) -> str | None:
    values = [v for k, v in query if k == name]
    if len(values) > 1:
        raise ProtocolError("INVALID", f"Send {name} once.")
    return values[0] if values else None


# ---------------------------------------------------------------------------------------------- routes
# The route list, methods and credentials come from the operations table (operations.py). Most routes are
# served by `_served`; a route whose arguments need shaping (headers, query strings, long poll) has its own
# handler in SHAPED, keyed by operation name.


def _served(ops: tuple[Operation, ...]) -> Handler:
    """The handler of one table route: the admin check where the table says so, the body parsed for every
    POST (an unparsable body is refused even where the engine would not read it), then the service call."""

    def handle(r: RestRouter, req: Request, p: dict[str, str]) -> Response:
        op = operations.pick(ops, p.get("action"))
        shaped = SHAPED.get(op.name)
        if shaped is not None:
            return shaped(r, req, p, op)
        if op.auth.credential == "admin":
            r.require_admin(req)
        payload = _body_of(r, req, op, p) if op.method == "POST" else None
        # the query parameters the table declares, each sent at most once (the rest are not read)
        named = (
            {q.name: _single(req.query, q.name) for q in op.params if q.where == "query"}
            if req.query
            else None
        )
        result = operations.invoke(r.service, op, p, payload, bearer(req), named)
        return Response(op.result.status_for(result), result)

    return handle


def _body_of(r: RestRouter, req: Request, op: Operation, p: dict[str, str]) -> Any:
    """A POST's body parsed; one that is not JSON is refused, and logged on the monitor the route names when
    the caller is its owner (section 10; MonitorService.log_refused_input decides)."""
    try:
        return parse_json_body(req)
    except ProtocolError as err:
        target = _refusal_target(op)
        if target is not None:
            raw = req.body.decode("utf-8", "replace")
            r.service.log_refused_input(target, p.get("id"), bearer(req), err, raw)
        raise


def _refusal_target(op: Operation) -> refusals.Target | None:
    # a creation or a subscribe: the body that would name the monitor is what was refused; a reader's call
    # is not logged (core/rules/refusals.py says why)
    return "monitor" if op.route.startswith("/monitors/{id}/") else None


Shaped = Callable[["RestRouter", Request, dict[str, str], Operation], Response]


def _publish(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    key = req.header("idempotency-key")
    try:
        parsed = parse_json_body(req)
    except ProtocolError as err:  # logged where the monitor is known (section 10), then returned
        r.service.refuse_publish(p["id"], bearer(req), err, req.body.decode("utf-8", "replace"))
        raise
    if isinstance(parsed, list):  # a batch: each item's seq or error, one commit (207: look at each)
        batch = r.service.publish_many(p["id"], parsed, bearer(req), idempotency_key=key)
        return Response(207, batch)
    body = r.service.publish(p["id"], parsed, bearer(req), idempotency_key=key)
    return Response(op.result.status_for(body), body)


def _pull(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    wait_raw = _single(req.query, "wait")
    wait = as_int(wait_raw, "wait", minimum=0, maximum=MAX_WAIT_SECONDS) if wait_raw is not None else 0
    cursor = _single(req.query, "cursor")
    sub_id, token, limit, flt = p["id"], bearer(req), _single(req.query, "limit"), _inline_filter(req.query)
    body = r.service.pull(sub_id, token, cursor=cursor, limit=limit, filter=flt, raw=req.door_encodes)
    again = _Repull(r.service, (sub_id, token, cursor, limit, flt), req)
    resp = _maybe_parked(Response(200, body), wait, req, again)
    if resp.long_poll is not None:
        resp.long_poll.pull = again.args
    return resp


def parked_reply(body: dict[str, Any], poll: LongPoll) -> Response:
    """A re-checked pull's reply (MonitorService.pull_many's body for `poll`'s reader), dressed as the
    request's: its headers and route, and parked again while it holds nothing."""
    resp = Response(200, body, dict(poll.headers), route=poll.route)
    if not pull_has_news(body):
        resp.long_poll = poll
    return resp


# A parked pull's re-checks are objects, not closures that name themselves: such a closure is a reference
# cycle per parked pull, garbage that only a full collection frees, and a full collection landing inside the
# wake of 1,000 readers cost it 60-90 ms (docs/bench-history.md, "Issue 10's targets, measured again").
class _Repull:
    """The engine call of a parked pull again, with the arguments its request parsed (subscription, token,
    cursor, limit, filter), parked once more while it holds nothing."""

    __slots__ = ("service", "args", "again")

    def __init__(self, service: MonitorService, args: tuple[Any, ...], again: Request) -> None:
        self.service, self.args, self.again = service, args, again

    def __call__(self) -> Response:
        sub_id, token, cursor, limit, flt = self.args
        body = self.service.pull(
            sub_id, token, cursor=cursor, limit=limit, filter=flt, raw=self.again.door_encodes
        )
        return _maybe_parked(Response(200, body), 1, self.again, self)


class _Dressed:
    """A parked pull's re-check: the engine call again, its reply dressed as this request's (headers,
    route), a refusal as a reply too; never the router again."""

    __slots__ = ("pull", "headers", "label")

    def __init__(self, pull: Callable[[], Response], headers: dict[str, str], label: str | None) -> None:
        self.pull, self.headers, self.label = pull, headers, label

    def __call__(self) -> Response:
        try:
            resp = self.pull()
        except ProtocolError as err:
            resp = error_response(err)
        resp.headers.update(self.headers)
        resp.route = self.label
        if resp.long_poll is not None:
            resp.long_poll.rerun = self
        return resp


def _maybe_parked(
    resp: Response, wait: int, again: Request, rerun: Callable[[], Response] | None = None
) -> Response:
    """An empty pull asked to wait is parked by the door, which re-checks (with `rerun`, the engine call
    alone, or with `again`, the request) when an append comes, with what is left of the wait."""
    body = resp.body
    if wait > 0 and not pull_has_news(body):
        resp.long_poll = LongPoll(monitor=body["monitor"], wait_seconds=float(wait), again=again, rerun=rerun)
    return resp


ACK_PULL_KEYS = ("ack", "limit", "wait", "filter")


def _ack_pull(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    """POST /subscriptions/{id}/pull {ack?, limit?, wait?, filter?}: ack, then pull, in one transaction.
    The long poll's re-checks are the plain GET pull from the cursor just committed: the ack runs once."""
    if req.query:
        raise ProtocolError(
            "INVALID",
            f"POST /pull takes its parameters in the JSON body ({', '.join(ACK_PULL_KEYS)}), not the query.",
        )
    payload = parse_json_body(req)
    payload = {} if payload is None else payload
    if not isinstance(payload, dict):
        raise ProtocolError("INVALID", 'The body must be a JSON object such as {"ack": 12, "limit": 50}.')
    unknown = sorted(set(payload) - set(ACK_PULL_KEYS))
    if unknown:
        raise ProtocolError(
            "INVALID",
            f"Unknown ack-and-pull field(s) {[u[:64] for u in unknown[:10]]}; send {list(ACK_PULL_KEYS)}.",
            invalid=[u[:64] for u in unknown[:10]],
        )
    wait_value = payload.get("wait")
    wait = (
        0
        if wait_value is None
        else as_int(wait_value, "wait", minimum=0, maximum=MAX_WAIT_SECONDS, text=False)
    )
    limit, flt = payload.get("limit"), payload.get("filter")
    if limit is not None:  # a JSON integer, as every integer in a body
        limit = as_int(limit, "limit", minimum=1, maximum=MAX_LIMIT, text=False)
    if flt is not None and not isinstance(flt, dict):
        raise ProtocolError("INVALID_FILTER", "filter must be a JSON object (the filter grammar).")
    body = r.service.pull(
        p["id"], bearer(req), limit=limit, filter=flt, ack=payload.get("ack"), raw=req.door_encodes
    )
    if not wait:
        return Response(200, body)  # nothing to park: no re-check to prepare
    again: list[tuple[str, str]] = []
    if limit is not None:
        again.append(("limit", str(limit)))
    if flt is not None:
        again.append(("filter", json.dumps(flt, separators=(",", ":"), ensure_ascii=False)))
    headers = Headers((k, v) for k, v in req.headers.items() if k != "content-length")
    recheck = Request("GET", req.path, again, headers, b"", req.door_encodes)
    rerun = _Repull(r.service, (p["id"], bearer(req), None, limit, flt), recheck)
    resp = _maybe_parked(Response(200, body), wait, recheck, rerun)
    if resp.long_poll is not None:
        resp.long_poll.pull = rerun.args
    return resp


def _stream(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    # Only a streaming door (mp serve) can hold an SSE response open; this binding says so plainly.
    raise ProtocolError(
        "NOT_FOUND",
        "This door does not stream; use GET /mp/v0/subscriptions/{id}/pull?wait=N (long poll) instead.",
    )


def _rpc(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    return jsonrpc.handle(r.service, req.body, bearer(req))


def _compact(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    r.require_admin(req)
    body = parse_json_body(req) or {}
    if not isinstance(body, dict) or "upto_seq" not in body:
        raise ProtocolError("INVALID", 'compact needs {"upto_seq": <seq>, "monitor"?: "<id>"}.')
    return Response(200, operations.invoke(r.service, op, p, body, None, body))


def _admin_log(r: RestRouter, req: Request, p: dict[str, str], op: Operation) -> Response:
    r.require_admin(req)
    monitor = _single(req.query, "monitor")
    if monitor is None:
        raise ProtocolError("INVALID", "admin/log needs ?monitor=<id> (and optionally from=<seq>&limit=<n>).")
    frm = _single(req.query, "from")
    named = {"monitor": monitor, "from": 1 if frm is None else frm, "limit": _single(req.query, "limit")}
    return Response(200, operations.invoke(r.service, op, p, None, None, named))


SHAPED: dict[str, Shaped] = {
    "publish": _publish,
    "pull": _pull,
    "ack_pull": _ack_pull,
    "stream": _stream,
    "rpc": _rpc,
    "admin_compact": _compact,
    "admin_log": _admin_log,
}

for _method, _template, _ops in operations.routes():
    route(_method, _template)(_served(_ops))
