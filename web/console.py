"""The curl tab: a terminal over curl.Shell (the shell subset), the README's quickstart ready to click.

Every token an answer carries (an owner token, a reader token) goes into the page's keyring, so what the
console made is also yours in the other tabs (one engine, one view). When a quickstart block collides with
what is already there (the monitor exists, the subscriber is taken) and the page holds the token it needs,
the console says so and offers to go on with it in one click."""

from __future__ import annotations

import json
import re
from typing import Any

import actions as a
import curl
import js
import model as m
import ui
from pyodide.ffi import create_proxy, to_js
from ui import action, el, esc

CURL: dict[str, Any] = {"history": [], "pos": 0, "shell": None, "examples": []}
README_MP = "http://127.0.0.1:8130/mp/v0"  # the README's $MP: the page rewrites its host to itself
EXTRAS = [
    (
        "An agent asserts src (a person's certainty): refused, and the refusal is kept in the log",
        'curl -sS -X POST "$MP/monitors/ci/observations" -H "Authorization: Bearer $OWNER" \\\n'
        "  -H 'Content-Type: application/json' \\\n"
        '  -d \'{"type": "com.example.ci.run", "subject": "build-412", "actor": "agent:claude", "tier": "src"}\'',
    ),
    (
        "A wrong reader token: 401, however the subscription is named",
        'curl -sS "$MP/subscriptions/$SUB_ID/pull" -H "Authorization: Bearer wrong"',
    ),
    (
        "The whole log through the reader, replayed from seq 1 (read-only)",
        'curl -sS "$MP/subscriptions/$SUB_ID/pull?cursor=1" -H "Authorization: Bearer $READER" | field \'["observations"]\'',
    ),
]


# The README speaks to someone at a terminal beside `mp serve`; here the page is the shell and the server.
FOR_THIS_PAGE = (
    (
        "Then, in another shell, run the blocks below in order",
        "Run the blocks below in order, here: this page is the shell",
    ),
    ("in another shell", "here (this page is the shell)"),
    # nothing to install here: the page is the shell, and field is built in
    ("(they need `curl` and `python3`; ", "("),
)


def code_spans(html_text: str) -> str:
    """The README's `code` spans as <code> (the sentence is escaped HTML already)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html_text)


def for_this_page(why: str) -> str:
    """A quickstart block's sentence as it reads in this console (the README's words, adjusted)."""
    for theirs, ours in FOR_THIS_PAGE:
        why = why.replace(theirs, ours)
    return why


def actor_note(extra: dict[str, Any]) -> str:
    """A publish sent without an actor: one line saying whose word it became, and how to say who saw it."""
    path = extra["url"].split("/mp/v0", 1)[-1].split("?", 1)[0]
    data = extra["data"]
    if (
        extra["method"] != "POST"
        or extra["status"] != 201
        or not re.fullmatch(r"/monitors/[^/]+/observations", path)
    ):
        return ""
    if (
        "actor" in request_json(extra)
        or not isinstance(data, dict)
        or not isinstance(data.get("observation"), dict)
    ):
        return ""
    obs = data["observation"]
    origin = str(obs.get("origin") or "")
    article = "an" if origin[:1] in ("a", "e", "i", "o", "u") else "a"
    return (
        f"<div class='note actor-note'># No \"actor\" was sent, so this is the owner's own word: actor "
        f"{esc(obs.get('actor'))}, origin {esc(origin)}, and {article} {esc(origin)}'s word "
        f'is tier {esc(obs.get("tier"))} unless it says more. Send "actor": "probe:ci" to say a probe '
        "measured it.</div>"
    )


def term_print(html_text: str) -> None:
    el("term-out").insertAdjacentHTML("beforeend", html_text)
    term = el("term")
    term.scrollTop = term.scrollHeight


def remember(body: Any) -> list[str]:
    """A single, unpiped curl's answer: keep its tokens under the quickstart's own variable names."""
    if not isinstance(body, dict):
        return []
    env = CURL["shell"].env
    saved = []
    if body.get("owner_token"):
        env["OWNER"] = body["owner_token"]
        saved.append("OWNER")
    sub = body.get("subscription")
    if isinstance(sub, dict) and sub.get("id") and body.get("token"):
        env["SUB_ID"] = sub["id"]
        env["READER"] = body["token"]
        saved += ["SUB_ID", "READER"]
    if isinstance(body.get("next"), int) and "observations" in body:
        env["NEXT"] = str(body["next"])
        saved.append("NEXT")
    return saved


def keep_tokens(data: Any) -> bool:
    """Any answer's tokens, piped or not, into the page's keyring: the UI can then act with them."""
    if not isinstance(data, dict):
        return False
    mon = data.get("monitor")
    if data.get("owner_token") and isinstance(mon, dict) and mon.get("id"):
        m.S.owners[mon["id"]] = data["owner_token"]
        return True
    sub = data.get("subscription")
    if isinstance(sub, dict) and sub.get("id") and data.get("token"):
        rd = m.S.readers.get(sub["id"])
        if rd is None:
            m.S.readers[sub["id"]] = m.Reader(
                sub["id"], sub["subscriber"], data["token"], sub["monitor"], made_by="curl"
            )
        else:
            rd.token = data["token"]
        return True
    return False


def request_json(extra: dict[str, Any]) -> dict[str, Any]:
    try:
        body = json.loads(extra.get("body") or "null")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def way_on(extra: dict[str, Any]) -> str:
    """When a quickstart block collides with what is there, the way on (one click), or what to do."""
    status, data = extra["status"], extra["data"]
    path = extra["url"].split("/mp/v0", 1)[-1].split("?", 1)[0]
    sent = request_json(extra)
    code = data.get("code") if isinstance(data, dict) else None
    if extra["method"] == "POST" and path == "/monitors" and code == "DUPLICATE":
        mid = str(sent.get("id", ""))
        if mid in m.S.owners:
            return (
                f"<div class='note offer'># The monitor {esc(mid)} already exists in this page's engine, and this "
                f"page holds its owner token. <button data-act='curl-adopt-owner' data-monitor='{esc(mid)}'>"
                f"Go on with the existing {esc(mid)}: set $OWNER</button> then run the next block.</div>"
            )
        return (
            f"<div class='note offer'># {esc(mid)} already exists, made by another door, and this page does not "
            "hold its owner token: change the id in the command, or Reset (top right) to start over.</div>"
        )
    if extra["method"] == "POST" and path == "/subscriptions" and status == 401:
        who = (str(sent.get("monitor", "")), str(sent.get("subscriber", "")))
        for rd in m.S.readers.values():
            if rd.monitor == who[0] and who[1] in (rd.name, f"agent:{rd.name}"):
                return (
                    f"<div class='note offer'># {esc(who[1])} is already subscribed to {esc(who[0])}, and this "
                    f"page holds its reader token. <button data-act='curl-adopt-reader' data-sub='{esc(rd.sub_id)}'>"
                    "Go on with it: set $SUB_ID and $READER</button> then run the next block.</div>"
                )
        return (
            f"<div class='note offer'># {esc(who[1])} is already subscribed and this page does not hold its token: "
            "use another subscriber name, or Reset (top right).</div>"
        )
    return ""


def term_emit(kind: str, text: str, extra: dict[str, Any]) -> None:
    if kind == "cmd":
        term_print(f"<div class='cmd'>$ {esc(text)}</div>")
    elif kind == "out":
        term_print(f"<div class='out'>{esc(text)}</div>")
    elif kind == "note":
        term_print(f"<div class='note'># {esc(text.lstrip('# '))}</div>")
    elif kind == "error":
        term_print(f"<div class='st-err' data-error='1'>✗ {esc(text)}</div>")
        ui.announce(f"error: {text}")
    elif kind == "http":
        status, data = extra["status"], extra["data"]
        ok = 200 <= status < 300
        code = f" {data.get('code')}" if isinstance(data, dict) and data.get("code") and not ok else ""
        where = "" if extra["shown"] else " · output piped or captured"
        pretty = json.dumps(data, indent=2, ensure_ascii=False) if data is not None else text
        ui.announce(f"HTTP {status}{code}, {extra['method']} {extra['url'].split('/mp/v0', 1)[-1]}")
        saved = remember(data) if extra["remember"] else []
        kept = keep_tokens(data)
        note = f"<div class='note'># saved ${', $'.join(saved)}</div>" if saved else ""
        if kept and not saved:
            note = "<div class='note'># its token is kept in this page: the Playground can act with it</div>"
        term_print(
            f"<div class='{'st-ok' if ok else 'st-err'}' data-status='{status}'>{'✓' if ok else '✗'} HTTP "
            f"{status}{esc(code)} <span class='note'>{esc(extra['method'])} "
            f"{esc(extra['url'].split('/mp/v0', 1)[-1])}{where}</span></div>"
            + (
                f"<div class='json'>{esc(pretty)}</div>"
                if extra["shown"]
                else f"<div class='json piped' role='region' tabindex='0' aria-label='captured answer'>{esc(pretty)}</div>"
            )
            + note
            + actor_note(extra)
            + ("" if ok else way_on(extra))
        )


async def page_fetch(call) -> tuple[int, str]:
    opts = {"method": call.method, "headers": call.headers}
    if call.body is not None:
        opts["body"] = call.body
    resp = await js.fetch(call.url, to_js(opts, dict_converter=js.Object.fromEntries))
    return int(resp.status), str(await resp.text())


async def run(command: str) -> None:
    if not command.strip():
        return
    bind_session()
    CURL["history"].append(command.strip())
    del CURL["history"][: -m.CURL_HISTORY_KEPT]
    CURL["pos"] = len(CURL["history"])
    await CURL["shell"].run(command)
    await a.save()
    ui.refresh_soon()


def take_prompt() -> str:
    box = el("curl-input")
    cmd = box.value
    box.value = ""
    box.rows = 1
    show_hint("")
    return cmd


def show_hint(text: str) -> None:
    """The line under the prompt that says why Enter added a line instead of running (empty: hidden)."""
    hint = el("curl-hint")
    hint.textContent = text
    hint.hidden = not text


def on_input(_evt) -> None:
    """A shown hint goes once what was typed can run (the quote was closed), not while the line after a backslash
    is still empty (the continuation's own newline makes the text whole)."""
    text = el("curl-input").value
    if not el("curl-hint").hidden and curl.awaiting(text) is None and not curl.continued(text):
        show_hint("")


@action("curl-run", exclusive=False)
async def curl_run(_el) -> None:
    await run(take_prompt())


@action("curl-example", exclusive=False)
async def curl_example(target) -> None:
    box = el("curl-input")
    box.value = CURL["examples"][int(target.getAttribute("data-i"))][1]
    box.rows = min(12, box.value.count("\n") + 1)
    box.focus()


@action("curl-adopt-owner", exclusive=False)
async def adopt_owner(target) -> None:
    mid = target.getAttribute("data-monitor")
    bind_session()
    CURL["shell"].env["OWNER"] = m.S.owners[mid]
    await a.save()
    target.disabled = True
    term_print(
        f"<div class='note'># $OWNER is {esc(mid)}'s owner token now: go on with the next block.</div>"
    )


@action("curl-adopt-reader", exclusive=False)
async def adopt_reader(target) -> None:
    rd = m.S.readers[target.getAttribute("data-sub")]
    bind_session()
    CURL["shell"].env["SUB_ID"] = rd.sub_id
    CURL["shell"].env["READER"] = rd.token
    await a.save()
    target.disabled = True
    term_print(
        f"<div class='note'># $SUB_ID and $READER are {esc(rd.name)}'s now: go on with the next block.</div>"
    )


def bind_session() -> None:
    """The console's variables and history are the session's (saved with it, restored after a reload);
    bound again before each command, since a reload of the session or Reset makes a new one."""
    m.S.curl_env.setdefault("MP", README_MP)
    CURL["shell"].env = m.S.curl_env
    if CURL.get("history") is not m.S.curl_history:
        CURL["history"] = m.S.curl_history
        CURL["pos"] = len(m.S.curl_history)


async def setup() -> None:
    CURL["shell"] = curl.Shell(str(js.location.origin), page_fetch, term_emit, {})
    bind_session()
    try:
        resp = await js.fetch("./quickstart.json")
        quick = [(for_this_page(b["why"]), b["code"]) for b in json.loads(str(await resp.text()))]
    except Exception as exc:  # shown, never hidden: the extras still work
        quick = []
        js.console.warn(f"quickstart.json: {exc!r}")
    CURL["examples"] = quick + EXTRAS
    items = []
    for i, (why, cmd) in enumerate(CURL["examples"]):
        if i == len(quick):
            items.append("<li class='sub'><h3>More</h3></li>")
        group = "quickstart" if i < len(quick) else "extra"
        items.append(
            f"<li data-group='{group}'><div class='why'>{code_spans(esc(why))}</div>"
            f"<button data-act='curl-example' data-i='{i}'>{esc(cmd)}</button></li>"
        )
    el("curl-examples").innerHTML = "".join(items)
    term_print(
        "<div class='note'># This page's engine answers /mp/v0 through the service worker; "
        "http://127.0.0.1:8130 and http://localhost:8130 mean this page. Paste the README's quickstart "
        "(or click or tap a block), Enter or Run runs it; Shift+Enter adds a line (on a phone's keyboard, "
        "a tapped block keeps its lines: edit them and tap Run).</div>"
    )
    el("curl-input").addEventListener("keydown", create_proxy(on_key))
    el("curl-input").addEventListener("input", create_proxy(on_input))


def on_key(evt) -> None:
    box = el("curl-input")
    why = curl.awaiting(box.value) if evt.key == "Enter" else None
    if evt.key == "Enter" and not evt.shiftKey and why is None:
        evt.preventDefault()
        ui.run_task(run(take_prompt()))
    elif evt.key == "Enter":
        box.rows = min(12, box.value.count("\n") + 2)  # a continuation: the newline goes in
        if not evt.shiftKey:  # Enter that did not run: say why, or it looks like nothing happened
            show_hint(f"# Not run yet: {why}. Enter runs it once it is whole; Run runs it as it is.")
    elif evt.key == "Escape" and box.value:
        evt.preventDefault()
        take_prompt()
    elif evt.key == "ArrowUp" and "\n" not in box.value:
        if CURL["history"]:
            evt.preventDefault()
            CURL["pos"] = max(0, CURL["pos"] - 1)
            box.value = CURL["history"][CURL["pos"]]
    elif evt.key == "ArrowDown" and "\n" not in box.value and CURL["history"]:
        evt.preventDefault()
        CURL["pos"] = min(len(CURL["history"]), CURL["pos"] + 1)
        box.value = CURL["history"][CURL["pos"]] if CURL["pos"] < len(CURL["history"]) else ""
