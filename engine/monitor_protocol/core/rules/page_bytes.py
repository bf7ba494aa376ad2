"""What one request may still return in pages, in bytes, where it holds several pulls (a JSON-RPC batch):
they share one PAGE_BYTES, so a batch of 100 pulls is not 100 pages' worth of reply. A single pull's page is
bounded by PAGE_BYTES alone (delivery.py)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.vocab import PAGE_BYTES

_REQUEST_PAGE_BYTES: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "request_page_bytes", default=None
)


@contextlib.contextmanager
def shared_page_bytes() -> Iterator[None]:
    """The pulls made inside share one page's bytes (PAGE_BYTES); past them, a pull is refused (TOO_LARGE)."""
    token = _REQUEST_PAGE_BYTES.set([PAGE_BYTES])
    try:
        yield
    finally:
        _REQUEST_PAGE_BYTES.reset(token)


def page_bytes() -> int:
    """What this pull's page may hold, in bytes."""
    shared = _REQUEST_PAGE_BYTES.get()
    if shared is None:
        return PAGE_BYTES
    if shared[0] <= 0:
        raise ProtocolError(
            "TOO_LARGE",
            f"The pulls before this one in the same request returned {PAGE_BYTES} bytes, what one request may "
            "return: send this pull in another request.",
            limit=PAGE_BYTES,
        )
    return shared[0]


def spent_page_bytes(batch: list[Any]) -> None:  # (observations or ServedRows: their sizes)
    shared = _REQUEST_PAGE_BYTES.get()
    if shared is not None:
        shared[0] -= sum(obs.size for obs in batch)
