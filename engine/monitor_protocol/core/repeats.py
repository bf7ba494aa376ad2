"""A failure that repeats (a probe every half second, a retry every second) logged as it starts, at most once a
minute while it lasts, and once when it ends: an outage is a few lines in the log, not a flood."""

from __future__ import annotations

import logging
import time


class Repeats:
    """`failed(reason)` for each failure, `ok()` for each success; thread-safe enough for one caller thread."""

    def __init__(self, log: logging.Logger, what: str, every: float = 60.0) -> None:
        self.log, self.what, self.every = log, what, every
        self.since: float | None = None  # when the failures began (monotonic), while they last
        self.count = 0
        self._said = 0.0

    def failed(self, reason: object) -> None:
        now = time.monotonic()
        self.count += 1
        if self.since is None:
            self.since = self._said = now
            self.log.warning("%s: %s", self.what, reason)
        elif now - self._said >= self.every:
            self._said = now
            self.log.warning(
                "%s, still (%d times in %.0f s): %s", self.what, self.count, now - self.since, reason
            )

    def ok(self) -> None:
        if self.since is not None:
            self.log.warning(
                "%s: over after %.0f s (%d times)", self.what, time.monotonic() - self.since, self.count
            )
        self.since = None
        self.count = 0
