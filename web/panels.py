"""The panels beside the track, each drawn from the engine's picture: the monitor picker, the readers (every
subscription of the monitor, whichever door made it), the two lease workers, the state, the owner token."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import model as m
import words
from ui import button, doc, el, esc, put, reasons, set_enabled
from words import tip


def at(ts: Any) -> str:
    """A moment as the local time of day: stable text, so a panel is not rebuilt every second for it."""
    if not ts:
        return "never"
    try:
        t = datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return str(ts)
    return "at " + time.strftime("%H:%M:%S", time.localtime(t))


def render_clocks() -> None:
    """The numbers that change every second (a lease's countdown, the state's ages) are written in place:
    the panels around them are only rebuilt when what they show changed."""
    now = time.time()
    for node in doc.querySelectorAll("[data-until]"):
        node.textContent = f"{max(0, int(round(float(node.getAttribute('data-until')) - now)))}s"
    for node in doc.querySelectorAll("[data-since]"):
        node.textContent = f"{max(0, int(now - float(node.getAttribute('data-since'))))} s"


# ---------------------------------------------------------------------------------------- the picker
def render_picker() -> None:
    pick = el("monitor-pick")
    mons = m.PIC.monitors
    if not mons:
        put(pick, "<option value=''>no monitor yet</option>")
        pick.disabled = True
        el("monitor-pick-note").textContent = ""
        return
    pick.disabled = False
    opts = []
    for mon in mons:
        mine = "" if mon["id"] in m.S.owners else " (read-only here)"
        sel = " selected" if mon["id"] == m.S.monitor else ""
        paused = "" if mon["active"] else " · paused or retired"
        opts.append(
            f"<option value='{esc(mon['id'])}'{sel}>{esc(mon['id'])} · {esc(mon['head'])} rows{paused}{mine}</option>"
        )
    if m.S.monitor is None:
        opts.insert(0, "<option value='' selected>pick a monitor</option>")
    put(pick, "".join(opts))
    note = el("monitor-pick-note")
    if m.S.monitor and m.S.monitor not in m.S.owners:
        note.textContent = (
            "This page does not hold this monitor's owner token (another door made it): you can watch it, "
            "not publish to it."
        )
    else:
        note.textContent = f"{len(mons)} monitor{'s' if len(mons) != 1 else ''} in this engine"


# ---------------------------------------------------------------------------------------- readers
def render_readers() -> None:
    box = el("readers")
    views = [v for v in m.PIC.subscriptions() if v["subscription"]["id"] not in worker_ids()]
    if not views:
        put(box, "<p class='muted small'>No reader yet: + reader subscribes one.</p>")
        return
    words.scope("readers")
    put(box, "".join(reader_card(v) for v in views))


def worker_ids() -> set[str]:
    return {w.sub_id for w in m.S.workers.values() if w.monitor == m.S.monitor}


def reader_card(view: dict[str, Any]) -> str:
    sub = view["subscription"]
    sid = sub["id"]
    rd = m.S.readers.get(sid)
    retired = not sub.get("active", True)
    name = rd.name if rd else sub["subscriber"]
    unacked = view["unacked"]
    lines = [
        f"<div><span class='name'>{esc(name)}</span> <span class='meta'>"
        + (f"{esc(sub['subscriber'])} · " if sub["subscriber"] != name else "")
        + ("made in the curl tab · " if rd and rd.made_by == "curl" else "")
        + ("driven by the race · " if rd and rd.made_by == "race" else "")
        + f"{esc(sid)}</span>"
        + (" <b class='crashed-word'>✖ crashed</b>" if rd and rd.crashed else "")
        + (" <b>retired</b>" if retired else "")
        + "</div>",
        f"<div class='meta'>{tip('cursor')} <b class='cursor'>{esc(sub['cursor'])}</b> "
        f"<span class='cursor-said'>{esc(cursor_said(sub))}</span> · {tip('lag')} "
        f"<b class='lag'>{esc(sub.get('lag'))}</b> · last pull {esc(at(sub.get('last_pull')))}"
        + (
            f" · filter {esc(','.join(sub['filter'].get('types', [])) or sub['filter'])}"
            if sub.get("filter")
            else f" · unfiltered: {tip('⚙ protocol rows', 'protocol')} too"
        )
        + "</div>",
    ]
    if rd and rd.held and not rd.crashed:
        chips = "".join(
            f"<span class='chip-s{' redelivered' if s in rd.redelivered else ''}'>#{s}"
            f"{' ↻' if s in rd.redelivered else ''}</span>"
            for s in rd.held
        )
        lines.append(f"<div class='chips'>{tip('holds', 'held')}: {chips}</div>")
    elif unacked:
        chips = "".join(f"<span class='chip-s'>#{s}</span>" for s in unacked[-20:])
        if len(unacked) > 20 or view.get("unacked_more"):
            chips = "<span class='muted'>older ones… </span>" + chips
        lines.append(f"<div class='chips'>{tip('delivered, not acked', 'unacked')}: {chips}</div>")
    if rd:
        twice = sum(1 for c in rd.processed.values() if c > 1)
        lines.append(f"<div class='meta'>processed {len(rd.processed)} ({twice} twice)</div>")
    if rd is None:
        lines.append(
            "<p class='why-not small'>Made by another door (curl in another tab, a script): this page does "
            "not hold its token, so it can only watch it.</p>"
        )
    elif rd.made_by == "race":
        lines.append(
            "<p class='why-not small'>The race drives this reader: start or stop it in its panel.</p>"
        )
    elif not retired:
        lines.append(reader_buttons(rd))
    cls = "card reader" + (" crashed" if rd and rd.crashed else "") + (" foreign" if rd is None else "")
    return f"<div class='{cls}' data-reader='{esc(name)}' data-sub='{esc(sid)}'>{''.join(lines)}</div>"


def cursor_said(sub: dict[str, Any]) -> str:
    """The cursor in words, where it shows: the next seq this reader gets; at head + 1 it has everything."""
    head = (m.PIC.monitor or {}).get("monitor", {}).get("head")
    cursor = sub.get("cursor")
    if isinstance(head, int) and cursor == head + 1:
        return f"(the next seq it gets: head {head} + 1, it has everything)"
    if cursor in (0, 1):  # seqs start at 1: 0 is "from the beginning", as the protocol writes it
        return "(nothing acknowledged yet: it starts at the first row)"
    return "(the next seq it gets)"


def reader_buttons(rd: m.Reader) -> str:
    crashed = "it crashed: restart it first" if rd.crashed else ""
    nothing = "nothing held: pull first" if not rd.held else ""
    why = {
        "Pull": crashed,
        "Process": crashed or nothing,
        "Ack": crashed or nothing,
        "Crash": "already crashed" if rd.crashed else "",
        "Restart": "" if rd.crashed else "it is running",
    }
    acts = {
        "Pull": "r-pull",
        "Process": "r-process",
        "Ack": "r-ack",
        "Crash": "r-crash",
        "Restart": "r-restart",
    }
    btns = "".join(button(acts[k], k, why[k], reader=rd.name, sub=rd.sub_id) for k in acts)
    shown = [(k, v) for k, v in why.items() if v and k in ("Process", "Ack", "Pull")]
    return f"<div class='btns'>{btns}</div>{reasons(shown[:1])}"


# ---------------------------------------------------------------------------------------- leases
def lease_subject() -> str:
    return str(el("lease-subject").value).strip()


def worker_named(sub_id: str) -> str | None:
    return next((k.split(":", 1)[1] for k, w in m.S.workers.items() if w.sub_id == sub_id), None)


def render_workers() -> None:
    box = el("workers")
    subject = lease_subject()
    lv = next((x for x in m.PIC.leases() if x["lease"]["subject"] == subject), None)
    holder = (lv or {}).get("lease", {}).get("holder") if lv and lv["state"] == "held" else None
    held_by = worker_named(str(holder).removeprefix("sub:")) if holder else None
    until = None
    if lv and lv.get("expires_in_s") is not None:
        until = round(m.PIC.read_at + lv["expires_in_s"])
    own = bool(m.S.owner_token())
    out = []
    for name in ("worker-a", "worker-b"):
        w = m.S.worker(name)
        is_holder = bool(w and holder == "sub:" + w.sub_id)
        if w is None:
            status = "not subscribed yet (its first claim subscribes it)"
        elif is_holder:
            status = f"holds the lease on {subject} ({holder})"
        elif holder:
            status = f"waiting: {held_by or 'another subscription'} holds it ({holder})"
        else:
            status = "free to claim"
        countdown = (
            f" · expires in <span class='countdown' data-until='{until}'></span>"
            if is_holder and until is not None
            else ""
        )
        why = "" if own else "this page does not hold the owner token of this monitor"
        why = why or ("" if subject else "type a subject above first")
        held_why = why or ("" if is_holder else "it does not hold the lease")
        btns = (
            button("w-claim", "Claim", why, worker=name)
            + button("w-complete", "Complete", held_why, worker=name)
            + button("w-release", "Release", held_why, worker=name)
            + button("w-reject", "Reject", held_why, worker=name)
        )
        out.append(
            f"<div class='card worker{' holder' if is_holder else ''}' data-worker='{name}'>"
            f"<div><span class='name'>{'★ ' if is_holder else ''}{name}</span> <span class='meta'>{esc(status)}"
            f"{countdown}</span></div><div class='meta small'>{esc('last: ' + w.last if w and w.last else '')}</div>"
            f"<div class='btns'>{btns}</div></div>"
        )
    if lv and lv["state"] == "dead_lettered":
        out.append(
            f"<p class='small warn-word'>⚠ {esc(subject)} is dead-lettered: claims get DEAD_LETTERED.</p>"
        )
    put(box, "".join(out))


# ---------------------------------------------------------------------------------------- state
def render_state() -> None:
    box = el("state")
    st = m.PIC.state()
    if not st:
        put(box, f"<p class='muted small'>{esc(m.PIC.error or 'No monitor on screen yet.')}</p>")
        return
    live = st["live"]
    lv = (
        f"<span class='live-yes'>● {tip('live')}</span>"
        if live.get("value")
        else f"<span class='live-no'>■ not {tip('live')} ({esc(live.get('reason'))})</span>"
    )
    counters = "".join(f"<dt>{tip(k)}</dt><dd>{esc(v)}</dd>" for k, v in (st.get("counters") or {}).items())
    ages = "".join(
        f"<dt>{tip(k[:-2] if k.endswith('_s') else k)}</dt>"
        f"<dd>{'<span class=unknown>null: unknown</span>' if v is None else since(v)}</dd>"
        for k, v in (st.get("ages") or {}).items()
    )
    source_html = source_markup(st)
    conf = st.get("confidence") or {}
    inputs = conf.get("inputs") or {}
    present = "".join(f"<span class='present'>✓ {esc(x)}</span> " for x in inputs.get("present", []))
    missing = "".join(f"<span class='missing'>? {esc(x)}</span> " for x in inputs.get("missing", []))
    gaps = "".join(f"<span class='gap'>⚠ {tip(g)}</span> " for g in conf.get("gaps", []))
    value = (
        "null: not known while inputs are missing" if conf.get("value") is None else esc(conf.get("value"))
    )
    last = st.get("last") or {}
    words.scope("state")
    put(
        box,
        f"<div>{lv} · {tip('head')} <b>{esc(st.get('head'))}</b> · {tip('as_of_seq')} {esc(st.get('as_of_seq'))}</div>"
        f"<div class='small muted'>last: {esc(last.get('type', '—'))} #{esc(last.get('seq', '—'))}</div>"
        f"<h3>counters</h3><dl>{counters}</dl><h3>ages</h3><dl>{ages}</dl>{source_html}"
        f"<h3>{tip('confidence')}</h3><div class='conf-value'><code>{value}</code></div>"
        f"<div class='chips'>{tip('present')}: {present or '<span class=muted>none</span>'}</div>"
        f"<div class='chips'>{tip('missing')}: {missing or '<span class=muted>none</span>'}</div>"
        f"<h3>{tip('gaps')}</h3><div class='chips' id='gaps'>{gaps or '<span class=muted>none</span>'}</div>",
    )


def source_markup(st: dict[str, Any]) -> str:
    """The state's `source` (docs/sources.md): its kind, and whether it answered last (since when not)."""
    source = st.get("source") or {}
    if not source or source.get("kind") == "log":
        return ""
    answering = source.get("answering")
    if answering is None:
        heard = "<span class=unknown>unknown: nothing heard yet</span>"
    elif answering:
        heard = "✓ yes"
    else:
        quiet = at(source.get("not_answering_since")).removeprefix("at ")
        heard = f"<span class='live-no'>✗ no</span>, quiet since {esc(quiet)}"
    return (
        f"<h3>{tip('source')}</h3><dl><dt>kind</dt><dd>{esc(source.get('kind'))}</dd>"
        f"<dt>{tip('answering')}</dt><dd id='answering'>{heard}</dd></dl>"
    )


def render_state_brief() -> None:
    """What the stale-source scene needs of the state, compact: the two ages that part ways when a source
    stops answering, whether it answers, and the gaps."""
    box = el("state-brief")
    st = m.PIC.state()
    if not st:
        put(box, f"<p class='muted small'>{esc(m.PIC.error or 'No monitor on screen yet.')}</p>")
        return
    words.scope("state")
    ages = st.get("ages") or {}
    shown = "".join(
        f"<dt>{tip(k[:-2])}</dt><dd>{'<span class=unknown>null: unknown</span>' if ages.get(k) is None else since(ages[k])}</dd>"
        for k in ("since_last_observation_s", "since_last_source_contact_s")
    )
    gaps = "".join(
        f"<span class='gap'>⚠ {tip(g)}</span> " for g in (st.get("confidence") or {}).get("gaps", [])
    )
    put(
        box,
        f"<div class='brief-grid'><div><h3>ages</h3><dl>{shown}</dl></div><div>{source_markup(st)}</div></div>"
        f"<h3>{tip('gaps')}</h3><div class='chips' id='gaps'>{gaps or '<span class=muted>none</span>'}</div>",
    )


def since(seconds: Any) -> str:
    """An age from the engine, kept ticking in place (render_clocks) from when it was read."""
    return f"<span data-since='{int(m.PIC.read_at - float(seconds))}'>{esc(seconds)} s</span>"


# ---------------------------------------------------------------------------------------- token and forms
def render_token_box() -> None:
    for box_id in ("token-box", "story-token"):
        box = el(box_id)
        token = m.S.shown_token
        if not token or box is None:
            if box is not None:
                box.setAttribute("hidden", "")
            continue
        box.removeAttribute("hidden")
        words.scope(box_id)
        put(
            box,
            f"<b>{tip('Owner token', 'owner token')} (shown once):</b> <code class='owner-token'>{esc(token)}</code><br>"
            "<span class='muted'>The engine keeps only its hash, so it can never show it again. Whoever holds it "
            "acts as the owner: this page keeps it to publish for you.</span>",
        )


def render_availability() -> None:
    """Static buttons: disabled, with the reason beside them, when they cannot act."""
    no_mon = "" if m.S.monitor else "create or pick a monitor first"
    not_owner = no_mon or ("" if m.S.owner_token() else "this page does not hold this monitor's owner token")
    set_enabled("btn-publish", not_owner)  # allowed while paused, on purpose: the refusal is kept
    set_enabled("btn-add-reader", not_owner)
    types = ((m.PIC.monitor or {}).get("monitor") or {}).get("types") or []
    said = el("reader-filter-said")
    if said is not None:
        said.textContent = ", ".join(types) if types else "(this monitor declares no types: unfiltered)"
    # What the monitor's life allows: a retired monitor stays retired (its state's live.reason says which).
    live = (((m.PIC.monitor or {}).get("state") or {}).get("live")) or {}
    life = "live" if live.get("value", True) else str(live.get("reason") or "")
    for act, refused in (
        ("pause", {"paused": "it is paused already", "retired": "it is retired, for good"}),
        ("resume", {"live": "it is live", "retired": "it is retired, for good"}),
        ("retire", {"retired": "it is retired already"}),
    ):
        set_enabled(f"btn-{act}", not_owner or refused.get(life, ""))
    set_enabled("btn-deadletter", not_owner)


def render_all_panels() -> None:
    render_picker()
    render_readers()
    render_workers()
    render_state()
    render_token_box()
    render_availability()
    render_clocks()
