"""A docs page (docs/*.html, built by tools/mdpages.py): this page's own engine and a Run button per block.

The page names its engine namespace (`<html data-mp-ns="docs-readme">`), so its IndexedDB, its Web Lock and
its view channel are its own: a docs page never touches the playground's log, and two tabs of one docs page
share one engine (one owner, the other a follower), as the playground's tabs do.

An `sh` block runs through the curl console's shell (web/curl.py), one shell per page, so the variables a
block sets are there for the next one (and saved with the page, so a reload keeps them); its curls go
through the service worker to this page's engine. `mp` in a block runs the real CLI, and a Python block
runs with the real `monitor_protocol.client`, both in web/runner.js: a Pyodide worker that installs the
client with micropip from this site's own wheel, started on the first block that needs it. Under each block:
its output (each request's status and its answer, pretty) and one line saying whether the run went as the
docs say (web/docs_check.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import curl
import docs_check
import js
from door import ENGINE, said_offline, when_offline
from pyodide.ffi import create_proxy, to_js

MP = js.MP
doc = js.document
BUSY = asyncio.Lock()  # one block at a time, in the order they were clicked
STATE: dict[str, Any] = {"shell": None, "run": None, "out": None}
RUNNER_TIMEOUT = 240.0  # a cold worker on a loaded 2-core machine: Pyodide, micropip, the wheel


def el(id_: str):
    return doc.getElementById(id_)


def esc(text: Any) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def js_obj(value: dict) -> Any:
    return to_js(value, dict_converter=js.Object.fromEntries)


# ---------------------------------------------------------------------------------------------- the runner
class Runner:
    """web/runner.js, the Pyodide worker: `{id, kind, ...}` in, `{id, ok, stdout, stderr, exit?, error?}` out,
    and `{type: "stage", stage, detail}` while it starts."""

    def __init__(self) -> None:
        self.worker = None
        self.pending: dict[int, asyncio.Future] = {}
        self.seq = 0
        self.stage = ""
        self.failed: str | None = None

    def start(self) -> None:
        if self.worker is not None:
            return
        root = js.URL.new("../", js.location.href)  # the site root: docs pages are one folder down
        url = js.URL.new("runner.js?mp-ns=" + js.encodeURIComponent(MP.ns), root)
        self.show_stage("starting", "starting the Python worker…")
        self.worker = js.Worker.new(url, js_obj({"type": "module"}))
        self.worker.addEventListener("message", create_proxy(self.on_message))
        self.worker.addEventListener("error", create_proxy(self.on_error))

    def show_stage(self, stage: str, detail: str) -> None:
        self.stage = stage
        box = el("runner-stages")
        text = f"Python worker: {stage}" + (f" · {detail}" if detail else "")
        if box:
            box.textContent = text
        if STATE["out"] is not None and stage != "ready":
            note(f"{text}")

    def on_message(self, evt) -> None:
        msg = evt.data.to_py() if hasattr(evt.data, "to_py") else {}
        if not isinstance(msg, dict):
            return
        if msg.get("type") == "stage":
            self.show_stage(str(msg.get("stage", "")), str(msg.get("detail") or ""))
            return
        if msg.get("type") == "error":  # its start failed: said here; its answers then say ok: false
            self.show_stage("failed", str(msg.get("error") or "the Python worker could not start"))
            return
        fut = self.pending.pop(msg.get("id"), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def on_error(self, evt) -> None:
        """The worker itself failed (its script did not load, or it crashed): every waiting run says so."""
        evt.preventDefault()
        self.failed = (
            f"the Python worker failed: {getattr(evt, 'message', '') or 'it did not load (web/runner.js)'}"
        )
        self.show_stage("failed", self.failed)
        self.drop(self.failed)

    def drop(self, why: str) -> None:
        """No worker any more: every run still waiting fails with `why`; the next run starts a new one."""
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(RuntimeError(why))
        self.pending.clear()
        self.worker = None

    async def call(self, kind: str, **payload: Any) -> dict:
        self.start()
        self.seq += 1
        fut = asyncio.get_event_loop().create_future()
        ident = self.seq
        self.pending[ident] = fut
        self.worker.postMessage(js_obj({"id": ident, "kind": kind, **payload}))
        try:
            return await asyncio.wait_for(fut, RUNNER_TIMEOUT)
        except TimeoutError:
            # The worker runs one request at a time: left running, the stuck code would hold every later
            # block. Stopped, the next block starts a fresh worker.
            why = (f"the Python worker did not answer within {RUNNER_TIMEOUT:.0f} s: it was stopped, and the "
                   "next block starts a new one")  # fmt: skip
            self.pending.pop(ident, None)
            self.worker.terminate()
            self.show_stage("stopped", why)
            self.drop(why)
            raise RuntimeError(why) from None


RUNNER = Runner()


def base_env() -> dict[str, str]:
    """What a reader sets in a terminal: MP_BASE is this page (the client and the CLI add /mp/v0)."""
    return {"MP_BASE": str(js.location.origin)}


async def run_cli(argv: list[str], env: dict[str, str], stdin: str | None) -> tuple[int, str, str]:
    payload: dict[str, Any] = {"argv": argv, "env": base_env() | env}
    if stdin is not None:
        payload["stdin"] = stdin
    reply = await RUNNER.call("cli", **payload)
    if reply.get("error") and reply.get("exit") is None:
        raise RuntimeError(str(reply["error"]))
    return int(reply.get("exit") or 0), str(reply.get("stdout") or ""), str(reply.get("stderr") or "")


# ---------------------------------------------------------------------------------------------- output
def put(html_text: str) -> None:
    out = STATE["out"]
    if out is not None:
        out.insertAdjacentHTML("beforeend", html_text)


def note(text: str) -> None:
    put(f"<div class='note'># {esc(text)}</div>")


def emit(kind: str, text: str, extra: dict) -> None:
    run: docs_check.Run = STATE["run"]
    if kind == "cmd":
        first = text.strip().split("\n", 1)
        put(f"<div class='cmd'>$ {esc(first[0])}{' …' if len(first) > 1 else ''}</div>")
    elif kind == "out":
        run.text += text
        put(f"<div class='out'>{esc(text)}</div>")
    elif kind == "note":
        hint = " (a block above sets it: run them top to bottom)" if "is not set" in text else ""
        put(f"<div class='note'># {esc(text.lstrip('# '))}{hint}</div>")
    elif kind == "error":
        run.errors.append(text)
        # a Python block's client raises Duplicate, an mp command prints DUPLICATE: the same hint as HTTP's
        hint = DUPLICATE_HINT if "Duplicate" in text or "DUPLICATE" in text else ""
        put(f"<div class='st-err' data-error='1'>✗ {esc(text)}</div>{hint}")
    elif kind == "exit":
        code = int(extra["exit"])
        run.exits.append(code)
        ok = code == 0
        put(
            f"<div class='{'st-ok' if ok else 'st-err'}' data-exit='{code}'>{'✓' if ok else '✗'} mp "
            f"{esc(' '.join(extra['argv'][:3]))}{' …' if len(extra['argv']) > 3 else ''} · exit {code}</div>"
        )
    elif kind == "http":
        status, data = int(extra["status"]), extra["data"]
        code = data.get("code") if isinstance(data, dict) and status >= 400 else None
        run.requests.append((status, code))
        ok = 200 <= status < 300
        pretty = json.dumps(data, indent=2, ensure_ascii=False) if data is not None else text
        run.text += pretty + "\n"
        path = extra["url"].split("/mp/v0", 1)[-1]
        head = (
            f"<div class='{'st-ok' if ok else 'st-err'}' data-status='{status}'>{'✓' if ok else '✗'} HTTP "
            f"{status}{' ' + esc(code) if code else ''} <span class='note'>{esc(extra['method'])} {esc(path)}</span></div>"
        )
        if extra["shown"]:
            body = f"<pre class='json'>{esc(pretty)}</pre>"
        else:
            body = f"<details class='captured'><summary>answer (captured by the shell)</summary><pre class='json'>{esc(pretty)}</pre></details>"
        hint = ""
        if code == "DUPLICATE":
            hint = DUPLICATE_HINT
        put(head + body + hint)


DUPLICATE_HINT = (
    "<div class='note'># This page's engine already holds it, from an earlier run of this block: "
    "“Reset this page's engine” (top) starts over.</div>"
)


def fresh_shell() -> curl.Shell:
    return curl.Shell(
        str(js.location.origin), page_fetch, emit, {"MP": "http://127.0.0.1:8130/mp/v0"}, cli=run_cli
    )


async def page_fetch(call) -> tuple[int, str]:
    opts: dict[str, Any] = {"method": call.method, "headers": js_obj(call.headers)}
    if call.body is not None:
        opts["body"] = call.body
    resp = await js.fetch(call.url, js_obj(opts))
    return int(resp.status), str(await resp.text())


# ---------------------------------------------------------------------------------------------- one block
def block_data(fig) -> tuple[str, str, list, list]:
    kind = str(fig.getAttribute("data-kind"))
    code = str(fig.querySelector("pre code").textContent)
    expect = [(int(s), c) for s, c in json.loads(str(fig.getAttribute("data-expect") or "[]"))]
    shows = json.loads(str(fig.getAttribute("data-shows") or "[]"))
    return kind, code, expect, shows


async def run_block(fig, button) -> None:
    kind, code, expect, shows = block_data(fig)
    state = fig.querySelector(".block-state")
    out = fig.querySelector(".block-out")
    button.disabled = True
    button.setAttribute("aria-busy", "true")
    fig.setAttribute("data-state", "queued")
    state.textContent = "waiting for the block before…" if BUSY.locked() else "running…"
    async with BUSY:
        state.textContent = "running…"
        fig.setAttribute("data-state", "running")
        out.innerHTML = ""
        out.removeAttribute("hidden")
        run = docs_check.Run()
        STATE["run"], STATE["out"] = run, out
        try:
            if kind == "sh":
                await STATE["shell"].run(code)
                await save_shell()
            else:
                await run_python(code, run)
        except Exception as exc:  # shown under the block, never a silent failure
            emit("error", f"{type(exc).__name__}: {exc}", {})
        finally:
            STATE["run"], STATE["out"] = None, None
        ok, why = docs_check.verdict(run, expect, shows)
        fig.setAttribute("data-state", "ok" if ok else "failed")
        fig.setAttribute("data-statuses", " ".join(str(s) for s, _ in run.requests))
        fig.setAttribute("data-runs", str(int(fig.getAttribute("data-runs") or 0) + 1))
        state.textContent = ("✓ " if ok else "✗ ") + why
        state.className = "block-state " + ("ok" if ok else "err")
        button.removeAttribute("aria-busy")
        button.disabled = False
        button.textContent = "Run again"
        MP.actionsDone += 1


async def run_python(code: str, run: docs_check.Run) -> None:
    note("running in the Python worker (Pyodide, monitor_protocol.client from this site's wheel)…")
    reply = await RUNNER.call("python", code=code, env=base_env())
    stdout, stderr = str(reply.get("stdout") or ""), str(reply.get("stderr") or "")
    if stdout:
        emit("out", stdout, {})
    if stderr and reply.get("ok"):
        note(stderr)
    if not reply.get("ok"):
        emit("error", str(reply.get("error") or stderr or "the block failed"), {})


# ---------------------------------------------------------------------------------------------- the page
async def save_shell() -> None:
    """The shell's variables, in this page's IndexedDB: a reload goes on where the reader was."""
    if ENGINE.ui_idb:
        sh = STATE["shell"]
        await MP.idb.putUi(json.dumps({"env": sh.env, "exported": sorted(sh.exported)}))


async def load_shell() -> None:
    sh = fresh_shell()
    saved = await MP.idb.getUi() if ENGINE.ui_idb else None
    if saved:
        try:
            data = json.loads(str(saved))
            sh.env.update({str(k): str(v) for k, v in data.get("env", {}).items()})
            sh.exported = {str(n) for n in data.get("exported", [])}
        except (ValueError, AttributeError):
            pass  # an unreadable session: start with a fresh shell
    STATE["shell"] = sh


def on_click(evt) -> None:
    target = evt.target.closest("button.run") if evt.target.closest else None
    if not target or target.disabled:
        return
    fig = target.closest("figure.block")
    asyncio.ensure_future(run_block(fig, target))


async def reset(_evt=None) -> None:
    if ENGINE.mode != "owner":
        js.alert("Reset from the tab that owns this page's engine.")
        return
    if not js.confirm("Reset this page's engine? Its log, its tokens and the shell's variables are deleted."):
        return
    if ENGINE.ui_idb:
        await MP.idb.clear()
    js.location.reload()


def set_chip() -> None:
    chip = el("status-chip")
    label = chip.querySelector(".label")
    if ENGINE.mode == "follower":
        chip.className, label.textContent = "chip warn", "ready · another tab owns this page's engine"
    elif ENGINE.storage == "indexeddb":
        chip.className, label.textContent = "chip ok", f"ready · engine {MP.ns}, saved in IndexedDB"
    else:
        chip.className, label.textContent = "chip warn", "ready · memory only: not saved"
    said_offline(chip, label)


def following() -> None:
    banner = el("other-tab")
    banner.textContent = (
        "This page is open in another tab: that tab's engine owns this page's log, and the blocks here run "
        "against it. This tab takes over when the other one closes."
    )
    banner.removeAttribute("hidden")


async def took_over() -> None:
    el("other-tab").setAttribute("hidden", "")
    el("reset-btn").disabled = False
    set_chip()


async def sweeper() -> None:
    """The owner's upkeep (lease expiry, the mute sweep), as the playground's ticker does it."""
    while True:
        await asyncio.sleep(2)
        try:
            if ENGINE.mode == "owner":
                await ENGINE.host.sweep()
        except Exception as exc:  # logged; the next round tries again
            js.console.warn(f"docs sweep: {exc!r}")


async def main() -> None:
    sw = await MP.swReady
    MP.stage("storage", "Opening this page's IndexedDB and taking its writer lock…")
    await ENGINE.open(following, took_over)
    await load_shell()
    doc.addEventListener("click", create_proxy(on_click))
    when_offline(set_chip)
    el("reset-btn").addEventListener("click", create_proxy(lambda e: asyncio.ensure_future(reset(e))))
    el("reset-btn").disabled = ENGINE.mode != "owner"
    for b in doc.querySelectorAll("button.run"):
        b.disabled = not sw
        if not sw:
            b.title = "This browser gave the page no service worker, so curl cannot reach the page's engine"
    set_chip()
    asyncio.ensure_future(sweeper())
    MP.stage("ready", "Ready")
