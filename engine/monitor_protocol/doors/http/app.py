"""The HTTP door: a raw ASGI app around the transport-free RestRouter (docs/protocol.md sections 5, 8, 9, 10).

What this module adds to the router, and nothing else:

* the body cap: a request whose Content-Length, or whose bytes read so far, exceed ``max_body`` is refused
  with 413 TOO_LARGE before the rest is read (asgi.py);
* one engine thread (doors/engines.py): every engine call runs there, never on the event loop; the
  calls made during one event-loop iteration travel together as one batch and one group commit, and no call
  is answered before its commit is durable;
* long poll: an empty pull that asked to wait is held by the doors' one park/wake machine
  (doors/parking.py ``hold``) and re-handled as soon as its monitor gets an append (no polling); the pulls
  one append wakes re-check in the same loop turn, so their re-checks are one batch on the engine thread;
* SSE at ``GET /mp/v0/subscriptions/{id}/stream`` (sse.py);
* the lifespan: a sweep timer (``service.sweep()`` every second), ``background_tasks`` and
  ``on_startup``/``on_shutdown`` hooks for other doors, and closing the store on shutdown;
* operations, outside ``/mp/v0``: ``GET /healthz``, ``GET /readyz`` and ``GET /metrics`` (ops.py).

Origin, Host and CORS policy live in the router; this module never answers a request under ``/mp/v0`` the
router has not seen first, so the policy holds for every protocol path, the stream included.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from monitor_protocol.api import jsonrpc, operations
from monitor_protocol.api.messages import LongPoll, Request, Response, error_response
from monitor_protocol.api.rest import PREFIX, parked_reply
from monitor_protocol.core.errors import ProtocolError, internal_failure
from monitor_protocol.core.repeats import Repeats
from monitor_protocol.core.vocab import DEFAULT_MAX_BODY
from monitor_protocol.doors import collector, parking
from monitor_protocol.doors.engines import EngineThread
from monitor_protocol.doors.http import ops, sse
from monitor_protocol.doors.http.asgi import (
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    discard_body,
    read_body,
    request_of,
    send_json,
    send_text,
    wait_disconnect,
)
from monitor_protocol.doors.http.ops import OPS_PATHS, Metrics

RPC_PATH = PREFIX + operations.BY_NAME["rpc"].route
log = logging.getLogger("monitor_protocol.http")

SWEEP_INTERVAL_SECONDS = 1.0
STREAM_PATH = re.compile(r"^/mp/v0/subscriptions/([^/]+)/stream/?$")
_MONITORS, _OBSERVATIONS = f"{PREFIX}/monitors/", "/observations"  # a REST publish's path, around its monitor

BackgroundTask = Callable[["MonitorApp"], Awaitable[None]]
Hook = Callable[["MonitorApp"], Awaitable[None] | None]


def _failure(request: Request, exc: BaseException) -> tuple[Response, int]:
    """An engine call that raised, as the (response, mark) it answers with: never a raise, never a 500."""
    if isinstance(exc, ProtocolError):
        return error_response(exc), -1
    incident = uuid.uuid4().hex[:12]
    log.error("router raised on %s %s (incident %s)", request.method, request.path, incident, exc_info=exc)
    # A bug is not bad input (docs/protocol.md section 10): 503 UNAVAILABLE with Retry-After, naming the incident.
    return error_response(internal_failure(incident)), -1


# The long polls an append wakes are re-checked in the append's own group commit (one fsync for the append and
# their deliveries, instead of one each in turn) when at most this many wait: the re-check (~20 µs a reader)
# delays the reply of every call in that group, so a larger fan-out takes a group of its own, just after.
JOIN_WOKEN_MAX = 32


class JoinWoken:
    """The HTTP door's joiner for a LoopEngine (doors/engines.Joiner): the re-check of the long polls woken by
    the appends of the group that is running, as one more call of that group."""

    def __init__(self, app: MonitorApp) -> None:
        self.app = app

    def wanted(self) -> bool:
        return self.app.waiters.parked > 0 or bool(self.app._woken)

    def take(self) -> list[tuple[Callable[..., Any], tuple[Any, ...], Callable[[bool, Any], None]]]:
        app = self.app
        woken = app._woken
        if not woken or len(woken) > JOIN_WOKEN_MAX:
            return []
        app._woken = []
        job, answer = app._woken_job(woken)

        def joined(ok: bool, value: Any) -> None:
            if ok:
                answer(ok, value)
            else:  # the group failed, or the re-check in it: re-checked on their own, as if never joined
                app._requeue_woken(woken)

        return [(job, (), joined)]


class MonitorApp:
    """An ASGI 3 application serving the Monitor Protocol over HTTP.

    ``background_tasks``: coroutine functions ``task(app)`` started after startup and cancelled at
    shutdown (for instance HTTP push delivery). ``on_startup`` / ``on_shutdown``: callables ``hook(app)``
    (sync or async) run in order. ``await app.engine.call(fn, *args)`` runs ``fn`` on the engine thread.
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
        heartbeat_seconds: float = sse.SSE_HEARTBEAT_SECONDS,
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
        self.waiters = parking.Waiters()
        self._listening = False
        self.draining = False
        # /healthz, /readyz and /metrics (outside /mp/v0); metrics_token may be changed while serving.
        self.ops_routes = ops_routes
        self.metrics_token = metrics_token
        self.metrics = Metrics()
        # Woken readers waiting for their re-check, gathered over one loop turn (see _woken_pull).
        self._woken: list[tuple[LongPoll, asyncio.Future[parking.Outcome]]] = []
        self._woken_scheduled = False
        self._collector_holds = 0  # this app's holds on the garbage collector (_schedule_recheck)
        if self.engine.on_commit is None:
            self.engine.on_commit = self.metrics.observe_commit
        if (
            getattr(self.engine, "group_key", False) is None
        ):  # EngineLanes: publishes to one monitor, one commit
            self.engine.group_key = self._group_key
        if getattr(self.engine, "joiner", False) is None:  # LoopEngine: woken readers join the append's group
            self.engine.joiner = JoinWoken(self)
        if getattr(self.engine, "merge", False) is None and hasattr(router, "handle_publishes"):
            self.engine.merge = self._merge  # a group's lone publishes: one engine call

    # -- the engine thread ------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """Hand one request to the router on the engine thread; never raises."""
        return (await self.handle_marked(request))[0]

    async def handle_marked(self, request: Request) -> tuple[Response, int]:
        """`handle`, plus the registry's mark for the response's monitor, read on the engine thread right
        after the request ran (so an append that commits before the caller parks still wakes it)."""
        try:
            return await self._submit_marked(request)
        except Exception as exc:
            return _failure(request, exc)

    def handle_job(self, request: Request) -> tuple[Response, int]:
        """One request through the router, on the engine's seat, with the registry's mark for the monitor
        its reply is about read right after it ran (a long poll parks past it)."""
        response = self.router.handle(request)
        return response, self.waiters.mark(_monitor_of(response))

    def _group_key(self, fn: Any, args: tuple[Any, ...]) -> str | None:
        """The monitor a REST publish names (POST /mp/v0/monitors/{id}/observations), for the engine to run
        publishes queued together for one monitor as one group commit; None for any other job."""
        if fn != self.handle_job or len(args) != 1 or not isinstance(args[0], Request):
            return None
        request = args[0]
        if request.method != "POST" or not request.path.endswith(_OBSERVATIONS):
            return None
        monitor_id = request.path[len(_MONITORS) : -len(_OBSERVATIONS)]
        if not request.path.startswith(_MONITORS) or not monitor_id or "/" in monitor_id:
            return None
        return monitor_id

    def _merge(self, fn: Any, args: tuple[Any, ...]) -> Callable[[list[tuple[Any, ...]]], list[Any]] | None:
        """For the engine (doors/engines.merged): a REST publish of one JSON object runs with its neighbours
        of the same kind as one call (`handle_publishes`); None for any other job."""
        if self._group_key(fn, args) is None or args[0].body[:64].lstrip()[:1] != b"{":
            return None
        return self.handle_publishes

    def handle_publishes(self, calls: list[tuple[Any, ...]]) -> list[tuple[bool, tuple[Response, int]]]:
        """`handle_job` for several requests (each call's args: its request) as one engine call: each one's
        outcome, (True, its response and mark), the response the one `handle_job` gives it."""
        responses = self.router.handle_publishes([args[0] for args in calls])
        return [(True, (response, self.waiters.mark(_monitor_of(response)))) for response in responses]

    def _submit_marked(self, request: Request) -> asyncio.Future[tuple[Response, int]]:
        return self.engine.submit(self.handle_job, request)

    @staticmethod
    def failure(request: Request, exc: BaseException) -> tuple[Response, int]:
        """An engine call that raised, as the (response, mark) it answers with."""
        return _failure(request, exc)

    # -- wake-ups ---------------------------------------------------------------------------------

    def _woken_pull(self, poll: LongPoll) -> asyncio.Future[parking.Outcome]:
        """Queue a woken reader's re-check: the readers of one loop turn (those one append woke) are
        re-checked in one engine call, MonitorService.pull_many, which reads what they share once. Woken
        inside an engine group (the append's own), they join that group when few (JoinWoken)."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[parking.Outcome] = loop.create_future()
        self._woken.append((poll, outcome))
        self._schedule_recheck(loop)
        return outcome

    def _schedule_recheck(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._woken_scheduled:
            loop.call_soon(self._recheck_woken)
            self._woken_scheduled = True
            # No automatic garbage collection until their replies have left (_recheck_woken releases it):
            # a full one inside the wake of 1,000 readers would hold every one of them (doors/collector.py).
            self._collector_holds += 1
            collector.HOLD.acquire()

    def _release_collector(self) -> None:
        if self._collector_holds > 0:
            self._collector_holds -= 1
            collector.HOLD.release()

    def _requeue_woken(self, woken: list[tuple[LongPoll, asyncio.Future[parking.Outcome]]]) -> None:
        """Readers whose re-check failed inside another call's group: re-checked again in a group of their own
        (what that group appended was rolled back with it, or was kept: their own pull finds out)."""
        self._woken.extend(woken)
        self._schedule_recheck(asyncio.get_running_loop())

    def _recheck_woken(self) -> None:
        self._woken_scheduled = False
        woken, self._woken = self._woken, []
        if not woken:
            self._release_collector()
            return  # (re-checked in the group whose appends woke them)
        try:
            job, answer = self._woken_job(woken)
            submitted = self.engine.submit(job)
        except RuntimeError as exc:  # the engine has stopped
            self._release_collector()
            for _poll, outcome in woken:
                if not outcome.done():
                    response, mark = _failure(Request("GET", "(woken pulls)"), exc)
                    outcome.set_result((response, None, mark))
            return
        except BaseException:
            self._release_collector()
            raise

        def answered(done: asyncio.Future[list[tuple[Response, int]]]) -> None:
            try:
                exc = RuntimeError("the engine call was cancelled") if done.cancelled() else done.exception()
                answer(exc is None, exc if exc is not None else done.result())
            finally:
                self._release_collector()  # the replies have been written

        submitted.add_done_callback(answered)

    def _woken_job(
        self, woken: list[tuple[LongPoll, asyncio.Future[parking.Outcome]]]
    ) -> tuple[Callable[[], list[tuple[Response, int]]], Callable[[bool, Any], None]]:
        """The engine call that re-checks these woken readers, and what answers them with its outcome. The
        readers go in the order of their monitors' ids: the call locks each reader's monitor as it comes to
        it, and two servers of one PostgreSQL database re-checking readers of the same monitors (each woken
        by its own append first, the other's a moment later) would otherwise lock them in opposite orders
        and deadlock (PostgreSQL breaks it after a second, and every reader of the call gets 503)."""
        woken.sort(key=_monitor_of_woken)
        polls = [poll for poll, _ in woken]
        # the replies' rows as stored JSON text when every reader's request came through a door that only
        # encodes them (Request.door_encodes)
        raw = all(poll.again is not None and poll.again.door_encodes for poll in polls)

        def job() -> list[tuple[Response, int]]:
            same: list[int] = []
            results = self.service.pull_many([poll.pull for poll in polls], same=same, raw=raw)
            marks: dict[str, int] = {}
            out: list[tuple[Response, int]] = []
            for poll, result, first in zip(polls, results, same, strict=True):
                if isinstance(result, ProtocolError):
                    response = error_response(result, poll.headers)
                    response.route = poll.route
                else:
                    response = parked_reply(result, poll)
                    if first >= 0:  # its body is that one's but for its id: written from its bytes
                        response.like = out[first][0]
                monitor = _monitor_of(response)
                mark = marks.get(monitor)
                if mark is None:
                    mark = marks[monitor] = self.waiters.mark(monitor)
                out.append((response, mark))
            return out

        def answer(ok: bool, value: Any) -> None:
            settled: list[tuple[asyncio.Future[parking.Outcome], parking.Outcome]] = []
            failed: BaseException | None = None
            # A failed engine call is logged once (one incident), each reader answered with its own copy.
            failure = None if ok else _failure(Request("GET", "(woken pulls)"), value)
            try:
                for i, (poll, outcome) in enumerate(woken):
                    if outcome.done():
                        continue
                    if failure is not None:
                        response, mark = replace(failure[0], headers=dict(failure[0].headers)), failure[1]
                    else:
                        try:
                            response, mark = value[i]
                        except Exception as exc:  # a result that does not fit: this reader's failure only
                            response, mark = _failure(Request("GET", "(woken pull)"), exc)
                    waiting = response.long_poll.monitor if response.long_poll is not None else None
                    settled.append((outcome, (response, waiting, mark)))
                    if waiting is None and poll.reply_now is not None:
                        try:
                            poll.reply_now(response)  # the answer: written now, the wait winds down after
                        except Exception:  # one reader's failed write must not strand the others' replies
                            log.exception("writing a woken long poll's reply failed")
            except BaseException as exc:
                failed = exc
                raise
            finally:
                # Every reply first, then the waiters (each resumes on a later loop step): the last reader's
                # reply does not wait behind the others' bookkeeping. Also when answering failed part way:
                # the readers not answered yet get that failure, none is left waiting for nothing.
                for outcome, result in settled:
                    if not outcome.done():
                        outcome.set_result(result)
                left = [outcome for _poll, outcome in woken if not outcome.done()]
                if left:
                    exc = failed or RuntimeError("answering the woken readers failed")
                    response, mark = _failure(Request("GET", "(woken pulls)"), exc)
                    for outcome in left:
                        outcome.set_result((replace(response, headers=dict(response.headers)), None, mark))

        return job, answer

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
            request = request_of(scope)
            if self.ops_routes and request.path in OPS_PATHS and request.method in ("GET", "HEAD"):
                client = scope.get("client") or (None, None)
                answer = await ops.answer(self, request, client[0])
                if isinstance(answer, bytes):
                    await send_text(tracked_send, answer, "text/plain; version=0.0.4; charset=utf-8")
                else:
                    await send_json(tracked_send, answer)
                return
            try:
                request.body = await read_body(request, receive, self.max_body)
            except BodyTooLarge:
                if "100-continue" not in (request.header("expect") or "").lower():
                    # A client that did not ask first is still sending; unread bytes at close would make
                    # the kernel reset the connection and destroy the 413. Discard them (bounded) first.
                    await discard_body(receive)
                await send_json(tracked_send, await self.too_large(request), close=True)
                return
            match = STREAM_PATH.match(request.path)
            if match and request.method == "GET":
                await sse.stream(self, request, match.group(1), receive, tracked_send)
                return
            response, mark = await self.handle_marked(request)
            if response.long_poll is not None:
                response = await self.hold_long_poll(request, response, mark, receive)
                if response is None:
                    return  # the client left while waiting
            await send_json(tracked_send, response)
        except ClientGone:
            return
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("unexpected failure on %s (incident %s)", scope.get("path"), incident)
            if not started:
                await send_json(tracked_send, error_response(internal_failure(incident)))

    async def too_large(self, request: Request) -> Response:
        """413 TOO_LARGE for a body past the cap, under the same Origin/Host policy as any request."""
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
        cors = {
            k: v
            for k, v in policy.headers.items()
            if k.lower().startswith("access-control") or k.lower() == "vary"
        }
        if request.path == RPC_PATH:  # a JSON-RPC client reads a JSON-RPC error (-32016), as for a long batch
            refused = jsonrpc.too_large(err)
            refused.headers.update(cors)
            return refused
        return error_response(err, cors)

    # -- long poll ---------------------------------------------------------------------------------

    async def hold_long_poll(
        self, request: Request, first: Response, mark: int, receive: Receive
    ) -> Response | None:
        """Hold an empty pull (parking.hold) until its monitor gets an append that matches, or until the
        deadline; each re-check is the same pull asking to wait what is left, submitted inside the wake-up
        so that every pull one append woke joins one engine batch. None: the client left."""
        assert first.long_poll is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, float(first.long_poll.wait_seconds))
        again = first.long_poll.again or request  # an ack-and-pull re-checks as a plain pull

        poll = first.long_poll
        rerun = poll.rerun  # the engine call again, without the router (when the route gave it)

        def job(retry: Request) -> tuple[Response, int]:
            response = rerun() if rerun is not None else self.router.handle(retry)
            return response, self.waiters.mark(_monitor_of(response))

        def recheck(remaining: float) -> asyncio.Future[parking.Outcome]:
            if poll.pull is not None:  # with every reader woken in this turn, in one engine call
                return self._woken_pull(poll)
            retry = _rewaited(again, remaining)
            outcome: asyncio.Future[parking.Outcome] = loop.create_future()
            try:
                submitted = self.engine.submit(job, retry)
            except RuntimeError as exc:  # the engine has stopped
                response, mark = _failure(retry, exc)
                outcome.set_result((response, None, mark))
                return outcome

            def answered(done: asyncio.Future[tuple[Response, int]]) -> None:
                exc = RuntimeError("the engine call was cancelled") if done.cancelled() else done.exception()
                response, mark = _failure(retry, exc) if exc is not None else done.result()
                waiting = response.long_poll.monitor if response.long_poll is not None else None
                outcome.set_result((response, waiting, mark))

            submitted.add_done_callback(answered)
            return outcome

        gone = asyncio.ensure_future(wait_disconnect(receive))
        self.metrics.parked_polls += 1
        try:
            response = await parking.hold(
                self.waiters, first.long_poll.monitor, mark, deadline, recheck, gone=gone
            )
        finally:
            self.metrics.parked_polls -= 1
            gone.cancel()
        if response is not None:
            response.long_poll = None
        return response

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
        try:
            self.begin_shutdown()
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
            self._tasks.clear()
            try:
                for hook in self.on_shutdown:
                    result = hook(self)
                    if asyncio.iscoroutine(result):
                        await result
            finally:  # a hook that raised still leaves the store closed (once: shutdown may run twice)
                if not self.closed:
                    await self.engine.call(self.close_store)
        finally:  # and whatever raised: the store's thread stopped, the collector back on
            self.waiters.detach()
            self.engine.stop()
            while self._collector_holds:  # a re-check the loop will never run
                self._release_collector()

    def close_store(self) -> None:
        """Close the store once (runs on the engine thread when called through ``call``, by itself: never
        inside a group commit, which would go on to commit on a closed store)."""
        if self.closed:
            return
        self.closed = True
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    close_store.runs_alone = True  # type: ignore[attr-defined]  # see doors/engines.run_group

    async def _sweeper(self) -> None:
        assert self.sweep_interval
        failing = Repeats(log, "sweep")
        while True:
            await asyncio.sleep(self.sweep_interval)
            here = getattr(self.service, "sweeps_here", None)
            if here is not None and not here():
                continue  # a shared store: another server leads the sweeps
            try:
                await self.engine.call(getattr(self.service, "sweep_due", self.service.sweep))
            except ProtocolError as err:  # the store is away (503): a few lines an outage, not one a tick
                failing.failed(f"{err.code}: {err.message}")
            except Exception:
                log.exception("sweep failed")
            else:
                failing.ok()

    async def _guard(self, task: BackgroundTask) -> None:
        try:
            await task(self)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %r failed", task)


# -- helpers -----------------------------------------------------------------------------------------


def _rewaited(request: Request, remaining: float) -> Request:
    """The same pull asking to wait what is left, in whole seconds (the wire's unit), rounded up."""
    wait = str(max(0, math.ceil(remaining))) if remaining > 0 else "0"
    query = [(k, v) for k, v in request.query if k != "wait"] + [("wait", wait)]
    return Request(request.method, request.path, query, request.headers, request.body, request.door_encodes)


def _monitor_of(response: Response) -> str:
    """The monitor a pull's reply is about ("" for any other reply): whose appends its reader waits for."""
    if response.long_poll is not None:
        return response.long_poll.monitor
    body = response.body
    if isinstance(body, dict) and isinstance(body.get("monitor"), str):
        return body["monitor"]
    return ""


def _monitor_of_woken(woken: tuple[LongPoll, Any]) -> str:
    return woken[0].monitor
