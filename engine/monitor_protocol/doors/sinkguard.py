"""The server's outgoing HTTP, vetted (docs/protocol.md section 9): HTTP push to a sink and an `http` source the
server runs (section 12) go through the same guard.

`vet(url, allowed, resolve)` judges the URL without I/O (`netguard.sink_refusal`), resolves its host (in a
thread) and judges every address; it returns the addresses a request may connect to, or the sentence saying
why none. `pinned(url, address)` is the request to make to one vetted address: the URL's host replaced by the
address, while the `Host` header and the TLS SNI / certificate check (httpx's `sni_hostname` extension) still
name the URL's own host, so the window between the check and the connection is closed (DNS rebinding)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import httpx

from monitor_protocol.core import netguard


def same_host(a: str, b: str) -> bool:
    ip_a, ip_b = netguard.parse_ip(a), netguard.parse_ip(b)
    if ip_a is not None or ip_b is not None:
        return ip_a == ip_b
    return a.lower().rstrip(".") == b.lower().rstrip(".")


class Unresolved(str):
    """vet's answer when the host does not resolve now: not a refusal of the URL but an outage (a source is
    then published as not answering; a push is retried), said in the same kind of sentence."""


async def vet(
    url: str,
    allowed: Collection[str],
    resolve: Callable[[str], list[str]] = netguard.resolve_host,
    what: str = "sink",
) -> list[str] | str:
    """The addresses a request to ``url`` may connect to, resolved now; or why it may not happen."""
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError, ValueError) as exc:
        return f"the {what} {url!r} is not a URL the HTTP client accepts ({exc})"
    seen = netguard.sink_host(url)
    if seen is None or not same_host(seen, parsed.host):
        # The guard and the client must judge and call the same host (no parser differential).
        return f"the {what} URL {url!r} names its host ambiguously; send a plain https:// or http:// URL"
    refusal = netguard.sink_refusal(url, allowed)
    if refusal is not None:
        return refusal
    try:
        addresses = await asyncio.to_thread(resolve, host)
    except (OSError, UnicodeError) as exc:
        return Unresolved(f"{what} host {host} could not be resolved ({exc})")
    refusal = netguard.sink_refusal(url, allowed, resolve=lambda _host: addresses)
    if refusal is not None:
        return refusal
    return addresses


def pinned(
    url: str, address: str, headers: dict[str, str]
) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """(the URL with its host replaced by `address`, the headers with `Host` naming the URL's own host, the
    request extensions that make TLS name and verify that host too)."""
    parsed = httpx.URL(url)
    pinned_headers = {**headers, "host": parsed.netloc.decode("ascii")}
    extensions = {}
    if parsed.scheme == "https" and netguard.parse_ip(parsed.host) is None:
        extensions["sni_hostname"] = parsed.host  # TLS names and verifies the URL's host, not the address
    return parsed.copy_with(host=address), pinned_headers, extensions
