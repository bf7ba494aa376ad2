"""Which HTTP push sinks the server may call (docs/protocol.md section 9). Standard library only.

A sink is an ``https://`` or ``http://`` URL whose host is not a loopback, private, link-local, multicast,
unspecified, shared (carrier-grade NAT) or otherwise reserved address, resolved at every delivery, unless the
operator allowed it with ``mp serve --allow-sink``. An allow-list entry is one of:

* an IP address (``127.0.0.1``, ``::1``, ``[::1]``): that address, as a literal sink host or resolved;
* a CIDR network (``10.0.0.0/8``, ``fd00::/8``): every address in it;
* a host name (``hooks.internal``): a sink with exactly that host (case-insensitive, a trailing dot
  ignored), whatever it resolves to. No wildcards.

``sink_refusal(url, allowed)`` judges what it can without I/O: the scheme, the URL's shape, IP literals in
every spelling resolvers accept (``127.1``, ``2130706433``, ``0x7f.1``, ``0177.0.0.1``, bracketed IPv6,
IPv4-mapped and IPv4-embedding IPv6) and names that are local by definition (``localhost``,
``*.localhost``, ``*.local``, ``*.internal``, ``*.home.arpa``). Given ``resolve`` it also judges every address
the host resolves to: one disallowed address refuses the sink.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import unicodedata
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

RULE = "push sinks must be public unless the operator allows them with --allow-sink"
SCHEMES = ("http", "https")
# Names that never leave the machine or the local network (RFC 6761, RFC 6762, ICANN's .internal, RFC 8375).
LOCAL_NAMES = {
    "localhost": "a loopback name",
    "localhost.localdomain": "a loopback name",
}
LOCAL_SUFFIXES = (
    (".localhost", "a loopback name"),
    (".local", "a link-local (mDNS) name"),
    (".internal", "a private-use name"),
    (".home.arpa", "a private-use name"),
)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
SITE_LOCAL = ipaddress.ip_network("fec0::/10")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
# Characters on which URL parsers disagree about where the host is: refuse rather than guess.
AMBIGUOUS = re.compile(r"[\\\s\x00-\x1f\x7f%]")
_IPV4_PART = re.compile(r"^(0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*)$")


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str | None) -> bool:
    """Whether `host` names this machine's loopback: `localhost` (with or without the root's dot, any case) or
    a loopback address, IPv6 in brackets or with a zone too. One rule for whatever asks: mp serve's bind and
    Host names, and whether a connection came from this machine."""
    if not host:
        return False
    if host.lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def parse_ipv4_loose(host: str) -> ipaddress.IPv4Address | None:
    """An IPv4 address in any form ``inet_aton`` accepts (``127.1``, ``2130706433``, ``0x7f.1``, ``0177.0.0.1``),
    or None when ``host`` is not one."""
    parts = host.split(".")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts = parts[:-1]  # a trailing dot, as resolvers and the WHATWG URL parser allow
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.match(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2].lower() == "0x":
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p.startswith("0"):
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = 0
    for v in head:
        number = number * 256 + v
    number = number * 256 ** (4 - len(head)) + last
    return ipaddress.IPv4Address(number)


def parse_ip(host: str) -> Address | None:
    """An IP literal (IPv6 with or without brackets, with or without a zone; IPv4 in any accepted form)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        text = text.split("%", 1)[0]  # a zone id (fe80::1%eth0) names an interface, not another address
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    return parse_ipv4_loose(text)


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and may be routed to (mapped, compatible, 6to4, NAT64)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr in IPV4_COMPATIBLE and int(addr) > 1:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def address_kind(addr: Address) -> str | None:
    """What makes ``addr`` unfit for a push sink ("a loopback address", ...), or None for a public address."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_ipv4(addr)
        if inner is not None:
            kind = address_kind(inner)
            return f"{kind} (it embeds the IPv4 address {inner})" if kind else None
        if addr in NAT64_LOCAL:
            return "a reserved address"
        if addr in SITE_LOCAL:
            return "a site-local address"
    if addr.is_unspecified:
        return "an unspecified address"
    if addr.is_loopback:
        return "a loopback address"
    if addr.is_link_local:
        return "a link-local address"
    if addr.is_multicast:
        return "a multicast address"
    if isinstance(addr, ipaddress.IPv4Address) and addr in CGNAT:
        return "a shared (carrier-grade NAT) address"
    if addr.is_reserved:
        return "a reserved address"
    if addr.is_private:
        return "a private address"
    if not addr.is_global:
        return "a reserved address"
    return None


def _canonical(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


# The label separators IDNA (UTS #46) maps to "." as resolvers and browsers read a host: 127。0。0。1 is
# 127.0.0.1 to them, so it is to this guard too (NFKC alone leaves the ideographic full stop as it is).
IDNA_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def _name(host: str) -> str:
    name = unicodedata.normalize("NFKC", host).translate(IDNA_DOTS).lower()
    return name[:-1] if name.endswith(".") else name


def _name_kind(name: str) -> str | None:
    if name in LOCAL_NAMES:
        return LOCAL_NAMES[name]
    for suffix, kind in LOCAL_SUFFIXES:
        if name.endswith(suffix):
            return kind
    return None


class Allowed:
    """The operator's ``--allow-sink`` entries, parsed: addresses, networks and exact host names."""

    def __init__(self, entries: Collection[str] = ()) -> None:
        self.networks: list[Network] = []
        self.names: set[str] = set()
        for entry in entries:
            text = str(entry).strip()
            if not text:
                continue
            if "/" in text:
                self.networks.append(ipaddress.ip_network(text.strip("[]"), strict=False))
                continue
            addr = parse_ip(text)
            if addr is not None:
                self.networks.append(ipaddress.ip_network(addr))
            else:
                self.names.add(_name(text))

    def allows_name(self, name: str) -> bool:
        return _name(name) in self.names

    def allows_address(self, addr: Address) -> bool:
        candidates: list[Address] = [addr]
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            candidates.append(addr.ipv4_mapped)
        return any(a.version == n.version and a in n for a in candidates for n in self.networks)


def check_allow_entry(entry: str) -> str | None:
    """A sentence saying why an ``--allow-sink`` entry is unusable, or None when it parses."""
    try:
        Allowed([entry])
    except ValueError as exc:
        return f"--allow-sink {entry!r} is neither a host name, an IP address nor a CIDR network ({exc})"
    if not entry.strip():
        return "--allow-sink needs a host name, an IP address or a CIDR network"
    return None


def sink_host(url: str) -> str | None:
    """The host of a sink URL as urllib reads it (lowercase, without brackets), or None when there is none."""
    try:
        return urlsplit(url).hostname or None
    except ValueError:
        return None


def sink_refusal(
    url: str,
    allowed: Collection[str] = (),
    resolve: Callable[[str], list[str]] | None = None,
) -> str | None:
    """None when the server may deliver to ``url``; else a sentence naming the rule it breaks.

    Without ``resolve`` this does no I/O (the subscribe-time check). With it, every address ``resolve(host)``
    returns is judged too (the delivery-time check); an empty or failed resolution refuses.
    """
    if not isinstance(url, str) or not url:
        return "a push sink must be an https:// or http:// URL"
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname
        port = parts.port  # raises ValueError on a port that is not a number in range
    except ValueError as exc:
        return f"the sink {url!r} is not a valid URL ({exc}); send an https:// or http:// URL"
    if port == 0:  # nothing listens on port 0: a connection there fails at every delivery
        return f"the sink {url!r} names port 0, where nothing can listen; send the port the sink listens on"
    if scheme not in SCHEMES:
        return (
            f"sink scheme {scheme or '(none)'!r} is not allowed; push sinks must be https:// or http:// URLs"
        )
    authority = parts.netloc
    if AMBIGUOUS.search(authority) or authority.count("@") > 1:
        return (
            "the sink URL's authority holds characters that URL parsers read differently "
            "(backslash, whitespace, control characters, percent-escapes or several '@'); send a plain URL"
        )
    if not host:
        return "the sink URL names no host; send an https:// or http:// URL with a host"
    rules = Allowed(allowed)
    # An internationalised host is judged after NFKC normalisation too (fullwidth digits spell 127.0.0.1).
    literal = parse_ip(host) or parse_ip(_name(host))
    if literal is not None:
        kind = address_kind(literal)
        if kind is not None and not rules.allows_address(literal):
            shown = host if _canonical(host) else f"{host} ({literal})"
            return f"sink host {shown} is {kind}; {RULE}"
        return None
    name = _name(host)
    if rules.allows_name(name):
        return None  # the operator trusts this name, whatever it resolves to
    kind = _name_kind(name)
    if kind is not None:
        return f"sink host {host} is {kind}; {RULE}"
    if resolve is None:
        return None
    try:
        addresses = list(resolve(host))
    except OSError as exc:
        return f"sink host {host} could not be resolved ({exc}); delivery will be retried"
    if not addresses:
        return f"sink host {host} resolved to no address; delivery will be retried"
    for text in addresses:
        addr = parse_ip(text)
        if addr is None:
            return f"sink host {host} resolved to {text!r}, which is not an IP address"
        kind = address_kind(addr)
        if kind is not None and not rules.allows_address(addr):
            return f"sink host {host} resolves to {addr}, {kind}; {RULE}"
    return None


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (``socket.getaddrinfo``), in the resolver's order, without
    duplicates; an IP literal in any accepted spelling is returned normalised, without I/O."""
    literal = parse_ip(host)
    if literal is not None:
        return [str(literal)]
    out: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in socket.getaddrinfo(
        host.strip("[]"), None, type=socket.SOCK_STREAM
    ):
        addr = str(sockaddr[0]).split("%", 1)[0]
        if addr not in out:
            out.append(addr)
    return out
