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
    authority taking the Host header's place (RFC 9112 3.2.2: a server accepts the form and uses that host).
    The authority is taken whole: with user info in it (`http://127.0.0.1@evil.example/`, made to hide the
    host it names, RFC 9110 4.2.4) it is no Host, and the Host check refuses it (400)."""
    scheme_end = url.find(b"://")
    if scheme_end < 0 or url[:scheme_end].lower() not in (b"http", b"https"):
        return url
    rest = url[scheme_end + 3 :]
    ends = [i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0]
    cut = min(ends) if ends else len(rest)
    headers["host"] = rest[:cut].decode("latin-1")
    target = rest[cut:]
    return target if target[:1] == b"/" else b"/" + target


# What would end the access log's quoted request field early, once the path is percent-decoded (`%22`, `%20`)
# or a lenient parser let it through raw: written back percent-encoded, so each line keeps its fields.
_FIELD_BREAKERS = re.compile(r'["\\ ]')


def logged_target(path: str, query: bytes) -> str:
    """The target as the access log writes it inside `"METHOD target HTTP/x"`: the decoded path and the raw
    query, with a quote, a space or a backslash percent-encoded (control characters are the formatter's)."""
    target = path + ("?" + query.decode("latin-1") if query else "")
    if _FIELD_BREAKERS.search(target) is None:
        return target
    return _FIELD_BREAKERS.sub(lambda m: f"%{ord(m.group()):02X}", target)
