"""What one request may still return in pages, in bytes, and walk of the log, in seqs, where it holds several
pulls (a JSON-RPC batch): they share one PAGE_BYTES and one SCAN_SPAN, so a batch of 100 pulls is neither 100
pages' worth of reply nor 100 walks' worth of work. A single pull is bounded by PAGE_BYTES and SCAN_SPAN
alone (delivery.py, pages.py, ledger.py)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.store_contract import LogQuery
from monitor_protocol.core.vocab import PAGE_BYTES, SCAN_SPAN

_REQUEST_PAGE_BYTES: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "request_page_bytes", default=None
)
_REQUEST_SCAN_SPAN: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "request_scan_span", default=None
)


@contextlib.contextmanager
def shared_page_bytes() -> Iterator[None]:
    """The pulls made inside share one page's bytes (PAGE_BYTES); past them, a pull is refused (TOO_LARGE)."""
    token = _REQUEST_PAGE_BYTES.set([PAGE_BYTES])
    walk = _REQUEST_SCAN_SPAN.set([SCAN_SPAN])
    try:
        yield
    finally:
        _REQUEST_SCAN_SPAN.reset(walk)
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


def walk_bound(query: LogQuery, first: int, head: int) -> tuple[int, bool]:
    """Where a read of `query` from `first` stops: the head, unless the read walks the log (LogQuery.walks),
    then `walk_end`'s bound; and whether the request's shared walk cut it short."""
    return walk_end(first, head) if query.walks else (head, False)


def walk_end(first: int, head: int) -> tuple[int, bool]:
    """Where a read that walks the log from `first` stops (its SCAN_SPAN seqs, or what the request has left
    of them; `first - 1` when nothing is left: the read is cut short at once and the reader goes on in another
    request), the walk counted as spent; and whether the request's share, not SCAN_SPAN, cut it short (such
    a read is this request's alone: no other reader of the group may be handed it)."""
    shared = _REQUEST_SCAN_SPAN.get()
    span = SCAN_SPAN if shared is None else max(0, min(SCAN_SPAN, shared[0]))
    end = min(head, first + span - 1)
    if shared is not None:
        shared[0] -= max(0, end - first + 1)
    return end, end < min(head, first + SCAN_SPAN - 1)
