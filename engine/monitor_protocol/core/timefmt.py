"""RFC 3339 UTC timestamps with milliseconds, the only time format on the wire."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


# The second last formatted with its "YYYY-MM-DDTHH:MM:SS", and the time last formatted with its text (a
# batch's items share one `now`). Each is one tuple, replaced whole: engine threads (PostgreSQL's lanes)
# may format at once, and a reader must never pair one time with another's text.
_last_second: tuple[Any, str] = (None, "")
_last: tuple[Any, str] = (None, "")


def iso(ts: float) -> str:
    """`ts` as RFC 3339 UTC with milliseconds. The date and time of a second are formatted once (times come
    in runs: every observation of a burst shares its second); the microseconds round as datetime rounds
    them (half to even), so the text is the one datetime.fromtimestamp gives."""
    global _last_second, _last
    last_ts, last_text = _last
    if last_ts == ts and type(ts) is float:
        return last_text
    second = math.floor(ts)
    micro = round((ts - second) * 1e6)
    if micro >= 1_000_000:
        second += 1
        micro -= 1_000_000
    cached_second, date_time = _last_second
    if cached_second != second:
        dt = datetime.fromtimestamp(second, tz=UTC)
        # Four-digit year always (strftime's %Y gives "1" for year 1 on glibc, which is not RFC 3339).
        date_time = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
        _last_second = (second, date_time)
    text = f"{date_time}.{micro // 1000:03d}Z"
    if type(ts) is float:
        _last = (ts, text)
    return text


def parse(value: str) -> float | None:
    """Seconds since the epoch for an RFC 3339 string, or None when it is not one."""
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        return None  # date only, no offset, a space, week dates, basic format: not RFC 3339
    text = value[:10] + "T" + value[11:]
    if "." in text:  # fromisoformat takes at most 6 fraction digits
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        ts = dt.timestamp()
        datetime.fromtimestamp(ts, tz=UTC)  # representable in UTC as well (year 1..9999 after the offset)
    except (ValueError, OverflowError, OSError):
        return None
    return ts
