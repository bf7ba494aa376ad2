"""RFC 3339 UTC timestamps with milliseconds, the only time format on the wire."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float) -> str:
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse(value: str) -> float | None:
    """Seconds since the epoch for an RFC 3339 string, or None when it is not one."""
    if not isinstance(value, str) or len(value) < 10:
        return None
    text = value.strip()
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
