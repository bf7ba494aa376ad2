"""What the client's own HTTP layers (keepalive.py: http.client and asyncio streams; webhttp.py: the
browser's fetch and XMLHttpRequest) hand back: a reply with the names httpx.Response uses, so every layer
decodes alike, and the one failure they raise. Standard library only, and no `ssl`: Pyodide has none."""

from __future__ import annotations


class SendFailed(Exception):
    """The request could not be completed: `sent` says whether it may have reached the server."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class Reply:
    """What the client reads of a response (the names httpx.Response uses). The headers are parsed when first
    read (`lines`: the raw header lines, CRLF): a successful call reads none of them."""

    __slots__ = ("status_code", "content", "_headers", "_lines")

    def __init__(
        self, status_code: int, content: bytes, headers: dict[str, str] | None = None, *, lines: str = ""
    ) -> None:
        self.status_code = status_code
        self.content = content
        self._headers = headers
        self._lines = lines

    @property
    def headers(self) -> dict[str, str]:
        found = self._headers
        if found is None:
            found = self._headers = parse_headers(self._lines)
        return found

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return (
            f"Reply(status_code={self.status_code}, content={self.content[:60]!r}, headers={self.headers!r})"
        )


def parse_headers(raw: str) -> dict[str, str]:
    """Header lines ("name: value", CRLF) as a dict with lower-case names; a repeated header is joined with
    ", " as the Fetch standard combines them. A line that is not a header is passed over."""
    headers: dict[str, str] = {}
    for line in raw.split("\r\n"):
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            continue
        key, value = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers
