"""What the page remembers (the session, saved in IndexedDB's "ui" store) and what it last read from the
engine (the picture, never saved: the engine is the one source of truth for cursors, lag, leases, state).

The session holds only what the engine cannot know: the tokens this page was given (shown once, so kept
here to act with them), what each reader the page runs holds in its memory, and where the Story is."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STORY_MONITOR = "builds"  # the Story's own monitor: the README quickstart's `ci` never collides with it
OWNER = "human:you"
CI_TYPE = "com.example.ci.run"
PROTO = "ai.mentu.monitor."
SOURCE_ROW = "python.monitor-protocol.source"  # a server-run source's start, stop, crash... (docs/sources.md)
SESSION_VERSION = 2


@dataclass
class Reader:
    """A reader this page runs: the engine keeps its cursor; the page keeps what its process holds."""

    sub_id: str
    name: str
    token: str
    monitor: str
    held: list[int] = field(default_factory=list)  # seqs of the batch in its memory (gone at a crash)
    redelivered: list[int] = field(default_factory=list)  # which of them came back marked redelivered
    next: int | None = None  # the cursor to acknowledge once the held batch is processed
    crashed: bool = False
    processed: dict[str, int] = field(default_factory=dict)  # seq -> how many times it was processed
    made_by: str = "page"  # "page" or "curl": which door subscribed it


@dataclass
class Worker:
    sub_id: str
    token: str
    monitor: str
    last: str = ""


CURL_HISTORY_KEPT = 50  # the curl console's commands kept across reloads


@dataclass
class Session:
    monitor: str | None = None  # the monitor on screen
    owners: dict[str, str] = field(default_factory=dict)  # monitor id -> owner token (the page's keyring)
    readers: dict[str, Reader] = field(default_factory=dict)  # subscription id -> reader
    workers: dict[str, Worker] = field(default_factory=dict)  # "<monitor>:worker-a" -> its subscription
    step: int = 0
    story_done: list[int] = field(default_factory=list)
    race_monitor: str | None = None  # the race scene's monitor and its cursor reader (kept across reloads)
    race_sub: str | None = None
    shown_token: str | None = None  # the owner token just minted: shown once, never saved
    # The curl console's variables and its last commands: a reload goes on where the reader was (the
    # variables hold tokens, kept here with the page's others; Reset clears them with the rest).
    curl_env: dict[str, str] = field(default_factory=dict)
    curl_history: list[str] = field(default_factory=list)
    # An embedded scene's monitor -> its head when the scene set itself up: a later visit goes on from
    # "your last visit" only when the log grew past it (something was done), not after a mere load.
    scene_heads: dict[str, int] = field(default_factory=dict)

    def owner_token(self, monitor: str | None = None) -> str | None:
        return self.owners.get(monitor or self.monitor or "")

    def worker(self, name: str, monitor: str | None = None) -> Worker | None:
        return self.workers.get(f"{monitor or self.monitor}:{name}")

    def set_worker(self, name: str, w: Worker) -> None:
        self.workers[f"{w.monitor}:{name}"] = w

    def merged_with(self, saved: Session) -> Session:
        """This tab's session over what another tab saved meanwhile: every token either holds is kept (a
        token is shown once; losing one loses the monitor or reader it opens), this tab's entries win."""
        self.owners = {**saved.owners, **self.owners}
        self.readers = {**saved.readers, **self.readers}
        self.workers = {**saved.workers, **self.workers}
        return self

    def reader_named(self, name: str, monitor: str) -> Reader | None:
        return next((r for r in self.readers.values() if r.name == name and r.monitor == monitor), None)

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("shown_token")
        data["version"] = SESSION_VERSION
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str | None) -> Session:
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        if data.get("version") != SESSION_VERSION:
            return cls._from_v1(data)
        try:
            return cls(
                monitor=data.get("monitor"),
                owners={str(k): str(v) for k, v in (data.get("owners") or {}).items()},
                readers={k: _record(Reader, v) for k, v in (data.get("readers") or {}).items()},
                workers={k: _record(Worker, v) for k, v in (data.get("workers") or {}).items()},
                step=int(data.get("step") or 0),
                story_done=[int(i) for i in data.get("story_done") or []],
                race_monitor=data.get("race_monitor"),
                race_sub=data.get("race_sub"),
                curl_env={str(k): str(v) for k, v in (data.get("curl_env") or {}).items()},
                curl_history=[str(c) for c in (data.get("curl_history") or [])][-CURL_HISTORY_KEPT:],
                scene_heads={str(k): int(v) for k, v in (data.get("scene_heads") or {}).items()},
            )
        except (TypeError, ValueError, AttributeError):  # a damaged or foreign session: start fresh
            return cls()

    @classmethod
    def _from_v1(cls, data: dict[str, Any]) -> Session:
        """A session saved before the page kept a keyring: one monitor, readers keyed by name."""
        s = cls()
        monitor = data.get("monitor")
        if monitor and data.get("owner_token"):
            s.monitor = monitor
            s.owners[monitor] = data["owner_token"]
            for name, rd in (data.get("readers") or {}).items():
                if rd.get("id") and rd.get("token"):
                    s.readers[rd["id"]] = Reader(rd["id"], name, rd["token"], monitor)
            for name, w in (data.get("workers") or {}).items():
                if w.get("id") and w.get("token"):
                    s.set_worker(name, Worker(w["id"], w["token"], monitor))
        return s


def _record(kind: type, value: Any) -> Any:
    """A saved record, keeping only the fields this page knows (a newer page may have saved more)."""
    known = {f for f in kind.__dataclass_fields__}
    return kind(**{k: v for k, v in dict(value).items() if k in known})


@dataclass
class Picture:
    """The engine's overview, as last read (upkeep.overview), plus the selected monitor's log so far."""

    monitors: list[dict[str, Any]] = field(default_factory=list)
    monitor: dict[str, Any] | None = None  # {monitor, state, subscriptions, leases}
    log: list[dict[str, Any]] = field(default_factory=list)
    log_of: str | None = None  # whose log `log` is
    log_skipped: int = 0  # rows read before `log` and no longer kept (the track draws only the newest)
    read_at: float = 0.0  # time.time() when it was read (countdowns run from it)
    error: str | None = None  # why the picture could not be read (a follower whose owner is gone)

    def subscriptions(self) -> list[dict[str, Any]]:
        return (self.monitor or {}).get("subscriptions") or []

    def subscription(self, sub_id: str) -> dict[str, Any] | None:
        return next((s for s in self.subscriptions() if s["subscription"]["id"] == sub_id), None)

    def leases(self) -> list[dict[str, Any]]:
        return (self.monitor or {}).get("leases") or []

    def state(self) -> dict[str, Any] | None:
        return (self.monitor or {}).get("state")

    def exists(self, monitor_id: str) -> bool:
        return any(m["id"] == monitor_id for m in self.monitors)

    def head_of(self, monitor_id: str) -> int | None:
        """A monitor's head as last read, or None when it is not in the picture."""
        return next((int(m.get("head") or 0) for m in self.monitors if m["id"] == monitor_id), None)


S = Session()
PIC = Picture()
FLASH: dict[int, float] = {}  # seq -> until when (time.time()) its card flashes: a redelivery just arrived

FLASH_SECONDS = 1.6  # a little longer than the CSS animation, so redraws meanwhile keep it running


def flash(seqs: list[int]) -> None:
    until = time.time() + FLASH_SECONDS
    for s in seqs:
        FLASH[s] = until


def flashing(seq: int) -> bool:
    return FLASH.get(seq, 0.0) > time.time()
