"""The HTTP door's operations routes, outside /mp/v0: GET /healthz (the process answers: 200), GET /readyz
(the store answers a trivial read on the engine thread within READY_TIMEOUT_SECONDS: 200, else 503) and
GET /metrics (Prometheus text; see ``Metrics``). The health routes skip the Origin and Host checks (they
reveal nothing, and probes name the server by address); /metrics keeps them, and answers only a loopback
client or a bearer of the metrics (or admin) token, and only that token once one is set."""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import math
import re
import threading
import time
from typing import Any

from monitor_protocol.api.messages import Request, Response, error_response
from monitor_protocol.api.rest import PREFIX, bearer, route_table
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.netguard import is_loopback
from monitor_protocol.core.repeats import Repeats

log = logging.getLogger("monitor_protocol.http")

OPS_PATHS = ("/healthz", "/readyz", "/metrics")
READY_TIMEOUT_SECONDS = 2.0
METRICS_TIMEOUT_SECONDS = 5.0
METRICS_TOP_SUBSCRIPTIONS = 20  # backlog gauges for at most this many active subscriptions (largest first)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "OPTIONS", "PUT", "PATCH", "DELETE"})
NO_STORE = {"cache-control": "no-store"}


def _route_templates() -> list[tuple[re.Pattern[str], str]]:
    """The router's routes as (regex on the path below /mp/v0, label such as /mp/v0/monitors/{id})."""
    out = []
    for _method, regex, _fn in route_table():
        label = re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", regex.pattern.strip("^$"))
        out.append((regex, PREFIX + label))
    return out


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# Headers a reverse proxy adds: a request carrying one was forwarded, whatever address it came from.
FORWARDED_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip", "x-forwarded-host")


def _asked_locally(app: Any, request: Request) -> bool:
    """Whether a loopback connection's request may be taken for a local client's: a reverse proxy on this
    machine connects from loopback too. Not when it carries a proxy's forwarding header, nor when the server
    accepts a public Host name (--allow-host): that is how a proxy or a public bind is set up, and the Host
    a request names is the client's to choose, so it tells nothing."""
    if any(request.header(name) is not None for name in FORWARDED_HEADERS):
        return False
    hosts = getattr(app.router, "allowed_hosts", None) or ()
    return all(is_loopback(host) for host in hosts)


class CollectorPauses:
    """How long the garbage collector held the process, per generation (gc.callbacks): a full collection
    stops every request at once, so its pauses are worth seeing beside the latencies they add to. One per
    process (`watch()` in mp serve); the collector runs under the GIL, one collection at a time."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._began = 0.0
        self.watching = False

    def _phase(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        g = info.get("generation", 2)
        self.count[g] += 1
        self.seconds[g] += took
        self.longest[g] = max(self.longest[g], took)

    def watch(self) -> None:
        if not self.watching:
            gc.callbacks.append(self._phase)
            self.watching = True

    def unwatch(self) -> None:
        if self.watching:
            gc.callbacks.remove(self._phase)
            self.watching = False


GC_PAUSES = CollectorPauses()


def settle_heap() -> int:
    """After startup: what startup made (modules, routes, the app, the store's caches) lives as long as the
    process, so it is moved out of the collector's sight (gc.freeze): a full collection then walks only what
    requests made, which shortens its pause by about a third in a server holding 1,000 connections
    (docs/bench-history.md). The price: an object of startup that dies later inside a reference cycle (a DB
    connection replaced on reconnect) is never collected, a bounded one-time cost. Returns the objects
    frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class Metrics:
    """The HTTP door's counters, rendered in the Prometheus text format (version 0.0.4).

    Every label set is bounded: routes are the router's templates (ids replaced by ``{id}``; anything else is
    ``other``), methods the HTTP ones, and per-subscription backlog only for the METRICS_TOP_SUBSCRIPTIONS
    active subscriptions with the largest backlog. Counters are bumped on the event loop; commit times and the
    engine's CPU on the engine's threads (several at once with EngineLanes: under a lock).
    """

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: dict[tuple[str, str, int], int] = {}
        self.commit_buckets = [0] * (len(COMMIT_BUCKETS) + 1)
        self.commit_sum = 0.0
        self.commit_count = 0
        self.engine_cpu = 0.0  # CPU seconds of the engine's threads running calls and their commits
        self.engine_calls = 0
        self._engine_lock = threading.Lock()
        self.parked_polls = 0
        self.open_streams = 0
        # The HTTP server's connections (mp serve's own server sets it: doors/http/protocol.py HttpServer):
        # `connections` (a sized collection) and `admission` (doors/http/admission.py).
        self.http_server: Any = None
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

    def count_request(self, method: str, path: str, status: int, response: Response | None = None) -> None:
        """One answered request; the route's label comes from the router when it answered (else from the
        path, matched against the route templates)."""
        label = response.route if response is not None and response.route is not None else self.route(path)
        key = (label, method if method in KNOWN_METHODS else "OTHER", status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def observe_commit(self, seconds: float, cpu_seconds: float = 0.0, calls: int = 1) -> None:
        """One engine batch: its wall time, its thread's CPU time, its calls (doors/engines.py CommitHook)."""
        with self._engine_lock:
            for i, bound in enumerate(COMMIT_BUCKETS):
                if seconds <= bound:
                    self.commit_buckets[i] += 1
                    break
            else:
                self.commit_buckets[-1] += 1
            self.commit_sum += seconds
            self.commit_count += 1
            self.engine_cpu += cpu_seconds
            self.engine_calls += calls

    def _routed(self, suffix: str, method: str) -> int:
        return sum(
            n
            for (route, m, status), n in list(self.requests.items())
            if route.endswith(suffix) and m == method and 200 <= status < 300
        )

    def render(self, appended: int, store: dict[str, Any] | None, link: dict[str, int] | None = None) -> str:
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
        server = self.http_server
        if server is not None:
            admission = server.admission
            family("mp_http_connections_open", "gauge", "Client connections open right now.")
            lines.append(f"mp_http_connections_open {len(server.connections)}")
            if admission.bound is not None:
                family(
                    "mp_http_connections_bound",
                    "gauge",
                    "The most client connections held at once (the open-files limit less a reserve).",
                )
                lines.append(f"mp_http_connections_bound {admission.bound}")
            family(
                "mp_http_connections_shed_total",
                "counter",
                "Connections closed to admit new ones at the connection bound (idle, or a request head too slow).",
            )
            lines.append(f"mp_http_connections_shed_total {admission.shed}")
            family(
                "mp_http_connections_refused_total",
                "counter",
                "New connections answered 503 at the connection bound, none could be closed.",
            )
            lines.append(f"mp_http_connections_refused_total {admission.refused}")
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
        family(
            "mp_engine_cpu_seconds_total",
            "counter",
            "CPU time the engine's threads spent running calls and committing them (the fsync's system time "
            "included; 0 where the platform has no per-thread CPU clock).",
        )
        lines.append(f"mp_engine_cpu_seconds_total {self.engine_cpu:.6f}")
        family(
            "mp_engine_calls_total", "counter", "Engine calls run (each call of a group commit counts once)."
        )
        lines.append(f"mp_engine_calls_total {self.engine_calls}")
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
        if link is not None:  # a store shared by several servers (PostgreSQL)
            family(
                "mp_store_listening",
                "gauge",
                "1 while this server's LISTEN connection to the shared store is up (other servers' appends "
                "wake its readers), else 0.",
            )
            lines.append(f"mp_store_listening {link['listening']}")
            family(
                "mp_store_listen_connects_total",
                "counter",
                "LISTEN connections made to the shared store: the first, then one per reconnection (after "
                "each, every parked reader re-checks).",
            )
            lines.append(f"mp_store_listen_connects_total {link['listen_connects']}")
            family(
                "mp_store_notifications_heard_total",
                "counter",
                "Notifications of other servers' appends heard on the shared store (one per commit and monitor: "
                "a group commit of many publishes is one).",
            )
            lines.append(f"mp_store_notifications_heard_total {link['heard']}")
            family(
                "mp_store_leader",
                "gauge",
                "1 while this server holds the shared store's leader lock (it runs the sweeps and push delivery).",
            )
            lines.append(f"mp_store_leader {link['leader']}")
        family("mp_gc_pauses_total", "counter", "Garbage collections, by generation (mp serve watches them).")
        for g in range(3):
            lines.append(f'mp_gc_pauses_total{{generation="{g}"}} {GC_PAUSES.count[g]}')
        family("mp_gc_pause_seconds_total", "counter", "Time the garbage collector held the process.")
        for g in range(3):
            lines.append(f'mp_gc_pause_seconds_total{{generation="{g}"}} {GC_PAUSES.seconds[g]:.6f}')
        family("mp_gc_pause_seconds_max", "gauge", "The longest collection since the server started.")
        for g in range(3):
            lines.append(f'mp_gc_pause_seconds_max{{generation="{g}"}} {GC_PAUSES.longest[g]:.6f}')
        family("mp_gc_frozen_objects", "gauge", "Objects startup made, kept out of the collector's walks.")
        lines.append(f"mp_gc_frozen_objects {gc.get_freeze_count()}")
        family("process_start_time_seconds", "gauge", "When the server started, in seconds since the epoch.")
        lines.append(f"process_start_time_seconds {self.started:.3f}")
        return "\n".join(lines) + "\n"


def store_summary(store: Any) -> dict[str, Any]:
    """Monitors, active subscriptions and their backlog (head past the committed cursor); engine thread."""
    return store.backlog_summary(METRICS_TOP_SUBSCRIPTIONS)  # type: ignore[no-any-return]


async def ready(app: Any) -> Response:
    """GET /readyz: 200 when the store answers a trivial read on the engine thread in time, else 503."""
    headers = dict(NO_STORE)
    if app.draining or app.closed:
        return Response(503, {"status": "stopping"}, {**headers, "retry-after": "1"})
    probe = getattr(app.store, "get_monitor", None)
    read_only = getattr(app.store, "read_only", None)  # PostgreSQL: a standby answers reads, not writes
    try:
        if probe is not None:
            await asyncio.wait_for(app.engine.call(probe, ""), READY_TIMEOUT_SECONDS)
        if read_only is not None and await asyncio.wait_for(
            app.engine.call(read_only), READY_TIMEOUT_SECONDS
        ):
            return Response(
                503,
                {
                    "status": "read-only",
                    "error": "the database accepts no writes (a standby, or default_transaction_read_only "
                    "is on): publishes, pulls and acks fail here; point this server at the primary",
                },
                {**headers, "retry-after": "1"},
            )
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
        _ready_failures(app).failed(getattr(exc, "detail", None) or exc)
        return Response(
            503,
            {"status": "unavailable", "error": "the store failed a trivial read (see the server log)"},
            {**headers, "retry-after": "1"},
        )
    _ready_failures(app).ok()
    return Response(200, {"status": "ready"}, headers)


def _ready_failures(app: Any) -> Repeats:
    """The readiness probe's failures, logged as they start and end (a load balancer probes every second)."""
    found = getattr(app, "_ready_failures", None)
    if found is None:
        found = app._ready_failures = Repeats(log, "readiness probe: the store failed")
    return found  # type: ignore[no-any-return]


def metrics_refusal(app: Any, request: Request, client_host: str | None) -> Response | None:
    """None when this request may read /metrics: the Origin and Host checks of the protocol routes
    hold (no DNS rebinding, no browser page reads it), then a metrics token, once one is set, is
    required of everyone; without one a loopback client may read, or a bearer of the admin token."""
    try:
        app.router.check_request(request)
    except ProtocolError as err:
        return error_response(err)
    token = bearer(request) or ""
    expected = [t for t in (app.metrics_token, getattr(app.router, "admin_token", None)) if t]
    if any(hmac.compare_digest(token.encode(), t.encode()) for t in expected):
        return None
    if not app.metrics_token and is_loopback(client_host) and _asked_locally(app, request):
        return None
    sentence = (
        "GET /metrics needs the metrics token: Authorization: Bearer <token> (mp serve --metrics-token)."
        if app.metrics_token
        else "GET /metrics answers local clients only (a loopback address, no proxy's forwarding header, "
        "and no public name in --allow-host); start the server with --metrics-token (env MP_METRICS_TOKEN) "
        "to scrape it from elsewhere, through a proxy, or on a server that serves a public name."
    )
    return error_response(ProtocolError("UNAUTHORIZED", sentence))


async def metrics_text(app: Any) -> bytes:
    """The Prometheus text of GET /metrics (the store's part read on the engine thread, bounded in time)."""
    summary = None
    if app.store is not None and hasattr(app.store, "list_subscriptions") and not app.closed:
        failures = getattr(app, "_summary_failures", None)
        if failures is None:  # logged as they start and end, not at every scrape of an outage
            failures = app._summary_failures = Repeats(log, "metrics: the store summary failed")
        try:
            summary = await asyncio.wait_for(
                app.engine.call(store_summary, app.store), METRICS_TIMEOUT_SECONDS
            )
        except TimeoutError:
            failures.failed(f"no answer within {METRICS_TIMEOUT_SECONDS} s")
        except Exception as exc:  # the scrape still answers, with mp_store_up 0
            failures.failed(getattr(exc, "detail", None) or f"{type(exc).__name__}: {exc}")
        else:
            failures.ok()
    link = getattr(app.store, "link_stats", None)
    appended = getattr(app.service, "observations_appended", app.waiters.appended)
    return app.metrics.render(appended, summary, link() if link is not None else None).encode()


async def answer(app: Any, request: Request, client_host: str | None) -> Response | bytes:
    """One operations route: a JSON Response, or the bytes of the metrics text (200, text/plain)."""
    if request.path == "/healthz":
        return Response(200, {"status": "ok"}, dict(NO_STORE))
    if request.path == "/readyz":
        return await ready(app)
    refusal = metrics_refusal(app, request, client_host)
    if refusal is not None:
        return refusal
    return await metrics_text(app)
