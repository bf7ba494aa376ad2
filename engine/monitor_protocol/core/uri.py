"""Whether a text is a URI as RFC 3986 (Appendix A) defines one: what JSON Schema's `uri` format asks of a
subscription's `sink` in the published schemas, so that no served subscription fails it."""

from __future__ import annotations

import ipaddress
import re

_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_SEGMENT_NZ = rf"{_PCHAR}+"
_SEGMENTS = rf"(?:/{_PCHAR}*)*"
_QUERY = rf"(?:{_PCHAR}|[/?])*"  # a fragment has the same form
_USERINFO = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*"
_REG_NAME = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"  # an IPv4 address is one too
_AUTHORITY = rf"(?:{_USERINFO}@)?(?:\[(?P<literal>[^\[\]]*)\]|{_REG_NAME})(?::[0-9]*)?"
_HIER_PART = rf"(?://{_AUTHORITY}{_SEGMENTS}|/(?:{_SEGMENT_NZ}{_SEGMENTS})?|{_SEGMENT_NZ}{_SEGMENTS}|)"
_URI = re.compile(rf"[A-Za-z][A-Za-z0-9+\-.]*:{_HIER_PART}(?:\?{_QUERY})?(?:#{_QUERY})?", re.ASCII)
_IP_FUTURE = re.compile(rf"v[0-9A-Fa-f]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+", re.ASCII)


def is_uri(text: str) -> bool:
    """An absolute URI (a scheme, then the rest in RFC 3986's characters and forms): `https://a.example/h`,
    `mailto:a@b.example`, `urn:x:y`; not `a b`, `/relative`, `https://exämple.com` or `http://h:port`."""
    found = _URI.fullmatch(text)
    if found is None:
        return False
    literal = found.group("literal")
    return literal is None or _IP_FUTURE.fullmatch(literal) is not None or _is_ipv6(literal)


def _is_ipv6(text: str) -> bool:
    if "%" in text:  # a zone id is not RFC 3986 (RFC 6874 adds it); ipaddress would take it
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True
