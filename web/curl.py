"""Parse a pasted curl command into a fetch() call for the playground's own origin."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

LOCAL_HOSTS = ("localhost:8130", "127.0.0.1:8130", "[::1]:8130", "0.0.0.0:8130")
DATA_FLAGS = ("-d", "--data", "--data-raw", "--data-binary", "--data-ascii", "--json")
IGNORED_FLAGS = ("-s", "--silent", "-S", "--show-error", "-i", "--include", "-v", "--verbose", "-L", "--location",
                 "-f", "--fail", "--fail-with-body", "--compressed", "-N", "--no-buffer", "-sS", "-fsS", "-sSf")  # fmt: skip


class CurlError(ValueError):
    pass


@dataclass
class CurlCall:
    method: str
    url: str  # absolute on the page's origin
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None


def expand(text: str, env: dict[str, str]) -> str:
    """Substitute $NAME and ${NAME} from the console's saved values (tokens from earlier answers)."""

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise CurlError(f"${name} is not set yet: run the command that returns it first")
        return env[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def parse(command: str, origin: str, env: dict[str, str] | None = None) -> CurlCall:
    text = command.strip().replace("\\\r\n", " ").replace("\\\n", " ")
    if not text:
        raise CurlError("type a curl command, e.g. curl -s http://localhost:8130/mp/v0/discover")
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CurlError(f"cannot parse the command: {exc} (check the quotes)") from exc
    if not words or words[0] != "curl":
        raise CurlError("only curl commands run here; start with: curl")
    env = env or {}
    method: str | None = None
    headers: dict[str, str] = {}
    body: str | None = None
    url: str | None = None
    i = 1
    while i < len(words):
        w = words[i]

        def value(i: int = i, w: str = w) -> str:
            if i + 1 >= len(words):
                raise CurlError(f"{w} needs a value")
            return expand(words[i + 1], env)

        if w in ("-X", "--request"):
            method = value().upper()
            i += 2
        elif w in DATA_FLAGS:
            body = value()
            if w == "--json":
                headers.setdefault("Content-Type", "application/json")
            i += 2
        elif w in ("-H", "--header"):
            raw = value()
            if ":" not in raw:
                raise CurlError(f"header {raw!r} should look like 'Name: value'")
            name, val = raw.split(":", 1)
            headers[name.strip()] = val.strip()
            i += 2
        elif w in IGNORED_FLAGS:
            i += 1
        elif w.startswith("-X") and len(w) > 2:
            method = w[2:].upper()
            i += 1
        elif w.startswith("-"):
            raise CurlError(f"option {w} is not supported here (use -X, -H, -d, -s)")
        else:
            if url is not None:
                raise CurlError(f"two URLs given ({url} and {w})")
            url = expand(w, env)
            i += 1
    if url is None:
        raise CurlError("no URL given, e.g. http://localhost:8130/mp/v0/discover")
    url = to_origin(url, origin)
    if method is None:
        method = "POST" if body is not None else "GET"
    if body is not None and body.startswith("@"):
        raise CurlError("files (-d @file) cannot be read in the browser; paste the JSON instead")
    return CurlCall(method, url, headers, body)


def to_origin(url: str, origin: str) -> str:
    """localhost:8130 (the README's server) becomes this page's origin; relative URLs stay relative."""
    m = re.match(r"^(https?://)?([^/]+)(/.*)?$", url)
    if url.startswith("/"):
        return origin + url
    if m is None:
        raise CurlError(f"cannot read the URL {url!r}")
    host, path = m.group(2), m.group(3) or "/"
    if host in LOCAL_HOSTS or origin.endswith("//" + host):
        return origin + path
    raise CurlError(
        f"{host} is another host: the playground only reaches its own engine (use localhost:8130)"
    )
