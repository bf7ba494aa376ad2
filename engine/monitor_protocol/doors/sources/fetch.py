"""An `http` source's fetch (docs/protocol.md section 12): one GET per period, its status, time taken and size,
and the start of its body (for `settings.pick`). Redirects are not followed (a 3xx is the answer), the body is
read up to MAX_READ_BYTES and counted, and everything is bounded by the plan's timeout.

Run by the server (`guarded`), the URL goes through the push sink guard first (doors/sinkguard.py: no
internal address unless `--allow-sink`, the host resolved and vetted at every fetch, the connection made to
the vetted address); run by `mp probe` on the user's own machine, it is fetched as it is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import httpx

from monitor_protocol.core import netguard
from monitor_protocol.core.vocab import MAX_SOURCE_OUTPUT_BYTES
from monitor_protocol.doors import sinkguard

MAX_READ_BYTES = 16 << 20  # a body longer than this is counted this far only (`bytes_capped`)
USER_AGENT = "monitor-protocol-source/0.1"


@dataclass
class Fetched:
    status: int | None  # None: no answer (see `failure`)
    ms: int
    body: bytes = b""  # its first MAX_SOURCE_OUTPUT_BYTES
    size: int = 0
    capped: bool = False
    failure: str | None = None  # why there was no answer
    refused: str | None = None  # the sink guard refused the URL: nothing was sent


class Fetcher:
    """One client for one source's fetches (a connection kept alive between periods)."""

    def __init__(
        self,
        *,
        guarded: bool,
        allowed_sinks: Collection[str] = (),
        resolve: Callable[[str], list[str]] = netguard.resolve_host,
    ) -> None:
        self.guarded = guarded
        self.allowed_sinks = tuple(allowed_sinks)
        self.resolve = resolve
        self.client = httpx.AsyncClient(follow_redirects=False, trust_env=not guarded, timeout=None)

    async def close(self) -> None:
        await self.client.aclose()

    async def fetch(self, url: str, timeout: float) -> Fetched:
        started = time.monotonic()

        def ms() -> int:
            return int((time.monotonic() - started) * 1000)

        headers = {"user-agent": USER_AGENT, "accept": "application/json, */*", "accept-encoding": "identity"}
        targets: list[tuple[httpx.URL | str, dict[str, str], dict[str, str]]] = [(url, headers, {})]
        if self.guarded:
            vetted = await sinkguard.vet(url, self.allowed_sinks, self.resolve, what="source")
            if isinstance(vetted, sinkguard.Unresolved):  # a name that does not resolve now: not answering
                return Fetched(None, ms(), failure=f"cannot connect: {vetted}"[:300])
            if isinstance(vetted, str):
                return Fetched(None, ms(), refused=vetted)
            targets = [sinkguard.pinned(url, address, headers) for address in vetted]
        failure = "no address to connect to"
        try:
            async with asyncio.timeout(timeout):
                for target, pinned_headers, extensions in targets:
                    try:
                        return await self._get(target, pinned_headers, extensions, ms)
                    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                        failure = (
                            f"cannot connect: {exc or type(exc).__name__}"  # the next address may answer
                        )
        except TimeoutError:
            return Fetched(None, ms(), failure=f"timed out after {timeout:g} s")
        except httpx.HTTPError as exc:
            return Fetched(None, ms(), failure=f"{type(exc).__name__}: {exc}"[:300])
        return Fetched(None, ms(), failure=failure[:300])

    async def _get(
        self,
        target: httpx.URL | str,
        headers: dict[str, str],
        extensions: dict[str, str],
        ms: Callable[[], int],
    ) -> Fetched:
        request = self.client.build_request("GET", target, headers=headers, extensions=extensions)
        response = await self.client.send(request, stream=True)
        try:
            body = b""
            size = 0
            capped = False
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if len(body) < MAX_SOURCE_OUTPUT_BYTES:
                    body += chunk[: MAX_SOURCE_OUTPUT_BYTES - len(body)]
                if size >= MAX_READ_BYTES:
                    capped = True
                    break
            return Fetched(response.status_code, ms(), body, size, capped)
        finally:
            await response.aclose()
