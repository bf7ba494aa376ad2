"""What the client's own HTTP layers (keepalive.py: http.client and asyncio streams; webhttp.py: the
browser's fetch and XMLHttpRequest) hand back: a reply with the names httpx.Response uses, so every layer
decodes alike, and the one failure they raise. Standard library only, and no `ssl`: Pyodide has none."""

from __future__ import annotations

from dataclasses import dataclass, field


class SendFailed(Exception):
    """The request could not be completed: `sent` says whether it may have reached the server; `final`, that
    trying again cannot help (the client is closed, the request is not HTTP: nothing left this process)."""

    def __init__(self, reason: str, *, sent: bool, final: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent
        self.final = final


@dataclass(slots=True)
class Reply:
    """What the client reads of a response (the names httpx.Response uses)."""

    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")
