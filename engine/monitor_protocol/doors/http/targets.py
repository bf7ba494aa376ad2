"""A request's target as the HTTP door reads it: the path percent-decoded but for an encoded slash, and an
absolute-form target turned into the path it names (RFC 9112 3.2, RFC 3986 3.3)."""

from __future__ import annotations

import re
from urllib.parse import unquote

_ENCODED_SLASH = re.compile("%2[fF]")


def decoded_path(raw: str) -> str:
    """A request path percent-decoded (as UTF-8), but for an encoded slash: `%2F` is data inside its segment
    (RFC 3986 3.3), so /monitors/ci%2Fstate names the monitor `ci%2Fstate` (none can exist: a 404), never
    the route /monitors/ci/state, which a proxy allowing or denying by path would not have seen."""
    return unquote(_ENCODED_SLASH.sub("%252F", raw)) if "%" in raw else raw


def origin_form(url: bytes, headers: dict[str, str]) -> bytes:
    """An absolute-form target (`GET http://host:port/mp/v0/discover`) as the path and query it names, its
    authority taking the Host header's place (RFC 9112 3.2.2: a server accepts the form and uses that host)."""
    scheme_end = url.find(b"://")
    if scheme_end < 0 or url[:scheme_end].lower() not in (b"http", b"https"):
        return url
    rest = url[scheme_end + 3 :]
    ends = [i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0]
    cut = min(ends) if ends else len(rest)
    headers["host"] = rest[:cut].rsplit(b"@", 1)[-1].decode("latin-1")
    target = rest[cut:]
    return target if target[:1] == b"/" else b"/" + target
