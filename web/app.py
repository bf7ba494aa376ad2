"""The Monitor Protocol playground: the UI, in Python, over the SAME engine as the server.

This module wires the page: it reads the engine's picture (door.ENGINE.overview) and redraws every panel
from it, dispatches clicks to the registered actions (ui.ACTIONS, filled by actions, story, compare,
console and conformance_ui), switches tabs, and starts the engine as the owner tab or a follower."""

from __future__ import annotations

import asyncio

import actions
import compare
import conformance_ui  # noqa: F401 - registers its action
import console
import js
import model as m
import page
import panels
import remote  # the Server panel: this page as a console for a running mp serve
import share  # export, import, and share links (records the Playground's steps)
import story
import track
import ui
import words
from door import ENGINE, said_offline, when_offline
from pyodide.ffi import create_proxy
from ui import ACTIONS, el

MP = js.MP
doc = js.document
VIEW = {"tab": "story"}


# ---------------------------------------------------------------------------------------- the picture
async def refresh() -> None:
    """Read the engine's picture (every monitor; the one on screen with its log, readers, leases and
    state) and redraw everything from it."""
    await page.reading(lambda: page.read_picture(lambda: actions.select(None), choose_default))
    reconcile()
    render_all()


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
    share.render()
    set_chip()


def set_chip() -> None:
    chip = el("status-chip")
    label = chip.querySelector(".label")
    if remote.chip(chip, label):  # connected to a server: "remote: <host>"
        return
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
    said_offline(chip, label)


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
    target = page.clicked(evt, ",[data-tab]")
    if target is None:
        return
    if target.getAttribute("data-tab"):
        switch_tab(target.getAttribute("data-tab"))
        return
    act = ACTIONS.get(target.getAttribute("data-act"))
    if act is None:
        return
    # a share link's step, if it is one (recorded once the action says how it went)
    captured = share.capture(target.getAttribute("data-act"), target) if act.exclusive else None
    page.run_action(act, target, done=lambda result: share.record(captured, result))


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
    question = "Reset the playground? This deletes the saved log and every token from this browser."
    await page.reset("tab", question, stop=lambda: setattr(compare.RACE, "on", False))


# ---------------------------------------------------------------------------------------- timers and tabs
def following() -> None:
    banner = el("other-tab")
    banner.textContent = (
        "The playground is open in another tab: that tab's engine owns the log. This tab shows the same "
        "engine and forwards its actions to it, and takes over when the other tab closes."
    )
    banner.removeAttribute("hidden")
    ui.set_reset(ui.FOLLOWER_NO_RESET)


async def took_over() -> None:
    el("other-tab").setAttribute("hidden", "")
    ui.set_reset()
    share.took_over()
    conn = remote.CONN["now"]
    if conn is None:
        await page.load_session()
    elif conn.ui_idb:  # connected: the server's session stays on screen; the page's own, as the tab that
        saved = await MP.idb.getUi()  # owned the engine saved it, is what Disconnect gives back
        conn.page_session = dict(m.Session.from_json(str(saved) if saved else None).__dict__)
    await refresh()


async def main() -> None:
    MP.mark("imports")
    await MP.swReady
    MP.stage("storage", "Opening IndexedDB and taking the writer lock…")
    page.wire(refresh)
    await ENGINE.open(following, took_over)
    await page.load_session()
    el("story-intro").innerHTML = words.INTRO
    el("legend-terms").innerHTML = (
        " ".join(
            words.tip(t, t, f"badge t-{t}") for t in ("src", "measured", "derived", "unverified", "falsified")
        )
        + f" · {words.tip('⚙ protocol rows', 'protocol')} · {words.tip('⚠ refused', 'rejected')}"
    )
    await refresh()
    await console.setup()
    await remote.setup()
    await story.setup()
    doc.addEventListener("click", create_proxy(on_click))
    when_offline(set_chip)  # boot.js, from the worker
    el("monitor-pick").addEventListener(
        "change", create_proxy(lambda e: ui.run_task(actions.pick(str(e.target.value))))
    )
    el("lease-subject").addEventListener("input", create_proxy(lambda e: panels.render_workers()))
    el("tabs").addEventListener("keydown", create_proxy(on_tab_key))
    # a #scenario= link opens where Replay is (at start, or pasted into this tab later)
    switch_tab("playground" if share.setup(lambda: switch_tab("playground")) else "story")
    for b in doc.querySelectorAll(".tab-btn"):
        b.disabled = False
    ui.set_reset("" if ENGINE.mode == "owner" else ui.FOLLOWER_NO_RESET)
    el("app").removeAttribute("inert")
    asyncio.ensure_future(page.ticker("playground"))
    MP.stage("ready", "Ready")
