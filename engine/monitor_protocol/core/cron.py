"""`cadence.schedule`: a five-field cron expression (minute hour day-of-month month day-of-week), read in UTC,
for a source that runs once per period (docs/protocol.md section 12). Standard library only, no I/O.

Each field is `*`, a number, a range `a-b`, a step `*/n` or `a-b/n`, or a comma-separated list of those.
Day of week runs 0-7 (0 and 7 are Sunday). As in classic cron, when both day-of-month and day-of-week are
restricted a day matching either one fires; names (`mon`, `jan`) and `@hourly`-style shorthands are not read:
a sentence says so instead of guessing."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_SEARCH_DAYS = 366 * 8  # a schedule that names no real day (Feb 30) is refused, never searched for ever


class CronError(ValueError):
    """The expression cannot be read; the message says what to send instead."""


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month was `*`
    any_weekday: bool  # day of week was `*`

    def _day_fires(self, day: _dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.weekday() + 1) % 7 in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def next_after(self, ts: float) -> float:
        """The first firing time strictly after `ts` (Unix seconds), in Unix seconds."""
        start = _dt.datetime.fromtimestamp(int(ts // 60) * 60, _dt.UTC)
        for offset in range(_SEARCH_DAYS):
            day = start.date() + _dt.timedelta(days=offset)
            if not self._day_fires(day):
                continue
            for hour in self.hours:
                for minute in self.minutes:
                    when = _dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=_dt.UTC)
                    if when.timestamp() > ts:
                        return when.timestamp()
        raise CronError(f"schedule {self.text!r} never fires (no such day); send a schedule that does")


def _field(text: str, name: str, low: int, high: int) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, _, step_text = part.partition("/")
            if not step_text.isascii() or not step_text.isdigit() or int(step_text) < 1:
                raise CronError(f"the {name} field's step {step_text!r} must be a whole number of at least 1")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, _, b = part.partition("-")
            first, last = _number(a, name, low, high), _number(b, name, low, high)
            if first > last:
                raise CronError(f"the {name} field's range {part!r} runs backwards")
        else:
            first = last = _number(part, name, low, high)
            if step != 1:
                last = high  # `5/15`: from 5, every 15, as cron reads it
        out.update(range(first, last + 1, step))
    return out


def _number(text: str, name: str, low: int, high: int) -> int:
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        raise CronError(f"the {name} field takes whole numbers {low}-{high}, not {text!r}")
    return int(text)


def parse(text: object) -> Cron:
    """Read a cron expression; CronError with a sentence when it cannot be read."""
    if not isinstance(text, str) or len(text) > 200:
        raise CronError(
            'cadence.schedule must be a cron expression such as "*/5 * * * *" (at most 200 characters)'
        )
    parts = text.split()
    if len(parts) != 5:
        raise CronError(
            f"cadence.schedule {text!r} has {len(parts)} fields; send five: minute hour day-of-month month "
            'day-of-week, e.g. "*/5 * * * *" (UTC)'
        )
    values = [_field(p, name, lo, hi) for p, (name, lo, hi) in zip(parts, _FIELDS, strict=True)]
    weekdays = {0 if d == 7 else d for d in values[4]}
    cron = Cron(
        text=text,
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=frozenset(weekdays),
        any_day=parts[2] == "*",
        any_weekday=parts[4] == "*",
    )
    cron.next_after(0.0)  # a schedule that never fires is refused now, not at its first run
    return cron
