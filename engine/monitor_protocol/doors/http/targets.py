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


# What would end the access log's quoted request field early or split its line, once the path is
# percent-decoded (`%22`, `%20`, `%0A`) or a lenient parser let it through raw: written back percent-encoded
# (as UTF-8), so each line keeps its fields. In the decoded path `%` itself too (so `/x%2522` and `/x%22` stay
# apart); the query is logged as it came, its `%` escapes its own.
_QUERY_BREAKERS = '\x00-\x20"\\\\\x7f-\x9f\u2028\u2029'
_IN_QUERY = re.compile(f"[{_QUERY_BREAKERS}]")
_IN_PATH = re.compile(f"[{_QUERY_BREAKERS}%]")


def _percent(match: re.Match[str]) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8", "surrogatepass"))


def logged_target(path: str, query: bytes) -> str:
    """The target as the access log writes it inside `"METHOD target HTTP/x"`: the decoded path and the raw
    query, with whitespace, control characters, a quote, a backslash and the Unicode line separators
    percent-encoded (and in the path, `%`)."""
    if _IN_PATH.search(path) is not None:
        path = _IN_PATH.sub(_percent, path)
    if not query:
        return path
    text = query.decode("latin-1")
    if _IN_QUERY.search(text) is not None:  # (its characters are its bytes: latin-1)
        text = _IN_QUERY.sub(lambda m: f"%{ord(m.group()):02X}", text)
    return f"{path}?{text}"
