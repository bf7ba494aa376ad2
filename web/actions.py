"""What the buttons do. Every engine call goes through the REST router (door.ENGINE.call), so what the page
shows is the real protocol answer; each action's answer lands in its own panel's answer line."""

from __future__ import annotations

import json
from typing import Any

import js
import model as m
import ui
from door import ENGINE
from monitor_protocol.doors.browser import Reply
from ui import action, el, note, show, show_one

CI_MONITOR = {
    "name": "CI builds",
    "description": "Build results reported by the CI probe",
    "horizon": "minute",
    "capabilities": ["observe", "react", "act"],
    "visibility": "private",
    "types": [m.CI_TYPE],
    "owner": m.OWNER,
}
BUILD_FILTER = {"types": [m.CI_TYPE]}
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "probe": (
        "a probe reports a failed build: accepted as measured",
        {"type": m.CI_TYPE, "subject": "build-412", "actor": "probe:ci", "data": {"status": "failed"}},
    ),
    "agent-src": (
        "an agent claims a person's certainty (tier src): refused, and the refusal is kept",
        {
            "type": m.CI_TYPE,
            "subject": "build-412",
            "actor": "agent:claude",
            "tier": "src",
            "data": {"status": "passed"},
        },
    ),
    "agent-owner": (
        "an agent acts on behalf of the owner: accepted, both names kept",
        {
            "type": m.CI_TYPE,
            "subject": "build-412",
            "actor": "agent:claude",
            "on_behalf_of": m.OWNER,
            "origin": "human",
            "tier": "src",
            "data": {"status": "passed", "note": "re-run green, confirmed by you"},
        },
    ),
    "agent-stranger": (
        "an agent names a stranger it does not act for: refused",
        {
            "type": m.CI_TYPE,
            "subject": "build-412",
            "actor": "agent:claude",
            "on_behalf_of": "human:mallory",
            "data": {"status": "passed"},
        },
    ),
}
FORM_KEYS = ("type", "subject", "actor", "on_behalf_of", "tier", "origin")


async def save() -> None:
    """Save the session, merged with what another tab saved meanwhile (both may hold new tokens)."""
    if ENGINE.ui_idb:
        saved = await js.MP.idb.getUi()
        if saved:
            m.S.merged_with(m.Session.from_json(str(saved)))
        await js.MP.idb.putUi(m.S.to_json())


def code(r: Reply) -> str:
    return str((r.body or {}).get("code", "")) if isinstance(r.body, dict) else ""


def holder_name(holder: str) -> str:
    """A lease holder (`sub:<subscription id>`) as a person reads it: the worker's or reader's name, and the
    id (the engine names the subscription; the page knows which of its workers that is)."""
    sid = str(holder).removeprefix("sub:")
    name = next((k.split(":", 1)[1] for k, w in m.S.workers.items() if w.sub_id == sid), None)
    if name is None and sid in m.S.readers:
        name = m.S.readers[sid].name
    if name is None:
        view = m.PIC.subscription(sid)
        name = view["subscription"]["subscriber"] if view else None
    return f"{name} ({holder})" if name else str(holder)


# ---------------------------------------------------------------------------------------- monitors
async def define(body: dict[str, Any], answer: str = "define-answer", show_token: bool = True) -> Reply:
    r = await ENGINE.call("POST", "/monitors", body)
    if r.status == 201:
        mid = r.body["monitor"]["id"]
        m.S.owners[mid] = r.body["owner_token"]
        m.S.shown_token = r.body["owner_token"] if show_token else None
        select(mid)
        await save()
        say = f"Monitor {mid} created." + (
            " Its owner token is shown once, in the box." if show_token else ""
        )
        show_one(answer, "POST /monitors", r, say)
    elif code(r) == "DUPLICATE" and body.get("id") in m.S.owners:
        select(body["id"])
        show_one(answer, "POST /monitors", r, f"{body['id']} already exists, and this page holds its owner token: "
                 "it is on screen now.")  # fmt: skip
    else:  # the refusal's own sentence first, as a publish's: the JSON below says the rest
        said = r.body.get("error") if isinstance(r.body, dict) else None
        show_one(answer, "POST /monitors", r, f"Refused ({code(r) or r.status}): {said}" if said else "")
    await ui.refresh()
    return r


def select(monitor_id: str | None) -> None:
    if monitor_id != m.S.monitor:
        m.S.monitor = monitor_id
        m.PIC.log = []
        m.PIC.log_of = None


def free_id(base: str) -> str:
    """`base`, or the first of base-2, base-3... that no monitor of this engine has taken."""
    if not m.PIC.exists(base):
        return base
    n = 2
    while m.PIC.exists(f"{base}-{n}"):
        n += 1
    return f"{base}-{n}"


@action("define-ci", answer="define-answer")
async def define_ci(_el) -> Reply:
    """The CI example: `ci` when free, or on screen if this page made it; otherwise the next free id."""
    if m.PIC.exists("ci") and "ci" in m.S.owners:
        select("ci")
        await ui.refresh()
        note("define-answer", "ci already exists and this page holds its owner token: it is on screen.")
        return Reply(200, {})
    return await define({"id": free_id("ci"), **CI_MONITOR})


@action("define-form", answer="define-answer")
async def define_form(_el) -> Reply:
    form = el("define-form")
    caps = [c.value for c in form.querySelectorAll("input[name=cap]") if c.checked]
    types = [t.strip() for t in form.elements.namedItem("types").value.split(",") if t.strip()]
    body: dict[str, Any] = {"capabilities": caps, "types": types}
    for key in ("id", "name", "horizon", "owner", "visibility"):
        v = form.elements.namedItem(key).value.strip()
        if v:
            body[key] = v
    return await define(body)


async def pick(value: str) -> None:
    """Show the monitor chosen in the picker. The value is the one the change event carried: read later,
    a redraw in between (the timer's, another action's) could have put the old choice back."""
    select(value or None)
    m.S.shown_token = None
    await save()
    await ui.refresh()
    js.MP.picked = value  # done (tests wait on it: another action may finish while this one runs)


async def configure(act: str, reason: str, answer: str = "define-answer") -> Reply:
    r = await ENGINE.call(
        "POST", f"/monitors/{m.S.monitor}/{act}", {"reason": reason}, token=m.S.owner_token()
    )
    says = {
        "pause": "Paused: writes are refused (and each refusal is kept in the log) until you resume.",
        "resume": "Live again: writes are accepted.",
        "retire": "Retired for good: its leases are released, and writes are refused from now on.",
    }
    show_one(answer, f"POST {act}", r, says[act] if r.ok else "")
    await ui.refresh()
    return r


def life_reason(act: str) -> str:
    """The lifecycle form's reason (the action's name when it is left empty)."""
    return str(el("life-reason").value).strip() or act


async def retire_asked() -> Reply | None:
    """Retire, once asked: it cannot be undone (writes are refused for good; the Story cannot go on with it)."""
    if not js.confirm(f"Retire {m.S.monitor}? It cannot be undone: every write is refused from now on."):
        return None
    return await configure("retire", life_reason("retire"))


for _act in ("pause", "resume"):
    action(_act, answer="define-answer")(lambda _el, a=_act: configure(a, life_reason(a)))
action("retire", answer="define-answer")(lambda _el: retire_asked())


# ---------------------------------------------------------------------------------------- publishing
async def publish(body: dict[str, Any], answer: str = "publish-answer") -> Reply:
    r = await ENGINE.call("POST", f"/monitors/{m.S.monitor}/observations", body, token=m.S.owner_token())
    seq = None
    if r.status == 201:
        obs, seq = r.body["observation"], r.body["seq"]
        say = f"Appended as seq {seq}: tier {obs.get('tier')}, origin {obs.get('origin')}."
    elif isinstance(r.body, dict) and r.body.get("rejected_seq"):
        seq = r.body["rejected_seq"]
        say = f"Refused ({code(r)}), and the refusal itself is in the log as seq {seq}."
    else:
        say = f"Refused: {code(r)}."
    show_one(answer, "POST observations", r, say, seq if answer == "publish-answer" else None)
    await ui.refresh()
    return r


@action("to-card", exclusive=False)
async def to_card(button) -> None:
    """The card a publish appended, brought into the window: on the Playground tab the log is below the
    forms, and the card appeared where a newcomer did not see it (found by a tester)."""
    card = js.document.querySelector(f"#log li.obs[data-seq='{int(button.getAttribute('data-seq'))}']")
    (card or el("log")).scrollIntoView(ui.js_options(block="center", inline="nearest"))


def fill_publish_form(body: dict[str, Any]) -> None:
    form = el("publish-form")
    for key in FORM_KEYS:
        form.elements.namedItem(key).value = body.get(key, "")
    form.elements.namedItem("data").value = json.dumps(body.get("data", {}))


class FormProblem(ValueError):
    """A form value the page will not send; the message says what to type instead."""


def read_publish_form() -> dict[str, Any]:
    """The publish form as a request body; FormProblem when `data` is not JSON (where it breaks, said)."""
    form = el("publish-form")
    body: dict[str, Any] = {}
    for key in FORM_KEYS:
        v = form.elements.namedItem(key).value.strip()
        if v:
            body[key] = v
    raw = form.elements.namedItem("data").value.strip()
    if raw:
        try:
            body["data"] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise FormProblem(
                f"data is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno} "
                f"(near {raw[max(0, exc.pos - 8) : exc.pos + 8]!r}). Nothing was sent. Type an object such as "
                '{"status": "failed"}.'
            ) from None
    return body


@action("preset", exclusive=False)
async def preset(target) -> None:
    name = target.getAttribute("data-preset")
    what, body = PRESETS[name]
    fill_publish_form(body)
    note("publish-answer", f"Preset filled in: {what}. Nothing is sent until you press Publish.")


@action("publish", answer="publish-answer")
async def publish_form(_el) -> Reply:
    try:
        body = read_publish_form()
    except FormProblem as problem:
        note("publish-answer", str(problem), ok=False)
        return Reply(400, {"code": "INVALID", "error": str(problem)})
    return await publish(body)


# ---------------------------------------------------------------------------------------- readers
async def add_reader(
    name: str | None = None, flt: dict | None = None, answer: str = "readers-answer"
) -> Reply:
    mine = [r for r in m.S.readers.values() if r.monitor == m.S.monitor]
    if name is None:
        taken = {r.name for r in mine}
        name = next(f"reader-{c}" for c in "abcdefghijklmnopqrstuvwxyz" if f"reader-{c}" not in taken)
    existing = m.S.reader_named(name, m.S.monitor)
    view = m.PIC.subscription(existing.sub_id) if existing is not None else None
    if view is not None and view["subscription"].get("active", True):
        r = Reply(200, {"note": f"{name} is already subscribed", "subscription": existing.sub_id})
        show_one(answer, f"subscribe {name}", r, f"{name} is already subscribed.")
        return r
    # New, or retired (or gone) in the engine: subscribing again, with the owner token, brings it back.
    body: dict[str, Any] = {"monitor": m.S.monitor, "subscriber": f"agent:{name}"}
    if existing is None:
        body["from"] = "earliest"  # a returning one keeps its cursor (an explicit earlier `from` is refused)
    if flt:
        body["filter"] = flt
    r = await ENGINE.call("POST", "/subscriptions", body, token=m.S.owner_token())
    if r.status == 201:
        sub = r.body["subscription"]
        if existing is not None and existing.sub_id != sub["id"]:
            m.S.readers.pop(existing.sub_id, None)
        m.S.readers[sub["id"]] = m.Reader(sub["id"], name, r.body["token"], m.S.monitor)
        await save()
        sees = (f"filtered to {', '.join(flt['types'])}: it gets only those" if flt and flt.get("types")
                else "unfiltered: it gets every row, the protocol's own (⚙ created, subscribed, lease...) too")  # fmt: skip
        say = f"{name} subscribed, {sees}. Its cursor is {sub['cursor']}: the next seq it will be given."
        show_one(answer, f"subscribe {name}", r, say)
    else:
        show_one(answer, f"subscribe {name}", r)
    await ui.refresh()
    return r


def reader_filter() -> dict[str, Any] | None:
    """The "+ reader" filter: the monitor's declared types (the default), or none (the protocol's own rows
    too) when the person unticks it."""
    box = el("reader-filter-types")
    types = list(((m.PIC.monitor or {}).get("monitor") or {}).get("types") or [])
    return {"types": types} if box is not None and box.checked and types else None


@action("add-reader", answer="readers-answer")
async def add_reader_btn(_el) -> Reply:
    return await add_reader(flt=reader_filter())


def reader_for(target) -> m.Reader:
    return m.S.readers[target.getAttribute("data-sub")]


async def pull(rd: m.Reader, limit: int = 20, answer: str = "readers-answer") -> Reply:
    r = await ENGINE.call("GET", f"/subscriptions/{rd.sub_id}/pull", token=rd.token, query={"limit": limit})
    if r.status == 200:
        obs = r.body["observations"]
        rd.held = [int(o["id"]) for o in obs]
        rd.redelivered = [int(o["id"]) for o in obs if o.get("redelivered")]
        rd.next = r.body["next"]
        m.flash(rd.redelivered)
        await save()
        if not obs:
            say = f"Nothing new for {rd.name}: lag 0. Its cursor is {r.body['cursor']}: the next seq it will be given."
            if r.body["next"] == r.body["head"] + 1:
                say += (f" The reply's next is {r.body['next']} = head {r.body['head']} + 1: past everything there "
                        "is (rows its filter skips included), where an ack would put it.")  # fmt: skip
        elif rd.redelivered:
            say = (f"{rd.name} got {len(obs)} again, marked redelivered: it never acknowledged them. Its cursor is "
                   f"still {r.body['cursor']}.")  # fmt: skip
        else:
            say = f"{rd.name} holds {len(obs)}; its cursor has not moved ({r.body['cursor']}): reading is not consuming."
        show_one(answer, f"{rd.name} pulls", r, say)
    else:
        show_one(answer, f"{rd.name} pulls", r)
    await ui.refresh()
    return r


def process(rd: m.Reader, answer: str = "readers-answer") -> Reply:
    for s in rd.held:
        rd.processed[str(s)] = rd.processed.get(str(s), 0) + 1
    twice = [s for s in rd.held if rd.processed[str(s)] > 1]
    r = Reply(200, {"processed": rd.held, "twice": twice})
    say = f"{rd.name} did the work for {len(rd.held)} observation(s)"
    say += f"; {len(twice)} for the second time (so the work must be safe to repeat)." if twice else "."
    show_one(answer, f"{rd.name} processes", r, say)
    return r


async def ack(rd: m.Reader, answer: str = "readers-answer") -> Reply:
    r = await ENGINE.call("POST", f"/subscriptions/{rd.sub_id}/ack", {"cursor": rd.next}, token=rd.token)
    if r.status == 200:
        rd.held, rd.redelivered, rd.next = [], [], None
        await save()
        head = int(((m.PIC.monitor or {}).get("monitor") or {}).get("head") or 0)
        at = r.body["cursor"]
        where = (f" It has everything up to head {head}, so it sits at head + 1." if at == head + 1
                 else "")  # fmt: skip
        show_one(answer, f"{rd.name} acks", r, f"The cursor moved to {at}, the next seq {rd.name} will be "
                 f"given: those before it will not come back.{where}")  # fmt: skip
    else:
        show_one(answer, f"{rd.name} acks", r)
    await ui.refresh()
    return r


async def crash(rd: m.Reader, answer: str = "readers-answer") -> Reply:
    lost = list(rd.held)
    rd.crashed = True
    rd.held, rd.redelivered, rd.next = [], [], None
    await save()
    r = Reply(200, {"crashed": rd.name, "was_holding": lost})
    show_one(answer, f"{rd.name} crashes", r, "Its memory is gone, its batch with it. Its cursor is in the "
             "engine, where it was: nothing was acknowledged.")  # fmt: skip
    await ui.refresh()
    return r


async def restart(rd: m.Reader, answer: str = "readers-answer") -> Reply:
    rd.crashed = False
    await save()
    r = Reply(200, {"restarted": rd.name})
    show_one(answer, f"{rd.name} restarts", r, "Running again, with an empty memory: the next pull starts from "
             "its cursor.")  # fmt: skip
    await ui.refresh()
    return r


async def process_and_save(rd: m.Reader) -> Reply:
    r = process(rd)
    await save()
    await ui.refresh()
    return r


READER_ACTS = {
    "r-pull": pull,
    "r-process": process_and_save,
    "r-ack": ack,
    "r-crash": crash,
    "r-restart": restart,
}
for _act, _run in READER_ACTS.items():
    action(_act, answer="readers-answer")(lambda target, run=_run: run(reader_for(target)))


# ---------------------------------------------------------------------------------------- leases
async def ensure_workers() -> Reply | None:
    for name in ("worker-a", "worker-b"):
        if m.S.worker(name) is not None:
            continue
        body = {
            "monitor": m.S.monitor,
            "subscriber": f"agent:{name}",
            "capabilities": ["observe", "act"],
            "from": "head",
        }
        r = await ENGINE.call("POST", "/subscriptions", body, token=m.S.owner_token())
        if r.status != 201:
            return r
        m.S.set_worker(name, m.Worker(r.body["subscription"]["id"], r.body["token"], m.S.monitor))
    await save()
    return None


async def lease(worker: str, act: str, subject: str, seconds: int = 8) -> Reply:
    failed = await ensure_workers()
    if failed is not None:
        return failed
    w = m.S.worker(worker)
    body: dict[str, Any] = {"subject": subject}
    if act == "claim":
        body["lease_duration_seconds"] = seconds
    elif act == "complete":
        body["outcome"] = "done"
    elif act == "reject":
        body["reason"] = "the build cannot be fixed here"
    r = await ENGINE.call("POST", f"/subscriptions/{w.sub_id}/leases/{act}", body, token=w.token)
    w.last = f"{act}: {r.status} {'OK' if r.ok else code(r)}"
    await save()
    return r


LEASE_SECONDS_DEFAULT, LEASE_SECONDS_MAX = 8, 86400
BAD_SECONDS = "Type the lease's duration in whole seconds, 1 to 86400 (e.g. 8): nothing was sent."


def lease_seconds() -> int | None:
    """The seconds typed in the Leases panel (8 when left empty); None when they are not a whole number of
    1..86400: the page never sends something else than what was typed (it made -5 a 1 s lease, "abc" 8 s)."""
    text = str(el("lease-seconds").value).strip()
    if not text:
        return LEASE_SECONDS_DEFAULT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= LEASE_SECONDS_MAX:
        return None
    return int(text)


LEASE_SAY = {
    "claim": "{w} holds {s} now, for {n} s unless renewed.",
    "complete": "{w} finished {s}: the lease is free and the outcome is in the log.",
    "release": "{w} gave {s} up: another worker may claim it.",
    "reject": "{w} could not do {s}: the attempt is counted; at the limit the job is dead-lettered.",
}


NO_SUBJECT = "Type the subject to lease first (the job's name, e.g. build-412): nothing was sent."


def lease_subject() -> str:
    """The subject typed in the Leases panel ("" when empty: the page never picks one silently)."""
    return str(el("lease-subject").value).strip()


async def lease_button(target) -> Reply:
    """A worker card's button: the subject and seconds typed in the Leases panel."""
    worker = target.getAttribute("data-worker")
    act = target.getAttribute("data-act")[2:]
    subject, seconds = lease_subject(), lease_seconds()
    if not subject or seconds is None:
        said = NO_SUBJECT if not subject else BAD_SECONDS
        note("lease-answer", said, ok=False)
        return Reply(400, {"code": "INVALID", "error": said})
    r = await lease(worker, act, subject, seconds)
    if r.ok:
        say = LEASE_SAY[act].format(w=worker, s=subject, n=seconds)
    elif code(r) == "LEASE_HELD":
        holder = (r.body or {}).get("holder")
        say = (f"Refused: {subject} is held by {holder_name(holder) if holder else 'another worker'}. Wait for "
               "it to expire or be released.")  # fmt: skip
    else:
        say = ""
    show_one("lease-answer", f"{worker} {act} {subject}", r, say)
    await ui.refresh()
    return r


for _act in ("claim", "complete", "release", "reject"):
    action(f"w-{_act}", answer="lease-answer")(lease_button)


@action("lease-deadletter", answer="lease-answer")
async def dead_letter_btn(_el) -> Reply:
    subject, seconds = lease_subject(), lease_seconds()
    if not subject or seconds is None:
        said = NO_SUBJECT if not subject else BAD_SECONDS
        note("lease-answer", said, ok=False)
        return Reply(400, {"code": "INVALID", "error": said})
    return await dead_letter(subject, seconds)


async def dead_letter(subject: str, seconds: int) -> Reply:
    """Reject the same subject until the delivery count limit dead-letters it, then show a claim refused."""
    pairs = []
    for _ in range(6):
        c = await lease("worker-a", "claim", subject, seconds)
        if not c.ok:
            pairs.append((f"worker-a claims {subject}", c))
            if code(c) == "LEASE_HELD":  # someone else works on it: nothing was rejected, say so
                holder = holder_name(str((c.body or {}).get("holder") or "another worker"))
                show("lease-answer", pairs, f"{holder} holds {subject}: nothing was rejected. Release it "
                     "(or let its lease run out), then reject ×5.")  # fmt: skip
                await ui.refresh()
                return c
            break
        r = await lease("worker-a", "reject", subject)
        pairs.append((f"worker-a rejects {subject}", r))
        if not r.ok or r.body.get("dead_letter"):
            break
    final = await lease("worker-b", "claim", subject, seconds)
    pairs.append((f"worker-b claims {subject}", final))
    # The engine's count of failed attempts (rejections here, and any expiry before them), not this loop's.
    last = next((r for t, r in reversed(pairs) if "rejects" in t and r.ok), None)
    attempts = ((last.body or {}).get("lease") or {}).get("attempts") if last is not None else None
    if code(final) == "DEAD_LETTERED":
        said = f"After {attempts} failed attempt(s), the engine's count," if attempts else "Now"
        say = f"{said} {subject} is dead-lettered: nobody gets it again."
    else:
        say = f"{subject} is not dead-lettered: {code(final) or 'the claim was accepted'}."
    show("lease-answer", pairs[-2:], say)
    await ui.refresh()
    return final
