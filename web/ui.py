"""The glue every panel uses: the action registry (data-act name -> coroutine), answers shown in the panel
where the action was, buttons disabled with their reason, and the redraw request."""

from __future__ import annotations

import asyncio
import html
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import js
from monitor_protocol.doors.browser import Reply

doc = js.document


@dataclass(frozen=True)
class Action:
    run: Callable[[Any], Awaitable[Any]]
    answer: str | None  # the panel's answer line ("<panel>-answer"), cleared when the action starts
    exclusive: bool  # waits for the engine lock (BUSY): anything that calls the engine
    local_only: bool = False  # acts on this page's own engine only: refused while it is a server's console


ACTIONS: dict[str, Action] = {}
# Why a local_only action is refused while the page is a console for a server (page.run_action says it).
LOCAL_ONLY = (
    "While the page is a console for a server, the Story and the race are paused: they teach on this "
    "page's own engine, and would write their teaching monitors into the server. Disconnect to go on."
)


def action(name: str, answer: str | None = None, exclusive: bool = True, local_only: bool = False):
    """Register `fn(el)` as the handler of buttons with data-act=`name`."""

    def register(fn: Callable[[Any], Awaitable[Any]]):
        ACTIONS[name] = Action(fn, answer, exclusive, local_only)
        return fn

    return register


def js_options(**options: Any):
    """A plain JavaScript object of options (scrollIntoView's, ...)."""
    from pyodide.ffi import to_js

    return to_js(options, dict_converter=js.Object.fromEntries)


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def el(el_id: str):
    """The element, or None (the DOM's null arrives as a falsy JsNull, which `is None` would miss)."""
    found = doc.getElementById(el_id)
    return found if found else None


RESET_TITLE = "Clear the saved log (IndexedDB) and start over"
FOLLOWER_NO_RESET = "Only the tab that owns the engine can reset: this tab follows another (reset there)"


def set_reset(why_not: str = "") -> None:
    """The top bar's Reset: its reason when it cannot be used (a follower tab, a server connected), else
    what it does."""
    b = el("reset-btn")
    b.disabled = bool(why_not)
    b.setAttribute("title", why_not or RESET_TITLE)


# ---------------------------------------------------------------------------------------- redrawing a panel
_DRAWN: dict[str, str] = {}  # element id -> the markup last put there
_KEYS = ("data-act", "data-sub", "data-worker", "data-reader", "data-tab", "aria-describedby")


def put(box, markup: str) -> None:
    """Replace a panel's markup only when it changed (the timer redraws every second), and keep the
    keyboard focus on the same control when it was inside: a redraw never throws a keyboard user out."""
    if not box or _DRAWN.get(box.id) == markup:
        return
    active = doc.activeElement
    key = focus_key(active) if active and box.contains(active) and not active.isSameNode(box) else None
    box.innerHTML = markup
    _DRAWN[box.id] = markup
    refocus(key, box)


def focus_key(node) -> tuple[str, list[tuple[str, str]]] | None:
    """What identifies a control across redraws: its id, or its data-act and the record it acts on."""
    if not node:
        return None
    attrs = [(k, str(node.getAttribute(k))) for k in _KEYS if node.getAttribute(k)]
    return (str(node.id or ""), attrs) if node.id or attrs else None


def refocus(key, within=None) -> None:
    """Put the keyboard focus back on the control `key` names, if it is still there and usable."""
    if key is None:
        return
    the_id, attrs = key
    again = doc.getElementById(the_id) if the_id else None
    if not again and attrs:
        selector = "".join(f'[{k}="{js.CSS.escape(v)}"]' for k, v in attrs)
        again = (within or doc).querySelector(selector)
    if again and not again.disabled:
        again.focus(js_options(preventScroll=True))  # the focus comes back; the view stays where it was put


# ---------------------------------------------------------------------------------------- answers
def _label(reply: Reply) -> str:
    if reply.ok:
        return f"{reply.status} OK"
    code = (reply.body or {}).get("code", "") if isinstance(reply.body, dict) else ""
    return f"{reply.status} {code}".strip()


SECRETS = ("owner_token", "token", "subscribe_token")  # shown once, in the token box only (or kept unseen)


def redacted(body: Any) -> Any:
    """An answer as shown in a panel: every token replaced by a note (the page keeps them)."""
    if isinstance(body, dict):
        return {k: ("(kept by this page, not shown)" if k in SECRETS and isinstance(v, str) else redacted(v))
                for k, v in body.items()}  # fmt: skip
    if isinstance(body, list):
        return [redacted(v) for v in body]
    return body


def _body(reply: Reply) -> str:
    return json.dumps(redacted(reply.body), indent=2, ensure_ascii=False) if reply.body is not None else ""


def announce(text: str) -> None:
    """What a screen reader hears of an answer: one line (the page's one live region, #announce). The
    answer boxes are not live: each would read its whole JSON aloud."""
    box = el("announce")
    if box is not None:
        box.textContent = ""  # the same words twice are still said twice
        box.textContent = text[:300]


def show(answer_id: str, pairs: list[tuple[str, Reply]], say: str = "", seq: int | None = None) -> None:
    """One or more calls' answers in a panel's answer line: each call's status, the last one's JSON, and a
    sentence saying what it means (`say`), stamped with the time so an old answer never passes for new."""
    box = el(answer_id)
    if box is None or not pairs:
        return
    last = pairs[-1][1]
    box.className = "answer " + ("ok" if last.ok else "err")
    steps = "".join(f"<div class='status'>{esc(t)} → {esc(_label(r))}</div>" for t, r in pairs[:-1])
    stamp = time.strftime("%H:%M:%S")
    sentence = f"<p class='say'>{esc(say)}</p>" if say else ""
    if seq is not None:  # the card the call appended, which may be below the window (the Playground tab)
        sentence += f"<button class='ghost small' data-act='to-card' data-seq='{int(seq)}'>↓ seq {int(seq)} in the log</button>"
    box.innerHTML = (
        f"{steps}<div class='status'>{esc(pairs[-1][0])} → {esc(_label(last))} <small>{stamp}</small></div>"
        f"{sentence}<pre class='json'>{esc(_body(last))}</pre>"
    )
    box.setAttribute("data-status", str(last.status))
    announce(f"{pairs[-1][0]}: {_label(last)}." + (f" {say}" if say else ""))
    codes = [str((r.body or {}).get("code", "")) for _, r in pairs if not r.ok and isinstance(r.body, dict)]
    box.setAttribute("data-code", " ".join(codes))


def show_one(answer_id: str, title: str, reply: Reply, say: str = "", seq: int | None = None) -> None:
    show(answer_id, [(title, reply)], say, seq)


def note(answer_id: str, text: str, ok: bool = True) -> None:
    """A sentence in a panel's answer line (a preset filled in, a refusal made before any call)."""
    box = el(answer_id)
    if box is None:
        return
    box.className = "answer " + ("ok" if ok else "err") + " note"
    box.innerHTML = f"<p class='say'>{esc(text)} <small>{time.strftime('%H:%M:%S')}</small></p>"
    announce(text)
    box.removeAttribute("data-status")
    box.removeAttribute("data-code")


def pending(answer_id: str | None) -> None:
    """An action started: its panel's old answer goes, so nothing stale lingers beside the new one."""
    box = el(answer_id) if answer_id else None
    if box is not None:
        box.className = "answer pending"
        box.innerHTML = "<p class='say'>…</p>"
        box.removeAttribute("data-status")
        box.removeAttribute("data-code")


# ---------------------------------------------------------------------------------------- buttons
def button(act: str, label: str, why_not: str = "", cls: str = "", **data: str) -> str:
    """A button that is disabled, with its reason shown beside it, when `why_not` says why it cannot act."""
    attrs = "".join(f" data-{k.replace('_', '-')}='{esc(v)}'" for k, v in data.items())
    klass = f" class='{cls}'" if cls else ""
    if why_not:
        return (
            f"<button data-act='{esc(act)}'{attrs}{klass} disabled data-why='{esc(why_not)}' "
            f"title='{esc(why_not)}'>{esc(label)}</button>"
        )
    return f"<button data-act='{esc(act)}'{attrs}{klass}>{esc(label)}</button>"


def reasons(pairs: list[tuple[str, str]]) -> str:
    """The visible list of why buttons are disabled (a title alone is invisible on a phone)."""
    items = [f"{esc(label)}: {esc(why)}" for label, why in pairs if why]
    if not items:
        return ""
    return "<p class='why-not small'>" + " · ".join(items) + "</p>"


def set_enabled(el_id: str, why_not: str = "") -> None:
    """A static button's state (the Publish button, + reader...): disabled with its reason, or enabled."""
    b = el(el_id)
    if b is None:
        return
    b.disabled = bool(why_not)
    if why_not:
        b.setAttribute("data-why", why_not)
        b.setAttribute("title", why_not)
    else:
        b.removeAttribute("data-why")
        b.removeAttribute("title")
    hint = el(el_id + "-why")
    if hint is not None:
        hint.textContent = why_not


# ---------------------------------------------------------------------------------------- redraw
REDRAW: dict[str, Callable[[], Any]] = {}  # set by app.main: "now" (await a refresh), "soon" (debounced)


async def refresh() -> None:
    await REDRAW["now"]()


def refresh_soon() -> None:
    REDRAW["soon"]()


def run_task(coro) -> asyncio.Future:
    """Run an action; a failure is shown where the person is looking, and counted (tests wait on the
    counters instead of sleeping)."""

    async def guarded():
        try:
            await coro
            js.MP.actionsDone = (js.MP.actionsDone or 0) + 1
        except Exception as exc:  # shown, never swallowed
            js.MP.actionsFailed = (js.MP.actionsFailed or 0) + 1
            js.console.error(f"playground action failed: {exc!r}")
            box = el("page-error")
            box.textContent = f"The page failed: {exc!r}. Reload to go on; what was saved is kept."
            box.removeAttribute("hidden")

    return asyncio.ensure_future(guarded())
