"""A scene: two readers of the same producer, side by side, both crashing at random.

- The notification reader only hears a best-effort notification sent as each build is published (no log,
  no cursor): whatever is sent while it is down is gone, so it loses builds.
- The cursor reader pulls from the monitor and acknowledges after processing: a crash before the ack means
  the same builds come back redelivered, so it loses none and processes some twice.

Both run on a real monitor of the page's engine (`race`), so its log, readers and state show in the other
panels like any other. `?seed=N` in the page's URL makes the crashes repeatable (the tests use it)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import actions as a
import js
import model as m
import ui
from door import ENGINE
from ui import action, el, esc

CRASH = 0.12  # each tick, the chance that a running reader crashes
DOWN_TICKS = (2, 4)  # how long a crashed reader stays down
TICK_S = 0.35


@dataclass
class Side:
    down: int = 0  # ticks left before it restarts
    crashes: int = 0
    received: int = 0  # notifications heard, or observations delivered (redeliveries included)
    redelivered: int = 0
    processed: dict[int, int] = field(default_factory=dict)  # seq -> times processed


@dataclass
class Race:
    on: bool = False
    monitor: str | None = None
    sub_id: str | None = None
    published: list[int] = field(default_factory=list)
    acked: int = 0  # the cursor reader's committed cursor
    notify: Side = field(default_factory=Side)
    cursor: Side = field(default_factory=Side)
    draining: bool = False


RACE = Race()


def rng() -> random.Random:
    """The race's dice: `?seed=N` repeats them; a seed that is not a whole number is said, not guessed."""
    params = js.URLSearchParams.new(js.location.search)
    if not params.has("seed"):  # (a missing one's get() is JS null: a JsNull, which `is None` misses)
        return random.Random()
    seed = str(params.get("seed")).strip()
    if seed.isascii() and seed.isdigit() and len(seed) <= 100:  # int() refuses past 4,300 digits
        return random.Random(int(seed))
    ui.note(
        "race-answer",
        f"?seed={seed[:40]} is not a whole number, so this race's crashes are random."
        " Send ?seed=32 (any digits) to repeat the same crashes.",
        ok=False,
    )
    return random.Random()


RNG = [random.Random()]


async def setup(answer: str = "race-answer") -> bool:
    """The race's monitor and cursor reader: the ones made before (kept in the session), or new ones. The
    create's answer goes to `answer` (an embed passes a line that is not drawn: it shows only failures)."""
    if m.S.race_monitor in m.S.owners and m.PIC.exists(m.S.race_monitor) and m.S.race_sub in m.S.readers:
        RACE.monitor, RACE.sub_id = m.S.race_monitor, m.S.race_sub
        return True
    body = {
        "id": a.free_id("race"),
        **a.CI_MONITOR,
        "name": "The race",
        "description": "Notifications vs a cursor",
    }
    r = await a.define(body, answer=answer, show_token=False)
    if not r.ok:
        ui.show_one("race-answer", "create the race's monitor", r)
        return False
    RACE.monitor = r.body["monitor"]["id"]
    sub = await ENGINE.call(
        "POST",
        "/subscriptions",
        {
            "monitor": RACE.monitor,
            "subscriber": "agent:cursor-reader",
            "filter": a.BUILD_FILTER,
            "from": "earliest",
        },
        token=m.S.owners[RACE.monitor],
    )
    if sub.status != 201:
        ui.show_one("race-answer", "subscribe the cursor reader", sub)
        return False
    RACE.sub_id = sub.body["subscription"]["id"]
    m.S.readers[RACE.sub_id] = m.Reader(
        RACE.sub_id, "cursor-reader", sub.body["token"], RACE.monitor, made_by="race"
    )
    m.S.race_monitor, m.S.race_sub = RACE.monitor, RACE.sub_id
    await a.save()
    return True


def maybe_crash(side: Side) -> bool:
    if side.down:
        side.down -= 1
        return True
    if RNG[0].random() < CRASH:
        side.crashes += 1
        side.down = RNG[0].randint(*DOWN_TICKS)
        return True
    return False


async def cursor_turn(rd: m.Reader, crash_mid: bool, limit: int = 5) -> bool:
    """One pull, process and ack; a crash between processing and the ack means the work is redone.
    Returns whether the pull gave anything."""
    r = await ENGINE.call("GET", f"/subscriptions/{rd.sub_id}/pull", token=rd.token, query={"limit": limit})
    if r.status != 200 or not r.body["observations"]:
        return False
    side = RACE.cursor
    for o in r.body["observations"]:
        s = int(o["id"])
        side.received += 1
        side.redelivered += 1 if o.get("redelivered") else 0
        side.processed[s] = side.processed.get(s, 0) + 1
    if crash_mid:
        return True
    ack = await ENGINE.call(
        "POST", f"/subscriptions/{rd.sub_id}/ack", {"cursor": r.body["next"]}, token=rd.token
    )
    if ack.status == 200:
        RACE.acked = ack.body["cursor"]
    return True


async def loop() -> None:
    n = len(RACE.published)
    rd = m.S.readers[RACE.sub_id]
    token = m.S.owners[RACE.monitor]
    while RACE.on:
        n += 1
        body = {
            "type": m.CI_TYPE,
            "subject": f"build-{600 + n}",
            "actor": "probe:ci",
            "data": {"status": "passed"},
        }
        p = await ENGINE.call("POST", f"/monitors/{RACE.monitor}/observations", body, token=token)
        if p.status != 201:
            ui.show_one(
                "race-answer", "the producer publishes", p, "The producer was refused: resume the monitor."
            )
            RACE.on = False
            break
        seq = int(p.body["seq"])
        RACE.published.append(seq)
        # The notification: sent once, as the build is published. Down now means never heard.
        if not maybe_crash(RACE.notify):
            RACE.notify.received += 1
            RACE.notify.processed[seq] = RACE.notify.processed.get(seq, 0) + 1
        # The cursor reader: down means it pulls later; the log keeps what it has not acknowledged.
        if not maybe_crash(RACE.cursor):
            crash_mid = RNG[0].random() < CRASH
            await cursor_turn(rd, crash_mid)
            if crash_mid:
                RACE.cursor.crashes += 1
                RACE.cursor.down = RNG[0].randint(*DOWN_TICKS)
        render()
        await asyncio.sleep(TICK_S)
    await drain(rd)


async def drain(rd: m.Reader) -> None:
    """After Stop: the cursor reader restarts and catches up, so its tally is final (lag 0)."""
    RACE.draining = True
    RACE.cursor.down = 0
    render()
    for _ in range(100):
        if not await cursor_turn(rd, crash_mid=False, limit=50):
            break
    RACE.draining = False
    render()
    ui.refresh_soon()


@action("race-toggle", answer="race-answer", exclusive=False, local_only=True)
async def toggle(_el) -> None:
    if RACE.on:
        RACE.on = False
        RACE.draining = (
            True  # the loop ends its tick, then the cursor reader catches up: Start waits for both
        )
        render()
        return
    if RACE.draining:
        return
    RACE.on = True  # before any await: a second click while setting up stops, it never starts a second loop
    render()
    if not await setup():
        RACE.on = False
        render()
        return
    RNG[0] = rng()
    asyncio.ensure_future(loop())


def tally(side: Side, lost: int, owed: int | None) -> list[tuple[str, int | str]]:
    twice = sum(1 for c in side.processed.values() if c > 1)
    rows: list[tuple[str, int | str]] = [
        ("received", side.received),
        ("processed", len(side.processed)),
        ("processed twice", twice),
        ("lost", lost),
        ("crashes", side.crashes),
    ]
    if owed is not None:
        rows.insert(3, ("still owed", owed))
    return rows


def render() -> None:
    box = el("race")
    if box is None:
        return
    pub = RACE.published
    n_lost = sum(1 for s in pub if s not in RACE.notify.processed)
    c_lost = sum(1 for s in pub if s < RACE.acked and s not in RACE.cursor.processed)
    owed = sum(1 for s in pub if s >= RACE.acked)

    def column(key: str, title: str, side: Side, lost: int, owed_n: int | None, how: str) -> str:
        status = "down (crashed)" if side.down else ("running" if RACE.on or RACE.draining else "stopped")
        cells = "".join(
            f"<div data-k='{esc(k)}' class='{esc(k.replace(' ', '-'))}'><b>{esc(v)}</b><span>{esc(k)}</span></div>"
            for k, v in tally(side, lost, owed_n)
        )
        return (
            f"<div class='race-side{' down' if side.down else ''}' id='race-{key}'><h3>{esc(title)}</h3>"
            f"<p class='small muted how'>{esc(how)}</p><p class='small'>now: <b>{esc(status)}</b></p>"
            f"<div class='tally'>{cells}</div></div>"
        )

    ui.put(
        box,
        f"<p class='small'>published <b data-k='published'>{len(pub)}</b>"
        f"{' · catching up…' if RACE.draining else ''}</p><div class='race-cols'>"
        + column(
            "notify",
            "Notifications only",
            RACE.notify,
            n_lost,
            None,
            "Hears each build once, as it is sent. Down when one is sent: never hears it.",
        )  # fmt: skip
        + column(
            "cursor",
            "Cursor + ack",
            RACE.cursor,
            c_lost,
            owed,
            "Pulls from its cursor and acks after the "
            "work. Down: pulls later, and what it had not acked comes back.",
        )  # fmt: skip
        + "</div>",
    )
    btn = el("race-btn")
    btn.textContent = "Stop" if RACE.on else ("Start again" if pub else "Start the race")
    btn.disabled = RACE.draining
