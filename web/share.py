"""Share and restore, in the Playground tab (Issue 14, item 3). No server involved: everything is this page.

- Export: the monitor on screen as CloudEvents JSON Lines (EngineHost.export_log), downloaded as
  `<monitor>-<UTC time>.jsonl` through a Blob and an <a download>.
- Import: a .jsonl file (or text pasted, for phones) checked line by line by the engine's own rules
  (importing.LogCheck, a slice at a time: a progress bar, the page free to paint and to take Cancel between
  slices); a line the schema refuses is worded by jsonschema against the project's schema. Any refused line
  is listed (line number, reason) and nothing is imported. Else what was checked is written, in one
  transaction, as a NEW monitor (default id `<id>-import`), its owner token shown once, and put on screen.
- Share link: the Playground's buttons are recorded, per monitor, as a small scenario (the steps and the
  form values they sent, a publish's data included; never a token, never the log itself). "Copy share link" puts
  `<page>#scenario=<base64url of compact JSON>` on the clipboard. Opening such a link says what it will do
  and offers Replay, which runs the same steps against this page's engine under a fresh monitor id.
  A fragment that is not base64url, not JSON, names an unknown step or is too long is refused, plainly,
  and nothing runs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import time
from collections.abc import Callable
from typing import Any

import actions
import js
import model as m
import ui
from door import ENGINE
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.rules import importing
from monitor_protocol.core.vocab import MONITOR_ID_PATTERN
from monitor_protocol.doors.browser import Reply
from pyodide.ffi import to_js
from ui import action, el, esc, note

FRAGMENT_KEY = "scenario="
MAX_FRAGMENT_CHARS = 4096  # the base64url text after #scenario=; a typical link is far shorter
MAX_STEPS = 60
MAX_STRING = 256
READER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")  # fullmatch: `$` would let a final newline through
WORKERS = ("worker-a", "worker-b")
LEASE_ACTS = ("claim", "complete", "release", "reject")
LIFECYCLE = ("pause", "resume", "retire")
READER_STEPS = ("pull", "process", "ack", "crash", "restart")
PUBLISH_KEYS = (*actions.FORM_KEYS, "data")
DEFINE_KEYS = ("id", "name", "horizon", "owner", "visibility", "capabilities", "types")
# What was recorded in this tab, per monitor (kept in sessionStorage: a reload keeps it, a new tab starts empty).
RECORDED: dict[str, list[list[Any]]] = {}
OPENED: dict[str, Any] = {"steps": None}


class BadScenario(ValueError):
    """A fragment that cannot be replayed; the message says why, in one sentence."""


# ---------------------------------------------------------------------------------------- the scenario codec
def encode(steps: list[list[Any]]) -> str:
    text = json.dumps({"v": 1, "steps": steps}, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(fragment: str) -> list[list[Any]]:
    """The steps of a `#scenario=...` fragment, checked; BadScenario says what is wrong."""
    if len(fragment) > MAX_FRAGMENT_CHARS:
        raise BadScenario(f"The scenario is {len(fragment)} characters long; a share link holds at most "
                          f"{MAX_FRAGMENT_CHARS}.")  # fmt: skip
    if not re.fullmatch(r"[A-Za-z0-9_-]*", fragment) or len(fragment) % 4 == 1:
        raise BadScenario(
            "The scenario is not base64url text (A-Z a-z 0-9 - _): the link was cut or changed."
        )
    try:
        raw = base64.urlsafe_b64decode(fragment + "=" * (-len(fragment) % 4))
        doc_ = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError):  # nested past the parser too
        raise BadScenario(
            "The scenario decodes to something that is not JSON: the link was cut or changed."
        ) from None
    if not isinstance(doc_, dict) or doc_.get("v") != 1 or not isinstance(doc_.get("steps"), list):
        raise BadScenario('The scenario is JSON but not a playground scenario ({"v": 1, "steps": [...]}).')
    steps = doc_["steps"]
    if not steps:
        raise BadScenario("The scenario has no steps.")
    if len(steps) > MAX_STEPS:
        raise BadScenario(f"The scenario has {len(steps)} steps; at most {MAX_STEPS} are replayed.")
    for i, step in enumerate(steps, 1):
        problem = _step_problem(step)
        if problem:
            raise BadScenario(f"Step {i} cannot be replayed: {problem}.")
    if steps[0][0] not in ("ci", "mon"):
        raise BadScenario("The scenario must begin by creating its monitor (its first step).")
    return steps


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_STRING


def _step_problem(step: Any) -> str | None:
    if not isinstance(step, list) or not step or not isinstance(step[0], str):
        return "a step is a list beginning with its name"
    kind, args = step[0], step[1:]
    if kind == "ci":
        return None if not args else "ci takes nothing"
    if kind == "mon":
        body = args[0] if len(args) == 1 else None
        if not isinstance(body, dict) or set(body) - set(DEFINE_KEYS):
            return f"mon takes one object with {', '.join(DEFINE_KEYS)}"
        if not MONITOR_ID_PATTERN.match(str(body.get("id", ""))):
            return "mon needs an id of 2-64 letters, digits, '_', '.' or '-'"
        for k, v in body.items():
            if k in ("capabilities", "types"):
                if not isinstance(v, list) or len(v) > 16 or not all(_text(x) for x in v):
                    return f"mon's {k} must be a short list of names"
            elif not _text(v):
                return f"mon's {k} must be a short string"
        return None
    if kind == "pub":
        body = args[0] if len(args) == 1 else None
        if not isinstance(body, dict) or set(body) - set(PUBLISH_KEYS):
            return f"pub takes one object with {', '.join(PUBLISH_KEYS)}"
        if not all(_text(v) for k, v in body.items() if k != "data"):
            return "pub's fields must be short strings"
        if "data" in body and len(json.dumps(body["data"])) > 1024:
            return "pub's data is over 1 KiB"
        return None
    if kind == "sub" and len(args) == 2:  # a reader with a filter: only the monitor's types
        flt = args[1]
        if (not isinstance(flt, dict) or set(flt) != {"types"} or not isinstance(flt["types"], list)
                or len(flt["types"]) > 16 or not all(_text(t) for t in flt["types"])):  # fmt: skip
            return 'sub\'s filter is {"types": [a short list of type names]}'
        args = args[:1]
    if kind == "sub" or kind in READER_STEPS:
        if len(args) != 1 or not isinstance(args[0], str) or not READER_NAME.fullmatch(args[0]):
            return f"{kind} takes one reader name such as reader-a"
        return None
    if kind == "lease":
        if (len(args) != 4 or args[0] not in WORKERS or args[1] not in LEASE_ACTS or not _text(args[2])
                or not args[2] or not isinstance(args[3], int) or isinstance(args[3], bool)
                or not 1 <= args[3] <= 3600):  # fmt: skip
            return (
                "lease takes a worker (worker-a, worker-b), claim|complete|release|reject, a subject, seconds"
            )
        return None
    if kind == "deadletter":
        if (
            len(args) != 2
            or not _text(args[0])
            or not args[0]
            or not isinstance(args[1], int)
            or not 1 <= args[1] <= 3600
        ):
            return "deadletter takes a subject and seconds"
        return None
    if kind in LIFECYCLE:
        return None if len(args) == 1 and _text(args[0]) else f"{kind} takes one reason"
    return f"{kind[:40]!r} is not a playground step"


def describe(steps: list[list[Any]]) -> str:
    """One line a person reads before replaying: "5 steps: create monitor ci, publish 2, subscribe ..."."""
    parts: list[str] = []
    run = 0
    for step in [*steps, ["end"]]:
        if step[0] == "pub":
            run += 1
            continue
        if run:
            parts.append(f"publish {run}")
            run = 0
        kind = step[0]
        if kind == "ci":
            parts.append("create monitor ci")
        elif kind == "mon":
            parts.append(f"create monitor {step[1]['id']}")
        elif kind == "sub":
            parts.append(f"subscribe {step[1]}")
        elif kind in READER_STEPS:
            parts.append(f"{kind} {step[1]}")
        elif kind == "lease":
            parts.append(f"{step[1]} {step[2]} {step[3]}")
        elif kind == "deadletter":
            parts.append(f"reject {step[1]} until dead-lettered")
        elif kind in LIFECYCLE:
            parts.append(kind)
    n = len(steps)
    return f"{n} step{'s' if n != 1 else ''}: {', '.join(parts)}"


# ---------------------------------------------------------------------------------------- recording
def _store_key() -> str:
    return "mp-share-steps" + (f"--{js.MP.ns}" if str(js.MP.ns or "") else "")


def _load() -> None:
    try:
        saved = js.sessionStorage.getItem(_store_key())
        data = json.loads(str(saved)) if saved else {}
        if isinstance(data, dict):
            RECORDED.update({k: v for k, v in data.items() if isinstance(v, list)})
    except Exception:  # storage refused (private mode): recording stays in memory only
        pass


def _keep() -> None:
    try:
        js.sessionStorage.setItem(_store_key(), json.dumps(RECORDED, separators=(",", ":")))
    except Exception:
        pass


def _reader_name(target) -> str | None:
    rd = m.S.readers.get(str(target.getAttribute("data-sub") or ""))
    return rd.name if rd is not None else None


def capture(name: str, target) -> dict[str, Any] | None:
    """What a Playground button is about to do, as a scenario step (read before it runs: the form values it
    sends, the reader it acts on). None: not a step (a preset, a tab, the Story's own buttons)."""
    step: list[Any] | None = None
    if name == "define-ci":
        step = ["ci"]
    elif name == "define-form":
        form = el("define-form")
        body: dict[str, Any] = {
            "capabilities": [c.value for c in form.querySelectorAll("input[name=cap]") if c.checked],
            "types": [t.strip() for t in form.elements.namedItem("types").value.split(",") if t.strip()],
        }
        for key in ("id", "name", "horizon", "owner", "visibility"):
            v = form.elements.namedItem(key).value.strip()
            if v:
                body[key] = v
        step = ["mon", body]
    elif name == "publish":
        try:
            step = ["pub", actions.read_publish_form()]
        except actions.FormProblem:
            step = None  # nothing is sent: nothing to record (the action says why)
    elif name in LIFECYCLE:
        step = [name, actions.life_reason(name)]
    elif name == "add-reader":
        step = ["sub", None, actions.reader_filter()]  # the name the action picks: read after it ran
    elif name.startswith("r-") and name[2:] in READER_STEPS:
        reader = _reader_name(target)
        step = [name[2:], reader] if reader else None
    elif name.startswith("w-") and name[2:] in LEASE_ACTS:
        subject, seconds = actions.lease_subject(), actions.lease_seconds()
        ok = subject and seconds is not None  # else nothing is sent: nothing to record (the action says why)
        step = ["lease", str(target.getAttribute("data-worker")), name[2:], subject, seconds] if ok else None
    elif name == "lease-deadletter":
        subject, seconds = actions.lease_subject(), actions.lease_seconds()
        step = ["deadletter", subject, seconds] if subject and seconds is not None else None
    if step is None:
        return None
    return {"step": step, "monitor": m.S.monitor, "readers": set(m.S.readers)}


def record(captured: dict[str, Any] | None, result: Any) -> None:
    """After the button ran: append its step to the scenario of the monitor it acted on. A create starts
    the new monitor's scenario, only when it made one (201)."""
    if captured is None or ENGINE.remote is not None:  # a server's history is not this page's to share
        return
    step = captured["step"]
    if step[0] in ("ci", "mon"):
        if not isinstance(result, Reply) or result.status != 201:
            return  # nothing new was created (a duplicate id, a bad form): no scenario starts
        mid = result.body["monitor"]["id"]
        if step[0] == "mon":
            step = ["mon", {**step[1], "id": mid}]
        RECORDED[mid] = [step]
    else:
        mon = captured["monitor"]
        if mon is None or mon not in RECORDED:
            return  # a monitor this tab did not create: its history is not ours to describe
        if step[0] == "sub":
            new = [m.S.readers[k] for k in set(m.S.readers) - captured["readers"]]
            if not new:
                return
            step = ["sub", new[0].name] + ([step[2]] if step[2] else [])
        if _step_problem(step) is None:
            RECORDED[mon].append(step)
    _keep()
    render()


def not_here(what: str) -> str | None:
    """Why this tab cannot export, import or replay (they act on the page's own engine, in its owner tab),
    or None when it can."""
    if ENGINE.remote is not None:
        return f"{what} works on this page's own engine: disconnect from the server first (Server panel)."
    if ENGINE.mode != "owner" or ENGINE.host is None:
        return f"{what} from the tab that owns the engine (this one follows another tab)."
    return None


# ---------------------------------------------------------------------------------------- replay
async def replay(steps: list[list[Any]]) -> list[tuple[str, Reply]]:
    """Run the steps against this page's engine, as the buttons would, under a fresh monitor id."""
    done: list[tuple[str, Reply]] = []
    first = steps[0]
    if first[0] == "ci":
        body = {"id": actions.free_id("ci"), **actions.CI_MONITOR}
    else:
        body = dict(first[1])
        body["id"] = actions.free_id(body["id"])
    r = await actions.define(body, answer="share-answer")
    done.append((f"create {body['id']}", r))
    if r.status != 201:
        return done
    mon = body["id"]
    for step in steps[1:]:
        kind = step[0]
        if kind == "pub":
            r = await actions.publish(step[1])
        elif kind == "sub":
            r = await actions.add_reader(step[1], step[2] if len(step) > 2 else None)
        elif kind in READER_STEPS:
            rd = m.S.reader_named(step[1], mon)
            if rd is None:
                r = Reply(
                    404, {"code": "NOT_FOUND", "error": f"no reader {step[1]} in this scenario", "done": []}
                )
            elif kind == "pull":
                r = await actions.pull(rd)
            elif kind == "process":
                r = await actions.process_and_save(rd)
            elif kind == "ack":
                r = await actions.ack(rd) if rd.next is not None else Reply(200, {"note": "nothing held"})
            elif kind == "crash":
                r = await actions.crash(rd)
            else:
                r = await actions.restart(rd)
        elif kind == "lease":
            r = await actions.lease(step[1], step[2], step[3], step[4])
        elif kind == "deadletter":
            r = await actions.dead_letter(step[1], step[2])
        else:
            r = await actions.configure(kind, step[1])
        done.append((" ".join(str(x) for x in step if not isinstance(x, dict)), r))
    RECORDED[mon] = [["mon", body] if first[0] == "mon" else first, *steps[1:]]
    _keep()
    return done


@action("share-replay", answer="share-answer")
async def replay_btn(_el) -> Reply:
    steps = OPENED["steps"]
    if not steps:
        note("share-answer", "No scenario to replay: open a share link first.", ok=False)
        return Reply(400, {})
    if (why := not_here("Replay")) is not None:
        note("share-answer", why, ok=False)
        _banner_says(f"{why} Switch to that tab and open the link there.", ok=False, why="elsewhere")
        return Reply(409, {})
    done = await replay(steps)
    failed = [t for t, r in done if r.status >= 500]
    mon = m.S.monitor
    say = (f"Replayed {len(done)} step(s) into monitor {mon}: the page is in the situation the link describes."
           if not failed else f"Replayed with {len(failed)} step(s) failing: {', '.join(failed)}.")  # fmt: skip
    ui.show("share-answer", done[-3:], say)
    el("share-open").setAttribute("data-replayed", mon or "")
    # Said where it was asked (on a phone the answer panel is screens below), and once: a second tap would
    # replay a second copy.
    _banner_says(f"{say} Its log is below.", ok=not failed)
    button = el("btn-share-replay")
    if button is not None:
        button.setAttribute("hidden", "")
    await ui.refresh()
    _show_log()
    return done[-1][1]


def took_over() -> None:
    """This tab now owns the engine (the other one closed): a Replay refused here as a follower's is
    possible now, so its refusal is replaced rather than left to send the reader to a tab that is gone."""
    said = js.document.querySelector("#share-open .share-said[data-why='elsewhere']")
    if said and OPENED["steps"] and not_here("Replay") is None:
        _banner_says("The other tab closed: this tab owns the engine now, so Replay works here.", ok=True)


def _show_log() -> None:
    """Bring the replayed log into view when it is out of it: on a phone it is screens below the link's
    box, where the banner said "below" and the page stayed put."""
    title = js.document.querySelector(".log-panel .log-title")
    if not title:  # the DOM's null arrives as a falsy JsNull
        return
    top = title.getBoundingClientRect().top
    if top < 0 or top > js.window.innerHeight * 0.6:
        title.scrollIntoView(ui.js_options(block="start"))


def _banner_says(text: str, *, ok: bool, why: str = "") -> None:
    """The outcome of Replay in the shared scenario's own box, where the button was pressed (`why` marks a
    refusal that a later change takes back: "elsewhere", refused in a tab that did not own the engine)."""
    box = el("share-open")
    said = box.querySelector(".share-said")
    if not said:  # the DOM's null arrives as a falsy JsNull
        said = js.document.createElement("p")
        box.appendChild(said)
    said.className = "share-said " + ("ok" if ok else "err")
    said.setAttribute("data-why", why)
    said.setAttribute("role", "status")
    said.textContent = text  # text, never markup: a monitor id or a reason is shown as it is


# ---------------------------------------------------------------------------------------- share link
def link_for(monitor: str | None) -> str | None:
    steps = RECORDED.get(monitor or "")
    if not steps:
        return None
    base = str(js.location.href).split("#", 1)[0]
    return f"{base}#{FRAGMENT_KEY}{encode(steps)}"


@action("share-link", answer="share-answer", exclusive=False)
async def copy_link(_el) -> None:
    link = link_for(m.S.monitor)
    out = el("share-link-out")
    if link is None:
        out.value = ""
        # The Log may have moved to another monitor (the race shows its own): name the one on screen, and
        # the ones that have a link, so that "nothing recorded" is not read as the steps being lost.
        others = sorted(k for k, v in RECORDED.items() if v and k != (m.S.monitor or ""))
        where = f" ({m.S.monitor}, the monitor the Log shows)" if m.S.monitor else ""
        elsewhere = (
            f" Recorded: {', '.join(others)}: pick it in the Log's monitor list, then copy." if others else ""
        )
        note("share-answer", f"Nothing recorded for this monitor{where} in this tab: create a monitor here with "
             f"the Playground's buttons, act on it, then copy its link.{elsewhere}", ok=False)  # fmt: skip
        return
    out.value = link
    out.removeAttribute("hidden")
    try:
        await js.navigator.clipboard.writeText(link)
        copied = "copied to the clipboard"
    except Exception:  # no clipboard permission (an insecure context, a test browser): it is shown instead
        copied = "shown below (the clipboard was not available)"
    steps = RECORDED[m.S.monitor]
    note("share-answer", f"Share link {copied}: {describe(steps)}. {len(link)} characters; it holds the "
         "steps (with what each publish sends), never a token or the log itself.")  # fmt: skip


def opened_fragment() -> str | None:
    frag = str(js.location.hash or "")
    if not frag.startswith("#" + FRAGMENT_KEY):
        return None
    return frag[len(FRAGMENT_KEY) + 1 :]


def setup(opened: Callable[[], None]) -> bool:
    """At start: the recorded scenarios of this tab, and a `#scenario=` link opened. True when one was
    (the page then shows the Playground, where its Replay button is). A link pasted into this tab later
    (the fragment changes, the page does not reload) is opened the same way, and `opened()` shows it."""
    _load()
    el("share-file").addEventListener("change", _proxy(lambda e: ui.run_task(_file_chosen())))
    js.window.addEventListener("hashchange", _proxy(lambda e: opened() if open_fragment() else None))
    render()
    return open_fragment()


def open_fragment() -> bool:
    """Show the scenario of the page's `#scenario=` fragment (or why it cannot be replayed); False when
    the fragment is no scenario."""
    fragment = opened_fragment()
    if fragment is None:
        return False
    box = el("share-open")
    box.removeAttribute("data-replayed")
    box.removeAttribute("hidden")
    try:
        steps = decode(fragment)
    except BadScenario as why:
        OPENED["steps"] = None
        box.className = "share-open err"
        box.setAttribute("data-state", "refused")
        ui.put(box, f"<p><b>This share link cannot be replayed.</b> {esc(why)} Nothing was run.</p>")
        return True
    OPENED["steps"] = steps
    box.className = "share-open"
    box.setAttribute("data-state", "ready")
    ui.put(
        box,
        f"<p><b>A shared scenario</b>: <span id='share-describe'>{esc(describe(steps))}</span>.</p>"
        "<p class='small muted'>Replay runs these steps against this page's engine, in a monitor of its "
        "own (a fresh id: nothing of yours is touched).</p>"
        "<button data-act='share-replay' id='btn-share-replay' class='primary'>Replay</button>",
    )
    return True


def _proxy(fn):
    from pyodide.ffi import create_proxy

    return create_proxy(fn)


def render() -> None:
    """The share panel's line about the monitor on screen: how many steps a link would hold."""
    info = el("share-recorded")
    if info is None:
        return
    steps = RECORDED.get(m.S.monitor or "")
    info.textContent = (
        f"Recorded for {m.S.monitor}: {describe(steps)}." if steps else
        "No steps recorded for the monitor on screen: links are made from what you do here."
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- export
@action("share-export", answer="share-answer")
async def export_btn(_el) -> Reply:
    if (why := not_here("Export")) is not None:
        note("share-answer", why, ok=False)
        return Reply(409, {})
    if m.S.monitor is None:
        note("share-answer", "No monitor on screen to export.", ok=False)
        return Reply(404, {})
    r = await ENGINE.host.export_log(m.S.monitor)
    if not r.ok:
        ui.show_one("share-answer", "export", r)
        return r
    name, text = r.body["name"], r.body["text"]
    blob = js.Blob.new(
        to_js([text]), to_js({"type": "application/x-ndjson"}, dict_converter=js.Object.fromEntries)
    )
    url = js.URL.createObjectURL(blob)
    link = js.document.createElement("a")
    link.href = url
    link.download = name
    link.style.display = "none"
    js.document.body.appendChild(link)
    link.click()
    link.remove()
    js.setTimeout(_proxy(lambda: js.URL.revokeObjectURL(url)), 10_000)
    note("share-answer", f"Downloaded {name}: {r.body['lines']} observations, one CloudEvent per line.")
    el("share-answer").setAttribute("data-file", name)
    return r


# ---------------------------------------------------------------------------------------- import
# An import of up to 8 MiB is checked a slice at a time (importing.LogCheck): each slice for about this
# long, then the page paints the progress and takes clicks (Cancel) before the next one.
SLICE_SECONDS = 0.05
IMPORT: dict[str, Any] = {"cancel": False}
SCHEMA: dict[str, Any] = {"validator": None}


async def _validator():
    """jsonschema's validator of the project's observation schema, loaded on first use (as Conformance)."""
    if SCHEMA["validator"] is None:
        import pyodide_js

        await pyodide_js.loadPackage(to_js(["jsonschema"]))
        try:
            from monitor_protocol.core import schemas
        except ImportError:
            return None
        try:
            SCHEMA["validator"] = schemas.validator("observation")
        except ImportError:  # jsonschema could not be loaded from this site: the engine's rules still apply
            return None
    return SCHEMA["validator"]


def schema_refusal(line: str, validator) -> str | None:
    """Why jsonschema refuses one line (a line that is not a JSON object is the engine check's to name)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return None
    e = errors[0]
    path = "/".join(str(p) for p in e.absolute_path) or "<root>"
    return f"jsonschema (schemas/observation.json): {path}: {e.message[:200]}"


async def _file_chosen() -> None:
    files = el("share-file").files
    if files.length:
        el("share-paste").value = ""
        note("share-answer", f"{files.item(0).name} chosen: press Import to check every line and import it.")


async def _import_text() -> tuple[str, str] | None:
    files = el("share-file").files
    if files.length:
        f = files.item(0)
        return str(f.name), str(await f.text())
    pasted = str(el("share-paste").value)
    if pasted.strip():
        return "the pasted text", pasted
    return None


def _show_refused(where: str, refused: list[dict[str, Any]], total: int) -> None:
    box = el("share-answer")
    box.className = "answer err"
    items = "".join(
        f"<li data-line='{int(x['line'])}'><b>line {int(x['line'])}</b>: {esc(x['reason'])}</li>"
        for x in refused
    )
    more = f"<p class='small'>… and {total - len(refused)} more.</p>" if total > len(refused) else ""
    box.innerHTML = (
        f"<p class='say'>{total} line(s) of {esc(where)} refused: nothing was imported. Fix or remove them and "
        f"import again.</p><ol class='refused'>{items}</ol>{more}"
    )
    box.setAttribute("data-status", "400")
    box.setAttribute("data-code", "INVALID")
    box.setAttribute("data-refused", ",".join(str(int(x["line"])) for x in refused))


def _progress(done: int, total: int, text: str) -> None:
    """The import's progress line (shown while it runs, with Cancel), or hidden when `total` is 0."""
    box = el("share-progress")
    if not total:
        box.setAttribute("hidden", "")
        return
    box.removeAttribute("hidden")
    bar = el("share-progress-bar")
    bar.max = total
    bar.value = done
    el("share-progress-text").textContent = text


async def _check_in_slices(items: list[tuple[int, str]]) -> importing.Checked | None:
    """The engine's rules over every line, a slice at a time, the progress shown and the page free between
    slices; None when Cancel was pressed (nothing was written)."""
    check = importing.LogCheck()
    total, i, step = len(items), 0, 100
    while i < total:
        began = time.monotonic()
        while i < total and time.monotonic() - began < SLICE_SECONDS:
            check.feed(items[i : i + step])
            i += step
        _progress(min(i, total), total, f"Checking line {min(i, total)} of {total}…")
        await asyncio.sleep(0)  # the page paints and takes clicks here
        if IMPORT["cancel"]:
            return None
    return check.result()


@action("share-import-cancel", answer=None, exclusive=False)
async def import_cancel(_el) -> None:
    IMPORT["cancel"] = True


@action("share-import", answer="share-answer")
async def import_btn(_el) -> Reply:
    if (why := not_here("Import")) is not None:
        note("share-answer", why, ok=False)
        return Reply(409, {})
    got = await _import_text()
    if got is None:
        note("share-answer", "Choose a .jsonl file (or paste its lines) first.", ok=False)
        return Reply(400, {})
    where, text = got
    try:
        items = importing.split_lines(text)  # the size bounds first: TOO_LARGE before any line is read
    except ProtocolError as err:
        r = Reply(err.status, err.body())
        ui.show_one("share-answer", f"check {where}", r)
        return r
    IMPORT["cancel"] = False
    try:
        checked = await _check_in_slices(items)
        if checked is None:
            note("share-answer", f"Import of {where} cancelled: nothing was imported.", ok=False)
            el("share-answer").setAttribute("data-cancelled", "1")
            return Reply(409, {"code": "UNAVAILABLE", "error": "cancelled"})
        if checked.refused:
            lines = dict(items)
            validator = await _validator() if any(
                x["reason"].startswith("Not a valid observation") for x in checked.refused[:100]
            ) else None  # fmt: skip
            listed = []
            for x in checked.refused[: importing.MAX_REFUSED_LISTED]:
                said = schema_refusal(lines.get(x["line"], ""), validator) if validator else None
                # the engine's own schema check says the same thing: jsonschema's words stand alone
                listed.append({"line": x["line"], "reason": said if said and x["reason"].startswith(
                    "Not a valid observation") else x["reason"]})  # fmt: skip
            _show_refused(where, listed, len(checked.refused))
            return Reply(400, {"code": "INVALID", "refused": listed})
        _progress(len(items), len(items), f"Writing {len(checked.rows)} observations in one transaction…")
        await asyncio.sleep(0)  # paint that before the write, which is one call
        new_id = el("share-new-id").value.strip() or actions.free_id(f"{checked.source_id}-import")
        r = await ENGINE.host.import_log(new_id, checked)
    finally:
        _progress(0, 0, "")
    ENGINE.changed()
    if r.status == 201:
        m.S.owners[new_id] = r.body["owner_token"]
        m.S.shown_token = r.body["owner_token"]
        actions.select(new_id)
        await actions.save()
        say = (f"Imported {r.body['imported']} observations of {r.body['from_monitor']} as {new_id}: the same "
               "seqs and provenance, no readers or leases. Its owner token is shown once, in the box.")  # fmt: skip
        ui.show_one("share-answer", f"import {where}", r, say)
        el("share-file").value = ""
        el("share-new-id").value = ""
    elif isinstance(r.body, dict) and r.body.get("refused"):
        _show_refused(where, r.body["refused"], int(r.body.get("refused_count") or 0))
    else:
        ui.show_one("share-answer", f"import {where}", r)
    await ui.refresh()
    return r
