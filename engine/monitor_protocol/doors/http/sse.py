"""Server-Sent Events at GET /mp/v0/subscriptions/{id}/stream (docs/protocol.md section 9): read-only replays of the
pull route (its `cursor` query parameter) with the reader's own headers, so the stream never commits; it
waits in the doors' one registry (doors/parking.py) between pages, with a heartbeat that is also the
reader's sign of life (P6)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from monitor_protocol.api.messages import Request, Response, error_response
from monitor_protocol.api.rest import bearer
from monitor_protocol.core import wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.validation import as_int
from monitor_protocol.doors.http.asgi import Receive, Send, send_json, wait_disconnect

SSE_RETRY_MS = 3000
SSE_HEARTBEAT_SECONDS = 5.0
SSE_PAGE = 200
PROBE_CURSOR = (1 << 53) - 1  # a replay cursor past any head (and within the wire's 0..2^53 integers)


pause = asyncio.sleep  # a stream's wait between walks of the log in vain (tests count them)


async def stream(app: Any, request: Request, sub_id: str, receive: Receive, send: Send) -> None:
    """Section 9: replay the subscription through the read-only pull route and follow it live."""
    # A read-only replay far past any head checks the policy (Origin/Host) and the reader's token,
    # changes nothing, and reports the monitor and the committed cursor.
    probe = await app.handle(_replay(request, sub_id, PROBE_CURSOR, limit=1))
    if probe.status != 200:
        await _refuse(send, request, probe)
        return
    try:
        start = _start(request)
    except ProtocolError as err:
        await send_json(send, error_response(err))
        return
    cursor = max(1, start if start is not None else _int(probe.body.get("cursor"), 1))
    monitor = str(probe.body.get("monitor", ""))
    first, mark = await app.handle_marked(_replay(request, sub_id, cursor))
    reset = None
    # An explicit ?cursor=N is a replay from there, refused below the floor as a pull's replay is; the
    # committed cursor and a reconnect's Last-Event-ID follow the reset policy (a compaction between two
    # tries moves the floor again: a few tries).
    asked = start is not None and not (request.header("last-event-id") or "").strip()
    for _try in range(0 if asked else 3):
        moved = None if first.status == 200 else await _moved(app, request, sub_id, first)
        if moved is None:
            break
        cursor, moved_reset = moved
        reset = moved_reset if reset is None else {**moved_reset, "requested": reset["requested"]}
        first, mark = await app.handle_marked(_replay(request, sub_id, cursor))
    if first.status != 200:
        await _refuse(send, request, first)
        return
    await app.engine.call(app.service.touch, sub_id, bearer(request))
    gone = asyncio.ensure_future(wait_disconnect(receive))
    app.metrics.open_streams += 1
    try:
        await _follow(app, request, sub_id, monitor, cursor, first, mark, gone, send, reset)
    finally:
        app.metrics.open_streams -= 1
        gone.cancel()
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:
            pass


async def _refuse(send: Send, request: Request, refused: Response) -> None:
    """A stream that cannot start. A browser's EventSource takes any status but 200 as final and never
    connects again, so a refusal that passes (503: the store is away for a moment) is told to an
    EventSource (it asks for text/event-stream) as a stream of one `error` event, after which it connects
    again in `retry` ms; every other refusal, and every other client, gets the status and its JSON."""
    accept = (request.header("accept") or "").lower()
    if refused.status != 503 or "text/event-stream" not in accept:
        await send_json(send, refused)
        return
    await send({"type": "http.response.start", "status": 200, "headers": _stream_head(refused)})
    text = f"retry: {SSE_RETRY_MS}\n\n" + _sse("error", refused.body)
    await send({"type": "http.response.body", "body": text.encode(), "more_body": False})


def _stream_head(response: Response) -> list[tuple[bytes, bytes]]:
    """A stream's headers: the reply's own (CORS), those of its JSON body and a retry hint left out."""
    headers = [
        (k.lower().encode("latin-1"), str(v).encode("latin-1"))
        for k, v in response.headers.items()
        if k.lower() not in ("content-type", "content-length", "retry-after")
    ]
    return headers + [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]


async def _follow(
    app: Any,
    request: Request,
    sub_id: str,
    monitor: str,
    cursor: int,
    page: Response,
    mark: int,
    gone: asyncio.Future[None],
    send: Send,
    reset: dict[str, Any] | None = None,
) -> None:
    """Send the stream's head, then each page, parking in the registry whenever it is caught up. `reset`:
    the stream began where the reset policy moved it (said first)."""
    await send({"type": "http.response.start", "status": 200, "headers": _stream_head(page)})
    await _chunk(send, f"retry: {SSE_RETRY_MS}\n\n" + (_sse_reset(reset) if reset is not None else ""))
    loop = asyncio.get_running_loop()
    next_beat = loop.time() + app.heartbeat_seconds
    while not gone.done() and not app.draining:
        if page.status != 200:
            moved = await _moved(app, request, sub_id, page)
            if moved is None:
                await _chunk(send, _sse("error", page.body))
                return
            cursor, reset = moved
            await _chunk(send, _sse_reset(reset))
            page, mark = await app.handle_marked(_replay(request, sub_id, cursor))
            continue
        observations = page.body.get("observations") or []
        if observations:
            await _chunk(send, "".join(_sse_observation(o) for o in observations))
        # the page's next, as a pull's: past the head (a Last-Event-ID or ?cursor= from a log since restored
        # from a backup, say) it is head + 1, where the next append will be, not the far cursor asked for
        cursor = _int(page.body.get("next"), cursor)
        if cursor > _int(page.body.get("head"), 0):
            # Caught up: sleep until an append to this monitor or the next heartbeat.
            await app.waiters.wait(monitor, mark, next_beat - loop.time(), stop=gone)
            if gone.done() or app.draining:
                return
        if loop.time() >= next_beat:
            # A reader following by stream is consuming (P6), though the stream never commits; a token renewed
            # or revoked meanwhile ends the stream with the refusal, as a replay's would
            try:
                await app.engine.call(app.service.touch, sub_id, bearer(request))
            except ProtocolError as err:
                await _chunk(send, _sse("error", err.body()))
                return
            await _chunk(send, _sse("heartbeat", {"cursor": cursor, "time": _now_iso()}))
            next_beat = loop.time() + app.heartbeat_seconds
        asked = loop.time()
        page, mark = await app.handle_marked(_replay(request, sub_id, cursor))
        if page.status == 200 and page.body.get("scan_capped") and not page.body.get("observations"):
            # A walk of the log that found nothing (a filter no single index answers, pages.py): the next one
            # waits as long as this one took, so a stream walking a long log in vain takes at most about half
            # of the server's time, never walk after walk (a tester's five such streams held every other
            # request 0.6-0.75 s for 15 s).
            await pause(max(0.01, loop.time() - asked))


async def _moved(
    app: Any, request: Request, sub_id: str, refused: Response
) -> tuple[int, dict[str, Any]] | None:
    """A replay refused because compaction passed its cursor, for a subscription whose reset policy moves
    such a cursor (earliest: to the retention floor; latest: past the head): where the stream goes on from,
    and what its `reset` event says (the fields of a pull's `reset`). The stream never commits, so only the
    stream moves, as a pull would have moved the cursor. None for any other refusal (with reset_policy
    none, the stream ends with CURSOR_EXPIRED as an `error` event)."""
    body = refused.body if isinstance(refused.body, dict) else {}
    policy = body.get("reset_policy")
    if refused.status != 410 or body.get("code") != "CURSOR_EXPIRED" or policy not in ("earliest", "latest"):
        return None
    floor = _int(body.get("retention_floor"), 1)
    cursor = floor
    if policy == "latest":
        probe = await app.handle(_replay(request, sub_id, PROBE_CURSOR, limit=1))
        if probe.status != 200:
            return None
        cursor = _int(probe.body.get("head"), 0) + 1
    said = {"reset_policy": policy, "requested": _int(body.get("requested"), 0), "retention_floor": floor}
    return cursor, {**said, "cursor": cursor}


def _sse_reset(reset: dict[str, Any]) -> str:
    """The reset event; its id makes a reconnect (Last-Event-ID) resume where the stream was moved to."""
    return f"id: {reset['cursor'] - 1}\n" + _sse("reset", reset)


def _replay(request: Request, sub_id: str, cursor: int, limit: int | None = None) -> Request:
    query = [(k, v) for k, v in request.query if k not in ("cursor", "limit", "wait")]
    query += [("cursor", str(cursor)), ("limit", str(SSE_PAGE if limit is None else limit))]
    return Request("GET", f"/mp/v0/subscriptions/{sub_id}/pull", query, request.headers)


async def _chunk(send: Send, text: str) -> None:
    await send({"type": "http.response.body", "body": text.encode(), "more_body": True})


def _start(request: Request) -> int | None:
    """Where the stream starts: after `Last-Event-ID` (a reconnect), else at `?cursor=` (a replay from there:
    nothing commits), else None (the committed cursor). Each is the strict integer rule's; any other
    spelling (-1, +5, 1.0, abc) is refused with a sentence, never read loosely or ignored."""
    last = (request.header("last-event-id") or "").strip()
    if last:
        try:
            return as_int(last, "Last-Event-ID", minimum=0) + 1
        except ProtocolError:
            raise ProtocolError(
                "INVALID",
                f"Last-Event-ID must be the id of an event this stream sent (a seq in ASCII decimal digits), "
                f"not {last[:40]!r}; reconnect without it to start at the subscription's committed cursor.",
                invalid=last[:40],
            ) from None
    cursors = [value for key, value in request.query if key == "cursor"]
    if len(cursors) > 1:
        raise ProtocolError("INVALID", "Send cursor once.")
    return as_int(cursors[0], "cursor", minimum=0) if cursors else None


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
