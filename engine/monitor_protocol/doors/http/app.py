"""The HTTP door: a raw ASGI app around the transport-free RestRouter (PROTOCOL.md sections 5, 8, 9, 10).

What this module adds to the router, and nothing else:

* the body cap: a request whose Content-Length, or whose bytes read so far, exceed ``max_body`` is refused
  with 413 TOO_LARGE before the rest is read;
* one engine thread: every engine call runs there, never on the event loop, so a slow call delays the
  others by at most its own group commit while the loop keeps reading, answering and streaming; the calls
  made during one event-loop iteration travel together as one batch and one group commit
  (``store.batch()``), and no call is answered before its commit is durable;
* long poll: an empty pull that asked to wait is parked in the shared ``Waiters`` registry (fed by
  ``service.add_listener``) and re-handled as soon as its monitor gets an append (no polling); the pulls
  one append wakes resume in the same loop turn, so their re-checks are one batch on the engine thread;
* SSE at ``GET /mp/v0/subscriptions/{id}/stream``: read-only replays of the pull route (the ``cursor``
  query parameter) with the reader's own headers, so the stream never commits; it waits in the same
  registry between pages;
* the lifespan: a sweep timer (``service.sweep()`` every second), ``background_tasks`` and
  ``on_startup``/``on_shutdown`` hooks for other doors, and closing the store on shutdown;
* operations, outside ``/mp/v0``: ``GET /healthz`` (the process answers: 200), ``GET /readyz`` (the store
  answers a trivial read on the engine thread within READY_TIMEOUT_SECONDS: 200, else 503) and
  ``GET /metrics`` (Prometheus text; see ``Metrics``). The health routes skip the Origin and Host checks
  (they reveal nothing, and probes name the server by address); ``/metrics`` keeps them, and answers only a
  loopback client or a bearer of the metrics (or admin) token, and only that token once one is set.

Origin, Host and CORS policy live in the router; this module never answers a request under ``/mp/v0`` the
router has not seen first, so the policy holds for every protocol path, the stream included.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import queue
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from monitor_protocol.api.messages import Request, Response
from monitor_protocol.api.rest import _ROUTES, PREFIX, bearer
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError, internal_failure
from monitor_protocol.doors.parking import Waiters

log = logging.getLogger("monitor_protocol.http")

DEFAULT_MAX_BODY = 1 << 20
SSE_RETRY_MS = 3000
SSE_HEARTBEAT_SECONDS = 5.0
SSE_PAGE = 200
SWEEP_INTERVAL_SECONDS = 1.0
PROBE_CURSOR = (1 << 53) - 1  # a replay cursor past any head (and within the wire's 0..2^53 integers)

DISCARD_BYTES = 64 << 20  # how much of a refused body is read and dropped so the 413 reaches the client
DISCARD_SECONDS = 5.0
STREAM_PATH = re.compile(r"^/mp/v0/subscriptions/([^/]+)/stream/?$")

OPS_PATHS = ("/healthz", "/readyz", "/metrics")
READY_TIMEOUT_SECONDS = 2.0
METRICS_TIMEOUT_SECONDS = 5.0
METRICS_TOP_SUBSCRIPTIONS = 20  # backlog gauges for at most this many active subscriptions (largest first)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "OPTIONS", "PUT", "PATCH", "DELETE"})

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
BackgroundTask = Callable[["MonitorApp"], Awaitable[None]]
Hook = Callable[["MonitorApp"], Awaitable[None] | None]


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


def error_response(err: ProtocolError, headers: dict[str, str] | None = None) -> Response:
    """The refusal as a response, with the transport headers it asks for (Retry-After on a 503)."""
    return Response(err.status, err.body(), {**err.headers, **(headers or {})})


def _internal_error_response(incident: str) -> Response:
    # A bug is not bad input (PROTOCOL.md section 10): 503 UNAVAILABLE with Retry-After, naming the incident.
    return error_response(internal_failure(incident))


def _failure(request: Request, exc: BaseException) -> tuple[Response, int]:
    """An engine call that raised, as the (response, mark) it answers with: never a raise, never a 500."""
    if isinstance(exc, ProtocolError):
        return error_response(exc), -1
    incident = uuid.uuid4().hex[:12]
    log.error("router raised on %s %s (incident %s)", request.method, request.path, incident, exc_info=exc)
    return _internal_error_response(incident), -1


Job = tuple[Callable[..., Any], tuple[Any, ...], Any, Callable[[bool, Any], None]]


class EngineThread:
    """Enters the engine for everyone, on this class's own thread only (SQLite has one writer; the engine
    is not thread-safe), so no engine call ever runs on the event loop.

    Calls that arrive together are run inside the store's ``batch()`` when it has one (group commit: many
    requests, one fsync), and no caller hears its result before that commit, so every success a client is
    told about is already durable.
    """

    def __init__(self, store: Any = None, max_batch: int = 64) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._batch = getattr(store, "batch", None)
        self.max_batch = max_batch
        # Calls made during one event-loop iteration travel to the engine thread together, so requests
        # that arrived together share one group commit (and one thread wake-up).
        self._pending: list[Job] = []
        self._flush_scheduled = False
        self._thread = threading.Thread(target=self._run, name="mp-engine", daemon=True)
        self._thread.start()
        self._stopped = False
        # Called as on_commit(seconds) on the engine thread after every batch (its calls and their commit).
        self.on_commit: Callable[[float], None] | None = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(*args)`` for the engine thread from the loop, without waiting: the returned future
        gets its outcome once the batch it joined has committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        if self._stopped:
            raise RuntimeError("the engine thread has stopped")
        self._pending.append((fn, args, loop, deliver))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Scheduled behind everything already runnable in this loop turn, so what this turn submits
            # (say, the re-checks of every pull one append woke) leaves as one batch.
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        jobs, self._pending = self._pending, []
        if jobs:
            self._queue.put(jobs)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine thread, from any thread, without waiting and without a reply: in
        order with the calls around it (a shared store's heard appends, see cli/serve.py)."""
        if not self._stopped:
            self._queue.put([(fn, args, None, _ignore)])

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` on the engine thread from any other thread, blocking until it is done."""
        done = threading.Event()
        box: list[Any] = []

        def deliver(ok: bool, value: Any) -> None:
            box.append((ok, value))
            done.set()

        if self._stopped:
            raise RuntimeError("the engine thread has stopped")
        self._queue.put([(fn, args, None, deliver)])
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            jobs = list(item)
            stop = False
            while len(jobs) < self.max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.extend(more)
            self._execute(jobs)
            if stop:
                return

    def _commit(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """Run the calls, as one group commit where the store has one (engine thread only)."""
        started = time.perf_counter()
        try:
            return self._commit_batch(jobs)
        finally:
            hook = self.on_commit
            if hook is not None:
                hook(time.perf_counter() - started)

    def _commit_batch(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        if len(jobs) == 1 or self._batch is None:
            return [_outcome(fn, args) for fn, args, _loop, _deliver in jobs]
        try:
            with self._batch():
                return [_outcome(fn, args) for fn, args, _loop, _deliver in jobs]
        except BaseException as exc:  # the group commit failed: nothing in it may be reported as done
            log.exception("group commit of %d engine calls failed", len(jobs))
            return [(False, exc)] * len(jobs)

    def _execute(self, jobs: list[Job]) -> None:
        outcomes = self._commit(jobs)
        # Replies go back once the commit is on disk: one wake-up per event loop, not one per request.
        by_loop: dict[Any, list[tuple[Callable[[bool, Any], None], tuple[bool, Any]]]] = {}
        for (_fn, _args, loop, deliver), outcome in zip(jobs, outcomes, strict=True):
            if loop is None:
                deliver(*outcome)
            else:
                by_loop.setdefault(loop, []).append((deliver, outcome))
        for loop, replies in by_loop.items():
            if loop.is_closed():
                continue  # nobody is waiting any more
            try:
                loop.call_soon_threadsafe(_deliver_all, replies)
            except RuntimeError:
                pass  # the loop closed meanwhile


def _ignore(ok: bool, value: Any) -> None:
    if not ok:
        log.error("an engine job posted without a reply failed: %r", value)


def _deliver_all(replies: list[tuple[Callable[[bool, Any], None], tuple[bool, Any]]]) -> None:
    for deliver, outcome in replies:
        deliver(*outcome)


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except BaseException as exc:
        return False, exc


def _route_templates() -> list[tuple[re.Pattern[str], str]]:
    """The router's routes as (regex on the path below /mp/v0, label such as /mp/v0/monitors/{id})."""
    out = []
    for _method, regex, _fn in _ROUTES:
        label = re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", regex.pattern.strip("^$"))
        out.append((regex, PREFIX + label))
    return out


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class Metrics:
    """The HTTP door's counters, rendered in the Prometheus text format (version 0.0.4).

    Every label set is bounded: routes are the router's templates (ids replaced by ``{id}``; anything else is
    ``other``), methods the HTTP ones, and per-subscription backlog only for the METRICS_TOP_SUBSCRIPTIONS
    active subscriptions with the largest backlog. Counters are bumped on the event loop; commit times on
    the engine thread.
    """

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.commit_buckets = [0] * (len(COMMIT_BUCKETS) + 1)
        self.commit_sum = 0.0
        self.commit_count = 0
        self.parked_polls = 0
        self.open_streams = 0
        self._routes = _route_templates()

    def route(self, path: str) -> str:
        if path in OPS_PATHS:
            return path
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            return "other"
        below = path[len(PREFIX) :].rstrip("/") or "/"
        for regex, label in self._routes:
            if regex.match(below):
                return label
        return "other"

    def count_request(self, method: str, path: str, status: int) -> None:
        key = (self.route(path), method if method in KNOWN_METHODS else "OTHER", int(status))
        self.requests[key] = self.requests.get(key, 0) + 1

    def observe_commit(self, seconds: float) -> None:
        for i, bound in enumerate(COMMIT_BUCKETS):
            if seconds <= bound:
                self.commit_buckets[i] += 1
                break
        else:
            self.commit_buckets[-1] += 1
        self.commit_sum += seconds
        self.commit_count += 1

    def _routed(self, suffix: str, method: str) -> int:
        return sum(
            n
            for (route, m, status), n in list(self.requests.items())
            if route.endswith(suffix) and m == method and 200 <= status < 300
        )

    def render(self, appended: int, store: dict[str, Any] | None) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        family(
            "mp_http_requests_total",
            "counter",
            "HTTP requests answered, by route template, method and status.",
        )
        for (route, method, status), n in sorted(self.requests.items()):
            lines.append(
                f'mp_http_requests_total{{route="{_label(route)}",method="{method}",status="{status}"}} {n}'
            )
        family(
            "mp_observations_appended_total", "counter", "Observations appended and committed (every door)."
        )
        lines.append(f"mp_observations_appended_total {appended}")
        family(
            "mp_publishes_total",
            "counter",
            "REST publishes answered 2xx (POST /mp/v0/monitors/{id}/observations).",
        )
        lines.append(f"mp_publishes_total {self._routed('/observations', 'POST')}")
        family(
            "mp_pulls_total",
            "counter",
            "REST pulls answered 200 (GET and POST /mp/v0/subscriptions/{id}/pull, ack-and-pull included).",
        )
        lines.append(f"mp_pulls_total {self._routed('/pull', 'GET') + self._routed('/pull', 'POST')}")
        family("mp_acks_total", "counter", "REST acks answered 200 (POST /mp/v0/subscriptions/{id}/ack).")
        lines.append(f"mp_acks_total {self._routed('/ack', 'POST')}")
        family("mp_long_polls_parked", "gauge", "Long polls waiting for an append right now.")
        lines.append(f"mp_long_polls_parked {self.parked_polls}")
        family("mp_sse_streams_open", "gauge", "Server-Sent Event streams open right now.")
        lines.append(f"mp_sse_streams_open {self.open_streams}")
        family(
            "mp_engine_commit_seconds",
            "histogram",
            "Time to run one engine batch (the calls of one event-loop turn) and commit it to the store.",
        )
        running = 0
        for bound, n in zip((*COMMIT_BUCKETS, math.inf), self.commit_buckets, strict=True):
            running += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            lines.append(f'mp_engine_commit_seconds_bucket{{le="{le}"}} {running}')
        lines.append(f"mp_engine_commit_seconds_sum {self.commit_sum:.6f}")
        lines.append(f"mp_engine_commit_seconds_count {self.commit_count}")
        family("mp_store_up", "gauge", "1 when the store answered the scrape's reads, else 0.")
        lines.append(f"mp_store_up {1 if store is not None else 0}")
        if store is not None:
            family("mp_monitors", "gauge", "Monitors in the store.")
            lines.append(f"mp_monitors {store['monitors']}")
            family("mp_subscriptions_active", "gauge", "Active subscriptions in the store.")
            lines.append(f"mp_subscriptions_active {store['active']}")
            family(
                "mp_subscription_backlog",
                "gauge",
                f"Observations past an active subscription's committed cursor (before its filter), for the "
                f"{METRICS_TOP_SUBSCRIPTIONS} largest.",
            )
            for backlog, monitor, sub in store["top"]:
                lines.append(
                    f'mp_subscription_backlog{{monitor="{_label(monitor)}",subscription="{_label(sub)}"}} {backlog}'
                )
            family("mp_subscription_backlog_total", "gauge", "Backlog summed over every active subscription.")
            lines.append(f"mp_subscription_backlog_total {store['total']}")
        family("process_start_time_seconds", "gauge", "When the server started, in seconds since the epoch.")
        lines.append(f"process_start_time_seconds {self.started:.3f}")
        return "\n".join(lines) + "\n"


def store_summary(store: Any) -> dict[str, Any]:
    """Monitors, active subscriptions and their backlog (head past the committed cursor); engine thread."""
    monitors = {m.id: m for m in store.list_monitors()}
    rows = []
    active = 0
    for sub in store.list_subscriptions():
        if not sub.active:
            continue
        active += 1
        rec = monitors.get(sub.monitor)
        if rec is None:
            continue
        start = max(sub.cursor, 1, rec.floor)
        rows.append((max(0, rec.head - start + 1), sub.monitor, sub.id))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    return {
        "monitors": len(monitors),
        "active": active,
        "top": rows[:METRICS_TOP_SUBSCRIPTIONS],
        "total": sum(r[0] for r in rows),
    }


class MonitorApp:
    """An ASGI 3 application serving the Monitor Protocol over HTTP.

    ``background_tasks``: coroutine functions ``task(app)`` started after startup and cancelled at
    shutdown (for instance HTTP push delivery). ``on_startup`` / ``on_shutdown``: callables ``hook(app)``
    (sync or async) run in order. ``await app.call(fn, *args)`` runs ``fn`` on the engine thread.
    """

    def __init__(
        self,
        service: Any,
        router: Any,
        *,
        store: Any = None,
        max_body: int = DEFAULT_MAX_BODY,
        engine: EngineThread | None = None,
        sweep_interval: float | None = SWEEP_INTERVAL_SECONDS,
        heartbeat_seconds: float = SSE_HEARTBEAT_SECONDS,
        background_tasks: Iterable[BackgroundTask] = (),
        on_startup: Iterable[Hook] = (),
        on_shutdown: Iterable[Hook] = (),
        ops_routes: bool = True,
        metrics_token: str | None = None,
    ) -> None:
        self.service = service
        self.router = router
        self.store = store if store is not None else getattr(service, "store", None)
        self.max_body = int(max_body)
        self.engine = engine or EngineThread(self.store)
        self.sweep_interval = sweep_interval
        self.heartbeat_seconds = heartbeat_seconds
        self.background_tasks: list[BackgroundTask] = list(background_tasks)
        self.on_startup: list[Hook] = list(on_startup)
        self.on_shutdown: list[Hook] = list(on_shutdown)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self._tasks: list[asyncio.Task[None]] = []
        # Long polls and streams park here until their monitor gets an append (shared with every door).
        self.waiters = Waiters()
        self._listening = False
        self.draining = False
        # /healthz, /readyz and /metrics (outside /mp/v0); metrics_token may be changed while serving.
        self.ops_routes = ops_routes
        self.metrics_token = metrics_token
        self.metrics = Metrics()
        if self.engine.on_commit is None:
            self.engine.on_commit = self.metrics.observe_commit

    # -- engine thread ---------------------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a synchronous engine call on the single engine thread."""
        return await self.engine.call(fn, *args)

    async def handle(self, request: Request) -> Response:
        """Hand one request to the router on the engine thread; never raises."""
        return (await self._handle_marked(request))[0]

    async def _handle_marked(self, request: Request) -> tuple[Response, int]:
        """`handle`, plus the registry's mark for the response's monitor, read on the engine thread right
        after the request ran (so an append that commits before the caller parks still wakes it)."""
        try:
            return await self._submit_marked(request)
        except Exception as exc:
            return _failure(request, exc)

    def _submit_marked(self, request: Request) -> asyncio.Future[tuple[Response, int]]:
        def job() -> tuple[Response, int]:
            response = self.router.handle(request)
            return response, self.waiters.mark(_monitor_of(response))

        return self.engine.submit(job)

    # -- wake-ups ---------------------------------------------------------------------------------

    def _ensure_listening(self) -> None:
        if self._listening:
            return
        self.loop = asyncio.get_running_loop()
        self.waiters.attach(self.service)
        self._listening = True

    def begin_shutdown(self) -> None:
        """Stop holding requests open: parked long polls answer now and streams end, so the server can
        finish its connections instead of waiting out its graceful-shutdown timeout."""
        self.draining = True
        self.waiters.wake_all()

    # -- ASGI entry -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        # websockets are not part of the protocol: let the server refuse them

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._ensure_listening()
        started = False

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.count_request(scope.get("method", ""), scope.get("path", ""), message["status"])
            await send(message)

        try:
            request = self._request(scope)
            if self.ops_routes and request.path in OPS_PATHS and request.method in ("GET", "HEAD"):
                await self._ops(request, scope, tracked_send)
                return
            try:
                request.body = await self._read_body(request, receive)
            except BodyTooLarge:
                if "100-continue" not in (request.header("expect") or "").lower():
                    # A client that did not ask first is still sending; unread bytes at close would make
                    # the kernel reset the connection and destroy the 413. Discard them (bounded) first.
                    await self._discard_body(receive)
                await self._send_json(tracked_send, await self._too_large(request), close=True)
                return
            match = STREAM_PATH.match(request.path)
            if match and request.method == "GET":
                await self._stream(request, match.group(1), receive, tracked_send)
                return
            response, mark = await self._handle_marked(request)
            if response.long_poll is not None:
                response = await self._long_poll(request, response, mark, receive)
                if response is None:
                    return  # the client left while waiting
            await self._send_json(tracked_send, response)
        except ClientGone:
            return
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected failure on %s (incident %s)", scope.get("path"), incident)
            if not started:
                await self._send_json(tracked_send, _internal_error_response(incident))

    def _request(self, scope: Scope) -> Request:
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", ()):
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        return Request(scope["method"].upper(), scope["path"], query, headers)

    async def _read_body(self, request: Request, receive: Receive) -> bytes:
        declared = request.header("content-length")
        if declared is not None:
            try:
                if int(declared.split(",")[0].strip()) > self.max_body:
                    raise BodyTooLarge
            except ValueError:
                pass  # a broken length is the server's (h11's) to refuse; the cap below still applies
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _discard_body(self, receive: Receive) -> None:
        """Read and drop the rest of a refused body: at most DISCARD_BYTES, for at most DISCARD_SECONDS."""
        dropped = 0

        async def drain() -> None:
            nonlocal dropped
            while dropped < DISCARD_BYTES:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    return
                dropped += len(message.get("body", b""))

        try:
            await asyncio.wait_for(drain(), DISCARD_SECONDS)
        except TimeoutError:
            return

    async def _too_large(self, request: Request) -> Response:
        # The Origin/Host policy still comes first, and an allowed origin still gets its CORS headers:
        # the router's own preflight answer (no body, no engine state) says which.
        policy = await self.handle(Request("OPTIONS", request.path, [], request.headers))
        if policy.status >= 400:
            return policy
        err = ProtocolError(
            "TOO_LARGE",
            f"the request body is larger than this server accepts ({self.max_body} bytes); "
            "send a smaller body (split a batch, or publish large payloads by reference)",
            max_body=self.max_body,
        )
        return error_response(
            err,
            {
                k: v
                for k, v in policy.headers.items()
                if k.lower().startswith("access-control") or k.lower() == "vary"
            },
        )

    async def _send_json(self, send: Send, response: Response, close: bool = False) -> None:
        body = response.json_bytes()
        headers = [
            (k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in response.headers.items()
        ]
        names = {k for k, _ in headers}
        if body and b"content-type" not in names:
            headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # -- operations: health, readiness, metrics ---------------------------------------------------------

    async def _ops(self, request: Request, scope: Scope, send: Send) -> None:
        if request.path == "/healthz":
            await self._send_json(send, Response(200, {"status": "ok"}, {"cache-control": "no-store"}))
        elif request.path == "/readyz":
            await self._send_json(send, await self._ready())
        else:
            await self._metrics(request, scope, send)

    async def _ready(self) -> Response:
        headers = {"cache-control": "no-store"}
        if self.draining or self.closed:
            return Response(503, {"status": "stopping"}, {**headers, "retry-after": "1"})
        probe = getattr(self.store, "get_monitor", None)
        try:
            if probe is not None:
                await asyncio.wait_for(self.call(probe, ""), READY_TIMEOUT_SECONDS)
        except TimeoutError:
            return Response(
                503,
                {
                    "status": "unavailable",
                    "error": f"the store did not answer within {READY_TIMEOUT_SECONDS:g} s",
                },
                {**headers, "retry-after": "1"},
            )
        except Exception as exc:
            log.warning("readiness probe: the store failed: %s", exc)
            return Response(
                503,
                {"status": "unavailable", "error": "the store failed a trivial read (see the server log)"},
                {**headers, "retry-after": "1"},
            )
        return Response(200, {"status": "ready"}, headers)

    def _metrics_refusal(self, request: Request, scope: Scope) -> Response | None:
        """None when this request may read /metrics: the Origin and Host checks of the protocol routes
        hold (no DNS rebinding, no browser page reads it), then a metrics token, once one is set, is
        required of everyone; without one a loopback client may read, or a bearer of the admin token."""
        try:
            self.router.check_request(request)
        except ProtocolError as err:
            return error_response(err)
        token = bearer(request) or ""
        expected = [t for t in (self.metrics_token, getattr(self.router, "admin_token", None)) if t]
        if any(hmac.compare_digest(token.encode(), t.encode()) for t in expected):
            return None
        client = scope.get("client") or (None, None)
        if not self.metrics_token and _is_loopback(client[0]):
            return None
        sentence = (
            "GET /metrics needs the metrics token: Authorization: Bearer <token> (mp serve --metrics-token)."
            if self.metrics_token
            else "GET /metrics answers loopback clients only; start the server with --metrics-token "
            "(env MP_METRICS_TOKEN) to scrape it from elsewhere."
        )
        return error_response(ProtocolError("UNAUTHORIZED", sentence))

    async def _metrics(self, request: Request, scope: Scope, send: Send) -> None:
        refusal = self._metrics_refusal(request, scope)
        if refusal is not None:
            await self._send_json(send, refusal)
            return
        summary = None
        if self.store is not None and hasattr(self.store, "list_subscriptions") and not self.closed:
            try:
                summary = await asyncio.wait_for(
                    self.call(store_summary, self.store), METRICS_TIMEOUT_SECONDS
                )
            except Exception as exc:  # the scrape still answers, with mp_store_up 0
                log.warning("metrics: the store summary failed: %s", exc)
        body = self.metrics.render(self.waiters.appended, summary).encode()
        headers = [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # -- long poll ---------------------------------------------------------------------------------

    async def _long_poll(
        self, request: Request, first: Response, mark: int, receive: Receive
    ) -> Response | None:
        """Hold an empty pull until its monitor gets an append that matches, or until the deadline."""
        assert first.long_poll is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, float(first.long_poll.wait_seconds))
        monitor = first.long_poll.monitor
        request = first.long_poll.again or request  # an ack-and-pull re-checks as a plain pull
        gone = asyncio.ensure_future(self._wait_disconnect(receive))
        self.metrics.parked_polls += 1
        try:
            while True:
                outcome = await self._park_and_recheck(request, monitor, mark, deadline, gone)
                if outcome is None:
                    return None  # the client left while waiting
                response, mark, remaining = outcome
                if response.long_poll is None or remaining <= 0:
                    response.long_poll = None
                    return response
                monitor = response.long_poll.monitor  # nothing matched yet: park again
        finally:
            self.metrics.parked_polls -= 1
            gone.cancel()

    async def _park_and_recheck(
        self, request: Request, monitor: str, mark: int, deadline: float, gone: asyncio.Future[None]
    ) -> tuple[Response, int, float] | None:
        """Park the pull; when an append wakes it (or its time is up) the registry calls back inside the
        wake-up itself, and the re-check is submitted right there: every pull one append woke joins the
        same engine batch, one group commit, and each task resumes once, with its answer. None: gone."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[Response, int, float] | None] = loop.create_future()

        def recheck(woken: bool) -> None:
            remaining = 0.0 if self.draining else deadline - loop.time()
            retry = _rewaited(request, remaining)
            try:
                future = self._submit_marked(retry)
            except RuntimeError as exc:  # the engine thread has stopped
                _settle(answer, (*_failure(retry, exc), 0.0))
                return

            def answered(done: asyncio.Future[tuple[Response, int]]) -> None:
                exc = RuntimeError("the engine call was cancelled") if done.cancelled() else done.exception()
                reply = _failure(retry, exc) if exc is not None else done.result()
                _settle(answer, (*reply, remaining))

            future.add_done_callback(answered)

        parked = self.waiters.park(monitor, mark, deadline - loop.time(), recheck)

        def left(_gone: asyncio.Future[None]) -> None:
            parked.cancel()
            _settle(answer, None)

        gone.add_done_callback(left)
        try:
            return await answer
        finally:
            gone.remove_done_callback(left)
            parked.cancel()

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    # -- SSE ---------------------------------------------------------------------------------------

    async def _stream(self, request: Request, sub_id: str, receive: Receive, send: Send) -> None:
        """Section 9: replay the subscription through the read-only pull route and follow it live."""
        # A read-only replay far past any head checks the policy (Origin/Host) and the reader's token,
        # changes nothing, and reports the monitor and the committed cursor.
        probe = await self.handle(self._replay(request, sub_id, PROBE_CURSOR, limit=1))
        if probe.status != 200:
            await self._send_json(send, probe)
            return
        start = _last_event_id(request)
        cursor = max(1, start if start is not None else _int(probe.body.get("cursor"), 1))
        monitor = str(probe.body.get("monitor", ""))
        first, mark = await self._handle_marked(self._replay(request, sub_id, cursor))
        if first.status != 200:
            await self._send_json(send, first)
            return
        await self.call(self.service.touch, sub_id, bearer(request))
        gone = asyncio.ensure_future(self._wait_disconnect(receive))
        self.metrics.open_streams += 1
        try:
            await self._follow(request, sub_id, monitor, cursor, first, mark, gone, send)
        finally:
            self.metrics.open_streams -= 1
            gone.cancel()
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:
                pass

    async def _follow(
        self,
        request: Request,
        sub_id: str,
        monitor: str,
        cursor: int,
        page: Response,
        mark: int,
        gone: asyncio.Future[None],
        send: Send,
    ) -> None:
        """Send the stream's head, then each page, parking in the registry whenever it is caught up."""
        headers = [
            (k.lower().encode("latin-1"), str(v).encode("latin-1"))
            for k, v in page.headers.items()
            if k.lower() not in ("content-type", "content-length")
        ]
        headers += [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._chunk(send, f"retry: {SSE_RETRY_MS}\n\n")
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.heartbeat_seconds
        while not gone.done() and not self.draining:
            if page.status != 200:
                await self._chunk(send, _sse("error", page.body))
                return
            observations = page.body.get("observations") or []
            if observations:
                await self._chunk(send, "".join(_sse_observation(o) for o in observations))
            cursor = max(cursor, _int(page.body.get("next"), cursor))
            if cursor > _int(page.body.get("head"), 0):
                # Caught up: sleep until an append to this monitor or the next heartbeat.
                await self.waiters.wait(monitor, mark, next_beat - loop.time(), stop=gone)
                if gone.done() or self.draining:
                    return
            if loop.time() >= next_beat:
                await self._chunk(send, _sse("heartbeat", {"cursor": cursor, "time": _now_iso()}))
                # A reader following by stream is consuming (P6), though the stream never commits.
                await self.call(self.service.touch, sub_id, bearer(request))
                next_beat = loop.time() + self.heartbeat_seconds
            page, mark = await self._handle_marked(self._replay(request, sub_id, cursor))

    @staticmethod
    def _replay(request: Request, sub_id: str, cursor: int, limit: int = SSE_PAGE) -> Request:
        query = [(k, v) for k, v in request.query if k not in ("cursor", "limit", "wait")]
        query += [("cursor", str(cursor)), ("limit", str(limit))]
        return Request("GET", f"/mp/v0/subscriptions/{sub_id}/pull", query, request.headers)

    @staticmethod
    async def _chunk(send: Send, text: str) -> None:
        await send({"type": "http.response.body", "body": text.encode(), "more_body": True})

    # -- lifespan ----------------------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.shutdown()
                except Exception as exc:
                    log.exception("shutdown failed")
                    await send({"type": "lifespan.shutdown.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        self._ensure_listening()
        for hook in self.on_startup:
            result = hook(self)
            if asyncio.iscoroutine(result):
                await result
        if self.sweep_interval:
            self._tasks.append(asyncio.create_task(self._sweeper(), name="mp-sweep"))
        for task in self.background_tasks:
            self._tasks.append(
                asyncio.create_task(self._guard(task), name=getattr(task, "__name__", "mp-task"))
            )

    async def shutdown(self) -> None:
        self.begin_shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for hook in self.on_shutdown:
            result = hook(self)
            if asyncio.iscoroutine(result):
                await result
        await self.call(self.close_store)
        self.waiters.detach()
        self.engine.stop()

    def close_store(self) -> None:
        """Close the store once (runs on the engine thread when called through ``call``)."""
        if self.closed:
            return
        self.closed = True
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    async def _sweeper(self) -> None:
        assert self.sweep_interval
        while True:
            await asyncio.sleep(self.sweep_interval)
            here = getattr(self.service, "sweeps_here", None)
            if here is not None and not here():
                continue  # a shared store: another server leads the sweeps
            try:
                await self.call(self.service.sweep)
            except ProtocolError as err:  # the store is away (503): one line a tick, not a traceback
                log.warning("sweep: %s: %s", err.code, err.message)
            except Exception:
                log.exception("sweep failed")

    async def _guard(self, task: BackgroundTask) -> None:
        try:
            await task(self)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %r failed", task)


def create_app(service: Any, router: Any, **options: Any) -> MonitorApp:
    """Build the ASGI app around a service and its router; ``options`` are MonitorApp's (``store``
    defaults to ``service.store``)."""
    return MonitorApp(service, router, **options)


# -- helpers -----------------------------------------------------------------------------------------


def _with_param(query: list[tuple[str, str]], name: str, value: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in query if k != name] + [(name, value)]


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _rewaited(request: Request, remaining: float) -> Request:
    """The same pull asking to wait what is left, in whole seconds (the wire's unit), rounded up."""
    wait = str(max(0, math.ceil(remaining))) if remaining > 0 else "0"
    return Request(
        request.method, request.path, _with_param(request.query, "wait", wait), request.headers, request.body
    )


def _monitor_of(response: Response) -> str:
    """The monitor a pull's reply is about ("" for any other reply): whose appends its reader waits for."""
    if response.long_poll is not None:
        return response.long_poll.monitor
    body = response.body
    if isinstance(body, dict) and isinstance(body.get("monitor"), str):
        return body["monitor"]
    return ""


def _last_event_id(request: Request) -> int | None:
    value = (request.header("last-event-id") or "").strip()
    if not value:
        return None
    try:
        return int(value) + 1
    except ValueError:
        return None


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {wire.encode_text(data)}\n\n"


def _sse_observation(observation: dict[str, Any]) -> str:
    seq = _int(observation.get("id"), 0) or _int(observation.get("sequence"), 0)
    data = wire.encode_text(observation)
    return f"id: {seq}\nevent: observation\ndata: {data}\n\n"


def _now_iso() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
