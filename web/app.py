"""The Monitor Protocol playground: the UI, in Python, over the SAME engine as the server.

Every action goes through the REST router (`EngineHost.call`, or the service worker when another tab owns
the engine), so what the page shows is the real protocol answer: status and JSON.
"""

import asyncio
import html
import json
import random
import time
from datetime import datetime
from urllib.parse import urlencode

import curl
import js
from monitor_protocol.browser.host import EngineHost, Reply
from monitor_protocol.store.indexeddb import IndexedDBStore
from monitor_protocol.store.memory import MemoryStore
from pyodide.ffi import create_proxy, to_js
from story import STEPS

MP = js.MP
doc = js.document

MONITOR = "ci"
OWNER = "human:you"
CI_TYPE = "com.example.ci.run"
PROTO = "ai.mentu.monitor."
CI_MONITOR = {
    "id": MONITOR,
    "name": "CI builds",
    "description": "Build results reported by the CI probe",
    "horizon": "minute",
    "capabilities": ["observe", "react", "act"],
    "visibility": "private",
    "types": [CI_TYPE],
    "owner": OWNER,
}
PRESETS = {
    "probe": {"type": CI_TYPE, "subject": "build-412", "actor": "probe:ci", "data": {"status": "failed"}},
    "agent-src": {
        "type": CI_TYPE,
        "subject": "build-412",
        "actor": "agent:claude",
        "tier": "src",
        "data": {"status": "passed"},
    },
    "agent-owner": {
        "type": CI_TYPE,
        "subject": "build-412",
        "actor": "agent:claude",
        "on_behalf_of": OWNER,
        "origin": "human",
        "tier": "src",
        "data": {"status": "passed", "note": "re-run green, confirmed by you"},
    },
    "agent-stranger": {
        "type": CI_TYPE,
        "subject": "build-412",
        "actor": "agent:claude",
        "on_behalf_of": "human:mallory",
        "data": {"status": "passed"},
    },
}


def q(sel):
    return doc.querySelector(sel)


def esc(x):
    return html.escape(str(x), quote=True)


def now():
    return time.time()


def parse_time(text):
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except (TypeError, ValueError):
        return None


# ============================================================================ the engine (owner or follower)
class Engine:
    def __init__(self):
        self.mode = None  # "owner" | "follower"
        self.host = None
        self.idb = None
        self.storage = "memory"
        self.storage_reason = None
        self.ui_idb = False

    async def open_ui_storage(self):
        try:
            await MP.idb.open()
            self.ui_idb = True
        except Exception as exc:  # IndexedDB refused: memory only, said plainly in the status chip
            self.ui_idb = False
            self.storage_reason = str(exc)

    async def start_owner(self):
        memory = MemoryStore()
        self.idb = IndexedDBStore(memory, MP.idb)
        restored = 0
        if self.ui_idb:
            self.idb.durable = True
            restored = await self.idb.restore()
        self.storage = "indexeddb" if self.idb.durable else "memory"
        self.host = EngineHost(memory, persist=self.idb.flush, start_persist=self.idb.start_flush)
        self.mode = "owner"
        MP.handler = create_proxy(lambda text: asyncio.ensure_future(self.host.handle_shim(str(text))))
        MP.announceOwner()
        return restored

    async def read_log(self, monitor, from_seq, limit=200):
        """The timeline's read, without a subscription. The owner tab uses its engine's admin door
        (GET /mp/v0/admin/log, a token minted for this page load and never forwarded); a follower tab
        holds no engine, so it reads the committed log straight from IndexedDB, read-only."""
        if self.mode == "owner":
            return await self.host.read_log(monitor, from_seq, limit)
        if not self.ui_idb:
            return Reply(503, {"code": "UNAVAILABLE", "error": "no log to read in this tab", "done": []})
        rows = [json.loads(v) for v in json.loads(str(await MP.idb.readLog(monitor, from_seq, limit)))]
        nxt = int(rows[-1]["id"]) + 1 if rows else from_seq
        return Reply(200, {"monitor": monitor, "head": None, "next": nxt, "observations": rows})

    async def call(self, method, path, body=None, token=None, query=None):
        if self.mode == "owner":
            return await self.host.call(method, path, body=body, token=token, query=query)
        url = "./mp/v0" + path + ("?" + urlencode(query) if query else "")
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        opts = {"method": method, "headers": headers}
        if body is not None:
            headers["Content-Type"] = "application/json"
            opts["body"] = json.dumps(body)
        resp = await js.fetch(url, to_js(opts, dict_converter=js.Object.fromEntries))
        text = await resp.text()
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = {"code": "UNAVAILABLE", "error": text}
        return Reply(int(resp.status), data)


ENGINE = Engine()
S = {}  # the UI's session (tokens, readers, workers, story step), saved in IndexedDB's "ui" store
LOG = []  # the monitor's log as read by the timeline (admin door: no subscription, no cursor)
VIEW = {"state": None, "head": 0, "flash": set(), "leases": {}, "tab": "story", "dead": set()}
AUTO = {
    "on": False,
    "published": [],
    "delivered": 0,
    "redelivered": 0,
    "processed": {},
    "acked": 0,
    "note": "",
}
BUSY = asyncio.Lock()


def fresh_session():
    return {"monitor": None, "owner_token": None, "readers": {}, "workers": {}, "step": 0}


async def save_session():
    if ENGINE.ui_idb:
        await MP.idb.putUi(json.dumps(S))


# ============================================================================ rendering helpers
def answer_html(reply, title=""):
    ok = reply.ok
    label = f"{reply.status} {'OK' if ok else (reply.body or {}).get('code', '')}".strip()
    body = json.dumps(reply.body, indent=2, ensure_ascii=False) if reply.body is not None else ""
    head = f"<span class='status'>{esc(title + ' → ' if title else '')}{esc(label)}</span>\n"
    return head + esc(body)


def show_answer(el_id, reply, title=""):
    el = doc.getElementById(el_id)
    if el is None:
        return
    el.className = "answer " + ("ok" if reply.ok else "err")
    el.innerHTML = answer_html(reply, title)
    el.setAttribute("data-status", str(reply.status))
    if not reply.ok and isinstance(reply.body, dict):
        el.setAttribute("data-code", str(reply.body.get("code", "")))
    else:
        el.removeAttribute("data-code")


def show_answers(el_id, pairs):
    """Several calls' answers in one box (the story's multi-step actions)."""
    el = doc.getElementById(el_id)
    if el is None or not pairs:
        return
    last = pairs[-1][1]
    el.className = "answer " + ("ok" if last.ok else "err")
    steps = "".join(
        f"<div class='status'>{esc(t)} → {r.status} {esc('OK' if r.ok else (r.body or {}).get('code', ''))}</div>"
        for t, r in pairs[:-1]
    )
    el.innerHTML = steps + answer_html(last, pairs[-1][0])
    el.setAttribute("data-status", str(last.status))
    codes = [str((r.body or {}).get("code", "")) for _, r in pairs if not r.ok and isinstance(r.body, dict)]
    el.setAttribute("data-code", " ".join(codes))


def set_chip():
    chip = doc.getElementById("status-chip")
    label = chip.querySelector(".label")
    if ENGINE.mode == "follower":
        chip.className = "chip warn"
        label.textContent = "ready · another tab owns the engine"
    elif ENGINE.storage == "indexeddb":
        chip.className = "chip ok"
        label.textContent = "ready · storage: IndexedDB"
    else:
        chip.className = "chip warn"
        label.textContent = "ready · storage: memory — not saved"


def seq_of(o):
    return int(o.get("id", 0))


def payload(o):
    d = o.get("data") or {}
    return d.get("payload") or {}


def short_type(t):
    return t[len(PROTO) :] if t.startswith(PROTO) else t


def obs_summary(o):
    t = o.get("type", "")
    p = payload(o)
    if t == PROTO + "rejected":
        raw = p.get("raw") if isinstance(p.get("raw"), dict) else {}
        sent = ", ".join(
            f"{k} {raw[k]}" for k in ("actor", "on_behalf_of", "origin", "tier", "verification") if k in raw
        )  # only what the refused request really carried
        return f"⚠ {p.get('code')}: {p.get('reason', '')}" + (f" (sent: {sent})" if sent else "")
    if t == PROTO + "configured":
        return f"{p.get('action')}" + (f" · {p.get('reason')}" if p.get("reason") else "")
    if t == PROTO + "subscribed":
        if p.get("seek"):
            return f"seek {p['seek']} · {p.get('reason', '')}"
        return f"{p.get('subscriber')} · cursor {p.get('cursor')} · {','.join(p.get('capabilities') or [])}"
    if t == PROTO + "lease":
        extra = ""
        if p.get("action") == "reject":
            extra = f" · attempts {p.get('attempts')}" + (" · DEAD LETTER" if p.get("dead_letter") else "")
        return f"{p.get('action')} {p.get('subject')} by {p.get('subscription')}{extra}"
    if t == PROTO + "subscription_retired":
        return f"{p.get('subscriber')} · {p.get('reason')}"
    d = {k: v for k, v in (o.get("data") or {}).items() if k not in ("provenance", "tags")}
    return json.dumps(d, ensure_ascii=False)[:140]


# ============================================================================ the live picture
def reader_markers():
    marks = []
    for name, rd in S.get("readers", {}).items():
        marks.append((max(1, int(rd.get("cursor") or 0)), name, rd))
    return marks


def held_seqs():
    held, unacked = {}, set()
    for name, rd in S.get("readers", {}).items():
        for h in rd.get("held", []):
            held.setdefault(h["seq"], []).append(name)
        unacked.update(rd.get("lost_batch", []))
    return held, unacked


def local_lag(rd):
    cursor = max(1, int(rd.get("cursor") or 0))
    return sum(1 for o in LOG if seq_of(o) >= cursor)


def render_log():
    el = doc.getElementById("log")
    if not S.get("monitor"):
        el.innerHTML = (
            "<li class='empty muted'>No monitor yet: create one (Story step 1, or Playground).</li>"
        )
        doc.getElementById("log-head").textContent = ""
        return
    near_bottom = el.scrollHeight - el.scrollTop - el.clientHeight < 60
    held, unacked = held_seqs()
    redelivered = {
        h["seq"] for rd in S.get("readers", {}).values() for h in rd.get("held", []) if h["redelivered"]
    }
    marks = reader_markers()
    window = LOG[-150:]
    parts = []
    if len(LOG) > len(window):
        parts.append(f"<li class='muted small'>… {len(LOG) - len(window)} earlier observations</li>")
    placed = set()

    def marker(name, rd):
        placed.add(name)
        crashed = " crashed" if rd.get("crashed") else ""
        return (
            f"<li class='marker{crashed}' data-reader='{esc(name)}'>{esc(name)} · cursor {esc(rd.get('cursor'))}"
            f" · lag {local_lag(rd)}{' · crashed' if crashed else ''}<span class='line'></span></li>"
        )

    for o in window:
        s = seq_of(o)
        for cur, name, rd in marks:
            if name not in placed and cur <= s:
                parts.append(marker(name, rd))
        t = o.get("type", "")
        cls = ["obs"]
        if t.startswith(PROTO):
            cls.append("protocol")
        if t == PROTO + "rejected":
            cls.append("rejected")
        if s in held:
            cls.append("held")
        if s in unacked:
            cls.append("unacked")
        if s in VIEW["flash"]:
            cls.append("flash")
        d = o.get("data") or {}
        prov = d.get("provenance") or {}
        tier = o.get("tier", "")
        who = f"{esc(o.get('origin', ''))} · {esc(o.get('actor', ''))}"
        if prov.get("on_behalf_of"):
            who += f" <b>for</b> {esc(prov['on_behalf_of'])}"
        tags = ""
        if s in redelivered:
            tags += " <span class='tag redelivered'>↻ redelivered</span>"
        if s in held:
            tags += f" <span class='tag'>held by {esc(', '.join(held[s]))}</span>"
        if s in unacked:
            tags += " <span class='tag'>un-acked at crash</span>"
        subject = f" <span class='who'>{esc(o.get('subject'))}</span>" if o.get("subject") else ""
        parts.append(
            f"<li class='{' '.join(cls)}' data-seq='{s}' data-type='{esc(t)}'><div class='top'>"
            f"<span class='seq'>#{s}</span><span class='type'>{'⚙ ' if t.startswith(PROTO) else ''}"
            f"{esc(short_type(t))}</span>"
            f"<span class='badge t-{esc(tier)}'>{esc(tier)}</span>{subject}<span class='who'>{who}</span>{tags}"
            f"</div><div class='small'>{esc(obs_summary(o))}</div></li>"
        )
    for _cur, name, rd in marks:
        if name not in placed:
            parts.append(marker(name, rd))
    el.innerHTML = "".join(parts) or "<li class='empty muted'>The log is empty.</li>"
    VIEW["flash"] = set()
    doc.getElementById("log-head").textContent = f"monitor {S['monitor']} · head {VIEW['head']}"
    if near_bottom:
        el.scrollTop = el.scrollHeight


def render_readers():
    el = doc.getElementById("readers")
    readers = S.get("readers", {})
    if not readers:
        el.innerHTML = "<p class='muted small'>No reader yet: + reader subscribes one.</p>"
        return
    out = []
    for name, rd in readers.items():
        crashed = rd.get("crashed")
        age = f"{int(now() - rd['last_pull'])} s ago" if rd.get("last_pull") else "never"
        held = "".join(
            f"<span class='chip-s{' redelivered' if h['redelivered'] else ''}'>#{h['seq']}"
            f"{' ↻' if h['redelivered'] else ''}</span>"
            for h in rd.get("held", [])
        )
        lost = "".join(f"<span class='chip-s'>#{s}</span>" for s in rd.get("lost_batch", []))
        processed = rd.get("processed", {})
        twice = sum(1 for c in processed.values() if c > 1)
        dis = " disabled" if crashed else ""
        has = "" if rd.get("held") and not crashed else " disabled"
        out.append(
            f"<div class='card reader{' crashed' if crashed else ''}' data-reader='{esc(name)}'>"
            f"<div><span class='name'>{esc(name)}</span> <span class='meta'>{esc(rd['id'])}</span>"
            f"{' <b>✖ crashed</b>' if crashed else ''}</div>"
            f"<div class='meta'>cursor <b class='cursor'>{esc(rd.get('cursor'))}</b> · lag <b class='lag'>"
            f"{local_lag(rd)}</b> · last pull {age} · processed {len(processed)} ({twice} twice)</div>"
            + (f"<div class='chips'>holds: {held}</div>" if held else "")
            + (f"<div class='chips'>un-acked when it crashed: {lost}</div>" if lost else "")
            + f"<div class='btns'><button data-act='r-pull' data-reader='{esc(name)}'{dis}>Pull</button>"
            f"<button data-act='r-process' data-reader='{esc(name)}'{has}>Process</button>"
            f"<button data-act='r-ack' data-reader='{esc(name)}'{dis}>Ack</button>"
            f"<button data-act='r-crash' data-reader='{esc(name)}'{dis}>Crash</button>"
            f"<button data-act='r-restart' data-reader='{esc(name)}'{'' if crashed else ' disabled'}>Restart"
            "</button></div></div>"
        )
    el.innerHTML = "".join(out)


def render_workers():
    el = doc.getElementById("workers")
    subject = doc.getElementById("lease-subject").value
    lease = VIEW["leases"].get(subject)
    out = []
    for name in ("worker-a", "worker-b"):
        w = S.get("workers", {}).get(name)
        holder = bool(lease and w and lease.get("holder") == "sub:" + w["id"])
        status = "no subscription yet"
        if w:
            status = "holds the lease" if holder else "waiting"
        countdown = ""
        if holder and lease.get("expires_ts"):
            left = max(0, int(round(lease["expires_ts"] - now())))
            countdown = f" · expires in <span class='countdown'>{left}s</span>"
        last = w.get("last", "") if w else ""
        out.append(
            f"<div class='card worker{' holder' if holder else ''}' data-worker='{name}'>"
            f"<div><span class='name'>{'★ ' if holder else ''}{name}</span> <span class='meta'>{esc(status)}"
            f"{countdown}</span></div><div class='meta small'>{esc(last)}</div>"
            f"<div class='btns'><button data-act='w-claim' data-worker='{name}'>Claim</button>"
            f"<button data-act='w-complete' data-worker='{name}'>Complete</button>"
            f"<button data-act='w-release' data-worker='{name}'>Release</button>"
            f"<button data-act='w-reject' data-worker='{name}'>Reject</button></div></div>"
        )
    if subject in VIEW["dead"]:
        out.append(
            f"<p class='small warn-word'>⚠ {esc(subject)} is dead-lettered: claims get DEAD_LETTERED.</p>"
        )
    el.innerHTML = "".join(out)


def render_state():
    el = doc.getElementById("state")
    st = VIEW["state"]
    if not st:
        el.innerHTML = "<p class='muted small'>No monitor yet.</p>"
        return
    if "live" not in st:
        el.innerHTML = f"<p class='warn-word'>{esc(st.get('code'))}: {esc(st.get('error'))}</p>"
        return
    live = st["live"]
    lv = (
        "<span class='live-yes'>● live</span>"
        if live.get("value")
        else f"<span class='live-no'>■ not live ({esc(live.get('reason'))})</span>"
    )
    counters = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in (st.get("counters") or {}).items())
    ages = "".join(
        f"<dt>{esc(k[:-2] if k.endswith('_s') else k)}</dt><dd>{'null (unknown)' if v is None else esc(v) + ' s'}</dd>"
        for k, v in (st.get("ages") or {}).items()
    )
    conf = st.get("confidence") or {}
    inputs = conf.get("inputs") or {}
    present = "".join(f"<span class='present'>✓ {esc(x)}</span> " for x in inputs.get("present", []))
    missing = "".join(f"<span class='missing'>? {esc(x)}</span> " for x in inputs.get("missing", []))
    gaps = "".join(f"<span class='gap'>⚠ {esc(g)}</span> " for g in conf.get("gaps", []))
    value = (
        "null — not known while inputs are missing" if conf.get("value") is None else esc(conf.get("value"))
    )
    last = st.get("last") or {}
    el.innerHTML = (
        f"<div>{lv} · head <b>{esc(st.get('head'))}</b> · as_of_seq {esc(st.get('as_of_seq'))}</div>"
        f"<div class='small muted'>last: {esc(last.get('type', '—'))} #{esc(last.get('seq', '—'))}</div>"
        f"<h4>counters</h4><dl>{counters}</dl><h4>ages</h4><dl>{ages}</dl>"
        f"<h4>confidence</h4><div class='conf-value'><code>{value}</code></div>"
        f"<div class='chips'>{present}</div><div class='chips'>{missing}</div>"
        f"<h4>gaps</h4><div class='chips' id='gaps'>{gaps or '<span class=muted>none</span>'}</div>"
    )


def render_auto():
    el = doc.getElementById("auto-tally")
    published = AUTO["published"]
    processed = AUTO["processed"]
    twice = sum(1 for s in published if processed.get(s, 0) > 1)
    lost = sum(1 for s in published if s < AUTO["acked"] and processed.get(s, 0) == 0)
    items = [
        ("published", len(published)),
        ("delivered", AUTO["delivered"]),
        ("redelivered", AUTO["redelivered"]),
        ("processed twice", twice),
        ("lost", lost),
    ]
    el.innerHTML = "".join(
        f"<div class='{k.replace(' ', '-')}' data-k='{k}'><b>{v}</b><span>{k}</span></div>" for k, v in items
    ) + (f"<p class='small muted' style='grid-column:1/-1'>{esc(AUTO['note'])}</p>" if AUTO["note"] else "")
    doc.getElementById("auto-btn").textContent = "Stop" if AUTO["on"] else "Start"


def render_token_box():
    el = doc.getElementById("token-box")
    token = S.get("shown_token")
    if not token:
        el.setAttribute("hidden", "")
        return
    el.removeAttribute("hidden")
    el.innerHTML = (
        f"<b>Owner token (shown once):</b> <code id='owner-token'>{esc(token)}</code><br>"
        "<span class='muted'>The server keeps only its hash, so it can never show it again. This page keeps "
        "it to act as the owner; copy it for the curl tab.</span>"
    )


def render_story():
    i = S.get("step", 0)
    step = STEPS[i]
    doc.getElementById("story-count").textContent = f"Step {i + 1} of {len(STEPS)}"
    doc.getElementById("story-title").textContent = step["title"]
    doc.getElementById("story-text").textContent = step["text"]
    doc.getElementById("story-principle").innerHTML = f"<b>The principle:</b> {esc(step['principle'])}"
    done = set(S.get("story_done", []))
    doc.getElementById("story-dots").innerHTML = "".join(
        f"<span class='{'done' if k in done else ''}{' cur' if k == i else ''}' title='step {k + 1}"
        f"{' (done)' if k in done else ''}{' (this step)' if k == i else ''}'></span>"
        for k in range(len(STEPS))
    )
    doc.getElementById("story-lesson").textContent = f"✓ Done. {step['lesson']}" if i in done else ""
    doc.getElementById("story-next").disabled = i >= len(STEPS) - 1
    doc.getElementById("story-back").disabled = i == 0


def render_all():
    render_log()
    render_readers()
    render_workers()
    render_state()
    render_auto()
    render_token_box()
    render_story()


# ============================================================================ reading the engine
def update_leases_from(obs_list):
    for o in obs_list:
        if o.get("type") != PROTO + "lease":
            continue
        p = payload(o)
        subject = p.get("subject")
        action = p.get("action")
        if action in ("claim", "renew"):
            cur = VIEW["leases"].get(subject) or {}
            holder = "sub:" + str(p.get("subscription"))
            expires = parse_time(p.get("expires")) if p.get("expires") else None
            if cur.get("holder") != holder or expires:
                cur = {"holder": holder, "expires_ts": expires or cur.get("expires_ts")}
            VIEW["leases"][subject] = cur
        else:
            VIEW["leases"].pop(subject, None)
            if action == "reject" and p.get("dead_letter"):
                VIEW["dead"].add(subject)


async def fetch_log():
    monitor = S.get("monitor")
    if not monitor:
        return
    while True:
        nxt = seq_of(LOG[-1]) + 1 if LOG else 1
        r = await ENGINE.read_log(monitor, nxt, 200)
        if r.status != 200:
            return
        if r.body.get("head") is not None:
            VIEW["head"] = r.body["head"]
        batch = r.body.get("observations") or []
        LOG.extend(batch)
        update_leases_from(batch)
        if len(batch) < 200:
            return


async def fetch_state():
    if not S.get("monitor"):
        VIEW["state"] = None
        return
    r = await ENGINE.call("GET", f"/monitors/{S['monitor']}/state", token=S.get("owner_token"))
    VIEW["state"] = r.body
    if r.ok and ENGINE.mode != "owner":
        VIEW["head"] = r.body.get("head", VIEW["head"])


async def refresh():
    await fetch_log()
    await fetch_state()
    render_all()


# ============================================================================ actions (all through the router)
async def define(body):
    r = await ENGINE.call("POST", "/monitors", body)
    show_answer("define-answer", r, "POST /monitors")
    if r.status == 201:
        S.update(fresh_session())
        S["step"] = S.get("step", 0)
        S["monitor"] = body["id"]
        S["owner_token"] = r.body["owner_token"]
        S["shown_token"] = r.body["owner_token"]
        LOG.clear()
        VIEW["leases"].clear()
        await save_session()
    await refresh()
    return r


async def define_ci():
    if S.get("monitor") == MONITOR and S.get("owner_token"):
        r = await ENGINE.call("GET", f"/monitors/{MONITOR}", token=S["owner_token"])
        if r.ok:
            return await define(CI_MONITOR)  # shows the real DUPLICATE refusal
    return await define(CI_MONITOR)


async def publish(body, answer_id="publish-answer"):
    if not S.get("monitor"):
        return no_monitor(answer_id)
    r = await ENGINE.call("POST", f"/monitors/{S['monitor']}/observations", body, token=S.get("owner_token"))
    show_answer(answer_id, r, "POST observations")
    await refresh()
    return r


def no_monitor(answer_id):
    r = Reply(404, {"code": "NOT_FOUND", "error": "Create the monitor first (step 1).", "done": []})
    show_answer(answer_id, r)
    return r


def fill_publish_form(body):
    form = doc.getElementById("publish-form")
    for key in ("type", "subject", "actor", "on_behalf_of", "tier", "origin"):
        form.elements.namedItem(key).value = body.get(key, "")
    form.elements.namedItem("data").value = json.dumps(body.get("data", {}))


def read_publish_form():
    form = doc.getElementById("publish-form")
    body = {}
    for key in ("type", "subject", "actor", "on_behalf_of", "tier", "origin"):
        v = form.elements.namedItem(key).value.strip()
        if v:
            body[key] = v
    raw = form.elements.namedItem("data").value.strip()
    if raw:
        try:
            body["data"] = json.loads(raw)
        except ValueError:
            body["data"] = raw  # the router answers with the real refusal
    return body


async def add_reader(name=None):
    if not S.get("monitor"):
        return no_monitor("story-answer")
    readers = S.setdefault("readers", {})
    if name is None:
        name = f"reader-{chr(ord('a') + len(readers))}"
    if name in readers:
        return Reply(200, {"note": f"{name} is already subscribed", "subscription": readers[name]["id"]})
    r = await ENGINE.call(
        "POST",
        "/subscriptions",
        {
            "monitor": S["monitor"],
            "subscriber": f"agent:{name}",
            "capabilities": ["observe"],
            "from": "earliest",
        },
        token=S["owner_token"],
    )
    if r.status == 201:
        sub = r.body["subscription"]
        readers[name] = {
            "id": sub["id"],
            "token": r.body["token"],
            "cursor": sub["cursor"],
            "held": [],
            "next": None,
            "processed": {},
            "crashed": False,
            "lost_batch": [],
            "last_pull": None,
        }
        await save_session()
    await refresh()
    return r


async def reader_pull(name, limit=20):
    rd = S["readers"][name]
    r = await ENGINE.call("GET", f"/subscriptions/{rd['id']}/pull", token=rd["token"], query={"limit": limit})
    if r.status == 200:
        obs = r.body["observations"]
        rd["held"] = [{"seq": seq_of(o), "redelivered": bool(o.get("redelivered"))} for o in obs]
        rd["next"] = r.body["next"]
        rd["cursor"] = r.body["cursor"]
        rd["last_pull"] = now()
        rd["lost_batch"] = []
        VIEW["flash"] = {h["seq"] for h in rd["held"] if h["redelivered"]}
        await save_session()
    await refresh()
    return r


async def reader_process(name):
    rd = S["readers"][name]
    for h in rd.get("held", []):
        key = str(h["seq"])
        rd["processed"][key] = rd["processed"].get(key, 0) + 1
    rd["processed_batch"] = [h["seq"] for h in rd.get("held", [])]
    await save_session()
    render_all()
    n = len(rd.get("held", []))
    return Reply(200, {"processed": n, "note": "processing is idempotent by (source, seq)"})


async def reader_ack(name):
    rd = S["readers"][name]
    cursor = rd.get("next") if rd.get("next") is not None else rd.get("cursor")
    r = await ENGINE.call("POST", f"/subscriptions/{rd['id']}/ack", {"cursor": cursor}, token=rd["token"])
    if r.status == 200:
        rd["cursor"] = r.body["cursor"]
        rd["held"] = []
        await save_session()
    await refresh()
    return r


async def reader_crash(name):
    rd = S["readers"][name]
    rd["crashed"] = True
    rd["lost_batch"] = [h["seq"] for h in rd.get("held", [])]
    rd["held"] = []
    rd["next"] = None
    await save_session()
    render_all()
    return Reply(
        200, {"crashed": name, "unacked": rd["lost_batch"], "note": "its memory is gone; the cursor is not"}
    )


async def reader_restart(name):
    rd = S["readers"][name]
    rd["crashed"] = False
    await save_session()
    render_all()
    return Reply(200, {"restarted": name, "cursor": rd.get("cursor")})


async def ensure_workers():
    workers = S.setdefault("workers", {})
    for name in ("worker-a", "worker-b"):
        if name in workers:
            continue
        r = await ENGINE.call(
            "POST",
            "/subscriptions",
            {
                "monitor": S["monitor"],
                "subscriber": f"agent:{name}",
                "capabilities": ["observe", "act"],
                "from": "head",
            },
            token=S["owner_token"],
        )
        if r.status != 201:
            return r
        workers[name] = {"id": r.body["subscription"]["id"], "token": r.body["token"]}
    await save_session()
    return None


def lease_subject():
    return doc.getElementById("lease-subject").value.strip() or "build-412"


async def lease_action(worker, action, subject=None):
    if not S.get("monitor"):
        return no_monitor("lease-answer")
    failed = await ensure_workers()
    if failed is not None:
        show_answer("lease-answer", failed)
        return failed
    w = S["workers"][worker]
    subject = subject or lease_subject()
    body = {"subject": subject}
    if action == "claim":
        try:
            body["lease_duration_seconds"] = int(doc.getElementById("lease-seconds").value)
        except ValueError:
            body["lease_duration_seconds"] = 8
    elif action == "complete":
        body["outcome"] = "done"
    elif action == "reject":
        body["reason"] = "the build cannot be fixed here"
    r = await ENGINE.call("POST", f"/subscriptions/{w['id']}/leases/{action}", body, token=w["token"])
    w["last"] = f"{action}: {r.status} {(r.body or {}).get('code', 'OK') if not r.ok else 'OK'}"
    if r.ok and action in ("claim", "renew"):
        VIEW["leases"][subject] = {
            "holder": r.body["lease"]["holder"],
            "expires_ts": parse_time(r.body.get("expires")),
        }
    if r.ok and action == "reject" and r.body.get("dead_letter"):
        VIEW["dead"].add(subject)
    if not r.ok and (r.body or {}).get("code") == "DEAD_LETTERED":
        VIEW["dead"].add(subject)
    show_answer("lease-answer", r, f"{worker} {action} {subject}")
    await save_session()
    await refresh()
    return r


async def dead_letter():
    """Reject the same subject until the delivery count limit dead-letters it, then show a claim refused."""
    subject = lease_subject()
    if not any(o.get("subject") == subject and not o.get("type", "").startswith(PROTO) for o in LOG):
        await publish(
            {"type": CI_TYPE, "subject": subject, "actor": "probe:ci", "data": {"status": "failed"}}
        )
    pairs = []
    for _ in range(6):
        c = await lease_action("worker-a", "claim", subject)
        if not c.ok:
            pairs.append((f"claim {subject}", c))
            break
        r = await lease_action("worker-a", "reject", subject)
        pairs.append((f"reject {subject}", r))
        if not r.ok or r.body.get("dead_letter"):
            break
    final = await lease_action("worker-b", "claim", subject)
    pairs.append((f"worker-b claims {subject}", final))
    show_answers("lease-answer", pairs[-2:])
    return final


async def configure(action):
    if not S.get("monitor"):
        return no_monitor("define-answer")
    reason = doc.getElementById("life-reason").value or action
    r = await ENGINE.call(
        "POST", f"/monitors/{S['monitor']}/{action}", {"reason": reason}, token=S.get("owner_token")
    )
    show_answer("define-answer", r, f"POST {action}")
    await refresh()
    return r


# ============================================================================ the story
async def story_action(action):
    pairs = []
    if action == "define-ci":
        pairs.append(("create the CI monitor", await define_ci()))
    elif action in PRESETS:
        fill_publish_form(PRESETS[action])
        pairs.append((f"publish ({action})", await publish(PRESETS[action], "story-answer")))
    elif action == "subscribe":
        pairs.append(("subscribe reader-a", await add_reader("reader-a")))
    elif action == "pull":
        await ensure_reader()
        pairs.append(("reader-a pulls", await reader_pull("reader-a")))
    elif action == "crash-restart-pull":
        await ensure_reader()
        if not S["readers"]["reader-a"].get("held"):
            pairs.append(("reader-a pulls", await reader_pull("reader-a")))
        pairs.append(("reader-a crashes", await reader_crash("reader-a")))
        pairs.append(("reader-a restarts", await reader_restart("reader-a")))
        pairs.append(("reader-a pulls again", await reader_pull("reader-a")))
    elif action == "process-ack-pull":
        await ensure_reader()
        rd = S["readers"]["reader-a"]
        if rd.get("crashed"):
            await reader_restart("reader-a")
        if not rd.get("held"):
            pairs.append(("reader-a pulls", await reader_pull("reader-a")))
        pairs.append(("reader-a processes", await reader_process("reader-a")))
        pairs.append(("reader-a acks", await reader_ack("reader-a")))
        pairs.append(("reader-a pulls again", await reader_pull("reader-a")))
    elif action == "lease-contend":
        doc.getElementById("lease-subject").value = "build-412"
        pairs.append(("worker-a claims build-412", await lease_action("worker-a", "claim", "build-412")))
        pairs.append(("worker-b claims build-412", await lease_action("worker-b", "claim", "build-412")))
    elif action == "state":
        await refresh()
        r = await ENGINE.call(
            "GET", f"/monitors/{S.get('monitor') or MONITOR}/state", token=S.get("owner_token")
        )
        pairs.append(("read the state", r))
        panel = doc.getElementById("panel-state")
        panel.classList.remove("pulse")
        panel.offsetWidth  # noqa: B018 - restart the CSS animation
        panel.classList.add("pulse")
    elif action == "pause-and-publish":
        doc.getElementById("life-reason").value = "maintenance window"
        pairs.append(("pause the monitor", await configure("pause")))
        pairs.append(("a probe publishes", await publish(PRESETS["probe"], "story-answer")))
    show_answers("story-answer", pairs)
    return pairs


async def ensure_reader():
    if "reader-a" not in S.get("readers", {}):
        await add_reader("reader-a")


# ============================================================================ automatic mode
async def auto_loop():
    name = "auto-reader"
    if name not in S.get("readers", {}):
        r = await add_reader(name)
        if not r.ok:
            AUTO["on"] = False
            AUTO["note"] = f"could not subscribe: {(r.body or {}).get('code')}"
            render_auto()
            return
    rd = S["readers"][name]
    rd["crashed"] = False
    n = 0
    while AUTO["on"]:
        n += 1
        body = {
            "type": CI_TYPE,
            "subject": f"build-{500 + n}",
            "actor": "probe:ci",
            "data": {"status": "passed"},
        }
        p = await ENGINE.call("POST", f"/monitors/{S['monitor']}/observations", body, token=S["owner_token"])
        if p.status == 201:
            AUTO["published"].append(int(p.body["seq"]))
            AUTO["note"] = ""
        else:
            AUTO["note"] = f"producer refused: {(p.body or {}).get('code')} (resume the monitor)"
        r = await ENGINE.call("GET", f"/subscriptions/{rd['id']}/pull", token=rd["token"], query={"limit": 5})
        if r.status == 200:
            mine = set(AUTO["published"])
            obs = r.body["observations"]
            rd["cursor"] = r.body["cursor"]
            rd["last_pull"] = now()
            for o in obs:
                if seq_of(o) in mine:
                    AUTO["delivered"] += 1
                    if o.get("redelivered"):
                        AUTO["redelivered"] += 1
            crash = random.random()
            if crash < 0.15:  # crash before processing: nothing done, nothing acked
                rd["held"] = []
            else:
                for o in obs:
                    s = seq_of(o)
                    AUTO["processed"][s] = AUTO["processed"].get(s, 0) + 1
                    rd["processed"][str(s)] = rd["processed"].get(str(s), 0) + 1
                if crash < 0.3:  # crash after processing, before the ack: this work will be redone
                    rd["held"] = []
                else:
                    a = await ENGINE.call(
                        "POST",
                        f"/subscriptions/{rd['id']}/ack",
                        {"cursor": r.body["next"]},
                        token=rd["token"],
                    )
                    if a.status == 200:
                        rd["cursor"] = a.body["cursor"]
                        AUTO["acked"] = a.body["cursor"]
        render_auto()
        schedule_refresh()
        await asyncio.sleep(0.3)
    await save_session()
    render_auto()


REFRESH = {"pending": False}


def schedule_refresh():
    if REFRESH["pending"]:
        return
    REFRESH["pending"] = True

    async def later():
        await asyncio.sleep(0.25)
        REFRESH["pending"] = False
        await refresh()

    asyncio.ensure_future(later())


# ============================================================================ curl console
# The README's quickstart (every ```sh block of the README's quickstart section, verbatim) comes from quickstart.json, which
# build.py extracts from the docs; the extras below use the same variable names.
CURL = {"history": [], "pos": 0, "shell": None, "examples": []}
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


def term_print(html_text):
    out = doc.getElementById("term-out")
    out.insertAdjacentHTML("beforeend", html_text)
    term = doc.getElementById("term")
    term.scrollTop = term.scrollHeight


def remember(body):
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


def term_emit(kind, text, extra):
    if kind == "cmd":
        term_print(f"<div class='cmd'>$ {esc(text)}</div>")
    elif kind == "out":
        term_print(f"<div class='out'>{esc(text)}</div>")
    elif kind == "note":
        term_print(f"<div class='note'># {esc(text.lstrip('# '))}</div>")
    elif kind == "error":
        term_print(f"<div class='st-err' data-error='1'>✗ {esc(text)}</div>")
    elif kind == "http":
        status, data = extra["status"], extra["data"]
        ok = 200 <= status < 300
        code = f" {data.get('code')}" if isinstance(data, dict) and data.get("code") and not ok else ""
        where = "" if extra["shown"] else " · output piped or captured"
        pretty = json.dumps(data, indent=2, ensure_ascii=False) if data is not None else text
        saved = remember(data) if extra["remember"] else []
        note = f"<div class='note'># saved ${', $'.join(saved)}</div>" if saved else ""
        term_print(
            f"<div class='{'st-ok' if ok else 'st-err'}' data-status='{status}'>{'✓' if ok else '✗'} HTTP "
            f"{status}{esc(code)} <span class='note'>{esc(extra['method'])} "
            f"{esc(extra['url'].split('/mp/v0', 1)[-1])}{where}</span></div>"
            f"<div class='{'json' if extra['shown'] else 'json piped'}'>{esc(pretty)}</div>{note}"
        )


async def page_fetch(call):
    opts = {"method": call.method, "headers": call.headers}
    if call.body is not None:
        opts["body"] = call.body
    resp = await js.fetch(call.url, to_js(opts, dict_converter=js.Object.fromEntries))
    return int(resp.status), str(await resp.text())


async def curl_run(command):
    if not command.strip():
        return
    CURL["history"].append(command.strip())
    CURL["pos"] = len(CURL["history"])
    await CURL["shell"].run(command)
    schedule_refresh()


async def render_examples():
    CURL["shell"] = curl.Shell(
        str(js.location.origin), page_fetch, term_emit, {"MP": "http://127.0.0.1:8130/mp/v0"}
    )
    try:
        resp = await js.fetch("./quickstart.json")
        quick = [(b["why"], b["code"]) for b in json.loads(str(await resp.text()))]
    except Exception as exc:  # shown, never hidden: the extras still work
        quick = []
        js.console.warn(f"quickstart.json: {exc!r}")
    CURL["examples"] = quick + EXTRAS
    ul = doc.getElementById("curl-examples")
    items = []
    for i, (why, cmd) in enumerate(CURL["examples"]):
        if i == len(quick):
            items.append("<li class='sub'><h4>More</h4></li>")
        group = "quickstart" if i < len(quick) else "extra"
        items.append(
            f"<li data-group='{group}'><div class='why'>{esc(why)}</div>"
            f"<button data-act='curl-example' data-i='{i}'>{esc(cmd)}</button></li>"
        )
    ul.innerHTML = "".join(items)
    term_print(
        "<div class='note'># This page's engine answers /mp/v0 through the service worker; "
        "http://127.0.0.1:8130 and http://localhost:8130 mean this page. Paste the README's quickstart "
        "(or click a block), Enter runs it; Shift+Enter adds a line.</div>"
    )


def on_curl_key(evt):
    box = doc.getElementById("curl-input")
    if evt.key == "Enter" and not evt.shiftKey and not curl.incomplete(box.value):
        evt.preventDefault()
        cmd = box.value
        box.value = ""
        box.rows = 1
        run_task(curl_run(cmd))
    elif evt.key == "Enter":
        box.rows = min(12, box.value.count("\n") + 2)  # a continuation: the newline goes in
    elif evt.key == "ArrowUp" and "\n" not in box.value:
        if CURL["history"]:
            evt.preventDefault()
            CURL["pos"] = max(0, CURL["pos"] - 1)
            box.value = CURL["history"][CURL["pos"]]
    elif evt.key == "ArrowDown" and "\n" not in box.value and CURL["history"]:
        evt.preventDefault()
        CURL["pos"] = min(len(CURL["history"]), CURL["pos"] + 1)
        box.value = CURL["history"][CURL["pos"]] if CURL["pos"] < len(CURL["history"]) else ""


# ============================================================================ conformance
async def run_conformance():
    btn = doc.getElementById("conf-btn")
    btn.disabled = True
    total = doc.getElementById("conf-total")
    tbody = doc.querySelector("#conf-table tbody")
    total.textContent = "loading jsonschema…"
    import pyodide_js

    loaded = await pyodide_js.loadPackage(to_js(["jsonschema"]))
    if loaded is not None and len(loaded.to_py()) == 0 and not _has_jsonschema():
        total.textContent = "FAILED: jsonschema could not be loaded from this site"
        btn.disabled = False
        return
    from monitor_protocol.conformance import run_suite
    from monitor_protocol.conformance.inprocess import InProcessTransport

    total.textContent = "running…"
    transport = InProcessTransport.create()  # a fresh in-page memory engine, not the person's log
    report = await run_suite(transport)
    rows = []
    for r in report.results:
        status = r.status.upper()
        rows.append(
            f"<tr data-id='{esc(r.id)}'><td>{esc(r.id)}</td><td>{esc(r.title)}</td>"
            f"<td class='{status}'>{'✓ ' if status == 'PASS' else ('✗ ' if status == 'FAIL' else '– ')}{status}</td>"
            f"<td class='small'>{esc(r.note)}</td></tr>"
        )
    tbody.innerHTML = "".join(rows)
    total.textContent = (
        f"{report.passed} passed, {report.failed} failed, {report.skipped} skipped · {report.seconds:.1f} s"
    )
    total.setAttribute("data-failed", str(report.failed))
    total.setAttribute("data-passed", str(report.passed))
    btn.disabled = False


def _has_jsonschema():
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return False
    return True


# ============================================================================ events
def switch_tab(tab):
    VIEW["tab"] = tab
    for b in doc.querySelectorAll(".tab-btn"):
        active = b.getAttribute("data-tab") == tab
        b.classList.toggle("active", active)
        b.setAttribute("aria-selected", "true" if active else "false")
    for v in doc.querySelectorAll(".view"):
        v.classList.toggle("active", v.id == f"tab-{tab}")
    if tab in ("story", "playground"):
        doc.getElementById(f"slot-{tab}").appendChild(doc.getElementById("live"))


async def dispatch(act, el):
    if act == "define-ci":
        return await define_ci()
    if act == "define-form":
        form = doc.getElementById("define-form")
        caps = [c.value for c in form.querySelectorAll("input[name=cap]") if c.checked]
        types = [t.strip() for t in form.elements.namedItem("types").value.split(",") if t.strip()]
        body = {"capabilities": caps, "types": types}
        for key in ("id", "name", "horizon", "owner", "visibility"):
            v = form.elements.namedItem(key).value.strip()
            if v:
                body[key] = v
        return await define(body)
    if act == "preset":
        fill_publish_form(PRESETS[el.getAttribute("data-preset")])
        return await publish(PRESETS[el.getAttribute("data-preset")])
    if act == "publish":
        return await publish(read_publish_form())
    if act in ("pause", "resume", "retire"):
        return await configure(act)
    if act == "add-reader":
        return await add_reader()
    if act.startswith("r-"):
        name = el.getAttribute("data-reader")
        fn = {
            "r-pull": reader_pull,
            "r-process": reader_process,
            "r-ack": reader_ack,
            "r-crash": reader_crash,
        }
        fn["r-restart"] = reader_restart
        return await fn[act](name)
    if act.startswith("w-"):
        return await lease_action(el.getAttribute("data-worker"), act[2:])
    if act == "lease-deadletter":
        return await dead_letter()
    if act == "story-do":
        i = S.get("step", 0)
        await story_action(STEPS[i]["action"])
        done = set(S.get("story_done", []))
        done.add(i)
        S["story_done"] = sorted(done)
        await save_session()
        render_story()
        return None
    if act in ("story-next", "story-back"):
        S["step"] = max(0, min(len(STEPS) - 1, S.get("step", 0) + (1 if act == "story-next" else -1)))
        doc.getElementById("story-answer").innerHTML = ""
        doc.getElementById("story-answer").className = "answer"
        await save_session()
        render_story()
        return None
    if act == "auto-toggle":
        if not S.get("monitor"):
            return no_monitor("publish-answer")
        AUTO["on"] = not AUTO["on"]
        render_auto()
        if AUTO["on"]:
            asyncio.ensure_future(auto_loop())
        return None
    if act == "curl-run":
        box = doc.getElementById("curl-input")
        cmd = box.value
        box.value = ""
        box.rows = 1
        return await curl_run(cmd)
    if act == "curl-example":
        box = doc.getElementById("curl-input")
        box.value = CURL["examples"][int(el.getAttribute("data-i"))][1]
        box.rows = min(12, box.value.count("\n") + 1)
        box.focus()
        return None
    if act == "conformance-run":
        return await run_conformance()
    if act == "reset":
        return await reset()
    return None


async def reset():
    if ENGINE.mode != "owner":
        js.alert("Reset from the tab that owns the engine.")
        return
    if not js.confirm("Reset the playground? This deletes the saved log and every token from this browser."):
        return
    AUTO["on"] = False
    if ENGINE.ui_idb:
        await MP.idb.clear()
    js.location.reload()


def run_task(coro):
    async def guarded():
        try:
            await coro
            MP.actionsDone = (MP.actionsDone or 0) + 1
        except Exception as exc:  # shown, never swallowed
            MP.actionsFailed = (MP.actionsFailed or 0) + 1
            js.console.error(f"playground action failed: {exc!r}")
            el = doc.getElementById("story-answer")
            el.className = "answer err"
            el.textContent = f"The page failed: {exc!r}"

    return asyncio.ensure_future(guarded())


def on_click(evt):
    target = evt.target.closest("[data-act],[data-tab]") if evt.target.closest else None
    if not target or target.disabled:  # null comes back as a falsy JsNull
        return
    if target.getAttribute("data-tab"):
        switch_tab(target.getAttribute("data-tab"))
        return
    act = target.getAttribute("data-act")
    if act in ("curl-example", "story-next", "story-back", "reset", "auto-toggle"):
        run_task(dispatch(act, target))
        return

    async def locked():
        async with BUSY:
            target.setAttribute("aria-busy", "true")
            try:
                await dispatch(act, target)
            finally:
                target.removeAttribute("aria-busy")

    run_task(locked())


# ============================================================================ timers and tabs
async def ticker():
    while True:
        await asyncio.sleep(1)
        try:
            if ENGINE.mode == "owner":
                await ENGINE.host.sweep()
            if S.get("monitor") and not BUSY.locked():
                await refresh()
            else:
                render_workers()
        except Exception as exc:
            js.console.error(f"playground timer: {exc!r}")


async def take_over_when_free():
    await MP.acquireLock(True)
    await ENGINE.start_owner()
    doc.getElementById("other-tab").setAttribute("hidden", "")
    doc.getElementById("reset-btn").disabled = False
    set_chip()
    await load_session()
    await refresh()


async def load_session():
    S.clear()
    S.update(fresh_session())
    if ENGINE.ui_idb:
        saved = await MP.idb.getUi()
        if saved:
            S.update(json.loads(str(saved)))
    S.pop("shown_token", None)
    S.pop("logsub", None)  # sessions saved before the timeline used the admin door


async def main():
    MP.mark("imports")
    await MP.swReady
    MP.stage("storage", "Opening IndexedDB and taking the writer lock…")
    await ENGINE.open_ui_storage()
    owner = await MP.acquireLock(False)
    if owner:
        await ENGINE.start_owner()
    else:
        ENGINE.mode = "follower"
        banner = doc.getElementById("other-tab")
        banner.textContent = (
            "The playground is open in another tab: that tab's engine owns the log. This tab forwards its "
            "actions to it through the service worker, and takes over when the other tab closes."
        )
        banner.removeAttribute("hidden")
        doc.getElementById("reset-btn").disabled = True
        asyncio.ensure_future(take_over_when_free())
    await load_session()
    await refresh()
    await render_examples()
    set_chip()
    click = create_proxy(on_click)
    doc.addEventListener("click", click)
    doc.getElementById("curl-input").addEventListener("keydown", create_proxy(on_curl_key))
    doc.getElementById("lease-subject").addEventListener("input", create_proxy(lambda e: render_workers()))
    switch_tab("story")
    for b in doc.querySelectorAll(".tab-btn"):
        b.disabled = False
    if ENGINE.mode == "owner":
        doc.getElementById("reset-btn").disabled = False
    doc.getElementById("app").removeAttribute("inert")
    asyncio.ensure_future(ticker())
    MP.stage("ready", "Ready")
