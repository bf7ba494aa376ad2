"""The client's HTTP layer in a browser (Pyodide, `sys.platform == "emscripten"`): the browser sends.

Pyodide has no sockets that reach the network and no `ssl` module, so neither keepalive.py (http.client,
asyncio streams) nor httpx can work there. `monitor_protocol.client` picks this layer by default on
emscripten (an explicit httpx `transport=` still uses httpx):

* `AsyncClient` (for `client.AsyncClient`, `http_layer == "fetch"`) sends with the browser's `fetch`, in a
  page or a worker; a page's own `/mp/v0/...` engine is reached through its service worker.
* `Client` (for `client.Client`, `http_layer == "xhr"`) sends with a synchronous XMLHttpRequest, which
  blocks the thread until the reply is in. Use it in a Web Worker (the site's runner.js runs code there):
  on a page's main thread the page's own engine cannot answer, because the service worker hands the
  request to that very page, which is blocked waiting for it; this layer refuses that case at once with a
  sentence saying so, instead of hanging. Cross-origin servers work from a main thread too (without a
  timeout there: browsers forbid one on a synchronous request of a window).

Both return a `Reply` with the names `clients.decode` reads (status_code, content, headers) and raise
`SendFailed` with `sent=False` only when the request certainly never left (a bad URL or header refused by
the browser before sending); a network error or timeout after that is `sent=True` (the outcome is unknown).

This module imports `js` and `pyodide` only inside the functions that send, so it imports on CPython too
(tests/test_client_web.py tests its pure parts there).
"""

from __future__ import annotations

import math
from typing import Any

from monitor_protocol.client.httpreply import Reply, SendFailed

__all__ = ["AsyncClient", "Client", "Reply", "SendFailed", "parse_headers", "timeout_ms", "x_user_defined"]

MAIN_THREAD_OWN_ENGINE = (
    "a synchronous Client cannot reach this page's own engine from the page's main thread: the service "
    "worker hands the request to this page, which is blocked waiting for the reply. Use AsyncClient "
    "(await its methods) here, or run this code in a Web Worker (the site's runner.js)"
)


def parse_headers(raw: str) -> dict[str, str]:
    """XMLHttpRequest.getAllResponseHeaders() text ("name: value" lines, CRLF) as a dict with lower-case
    names; a repeated header is joined with ", " as the Fetch standard combines them."""
    headers: dict[str, str] = {}
    for line in raw.split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            continue
        key, value = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers


def timeout_ms(timeout: float) -> int:
    """A timeout in seconds as the whole milliseconds the browser takes (at least 1: 0 means "none")."""
    if not timeout or timeout <= 0 or math.isnan(timeout):
        raise ValueError(f"timeout is seconds > 0, not {timeout!r}")
    return max(1, math.ceil(timeout * 1000))


def x_user_defined(text: str) -> bytes:
    """The bytes of a reply read as text with the "x-user-defined" charset (how a window's synchronous
    XMLHttpRequest returns binary: byte b >= 0x80 arrives as U+F700 + b, the rest as themselves)."""
    return bytes(ord(ch) & 0xFF for ch in text)


def _js_reason(exc: BaseException) -> str:
    """A JavaScript error as "Name: message" (JsException carries the error's name and message)."""
    name = str(getattr(exc, "name", "") or type(exc).__name__)
    message = str(getattr(exc, "message", "") or exc)
    return message if message.startswith(name) else f"{name}: {message}"


def _on_main_thread(js: Any) -> bool:
    return hasattr(js, "document") and hasattr(js, "window")


def _own_engine(js: Any, url: str) -> bool:
    """Whether `url` goes to this page's origin while a service worker controls the page (its engine)."""
    try:
        origin = str(js.location.origin)
        controlled = bool(js.navigator.serviceWorker and js.navigator.serviceWorker.controller)
    except AttributeError:
        return False
    return controlled and (url == origin or url.startswith(origin + "/"))


class Client:
    """Synchronous requests with XMLHttpRequest (blocking the calling thread: a Web Worker's)."""

    http_layer = "xhr"

    def __init__(self) -> None:
        self.closed = False

    def request(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Reply:
        if self.closed:
            raise SendFailed("the client is closed", sent=False, final=True)
        import js  # type: ignore[import-not-found,unused-ignore]  # Pyodide's modules: only there
        from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found,unused-ignore]

        main = _on_main_thread(js)
        if main and _own_engine(js, url):
            raise SendFailed(MAIN_THREAD_OWN_ENGINE, sent=False, final=True)
        xhr = js.XMLHttpRequest.new()
        try:
            xhr.open(method, url, False)
            for name, value in headers.items():
                xhr.setRequestHeader(name, value)
            if main:  # a window's synchronous request takes no responseType and no timeout
                xhr.overrideMimeType("text/plain; charset=x-user-defined")
            else:
                xhr.responseType = "arraybuffer"
                xhr.timeout = timeout_ms(timeout)
        except JsException as exc:  # a URL or header the browser refuses: nothing was sent
            raise SendFailed(_js_reason(exc), sent=False) from exc
        try:
            xhr.send(to_js(body) if body is not None else None)
        except JsException as exc:  # NetworkError, TimeoutError: it may have reached the server
            reason = _js_reason(exc)
            if getattr(exc, "name", "") == "TimeoutError":
                reason = "TimeoutError: the server did not answer in time"
            raise SendFailed(reason, sent=True) from exc
        if not xhr.status:  # no HTTP reply at all (a network error not raised as one)
            raise SendFailed("NetworkError: no reply from the server", sent=True)
        if main:
            content = x_user_defined(str(xhr.responseText or ""))
        else:
            content = xhr.response.to_bytes() if xhr.response is not None else b""
        return Reply(int(xhr.status), bytes(content), parse_headers(str(xhr.getAllResponseHeaders())))

    def close(self) -> None:
        self.closed = True


class AsyncClient:
    """Requests with the browser's fetch (a page or a worker; asyncio on Pyodide's event loop)."""

    http_layer = "fetch"

    def __init__(self) -> None:
        self.closed = False

    async def request(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Reply:
        if self.closed:
            raise SendFailed("the client is closed", sent=False, final=True)
        import asyncio

        import js  # type: ignore[import-not-found,unused-ignore]  # Pyodide's modules: only there
        from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found,unused-ignore]

        controller = js.AbortController.new()
        # The timeout covers the whole exchange, body included (the signal aborts reading it too).
        signals = to_js([controller.signal, js.AbortSignal.timeout(timeout_ms(timeout))])
        options: dict[str, Any] = {
            "method": method,
            "headers": headers,
            "cache": "no-store",
            "signal": js.AbortSignal.any(signals),
        }
        if body is not None:
            options["body"] = to_js(body)
        try:
            request = js.Request.new(url, to_js(options, dict_converter=js.Object.fromEntries))
        except JsException as exc:  # a URL, method or header the browser refuses: nothing was sent
            raise SendFailed(_js_reason(exc), sent=False) from exc
        try:
            response = await js.fetch(request)
            content = (await response.arrayBuffer()).to_bytes()
        except JsException as exc:  # TypeError (network), TimeoutError: it may have reached the server
            reason = _js_reason(exc)
            if getattr(exc, "name", "") == "TimeoutError":
                reason = "TimeoutError: the server did not answer in time"
            raise SendFailed(reason, sent=True) from exc
        except asyncio.CancelledError:
            controller.abort()  # the caller gave up: so does the browser
            raise
        found = js.Object.fromEntries(response.headers.entries()).to_py()
        return Reply(int(response.status), bytes(content), {str(k).lower(): str(v) for k, v in found.items()})

    async def aclose(self) -> None:
        self.closed = True
