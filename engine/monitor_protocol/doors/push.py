"""HTTP push delivery (`protocol: "http"`, docs/protocol.md section 9) for `mp serve`.

For every active subscription with protocol http, a worker pulls a batch as the subscription
(`service.pull_as_system`), POSTs the pull reply as JSON to the subscription's `sink` with Standard Webhooks
headers, and then:

* 2xx: commits the batch (`service.ack_as_system(sub, next)`) and goes on with the next batch;
* 410 Gone: retires the subscription (`service.retire_as_system`, logged as subscription_retired);
* anything else, or no answer: retries the same cursor after an exponential backoff with jitter
  (0.5 s doubling up to 60 s). The batch comes back from the log, its observations marked `redelivered`.

Nothing is committed that the sink did not acknowledge with a 2xx, and a worker never has more than one
request in flight for its subscription. Workers sleep until an append wakes them (`service.add_listener`);
the set of push subscriptions is re-read on every wake and every few seconds.

Sink guard (docs/protocol.md section 9): before every POST the sink's host is resolved again (in a thread) and
`netguard.sink_refusal` judges the URL and every address it resolves to against the operator's allow-list
(`service.allowed_sinks`, from `mp serve --allow-sink`). A refused sink gets no request at all: the refusal is
logged and retried with the same backoff as a failed delivery, and the cursor does not move.
To keep the window between that check and the connection closed (DNS rebinding), the POST connects to the
vetted address itself (doors/sinkguard.py, shared with the server's `http` sources): the URL's host is
replaced by the address, while the `Host` header and the TLS SNI / certificate check (httpx's
`sni_hostname` request extension) still name the sink's own host. Each sink host
gets its own client, so a TLS connection verified for one name is never reused for another name that happens
to share its address.

A failed batch is retried unchanged (docs/protocol.md section 9): the worker remembers the in-flight batch of each
subscription (its first seq and its number of observations) and pulls the retry with that limit, so the same
first N rows come back from the immutable log (same seqs, same `webhook-id`); observations appended meanwhile
wait for the next batch. Only when the log itself says otherwise (the cursor moved past the batch, or its rows
were compacted) does a new batch start.

Signing (Standard Webhooks): `webhook-id` is `<subscription>:<first seq>-<last seq>` (stable while the same
batch is retried, so a receiver can de-duplicate), `webhook-timestamp` is Unix seconds (of each attempt), and
`webhook-signature` is `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>` where `key` is the base64
decoded part of the subscription's `sink_secret` after `whsec_`. The secret is returned once, in the subscribe
reply, as `sink_secret` (send your own `sink_secret` at subscribe to choose it). `verify` is the receiver's
side: it also refuses a `webhook-timestamp` more than 5 minutes away from the receiver's clock (a replay).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import httpx

from monitor_protocol.core import netguard
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules.refusals import shown_sink
from monitor_protocol.doors import sinkguard

log = logging.getLogger("monitor_protocol.doors.push")

Call = Callable[..., Awaitable[Any]]

BATCH_LIMIT = 50
REQUEST_TIMEOUT_SECONDS = 10.0
MAX_REPLY_BYTES = 64 << 10  # of a sink's reply read at most (only its status is used), then closed
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 60.0
RESCAN_SECONDS = 5.0
STORAGE_RETRY_SECONDS = 1.0  # a store that is away answers 503 with Retry-After: 1 (errors.py)
# verify: a webhook-timestamp further than this from the receiver's clock is refused (a replay)
TIMESTAMP_TOLERANCE_SECONDS = 300.0


def secret_key(sink_secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (a secret without the prefix is used as raw bytes)."""
    if sink_secret.startswith("whsec_"):
        return base64.b64decode(sink_secret[len("whsec_") :])
    return sink_secret.encode()


def sign(sink_secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of id.timestamp.body>` (Standard Webhooks)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(sink_secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    sink_secret: str,
    headers: dict[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_seconds: float = TIMESTAMP_TOLERANCE_SECONDS,
) -> bool:
    """What a receiver does: refuse a `webhook-timestamp` more than `tolerance_seconds` (5 minutes) away from
    its clock (`now`, Unix seconds, default the current time), then recompute the signature and compare in
    constant time (any listed v1 matches)."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, ts = lower.get("webhook-id", ""), lower.get("webhook-timestamp", "")
    if not msg_id or not ts.isascii() or not ts.isdigit() or len(ts) > 16:
        return False
    current = time.time() if now is None else float(now)
    if abs(current - int(ts)) > tolerance_seconds:
        return False  # too old (a replay) or too far ahead
    expected = sign(sink_secret, msg_id, int(ts), body)
    return any(hmac.compare_digest(expected, given) for given in lower.get("webhook-signature", "").split())


def backoff(attempt: int) -> float:
    """Exponential backoff with full jitter in its upper half: attempt 1 -> ~0.5 s, doubling, capped."""
    delay = min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * (2 ** max(0, attempt - 1)))
    return delay * random.uniform(0.5, 1.0)


class Pusher:
    """Delivers every http subscription; `call(fn, *args)` runs an engine call on the engine thread."""

    def __init__(
        self,
        call: Call,
        service: Any,
        *,
        http: httpx.AsyncClient | None = None,
        limit: int = BATCH_LIMIT,
        rescan_seconds: float = RESCAN_SECONDS,
        backoff: Callable[[int], float] = backoff,
        clock: Callable[[], float] = time.time,
        allowed_sinks: Collection[str] | None = None,
        resolve: Callable[[str], list[str]] = netguard.resolve_host,
    ) -> None:
        self.call = call
        self.service = service
        # An injected client serves every sink (tests); otherwise one owned client per sink host.
        self.http = http
        self._clients: dict[tuple[str, str, int | None], httpx.AsyncClient] = {}
        if allowed_sinks is None:
            allowed_sinks = getattr(service, "allowed_sinks", None) or ()
        self.allowed_sinks: tuple[str, ...] = tuple(allowed_sinks)
        self.resolve = resolve
        self.limit = limit
        self.rescan_seconds = rescan_seconds
        self.backoff = backoff
        self.clock = clock
        self.workers: dict[str, asyncio.Task[None]] = {}
        self.wakes: dict[str, asyncio.Event] = {}
        self.targets: dict[str, dict[str, Any]] = {}
        # The batch each subscription failed to deliver, as (first seq, number of observations): it is
        # retried unchanged until the sink answers it (docs/protocol.md section 9).
        self.inflight: dict[str, tuple[str, int]] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoch: int | None = -1  # the engine's push_epoch when the targets were last read
        self._targets_epoch: int | None = None  # the same, for the read `targets` came from (None: none yet)

    # -- wake-ups ------------------------------------------------------------------------------------

    def _appended(self, monitor_id: str, head: int) -> None:
        # On the engine thread after a committed append: hop to the loop, never block here.
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        epoch = getattr(self.service, "push_epoch", None)
        if not self.targets and epoch is not None and epoch == self._epoch:
            # Nobody to push to and nothing changed: no hop (a hop per publish costs a wake-up of the loop).
            # A target read after this starts with its backlog (rescan sets its wake), so none is missed.
            return
        try:
            loop.call_soon_threadsafe(self._on_append, monitor_id)
        except RuntimeError:
            pass

    def _on_append(self, monitor_id: str) -> None:
        # The set of push subscriptions changed (a subscribe, a retirement): look it up again. An append
        # that changed nothing of it costs no engine call here.
        epoch = getattr(self.service, "push_epoch", None)
        if epoch is None or epoch != self._epoch:  # an engine that keeps no epoch: look every time
            self._wake.set()
        for sub_id, target in self.targets.items():
            if target["monitor"] == monitor_id and sub_id in self.wakes:
                self.wakes[sub_id].set()

    # -- the supervisor --------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.call(self.service.add_listener, self._appended)
        try:
            while True:
                try:
                    await self.rescan()
                except ProtocolError as err:  # the store is away (503): keep the workers, look again later
                    log.warning(
                        "push: re-reading the push subscriptions failed (%s): %s", err.code, err.message
                    )
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.rescan_seconds)
                except TimeoutError:
                    pass
        finally:
            for task in self.workers.values():
                task.cancel()
            await asyncio.gather(*self.workers.values(), return_exceptions=True)
            remove = getattr(self.service, "remove_listener", None)
            if remove is not None:
                try:
                    await self.call(remove, self._appended)
                except Exception:
                    log.exception("removing the push listener failed")
            clients, self._clients = list(self._clients.values()), {}
            for client in clients:
                await client.aclose()

    def _here(self) -> bool:
        here = getattr(self.service, "sweeps_here", None)
        return True if here is None else bool(here())

    def _sees_every_change(self) -> bool:
        """Whether this engine makes every change of its store's subscriptions (one server on its own file),
        so that `push_epoch` moves whenever the set of push targets does; not so on a shared store."""
        return not getattr(getattr(self.service, "store", None), "shared", False)

    async def rescan(self) -> None:
        # Read before the targets: a change after this moves the epoch again, and the next append wakes us.
        epoch = self._epoch = getattr(self.service, "push_epoch", None)
        if not self._here():
            targets: dict[str, Any] = {}  # a shared store: the leading server pushes (one request in flight)
            self._targets_epoch = None
        elif (
            epoch is not None
            and epoch == self._targets_epoch
            and self._sees_every_change()
            and not any(worker.done() for worker in self.workers.values())
        ):
            # Nothing changed the set since it was read (and no worker stopped, which a target gone without
            # a change this engine kept, such as a rolled-back group, would make): no read of every
            # subscription on the engine's seat (the loop, on SQLite) every few seconds (~17 ms per 1,000).
            targets = self.targets
        else:
            targets = {t["id"]: t for t in await self.call(self.service.push_targets)}
            self._targets_epoch = epoch
        self.targets = targets
        for sub_id in list(self.workers):
            if sub_id not in targets or self.workers[sub_id].done():
                task = self.workers.pop(sub_id)
                self.wakes.pop(sub_id, None)
                self.inflight.pop(sub_id, None)
                task.cancel()
        for sub_id, wake in self.wakes.items():
            if sub_id in targets:
                # Every rescan also looks once at each idle subscription: an append whose notification was
                # lost (another server's, while the LISTEN connection was down) is pushed within a rescan.
                wake.set()
        for sub_id in targets:
            if sub_id not in self.workers:
                self.wakes[sub_id] = asyncio.Event()
                self.wakes[sub_id].set()  # deliver the backlog at once
                self.workers[sub_id] = asyncio.create_task(self._worker(sub_id), name=f"mp-push-{sub_id}")

    # -- one subscription ------------------------------------------------------------------------------

    async def _worker(self, sub_id: str) -> None:
        wake = self.wakes[sub_id]
        attempt = 0
        while True:
            await wake.wait()
            wake.clear()
            while True:  # drain: one batch at a time, never two in flight
                if not self._here():
                    return  # a shared store's leadership moved: the leading server pushes now (rescan)
                outcome = await self.deliver_once(sub_id)
                if outcome == "delivered":
                    attempt = 0
                    continue
                if outcome == "idle":
                    attempt = 0
                    break
                if outcome == "stop":
                    return
                if outcome == "unavailable":  # the store, not the sink: retry as its Retry-After says
                    await asyncio.sleep(STORAGE_RETRY_SECONDS)
                    continue
                attempt += 1
                await asyncio.sleep(self.backoff(attempt))

    async def deliver_once(self, sub_id: str) -> str:
        """One pull, one POST, one commit. Returns delivered | idle | retry | unavailable | stop."""
        outcome = await self._deliver_once(sub_id)
        if outcome not in ("retry", "unavailable"):
            self.inflight.pop(sub_id, None)  # answered (or given up): the next batch is a new one
        return outcome

    async def _deliver_once(self, sub_id: str) -> str:
        target = self.targets.get(sub_id)
        if target is None:
            return "stop"
        held = self.inflight.get(sub_id)
        # A failed batch is pulled again with its own size: the log is immutable, so the same first N rows
        # come back (same seqs, same webhook-id) and what was appended meanwhile waits for the next batch.
        limit = held[1] if held is not None else self.limit
        try:
            batch = await self.call(lambda: self.service.pull_as_system(sub_id, limit=limit))
        except ProtocolError as err:
            if err.code == "UNAVAILABLE":
                log.warning("push %s: the store is unavailable (%s); will retry", sub_id, err.message)
                return "unavailable"
            log.warning("push %s: pull refused (%s: %s); delivery stopped", sub_id, err.code, err.message)
            return "stop"
        observations = batch.get("observations") or []
        if held is not None and (not observations or str(observations[0]["id"]) != held[0]):
            # The log moved under the batch (a reader committed past it, or its rows were compacted).
            log.info(
                "push %s: the failed batch from seq %s is gone from the cursor; a new batch", sub_id, held[0]
            )
            self.inflight.pop(sub_id, None)  # what came back (perhaps fewer rows than usual) is a new batch
        if not observations and batch.get("scan_capped"):
            # A bounded pull examined rows none of which is for this sink: commit past them and go on.
            return await self._commit(sub_id, int(batch["next"]))
        if not observations:
            return "idle"
        # From here on a failure retries exactly this batch.
        self.inflight[sub_id] = (str(observations[0]["id"]), len(observations))
        body = json.dumps(batch, separators=(",", ":"), ensure_ascii=False).encode()
        msg_id = f"{sub_id}:{observations[0]['id']}-{observations[-1]['id']}"
        timestamp = int(self.clock())
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(target.get("sink_secret") or "", msg_id, timestamp, body),
            "user-agent": "monitor-protocol-push/0.1",
        }
        sink = target["sink"]
        plan = await self.vet(sink)
        if isinstance(plan, str):
            log.warning("push %s: sink %s refused, nothing sent (%s); will retry", sub_id, sink, plan)
            return "retry"
        response = await self.post(sink, plan, body, headers)
        if isinstance(response, str):
            log.info("push %s: sink %s did not answer (%s); will retry", sub_id, sink, response)
            return "retry"
        if 200 <= response.status_code < 300:
            return await self._commit(sub_id, int(batch["next"]))
        if response.status_code == 410:
            try:
                await self.call(
                    self.service.retire_as_system,
                    sub_id,
                    f"sink {shown_sink(target['sink'])} answered 410 Gone",
                )
            except ProtocolError as err:
                log.warning("push %s: retire refused (%s: %s)", sub_id, err.code, err.message)
            return "stop"
        log.info("push %s: sink answered %s; will retry", sub_id, response.status_code)
        return "retry"

    async def _commit(self, sub_id: str, cursor: int) -> str:
        """Ack as the subscription: "delivered", or "stop" when the commit is refused for another reason than
        CURSOR_BACKWARDS (a reader with the token committed further meanwhile: the log is the truth)."""
        try:
            await self.call(self.service.ack_as_system, sub_id, cursor)
        except ProtocolError as err:
            if (
                err.code == "UNAVAILABLE"
            ):  # delivered, not committed: the same batch goes again (at-least-once)
                log.warning(
                    "push %s: the store is unavailable for the commit (%s); will retry", sub_id, err.message
                )
                return "unavailable"
            if err.code != "CURSOR_BACKWARDS":
                log.warning("push %s: commit refused (%s: %s)", sub_id, err.code, err.message)
                return "stop"
        return "delivered"

    # -- the sink guard ----------------------------------------------------------------------------------

    async def vet(self, sink: str) -> list[str] | str:
        """The addresses a delivery to ``sink`` may connect to, resolved now; or why it may not happen."""
        return await sinkguard.vet(sink, self.allowed_sinks, self.resolve)

    def _client(self, url: httpx.URL) -> httpx.AsyncClient:
        if self.http is not None:
            return self.http
        key = (url.scheme, url.host, url.port)
        client = self._clients.get(key)
        if client is None:
            client = httpx.AsyncClient(
                timeout=REQUEST_TIMEOUT_SECONDS, follow_redirects=False, trust_env=False
            )
            self._clients[key] = client
        return client

    async def post(
        self, sink: str, addresses: list[str], body: bytes, headers: dict[str, str]
    ) -> httpx.Response | str:
        """POST to the vetted addresses in turn (the next only when a connection could not be made at all)."""
        url = httpx.URL(sink)
        client = self._client(url)
        failure = "no address to connect to"
        for address in addresses:
            target, pinned_headers, extensions = sinkguard.pinned(sink, address, headers)
            try:
                request = client.build_request(
                    "POST", target, content=body, headers=pinned_headers, extensions=extensions
                )
                response = await client.send(request, stream=True)
                try:
                    await self._drain(response)
                finally:
                    await response.aclose()
                return response
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = f"{address}: {exc}"  # nothing reached the sink: the next address may answer
            except httpx.HTTPError as exc:
                return f"{address}: {exc}"
        return failure

    @staticmethod
    async def _drain(response: httpx.Response) -> None:
        """Read a sink's reply only so far (its status decides; its body is never used): at most
        MAX_REPLY_BYTES within REQUEST_TIMEOUT_SECONDS, so a connection can be kept for the next batch,
        and a sink answering a huge or endless body costs the server nothing more (it is closed)."""
        read = 0
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read > MAX_REPLY_BYTES:
                        return
        except (TimeoutError, httpx.StreamConsumed):  # a given transport may have read it already
            return


async def delivery_task(app: Any) -> None:
    """The `background_tasks` entry for `MonitorApp`: push delivery for the app's service."""
    await Pusher(app.engine.call, app.service).run()
