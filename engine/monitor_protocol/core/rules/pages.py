"""The page a pull reads: up to its limit of rows from its cursor under the reader's filter and the pull's
own, within the page's bytes, examining at most SCAN_BUDGET rows that do not match (a bounded read), the same
read shared by the readers of one group commit. delivery.py's pull hands it out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monitor_protocol.core import filters
from monitor_protocol.core.records import Monitor, Subscription
from monitor_protocol.core.rules.ledger import few_rows, past_known_misses
from monitor_protocol.core.rules.page_bytes import page_bytes, spent_page_bytes, walk_bound
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.vocab import FEW_ROWS, PAGE_BYTES, SCAN_BUDGET, SCAN_BYTES


@dataclass(slots=True)
class Page:
    """What one pull read: the rows it hands out, the last seq it examined, whether the scan budget cut the
    read short (`capped`), whether the reader's stored record changed on the way (`changed`), and whether the
    read walked the log rather than seeking one index (`walked`: rows may have been examined in vain)."""

    # Its rows are used by their `seq`, `size` and `to_wire` alone: they are observations, or records.ServedRow
    # when a pull that only serves them read them (scan_page); in one group, another reader may get that page.
    batch: list[Any]
    last_examined: int
    capped: bool = False
    changed: bool = False
    walked: bool = False
    cut_by_request: bool = False  # the request's shared walk (page_bytes.walk_end) ended it: not shared


def read_page(
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    inline_flt: Any,
    start: int,
    lim: int,
    memo: dict[Any, Any] | None,
    raw: bool = False,
) -> Page:
    """Up to `lim` rows from `start` under the reader's filter and the pull's own, examining at most
    SCAN_BUDGET rows that do not match (a bounded read: the rest waits for the next pull, from `next`). The
    same read in one group commit (the same monitor, log, filters, start and limit) is read once. `raw`:
    pull's (the rows are only served: an unfiltered page may be records.ServedRow, see scan_page)."""
    head = rec.head
    max_bytes = page_bytes()
    first = past_known_misses(sub, max(start, 1))
    if first > head:
        return Page([], first - 1)
    key = None
    if memo is not None:
        key = (
            "page",
            rec.id,
            head,
            rec.floor,
            first,
            lim,
            filters.key_of(sub.filter),
            filters.key_of(inline_flt),
            max_bytes,
        )
        known = memo.get(key)
        if known is not None:
            page = Page(list(known[0]), known[1], known[2], walked=known[3])
            spent_page_bytes(page.batch)
            return page
    page = scan_page(tx, rec, sub, inline_flt, first, lim, max_bytes, raw, memo)
    if key is not None and not page.cut_by_request:
        memo[key] = (tuple(page.batch), page.last_examined, page.capped, page.walked)
    spent_page_bytes(page.batch)
    return page


def _few_rows_page(
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    inline_flt: Any,
    first: int,
    lim: int,
    max_bytes: int,
    memo: dict[Any, Any] | None,
) -> Page:
    """A page of at most FEW_ROWS seqs: the rows read whole (once per group commit) and checked here."""
    page = Page([], first - 1)
    kept = 0
    for obs in few_rows(tx, rec, first, memo):
        if filters.matches(sub.filter, obs.event) and filters.matches(inline_flt, obs.event):
            kept += obs.size
            if kept > max_bytes and page.batch:
                return page  # the page is full by bytes: this row comes first in the next
            page.batch.append(obs)
            page.last_examined = obs.seq
            if len(page.batch) >= lim:
                return page
        else:
            page.last_examined = obs.seq
    page.last_examined = rec.head  # every seq up to the head examined
    return page


def scan_page(
    tx: Tx,
    rec: Monitor,
    sub: Subscription,
    inline_flt: Any,
    first: int,
    lim: int,
    max_bytes: int = PAGE_BYTES,
    raw: bool = False,
    memo: dict[Any, Any] | None = None,
) -> Page:
    query = filters.prefilter(sub.filter, inline_flt)
    head = rec.head
    if head - first < FEW_ROWS and query.walks:
        return _few_rows_page(tx, rec, sub, inline_flt, first, lim, max_bytes, memo)
    page = Page([], first - 1)
    kept = missed = 0  # bytes of the rows in the page, and of the rows examined in vain
    # Without a filter every seq from the floor to the head is a row: the page is the next `lim` seqs, read
    # at once (tx.read_range: one statement on SQLite; a store's default, scan, fetches a range so bounded
    # in one go too, store_contract.chunked_rows), not in chunks of 8, 16, 32... and a generator step a row.
    # Every row it reads is in the page, up to its bytes. Rows only served (`raw`) are read as such: on
    # SQLite their seq and text alone, no observation built (a drain's rows cost their bytes).
    if query.complete and query.selects_all:
        batch = page.batch
        for obs in tx.read_range(rec.id, first, min(head, first + lim - 1), served=raw):
            kept += obs.size
            if kept > max_bytes and batch:
                break  # the page is full by bytes: this row comes first in the next
            batch.append(obs)
        if batch:
            page.last_examined = batch[-1].seq
        return page
    # A store that may test rows in vain inside the read (no single index to seek) reads SCAN_SPAN seqs at
    # most: what it examined there is bounded by the stretch, not by the rows the engine is handed.
    end, page.cut_by_request = walk_bound(query, first, head)
    page.walked = not (query.complete and query.seeks_alone)
    for examined, obs in enumerate(tx.scan(rec.id, first, end, query), start=1):
        if query.complete or (
            filters.matches(sub.filter, obs.event) and filters.matches(inline_flt, obs.event)
        ):
            kept += obs.size
            if kept > max_bytes and page.batch:
                break  # the page is full by bytes: this row comes first in the next
            page.last_examined = obs.seq
            page.batch.append(obs)
            if len(page.batch) >= lim:
                break
        else:
            page.last_examined = obs.seq
            missed += obs.size
            if (examined >= SCAN_BUDGET or missed > SCAN_BYTES) and page.last_examined < head:
                page.capped = True
                break
    else:  # every row up to `end` was examined
        page.last_examined = end
        page.capped = end < head
    return page
