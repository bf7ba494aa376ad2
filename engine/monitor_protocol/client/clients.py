"""`Client` (sync) and `AsyncClient` (asyncio) over the routes of routes.py: keep-alive connections of the client's own HTTP layers (keepalive.py; webhttp.py in a browser), httpx where a proxy applies or a transport is given, retries with idempotency keys, and the extensions a server offers."""

from __future__ import annotations

import functools
import inspect
import json
import random
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from monitor_protocol.client import httpreply, webhttp
from monitor_protocol.client.errors import (
    ConnectionFailed,
    MonitorProtocolError,
    UnexpectedResponse,
    error_from_body,
    not_sent_errors,
    retry_after_of,
)
from monitor_protocol.client.results import (
    Discovery,
    raw_reply,
)
from monitor_protocol.client.routes import (
    API_PREFIX,
    DEFAULT_BASE,
    DEFAULT_TIMEOUT,
    MAX_RETRY_DELAY,
    Ask,
    Call,
    ClientBase,
    Plan,
    Routes,
)
from monitor_protocol.core.wire import compact_encoder

if TYPE_CHECKING:
    import httpx  # imported where a client uses it: `import monitor_protocol.client` stays light

# In a browser (Pyodide) the browser sends (webhttp); keepalive needs sockets and `ssl`, which it lacks.


IN_BROWSER = sys.platform == "emscripten"
if sys.platform != "emscripten":
    from monitor_protocol.client import keepalive

# Replies decode faster with orjson when it is installed (the `server` extra): the same values.
_loads: Callable[[bytes], Any] = json.loads
try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - the standard library's decoder
    pass


T = TypeVar("T")
P = ParamSpec("P")


def pooled_request(prefix: str, call: Call[Any]) -> tuple[str, bytes | None, dict[str, str]]:
    """The request target, body and headers the client's own layers send for `call` (both clients): a
    keep-alive pool takes the base's path as `prefix`, the browser (webhttp) the whole base URL. The headers
    are shared between calls: read them, never change them."""
    target = prefix + call.path
    if call.params:
        target += "?" + urlencode(call.params, quote_via=quote)
    if call.body is None:
        return target, None, _shared_headers(call.token, False)
    return target, _json_body(call.body), _shared_headers(call.token, True)


def _shared_headers(token: str | None, json_body: bool) -> dict[str, str]:
    """A call's headers, made once per token: a client sends the same few again and again."""
    found = _HEADERS.get((token, json_body))
    if found is None:
        found = _headers(token)
        if json_body:
            found["content-type"] = "application/json"
        if len(_HEADERS) >= 256:
            _HEADERS.clear()
        _HEADERS[(token, json_body)] = found
    return found


_HEADERS: dict[tuple[str | None, bool], dict[str, str]] = {}

_encode = compact_encoder()
_encode_ascii = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _json_body(body: Any) -> bytes:
    try:
        return _encode(body).encode()
    except UnicodeEncodeError:  # a lone surrogate: sent escaped, so the server refuses it in its own words
        return _encode_ascii(body).encode()
    except ValueError as exc:  # NaN, Infinity, a circular reference: nothing is sent
        raise ValueError(
            f"the request is not JSON ({exc}): NaN and Infinity are not JSON numbers; send null or a string"
        ) from None
    except TypeError as exc:  # a set, bytes, a datetime: nothing is sent
        raise TypeError(
            f"the request is not JSON ({exc}): convert it first (a set to a list, bytes to text, a datetime "
            "to an RFC 3339 string)"
        ) from None


def _url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith(API_PREFIX) else base + API_PREFIX


def _headers(token: str | None) -> dict[str, str]:
    headers = {"accept": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def decode(response: httpx.Response | httpreply.Reply, call: Call[T]) -> T:
    try:
        body = _loads(response.content) if response.content else None
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise error_from_body(response.status_code, body, response.text, retry_after_of(response))
    if body is None and call.parse is not raw_reply:
        raise UnexpectedResponse(
            "UNEXPECTED_RESPONSE", f"HTTP {response.status_code} with no JSON body", response.status_code
        )
    return call.parse(body if body is not None else {})


def _network_reason(exc: httpx.HTTPError) -> str:
    kind = type(exc).__name__
    detail = str(exc) or kind
    return f"{kind}: {detail}" if detail != kind else kind


def _connection_failed(exc: httpx.HTTPError, url: str) -> ConnectionFailed:
    return ConnectionFailed(_network_reason(exc), url, sent=not isinstance(exc, not_sent_errors()))


def _retry_delay(call: Call[Any], attempt: int, exc: Exception) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None when `exc` must raise now."""
    if attempt >= call.retries:
        return None
    if isinstance(exc, MonitorProtocolError):
        if exc.code != "UNAVAILABLE" or exc.status != 503:
            return None  # a paused monitor (409) or any other refusal: retrying cannot help
    elif not isinstance(exc, ConnectionFailed) or not exc.retryable:
        return None  # a closed client, a request that is not HTTP: the same again would fail the same
    delay = call.backoff * (2.0**attempt) * random.uniform(0.5, 1.0)
    if isinstance(exc, MonitorProtocolError) and exc.retry_after is not None:
        delay = max(delay, exc.retry_after)
    return min(delay, MAX_RETRY_DELAY)


def _signature(build: Callable[..., Any], returns: str) -> inspect.Signature:
    sig = inspect.signature(build)
    params = list(sig.parameters.values())
    params[0] = params[0].replace(name="self", annotation=inspect.Parameter.empty)
    return sig.replace(parameters=params, return_annotation=returns)


def _returned(build: Callable[..., Any]) -> str:
    text = str(inspect.signature(build).return_annotation)
    return text[len("Call[") : -1] if text.startswith("Call[") else text


def _sync(build: Callable[Concatenate[ClientBase, P], Call[T]]) -> Callable[Concatenate[Client, P], T]:
    """A `Client` method performing the route `build` describes."""

    @functools.wraps(build)
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._perform(build(self, *args, **kwargs))

    method.__signature__ = _signature(build, _returned(build))  # type: ignore[attr-defined]
    return method


def _async(
    build: Callable[Concatenate[ClientBase, P], Call[T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    """An `AsyncClient` coroutine method performing the route `build` describes."""

    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._perform(build(self, *args, **kwargs))

    method.__signature__ = _signature(build, _returned(build))  # type: ignore[attr-defined]
    return method


# ---------------------------------------------------------------------------------------------- clients


class Client(ClientBase):
    """Synchronous client. `token` is used for every call that does not pass its own."""

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base = _url(base)
        self.token = token
        self.timeout = timeout
        # The HTTP layer, chosen by measurement (keepalive.py): the standard library's keep-alive
        # connections, or httpx where a proxy applies or the caller brings an httpx transport. In a browser,
        # a synchronous XMLHttpRequest (webhttp.Client: use it in a Web Worker).
        # The client's own layers take the same request (`pooled_request` with `_prefix`).
        self._pool: keepalive.Pool | webhttp.Client | None = None
        self._http: httpx.Client | None = None
        if transport is None and IN_BROWSER:
            self._pool, self._prefix = webhttp.Client(), self.base  # the browser takes absolute URLs
        elif transport is None and not keepalive.proxied(self.base):
            self._pool, self._prefix = keepalive.Pool(self.base), urlsplit(self.base).path
        else:
            import httpx

            self._http = httpx.Client(timeout=timeout, transport=transport)

    @property
    def http_layer(self) -> str:
        """Which HTTP layer this client uses: "keep-alive" (its own pool), "httpx", or in a browser "xhr"
        (a synchronous XMLHttpRequest)."""
        return self._pool.http_layer if self._pool is not None else "httpx"

    def _once(self, call: Call[T]) -> T:
        if self._pool is not None:
            return self._once_pooled(self._pool, call)
        import httpx

        assert self._http is not None
        url = self.base + call.path
        try:
            response = self._http.request(
                call.method,
                url,
                params=tuple(call.params) or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise _connection_failed(exc, url) from exc
        return decode(response, call)

    def _once_pooled(self, pool: keepalive.Pool | webhttp.Client, call: Call[T]) -> T:
        target, body, headers = pooled_request(self._prefix, call)
        try:
            reply = pool.request(call.method, target, body, headers, call.timeout or self.timeout)
        except httpreply.SendFailed as exc:
            raise ConnectionFailed(
                exc.reason, self.base + call.path, sent=exc.sent, retryable=not exc.final
            ) from exc
        return decode(reply, call)

    def _perform(self, call: Call[T]) -> T:
        if call.plan is not None:
            return self._drive(call.plan())
        attempt = 0
        while True:
            try:
                return self._once(call)
            except (ConnectionFailed, MonitorProtocolError) as exc:
                delay = _retry_delay(call, attempt, exc)
                if delay is None:
                    raise
            time.sleep(delay)
            attempt += 1

    def _drive(self, plan: Plan[T]) -> T:
        reply: Any = None
        refusal: MonitorProtocolError | None = None
        while True:
            try:
                step = plan.throw(refusal) if refusal is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            refusal = None
            try:
                reply = self._extension(step.extension) if isinstance(step, Ask) else self._perform(step)
            except MonitorProtocolError as err:
                refusal = err

    def _extension(self, name: str) -> Any:
        known = self._extensions
        if known is None:
            try:
                found: Discovery = self._perform(Routes.discover(self))
                known = self._learn_extensions(found)
            except MonitorProtocolError:
                known = self._learn_extensions(None)
        return known.get(name)

    request = _sync(Routes.request)
    discover = _sync(Routes.discover)
    list_monitors = _sync(Routes.list_monitors)
    get_monitor = _sync(Routes.get_monitor)
    create_monitor = _sync(Routes.create_monitor)
    update_monitor = _sync(Routes.update_monitor)
    pause_monitor = _sync(Routes.pause_monitor)
    resume_monitor = _sync(Routes.resume_monitor)
    retire_monitor = _sync(Routes.retire_monitor)
    state = _sync(Routes.state)
    publish = _sync(Routes.publish)
    publish_many = _sync(Routes.publish_many)
    subscribe = _sync(Routes.subscribe)
    get_subscription = _sync(Routes.get_subscription)
    pull = _sync(Routes.pull)
    ack = _sync(Routes.ack)
    seek = _sync(Routes.seek)
    renew = _sync(Routes.renew)
    retire_subscription = _sync(Routes.retire_subscription)
    claim = _sync(Routes.claim)
    renew_lease = _sync(Routes.renew_lease)
    complete = _sync(Routes.complete)
    release = _sync(Routes.release)
    reject = _sync(Routes.reject)
    admin_compact = _sync(Routes.admin_compact)
    admin_snapshot = _sync(Routes.admin_snapshot)
    admin_log = _sync(Routes.admin_log)
    rpc = _sync(Routes.rpc)
    rpc_batch = _sync(Routes.rpc_batch)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(ClientBase):
    """Asynchronous client: the same methods as `Client`, each a coroutine (await it)."""

    def __init__(
        self,
        base: str = DEFAULT_BASE,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base = _url(base)
        self.token = token
        self.timeout = timeout
        # Under asyncio, its own keep-alive connections (keepalive.AsyncPool, asyncio protocols); httpx under
        # trio, where a proxy applies, or with a caller's transport (created when first needed). In a
        # browser, the browser's fetch (webhttp.AsyncClient).
        self._transport = transport
        self._pool: keepalive.AsyncPool | webhttp.AsyncClient | None = None
        self._in_browser = transport is None and IN_BROWSER
        if self._in_browser:
            self._pool, self._prefix = webhttp.AsyncClient(), self.base  # the browser takes absolute URLs
        elif transport is None and not keepalive.proxied(self.base):
            self._pool, self._prefix = keepalive.AsyncPool(self.base), urlsplit(self.base).path
        self._http: httpx.AsyncClient | None = None

    @property
    def http_layer(self) -> str:
        """Which HTTP layer this client uses under asyncio: "asyncio keep-alive" (its own pool) or "httpx"
        (always httpx under trio), or in a browser "fetch"."""
        return self._pool.http_layer if self._pool is not None else "httpx"

    async def _via_httpx(self, call: Call[T]) -> T:
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout, transport=self._transport)
        url = self.base + call.path
        try:
            response = await self._http.request(
                call.method,
                url,
                params=tuple(call.params) or None,
                json=call.body if call.body is not None else None,
                headers=_headers(call.token),
                timeout=call.timeout or self.timeout,
            )
        except httpx.HTTPError as exc:
            raise _connection_failed(exc, url) from exc
        return decode(response, call)

    async def _sleep(self, delay: float) -> None:
        if isinstance(
            self._pool, webhttp.AsyncClient
        ):  # Pyodide's event loop is asyncio's, and anyio is not installed there
            import asyncio

            await asyncio.sleep(delay)
            return
        import anyio  # httpx depends on it; works under asyncio and trio

        await anyio.sleep(delay)

    async def _perform(self, call: Call[T]) -> T:
        if call.plan is not None:
            return await self._drive(call.plan())
        attempt = 0
        while True:
            try:
                pool = self._pool
                if pool is None or not (self._in_browser or keepalive.running_asyncio()):
                    return await self._via_httpx(call)
                # The pooled request inline, not in a coroutine of its own: each level of coroutine is a
                # frame made and resumed per request (issue 23's client budget).
                target, body, headers = pooled_request(self._prefix, call)
                try:
                    reply = await pool.request(
                        call.method, target, body, headers, call.timeout or self.timeout
                    )
                except httpreply.SendFailed as exc:
                    raise ConnectionFailed(
                        exc.reason, self.base + call.path, sent=exc.sent, retryable=not exc.final
                    ) from exc
                return decode(reply, call)
            except (ConnectionFailed, MonitorProtocolError) as exc:
                delay = _retry_delay(call, attempt, exc)
                if delay is None:
                    raise
            await self._sleep(delay)
            attempt += 1

    async def _drive(self, plan: Plan[T]) -> T:
        reply: Any = None
        refusal: MonitorProtocolError | None = None
        while True:
            try:
                step = plan.throw(refusal) if refusal is not None else plan.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            refusal = None
            try:
                if isinstance(step, Ask):
                    reply = await self._extension(step.extension)
                else:
                    reply = await self._perform(step)
            except MonitorProtocolError as err:
                refusal = err

    async def _extension(self, name: str) -> Any:
        known = self._extensions
        if known is None:
            try:
                found: Discovery = await self._perform(Routes.discover(self))
                known = self._learn_extensions(found)
            except MonitorProtocolError:
                known = self._learn_extensions(None)
        return known.get(name)

    request = _async(Routes.request)
    discover = _async(Routes.discover)
    list_monitors = _async(Routes.list_monitors)
    get_monitor = _async(Routes.get_monitor)
    create_monitor = _async(Routes.create_monitor)
    update_monitor = _async(Routes.update_monitor)
    pause_monitor = _async(Routes.pause_monitor)
    resume_monitor = _async(Routes.resume_monitor)
    retire_monitor = _async(Routes.retire_monitor)
    state = _async(Routes.state)
    publish = _async(Routes.publish)
    publish_many = _async(Routes.publish_many)
    subscribe = _async(Routes.subscribe)
    get_subscription = _async(Routes.get_subscription)
    pull = _async(Routes.pull)
    ack = _async(Routes.ack)
    seek = _async(Routes.seek)
    renew = _async(Routes.renew)
    retire_subscription = _async(Routes.retire_subscription)
    claim = _async(Routes.claim)
    renew_lease = _async(Routes.renew_lease)
    complete = _async(Routes.complete)
    release = _async(Routes.release)
    reject = _async(Routes.reject)
    admin_compact = _async(Routes.admin_compact)
    admin_snapshot = _async(Routes.admin_snapshot)
    admin_log = _async(Routes.admin_log)
    rpc = _async(Routes.rpc)
    rpc_batch = _async(Routes.rpc_batch)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
