"""The Monitor Protocol playground: the UI, in Python, over the SAME engine as the server.

This module wires the page: it reads the engine's picture (door.ENGINE.overview) and redraws every panel
from it, dispatches clicks to the registered actions (ui.ACTIONS, filled by actions, story, compare,
console and conformance_ui), switches tabs, and starts the engine as the owner tab or a follower."""

from __future__ import annotations

import asyncio
import time

import actions
import compare
import conformance_ui  # noqa: F401 - registers its action
import console
import js
import model as m
import panels
import story
import track
import ui
import words
from door import ENGINE
from pyodide.ffi import create_proxy
from ui import ACTIONS, el

MP = js.MP
doc = js.document
BUSY = asyncio.Lock()  # one engine action at a time: no double effects, no interleaved answers
VIEW = {"tab": "story"}


# ---------------------------------------------------------------------------------------- the picture
REFRESHING = asyncio.Lock()  # one read of the picture at a time: two would append the same rows twice


async def refresh() -> None:
    """Read the engine's picture (every monitor; the one on screen with its log, readers, leases and
    state) and redraw everything from it."""
    async with REFRESHING:
        SOON["read_at"] = time.monotonic()
        await _read_picture()
    reconcile()
    render_all()


async def _read_picture() -> None:
    if m.S.monitor is None:
        choose_default()
    mon = m.S.monitor
    if m.PIC.log_of != mon:
        m.PIC.log, m.PIC.log_of, m.PIC.log_skipped = [], mon, 0
    while True:
        nxt = int(m.PIC.log[-1]["id"]) + 1 if m.PIC.log else 1
        r = await ENGINE.overview(mon, nxt)
        if r.status == 404 and mon is not None:  # gone (reset elsewhere): show the engine as it is
            actions.select(None)
            mon = None
            continue
        if not r.ok:
            m.PIC.error = f"{(r.body or {}).get('code')}: {(r.body or {}).get('error')}"
            break
        m.PIC.error = None
        m.PIC.monitors = r.body["monitors"]
        m.PIC.monitor = r.body["monitor"]
        m.PIC.read_at = time.time()
        if mon is None:
            if choose_default():
                mon = m.S.monitor
                m.PIC.log_of = mon
                continue
            break
        rows = r.body["monitor"]["log"]["observations"]
        if rows and int(rows[0]["id"]) != nxt and m.PIC.log:  # compacted under us: read it again
            m.PIC.log = []
            continue
        m.PIC.log.extend(rows)
        if len(m.PIC.log) > LOG_KEPT:  # the track draws the last 80; the rest is only counted
            m.PIC.log_skipped += len(m.PIC.log) - LOG_KEPT
            del m.PIC.log[: len(m.PIC.log) - LOG_KEPT]
        if len(rows) < 200:
            break


LOG_KEPT = 400


def reconcile() -> None:
    """What a reader of this page holds, checked against its subscription in the engine: a batch another
    door acknowledged is not held any more, and a retired subscription holds nothing."""
    for view in m.PIC.subscriptions():
        sub = view["subscription"]
        rd = m.S.readers.get(sub["id"])
        if rd is None or not rd.held:
            continue
        if not sub.get("active", True):
            rd.held, rd.redelivered, rd.next = [], [], None
        elif any(seq < int(sub["cursor"]) for seq in rd.held):
            rd.held = [seq for seq in rd.held if seq >= int(sub["cursor"])]
            rd.redelivered = [seq for seq in rd.redelivered if seq in rd.held]
            if not rd.held:
                rd.next = None


def choose_default() -> bool:
    """Nothing on screen: the first monitor this page holds a token for, else the first one there is."""
    if not m.PIC.monitors:
        return False
    ids = [x["id"] for x in m.PIC.monitors]
    mine = [i for i in ids if i in m.S.owners]
    actions.select((mine or ids)[0])
    return True


def render_all() -> None:
    track.render()
    panels.render_all_panels()
    story.render()
    compare.render()
    set_chip()


SOON = {"pending": False, "read_at": 0.0}  # a redraw asked for; when the last picture read began


def refresh_soon() -> None:
    """A redraw shortly (debounced): the engine changed, through whichever door."""
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
        await refresh()

    asyncio.ensure_future(later())


def set_chip() -> None:
    chip = el("status-chip")
    label = chip.querySelector(".label")
    if ENGINE.mode == "follower":
        chip.className = "chip warn"
        label.textContent = "ready · another tab owns the engine"
    elif ENGINE.storage == "indexeddb":
        chip.className = "chip ok"
        label.textContent = "ready · saved in IndexedDB"
    else:
        chip.className = "chip warn"
        label.textContent = "ready · memory only: not saved"
        chip.title = ENGINE.storage_reason or "IndexedDB is not available in this browser"


# ---------------------------------------------------------------------------------------- events
def switch_tab(tab: str) -> None:
    VIEW["tab"] = tab
    for b in doc.querySelectorAll(".tab-btn"):
        active = b.getAttribute("data-tab") == tab
        b.classList.toggle("active", active)
        b.setAttribute("aria-selected", "true" if active else "false")
        b.tabIndex = 0 if active else -1
    for v in doc.querySelectorAll(".view"):
        v.classList.toggle("active", v.id == f"tab-{tab}")
    if tab in ("story", "playground"):
        el(f"slot-{tab}").appendChild(el("live"))
    compare.render()


def on_click(evt) -> None:
    target = evt.target.closest("[data-act],[data-tab]") if evt.target.closest else None
    if not target or target.disabled:  # null comes back as a falsy JsNull
        return
    if target.getAttribute("data-tab"):
        switch_tab(target.getAttribute("data-tab"))
        return
    act = ACTIONS.get(target.getAttribute("data-act"))
    if act is None:
        return
    if not act.exclusive:
        ui.run_task(act.run(target))
        return
    # Disabled now, synchronously: a double click cannot start the action twice. Disabling drops the
    # keyboard focus, so where it was is noted and given back once the page is redrawn.
    focused = ui.focus_key(target) if target.isSameNode(doc.activeElement) else None
    target.disabled = True
    target.setAttribute("aria-busy", "true")
    ui.pending(act.answer)

    async def locked():
        try:
            async with BUSY:
                await act.run(target)
        finally:
            target.removeAttribute("aria-busy")
            target.disabled = bool(target.getAttribute("data-why"))
            await refresh()
            if focused is not None and not doc.activeElement.closest("button, input, select, textarea"):
                ui.refocus(focused)

    ui.run_task(locked())


def on_tab_key(evt) -> None:
    """Arrow keys move between tabs (the ARIA tabs pattern)."""
    if evt.key not in ("ArrowLeft", "ArrowRight"):
        return
    tabs = list(doc.querySelectorAll(".tab-btn"))
    i = next((k for k, b in enumerate(tabs) if b.getAttribute("data-tab") == VIEW["tab"]), 0)
    nxt = tabs[(i + (1 if evt.key == "ArrowRight" else -1)) % len(tabs)]
    switch_tab(nxt.getAttribute("data-tab"))
    nxt.focus()


@ui.action("reset", exclusive=False)
async def reset(_el) -> None:
    if ENGINE.mode != "owner":
        js.alert("Reset from the tab that owns the engine.")
        return
    if not js.confirm("Reset the playground? This deletes the saved log and every token from this browser."):
        return
    compare.RACE.on = False
    if ENGINE.ui_idb:
        await MP.idb.clear()
    js.location.reload()


# ---------------------------------------------------------------------------------------- timers and tabs
async def ticker() -> None:
    """Every second: the owner's sweep (lease expiry, mute), and the clocks on screen. The picture is read
    again when something changed (every door says so) and every few seconds anyway."""
    quiet = 0
    while True:
        await asyncio.sleep(1)
        try:
            swept = await ENGINE.host.sweep() if ENGINE.mode == "owner" else 0
            quiet += 1
            if swept or quiet >= 5:
                quiet = 0
                if not BUSY.locked():
                    await refresh()
            panels.render_clocks()
        except Exception as exc:  # a failed redraw is logged; the next tick tries again
            js.console.error(f"playground timer: {exc!r}")


async def take_over_when_free() -> None:
    await MP.acquireLock(True)
    await ENGINE.start_owner()
    el("other-tab").setAttribute("hidden", "")
    el("reset-btn").disabled = False
    await load_session()
    await refresh()


async def load_session() -> None:
    saved = await MP.idb.getUi() if ENGINE.ui_idb else None
    fresh = m.Session.from_json(str(saved) if saved else None)
    m.S.__dict__.update(fresh.__dict__)


async def main() -> None:
    MP.mark("imports")
    await MP.swReady
    MP.stage("storage", "Opening IndexedDB and taking the writer lock…")
    await ENGINE.open_ui_storage()
    ENGINE.on_change = refresh_soon
    ui.REDRAW["now"] = refresh
    ui.REDRAW["soon"] = refresh_soon
    MP.onChanged = create_proxy(refresh_soon)
    if await MP.acquireLock(False):
        await ENGINE.start_owner()
    else:
        ENGINE.mode = "follower"
        banner = el("other-tab")
        banner.textContent = (
            "The playground is open in another tab: that tab's engine owns the log. This tab shows the same "
            "engine and forwards its actions to it, and takes over when the other tab closes."
        )
        banner.removeAttribute("hidden")
        el("reset-btn").disabled = True
        asyncio.ensure_future(take_over_when_free())
    await load_session()
    el("story-intro").innerHTML = words.INTRO
    el("legend-terms").innerHTML = (
        " ".join(
            words.tip(t, t, f"badge t-{t}") for t in ("src", "measured", "derived", "unverified", "falsified")
        )
        + f" · {words.tip('⚙ protocol rows', 'protocol')} · {words.tip('⚠ refused', 'rejected')}"
    )
    await refresh()
    await console.setup()
    doc.addEventListener("click", create_proxy(on_click))
    el("monitor-pick").addEventListener("change", create_proxy(lambda e: ui.run_task(actions.pick(None))))
    el("lease-subject").addEventListener("input", create_proxy(lambda e: panels.render_workers()))
    el("tabs").addEventListener("keydown", create_proxy(on_tab_key))
    switch_tab("story")
    for b in doc.querySelectorAll(".tab-btn"):
        b.disabled = False
    el("reset-btn").disabled = ENGINE.mode != "owner"
    el("app").removeAttribute("inert")
    asyncio.ensure_future(ticker())
    MP.stage("ready", "Ready")
