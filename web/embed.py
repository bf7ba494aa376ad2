"""embed.html: one scene of the playground, sized for an iframe, in its own engine namespace.

embed-ns.js (a plain script before boot.js) picked the namespace (`embed-<scene>-<id>`) before boot.js ran, so this frame's
IndexedDB, Web Lock and view channel are its own: it never mixes with the playground (namespace "") or with
another embed. Everything drawn or called is the playground's own code (door, actions, track, panels,
compare); this module only starts the engine, reads the picture of the scene's one monitor, and dispatches
the clicks. An unknown or missing scene shows the list of scenes and starts no engine at all."""

from __future__ import annotations

import asyncio
import re

import actions as a
import compare
import js
import model as m
import page
import panels
import scenes
import track
import ui
from door import ENGINE, said_offline, when_offline
from pyodide.ffi import create_proxy
from ui import ACTIONS, el, esc

MP = js.MP
doc = js.document
ID_RE = re.compile(r"[a-z0-9-]{1,40}\Z")  # the `id` parameter (and a scene's name); embed-ns.js agrees
HERE: list[scenes.Scene] = []  # the scene on this page, once it is known to be one


def query(name: str) -> str | None:
    value = js.URLSearchParams.new(js.location.search).get(name)
    return str(value) if value else None


def namespace(scene: str, ident: str) -> str:
    return f"embed-{scene}-{ident}"


# ---------------------------------------------------------------------------------------- the picture
async def refresh() -> None:
    """Read the scene's monitor from the engine (a follower also the session the owner frame saved) and
    redraw everything from it."""

    async def read() -> None:
        if ENGINE.mode == "follower":
            await page.load_session()  # the owner frame holds the readers and tokens: what it saved
        await page.read_picture(gone=lambda: None, default=lambda: False)  # not made yet: monitors only

    await page.reading(read)
    render_all()


def render_all() -> None:
    scene = HERE[0]
    track.render()
    if scene.moves:
        ui.put(el("scene-moves"), scenes.moves_markup(scene))
    if el("workers") is not None:
        panels.render_workers()
    if el("state-brief") is not None:
        panels.render_state_brief()
    compare.render()
    panels.render_clocks()
    set_chip()


def set_chip() -> None:
    chip = el("status-chip")
    label = chip.querySelector(".label")
    if ENGINE.mode == "follower":
        chip.className = "chip warn"
        label.textContent = "ready · shared with another frame"
        chip.title = "Another frame shows this scene with the same id: its engine owns the log."
    elif ENGINE.storage == "indexeddb":
        chip.className = "chip ok"
        label.textContent = "ready · saved in this browser"
        chip.title = f"IndexedDB namespace {MP.ns}"
    else:
        chip.className = "chip warn"
        label.textContent = "ready · memory only"
        chip.title = ENGINE.storage_reason or "IndexedDB is not available in this browser"
    said_offline(chip, label)


# ---------------------------------------------------------------------------------------- events
@ui.action("scene-move")
async def scene_move(target) -> None:
    await scenes.run_move(HERE[0], str(target.getAttribute("data-move")))


@ui.action("embed-reset", exclusive=False)
async def reset(_el) -> None:
    question = "Reset this scene? Its saved log and tokens are deleted from this browser."
    await page.reset(
        "frame (the first one opened)", question, stop=lambda: setattr(compare.RACE, "on", False)
    )


@ui.action("embed-start-over", exclusive=False)
async def start_over(_el) -> None:
    """The scene as new: this frame's own saved log goes (nothing else is touched), without a question."""
    await page.reset("frame (the first one opened)", None, stop=lambda: setattr(compare.RACE, "on", False))


def on_click(evt) -> None:
    target = page.clicked(evt)
    act = ACTIONS.get(target.getAttribute("data-act")) if target is not None else None
    if act is not None:
        page.run_action(act, target, answer=HERE[0].answer)


# ---------------------------------------------------------------------------------------- start
async def took_over() -> None:
    """A follower frame whose owner frame went: this one owns the engine now, and goes on."""
    el("reset-btn").disabled = False
    async with page.BUSY:
        await page.load_session()
        await setup(HERE[0])


async def setup(scene: scenes.Scene) -> None:
    """The scene's monitor (and reader or workers), made once per namespace; an answer only if it failed.
    A scene found as a previous visit left it says so, and offers to start over."""
    a.select(scenes.monitor_of(scene))
    await refresh()
    before = m.PIC.head_of(scenes.monitor_of(scene))
    # found, and grown past where the scene left it when it set itself up (a load alone adds nothing)
    continued = before is not None and before > m.S.scene_heads.get(scenes.monitor_of(scene), -1)
    el("scene-continued").hidden = not continued
    pairs = await scene.setup()
    mon = scenes.monitor_of(scene)
    a.select(mon)
    if any(not r.ok for _, r in pairs):
        ui.show(scene.answer, pairs, "The scene could not set itself up: the answer says why. Reset it.")
    await refresh()
    if before is None and (head := m.PIC.head_of(mon)) is not None:
        m.S.scene_heads[mon] = head
        await a.save()


def show_list(why: str) -> None:
    """No scene (or a bad one): the scenes as links, never a blank page."""
    doc.title = "Monitor Protocol scenes"
    el("scene-title").textContent = "Monitor Protocol scenes"
    el("scene-text").textContent = why
    items = "".join(
        f"<li><a href='?scene={esc(s.name)}'>{esc(s.title)}</a> <code>scene={esc(s.name)}</code>"
        f"<br><span class='small muted'>{esc(s.text)}</span></li>"
        for s in scenes.SCENES.values()
    )
    el("scene-body").innerHTML = f"<ul class='scene-list' id='scene-list'>{items}</ul>"
    el("log-panel").setAttribute("hidden", "")
    el("scene-answer").setAttribute("hidden", "")
    chip = el("status-chip")
    chip.className = "chip"
    chip.querySelector(".label").textContent = "pick a scene"
    el("app").removeAttribute("inert")
    MP.stage("ready", "Ready")


def draw(scene: scenes.Scene) -> None:
    doc.title = f"{scene.title} · Monitor Protocol"
    el("scene-title").textContent = scene.title
    el("scene-text").textContent = scene.text
    el("scene-body").innerHTML = scene.body
    el("scene-answer").id = scene.answer  # the reused modules write their answers to their own line
    el("embed-ns").textContent = f"storage: {MP.ns}"
    track.EMPTY = "Setting the scene up…"


async def main() -> None:
    MP.mark("imports")
    name, ident = query("scene"), query("id")
    scene = scenes.SCENES.get(name or "")
    if scene is None:
        said = f"There is no scene “{name}”." if name else "No scene was named (embed.html?scene=…)."
        show_list(f"{said} Pick one of these:")
        return
    ident = ident or scene.name
    if not ID_RE.match(ident):  # \Z, not $: a trailing newline is refused here too
        show_list(f"The id “{ident}” is not usable: send 1 to 40 of a-z, 0-9 and -, e.g. &id=left.")
        return
    if str(MP.ns or "") != namespace(scene.name, ident):
        # Never guess a namespace: a wrong one could mix this frame with the playground or another embed.
        show_list(f"This page's storage namespace is {MP.ns!r}, not {namespace(scene.name, ident)!r}: "
                  "load embed.html as built, with embed-ns.js before boot.js.")  # fmt: skip
        return
    HERE.append(scene)
    draw(scene)
    await MP.swReady
    MP.stage("storage", "Opening IndexedDB and taking the writer lock…")
    page.wire(refresh)
    await ENGINE.open(follower=lambda: None, took_over=took_over)  # the chip says "shared with another frame"
    await page.load_session()
    if ENGINE.mode == "owner":
        async with page.BUSY:
            await setup(scene)
    else:
        a.select(scenes.monitor_of(scene))
        await refresh()
    doc.addEventListener("click", create_proxy(on_click))
    when_offline(set_chip)
    el("reset-btn").disabled = ENGINE.mode != "owner"
    el("app").removeAttribute("inert")
    asyncio.ensure_future(page.ticker("embed"))
    MP.stage("ready", "Ready")
