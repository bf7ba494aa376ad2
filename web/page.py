"""What every page that draws an engine does, the playground (app.py) and the embeds (embed.py) alike: read
the engine's picture of one monitor into model.PIC, redraw soon after a change (debounced), run a clicked
action under the engine lock with its button disabled and the keyboard focus kept, tick the sweep and the
clocks, reset the namespace's storage, and load the saved session. One place, so the pages cannot drift."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import js
import model as m
import panels
import ui
from door import ENGINE
from pyodide.ffi import create_proxy

MP = js.MP
doc = js.document
BUSY = asyncio.Lock()  # one engine action at a time: no double effects, no interleaved answers
READING = asyncio.Lock()  # one read of the picture at a time: two would append the same rows twice
SOON = {"pending": False, "read_at": 0.0}  # a redraw asked for; when the last picture read began
LOG_KEPT = 400  # rows of the log kept in the page (the track draws the newest 80; older ones are counted)
PAGE: dict[str, Callable[[], Awaitable[None]]] = {}  # "refresh": the page's own read-and-redraw


async def read_picture(gone: Callable[[], None], default: Callable[[], bool]) -> None:
    """Every monitor, and the one on screen (m.S.monitor) with its log read on from the last row held.
    `gone()` runs when that monitor is not there (reset or retired elsewhere); `default()` picks one when
    none is on screen and says whether it did."""
    mon = m.S.monitor
    if m.PIC.log_of != mon:
        m.PIC.log, m.PIC.log_of, m.PIC.log_skipped = [], mon, 0
    while True:
        nxt = int(m.PIC.log[-1]["id"]) + 1 if m.PIC.log else 1
        r = await ENGINE.overview(mon, nxt)
        if r.status == 404 and mon is not None:  # gone (or not made yet): show the engine as it is
            gone()
            mon, m.PIC.log = None, []
            continue
        if not r.ok:
            m.PIC.error = f"{(r.body or {}).get('code')}: {(r.body or {}).get('error')}"
            return
        m.PIC.error = None
        m.PIC.monitors = r.body["monitors"]
        m.PIC.monitor = r.body["monitor"]
        m.PIC.read_at = time.time()
        if mon is None:
            if default():
                mon = m.S.monitor
                m.PIC.log_of = mon
                continue
            return
        rows = r.body["monitor"]["log"]["observations"]
        if rows and int(rows[0]["id"]) != nxt and m.PIC.log:  # compacted under us: read it again
            m.PIC.log = []
            continue
        m.PIC.log.extend(rows)
        if len(m.PIC.log) > LOG_KEPT:
            m.PIC.log_skipped += len(m.PIC.log) - LOG_KEPT
            del m.PIC.log[: len(m.PIC.log) - LOG_KEPT]
        if len(rows) < 200:
            return


async def reading(read: Callable[[], Awaitable[None]]) -> None:
    """Run one read of the picture, alone, noting when it began (a redraw asked for before that is done)."""
    async with READING:
        SOON["read_at"] = time.monotonic()
        await read()


def refresh_soon() -> None:
    """A redraw shortly (debounced): the engine changed, through whichever door, tab or frame."""
    if SOON["pending"]:
        return
    SOON["pending"] = True
    asked = time.monotonic()

    async def later():
        await asyncio.sleep(0.15)
        SOON["pending"] = False
        # The running action redraws when it is done, and a read begun since the change already shows it.
        if BUSY.locked() or SOON["read_at"] > asked:
            return
        await PAGE["refresh"]()

    asyncio.ensure_future(later())


def wire(refresh: Callable[[], Awaitable[None]]) -> None:
    """Tell every door how this page redraws: the engine's change notice, other tabs' notices, ui's calls."""
    PAGE["refresh"] = refresh
    ENGINE.on_change = refresh_soon
    ui.REDRAW["now"] = refresh
    ui.REDRAW["soon"] = refresh_soon
    MP.onChanged = create_proxy(refresh_soon)


def clicked(evt, extra: str = "") -> Any:
    """The enabled [data-act] element (or one matching `extra`) a click landed on, else None."""
    target = evt.target.closest("[data-act]" + extra) if evt.target.closest else None
    if not target or target.disabled:  # null comes back as a falsy JsNull
        return None
    return target


def run_action(
    act: ui.Action,
    target,
    answer: str | None = None,
    done: Callable[[Any], None] | None = None,
) -> None:
    """Run a clicked action: a non-exclusive one at once; an engine one under BUSY, its button disabled now
    (synchronously: a double click cannot start it twice), the picture read again after it, and the
    keyboard focus given back (disabling drops it). `done(result)` sees what the action returned."""
    if act.local_only and ENGINE.remote is not None:
        ui.note(act.answer or answer or "", "Not while connected to a server. " + ui.LOCAL_ONLY, ok=False)
        return
    if not act.exclusive:
        ui.run_task(act.run(target))
        return
    focused = ui.focus_key(target) if target.isSameNode(doc.activeElement) else None
    target.disabled = True
    target.setAttribute("aria-busy", "true")
    ui.pending(act.answer or answer)

    async def locked():
        try:
            async with BUSY:
                result = await act.run(target)
                if done is not None:
                    done(result)
        finally:
            target.removeAttribute("aria-busy")
            target.disabled = bool(target.getAttribute("data-why"))
            await PAGE["refresh"]()
            if focused is not None and not doc.activeElement.closest("button, input, select, textarea"):
                ui.refocus(focused)

    ui.run_task(locked())


async def ticker(name: str) -> None:
    """Every second: the owner's sweep (lease expiry, mute), and the clocks on screen. The picture is read
    again when the sweep changed something (every door says so otherwise) and every few seconds anyway."""
    quiet = 0
    while True:
        await asyncio.sleep(1)
        try:
            swept = await ENGINE.host.sweep() if ENGINE.mode == "owner" else 0
            quiet += 1
            if (swept or quiet >= 5) and not BUSY.locked():
                quiet = 0
                await PAGE["refresh"]()
            panels.render_clocks()
        except Exception as exc:  # a failed redraw is logged; the next tick tries again
            js.console.error(f"{name} timer: {exc!r}")


async def reset(where: str, question: str | None, stop: Callable[[], None]) -> None:
    """Delete this namespace's saved log and tokens (after asking `question`, unless None), then start
    again from a reload."""
    if ENGINE.mode != "owner":
        js.alert(f"Reset from the {where} that owns the engine.")
        return
    if question is not None and not js.confirm(question):
        return
    stop()
    if ENGINE.ui_idb:
        await MP.idb.clear()
    js.location.reload()


async def load_session() -> None:
    """The page's saved session (readers, tokens, workers) from this namespace's IndexedDB."""
    saved = await MP.idb.getUi() if ENGINE.ui_idb else None
    fresh = m.Session.from_json(str(saved) if saved else None)
    m.S.__dict__.update(fresh.__dict__)
