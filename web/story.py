"""The Story: PLAYGROUND.md's lesson, one step at a time, on its own monitor (`builds`, so the README's
quickstart can still create `ci`). Each step has a sentence or two, the principle it shows, one action (Do
it), and what to take away. Panels appear when the story reaches them; the crash is a step of its own, so
the reader is seen crashed, holding nothing, before the same builds come back redelivered."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import actions as a
import js
import model as m
import panels
import ui
from door import ENGINE
from ui import action, el, esc, show

READER = "reader-a"
PROBE_412 = {"type": m.CI_TYPE, "subject": "build-412", "actor": "probe:ci", "data": {"status": "failed"}}
PROBE_413 = {"type": m.CI_TYPE, "subject": "build-413", "actor": "probe:ci", "data": {"status": "passed"}}


@dataclass(frozen=True)
class Step:
    title: str
    text: str
    principle: str
    action: str
    lesson: str
    reveal: tuple[str, ...] = ()  # panels shown from this step on: "readers", "leases", "state"
    # The revealed panels this step works in, shown whole; any other revealed panel is folded to its title
    # (one click shows it), so the step fits one 1280x800 screen (PLAYGROUND.md).
    works_in: tuple[str, ...] = ()
    look: str = (
        ""  # what the step talks about (a CSS selector, its last match): brought into view after Do it
    )


MARKER_LOOK = f"#lanes .lane[data-reader='{READER}'] .mark"  # reader-a's marker, at its cursor
STEPS = [
    Step(
        "Define what is watched",
        "Create the monitor of CI builds. It says up front what it watches and how often, and who may read it.",
        "Even creating a monitor is written in its log: configuration is an observation.",
        "define",
        "A monitor is a definition plus an append-only log. The owner token is shown once: the engine keeps "
        "only its hash.",
        look="#story-token",
    ),
    Step(
        "A probe reports two builds",
        "The CI probe publishes build-412 (failed) and build-413 (passed). Each gets the next seq, with tier "
        "measured and origin probe.",
        "Every observation says who saw it and how much to believe it: a probe measures, it is not a "
        "person's certainty.",
        "probe",
        "Every observation says who saw it (actor, origin) and how much to believe it (tier).",
        look="#log li.obs",
    ),
    Step(
        "Subscribe a reader",
        "reader-a subscribes to the builds. Its marker appears under the log, at its cursor: the start of "
        "the log, because nothing was acknowledged yet.",
        "The log does not wait for readers: it kept the builds before anyone subscribed.",
        "subscribe",
        "A reader's cursor is its own place in the log; the monitor kept everything until it came.",
        ("readers",),
        works_in=("readers",),
        look=MARKER_LOOK,
    ),
    Step(
        "Pull",
        "reader-a pulls. The builds it was given are outlined: it holds them. Look at its marker: the "
        "cursor has not moved.",
        "Reading is not consuming: a pull hands observations out but never moves the reader's place.",
        "pull",
        "Pull never commits. Only an acknowledgement moves the cursor.",
        works_in=("readers",),
        look=MARKER_LOOK,
    ),
    Step(
        "Crash",
        "reader-a crashes before acknowledging. Its lane greys out; what it was holding is gone from its "
        "memory, but the batch stays outlined on the log: delivered, not acknowledged.",
        "A crash loses what a reader held in memory, never what the monitor kept.",
        "crash",
        "The cursor lives in the engine, not in the reader: the crash did not move it.",
        works_in=("readers",),
        look=MARKER_LOOK,
    ),
    Step(
        "Restart and pull again",
        "reader-a restarts with an empty memory and pulls: the same builds come back, flashing, marked "
        "redelivered.",
        "Nothing is lost when a reader dies: what it had not acknowledged comes back (at-least-once). So the "
        "work must be safe to do twice.",
        "restart-pull",
        "At-least-once: nothing is lost, so processing must be idempotent by (source, seq).",
        works_in=("readers",),
        look="#log li.obs.held",
    ),
    Step(
        "Process and acknowledge",
        "reader-a does the work and acknowledges. Watch its marker move past the builds: the cursor is "
        "the next seq reader-a will be given. The next pull is empty, its lag is 0 and its next is head + 1: "
        "past everything there is, the rows its filter skips (such as its own subscription's) included.",
        "Acknowledging commits the reader's place, after the work is done, and the place only moves forward.",
        "process-ack",
        "Ack commits the reader's place; it never moves backwards.",
        works_in=("readers",),
        look=MARKER_LOOK,
    ),
    Step(
        "An agent claims a person's certainty",
        "agent:claude publishes 'passed' with tier src, the tier only a person can assert. It is refused "
        "with TIER_NOT_ASSERTABLE, and the refusal is appended to the log (the ⚠ card).",
        "A machine cannot give itself a person's certainty, and a refusal is itself evidence.",
        "agent-src",
        "A machine cannot give itself a person's certainty, and a refusal is still evidence.",
        look="#log li.obs.rejected",
    ),
    Step(
        "The agent acts on behalf of the owner",
        "The same agent publishes on behalf of human:you, the monitor's owner: accepted, and the card "
        "keeps both names.",
        "Delegation is explicit: an agent may speak for a person only by naming them.",
        "agent-owner",
        "Delegation is explicit: actor and on_behalf_of are both kept.",
        look="#log li.obs",
    ),
    Step(
        "Two workers, one job",
        "worker-a claims the lease on build-412; worker-b tries too and is refused with LEASE_HELD, naming "
        "the holder. Watch the countdown: when it runs out, worker-b can claim it.",
        "A lease shares work without doing the same job twice, and it expires by itself if the holder goes "
        "quiet.",
        "lease",
        "One holder at a time, and a lease expires by itself.",
        ("leases",),
        works_in=("leases",),
        look="#workers .card.worker.holder",
    ),
    Step(
        "Read the state",
        "The state is computed from the log. Its confidence stays null, because inputs are missing, and "
        "the gaps name what is not known. Hover, tap or focus any field to see what it means.",
        "The state says what it does not know instead of showing a confident zero.",
        "state",
        "An unknown value is null, never a confident 0, and each missing input is named.",
        ("state",),
        works_in=("state",),
        look="#panel-state",
    ),
    Step(
        "Reload, then pause",
        "Press Reload the page: it reloads, and everything is still there (IndexedDB). Then Do it pauses "
        "the monitor: the next write is refused with UNAVAILABLE, and both the pause and the refusal are in "
        "the log.",
        "Nothing disappears silently: it survives a reload, a pause is recorded, a refused write is kept.",
        "pause",
        "Configuration is an observation too. Nothing disappears silently.",
        works_in=("state",),
        look="#log li.obs",
    ),
    Step(
        "What next",
        "You have seen the whole cycle. Try it yourself: the Playground has every control and a race "
        "between a reader that trusts notifications and one that keeps a cursor; the curl tab runs the "
        "README's quickstart against this page; the Docs (docs/protocol.md, the whole contract, among them) and "
        "docs/playground.md say the rest. To show someone a moment, do it on the Playground tab and share it "
        "there: a share link replays the Playground's buttons, not the Story's steps.",
        "Durable, shareable, accountable: a monitor keeps what it saw, each reader reads at its own pace, "
        "and every observation says how far to trust it.",
        "next",
        "",
    ),
]


def revealed(i: int) -> set[str]:
    """The panels the Story has reached by step i (the Playground tab shows them all)."""
    return {p for k, st in enumerate(STEPS) if k <= i for p in st.reveal}


def story_reader() -> m.Reader | None:
    return m.S.reader_named(READER, m.STORY_MONITOR)


async def ensure_monitor() -> None:
    if m.S.monitor != m.STORY_MONITOR:
        a.select(m.STORY_MONITOR)
        await ui.refresh()


async def ensure_reader(pairs: list) -> m.Reader | None:
    """reader-a, subscribed and active in the engine (subscribed again if another door retired it)."""
    rd = story_reader()
    view = m.PIC.subscription(rd.sub_id) if rd is not None else None
    if view is None or not view["subscription"].get("active", True):
        r = await a.add_reader(READER, a.BUILD_FILTER, answer="story-answer")
        pairs.append(("subscribe reader-a", r))
        rd = story_reader()
    return rd


MADE_ELSEWHERE = (
    "The builds monitor already exists: another tab of this playground made it, and its owner token is in that "
    "tab. Go on there, or Reset (top bar) to start over in both."
)


async def do(step: Step) -> tuple[list, str]:
    """Run one step's action; returns the calls' answers and a sentence about what happened."""
    pairs: list = []
    say = ""
    if step.action == "define":
        if m.STORY_MONITOR in m.S.owners and m.PIC.exists(m.STORY_MONITOR):
            a.select(m.STORY_MONITOR)
            await ui.refresh()
            return (
                [],
                "The builds monitor already exists (made earlier, in this tab or another): it is on screen.",
            )
        r = await a.define({"id": m.STORY_MONITOR, **a.CI_MONITOR}, answer="define-answer")
        if r.status == 409 and isinstance(r.body, dict) and r.body.get("code") == "DUPLICATE":
            # Another tab made it: the tabs share one engine and log, each keeps its own place in the Story
            await ui.refresh()
            if m.STORY_MONITOR in m.S.owners:
                a.select(m.STORY_MONITOR)
                await ui.refresh()
                return [], (
                    "The builds monitor already exists: another tab of this playground made it, and the tabs "
                    "share one log. It is on screen; press Next."
                )
            pairs.append(("create the builds monitor", r))
            return pairs, MADE_ELSEWHERE
        pairs.append(("create the builds monitor", r))
        say = "Created. Here is its owner token, the only time it is shown:" if r.ok else ""
        return pairs, say
    if step.action == "next":
        return [], ""
    if m.STORY_MONITOR not in m.S.owners:
        return [], "Do step 1 first: the Story needs its monitor."
    await ensure_monitor()
    if step.action == "probe":
        pairs.append(("publish build-412", await a.publish(PROBE_412, "publish-answer")))
        pairs.append(("publish build-413", await a.publish(PROBE_413, "publish-answer")))
        say = "Two builds appended: look at their cards, seq, tier and origin."
    elif step.action == "subscribe":
        r = await a.add_reader(READER, a.BUILD_FILTER, answer="readers-answer")
        pairs.append(("subscribe reader-a", r))
        say = "reader-a's marker is at cursor 0: it will be given everything from the start." if r.ok else ""
    elif step.action == "pull":
        rd = await ensure_reader(pairs)
        if rd.crashed:
            await a.restart(rd)
        pairs.append(("reader-a pulls", await a.pull(rd, answer="readers-answer")))
        say = f"reader-a holds {len(rd.held)} build(s). Its cursor did not move."
    elif step.action == "crash":
        rd = await ensure_reader(pairs)
        if not rd.held and not rd.crashed:
            pairs.append(("reader-a pulls", await a.pull(rd, answer="readers-answer")))
        held = list(rd.held)
        pairs.append(("reader-a crashes", await a.crash(rd, answer="readers-answer")))
        say = f"Crashed while holding {len(held)}: nothing was acknowledged, so the engine still owes them."
    elif step.action == "restart-pull":
        rd = await ensure_reader(pairs)
        if rd.crashed:
            pairs.append(("reader-a restarts", await a.restart(rd, answer="readers-answer")))
        pairs.append(("reader-a pulls again", await a.pull(rd, answer="readers-answer")))
        say = f"The same {len(rd.redelivered)} came back, marked redelivered." if rd.redelivered else ""
    elif step.action == "process-ack":
        rd = await ensure_reader(pairs)
        if rd.crashed:
            await a.restart(rd)
        if not rd.held:
            pairs.append(("reader-a pulls", await a.pull(rd, answer="readers-answer")))
        pairs.append(("reader-a processes", a.process(rd, answer="readers-answer")))
        acked = await a.ack(rd, answer="readers-answer")
        pairs.append(("reader-a acks", acked))
        again = await a.pull(rd, answer="readers-answer")
        pairs.append(("reader-a pulls again", again))
        say = "Acknowledged: the marker moved past the builds, and the next pull is empty."
        if acked.ok and again.ok:
            cursor, nxt, head = acked.body["cursor"], again.body["next"], again.body["head"]
            say = (f"Acknowledged: reader-a's cursor is {cursor}, the next seq it will be given, past the "
                   f"builds. The next pull is empty: its next is {nxt}"
                   + (f" = head {head} + 1, past everything there is (rows its filter skips included)."
                      if nxt == head + 1 else "."))  # fmt: skip
    elif step.action in ("agent-src", "agent-owner"):
        _what, body = a.PRESETS[step.action]
        a.fill_publish_form(body)
        r = await a.publish(body, "publish-answer")
        pairs.append((AGENT_CALLS[step.action], r))
        say = (
            "Refused, and the ⚠ card is the refusal, kept."
            if not r.ok
            else "Accepted: the card says agent:claude for human:you."
        )
    elif step.action == "lease":
        el("lease-subject").value = "build-412"
        pairs.append(("worker-a claims build-412", await a.lease("worker-a", "claim", "build-412", 8)))
        refused = await a.lease("worker-b", "claim", "build-412", 8)
        pairs.append(("worker-b claims build-412", refused))
        await ui.refresh()
        holder = refused.body.get("holder") if isinstance(refused.body, dict) else None
        say = (f"worker-a holds it; worker-b was refused with LEASE_HELD, naming the holder: "
               f"{a.holder_name(holder) if holder else 'worker-a'}. Watch the countdown.")  # fmt: skip
    elif step.action == "state":
        r = await ENGINE.call("GET", f"/monitors/{m.STORY_MONITOR}/state", token=m.S.owner_token())
        pairs.append(("read the state", r))
        await ui.refresh()
        panel = el("panel-state")
        panel.classList.remove("pulse")
        _ = panel.offsetWidth  # restart the CSS animation
        panel.classList.add("pulse")
        say = "confidence.value is null: the inputs it needs are not all present, and the gaps say which."
    elif step.action == "pause":
        el("life-reason").value = "maintenance window"
        pairs.append(("pause the monitor", await a.configure("pause", "maintenance window")))
        pairs.append(("a probe publishes", await a.publish(PROBE_412, "publish-answer")))
        say = "The write was refused, and both the pause and the refusal are cards in the log. Resume it from the Playground."
    return pairs, say


# The calls a step makes that are refused on purpose: the refusal is the lesson.
AGENT_CALLS = {
    "agent-src": "agent:claude publishes with tier src",
    "agent-owner": "agent:claude publishes for human:you",
}
# Each by the refusal that is the lesson: another one (the monitor paused or retired on the Playground tab) is
# not that lesson, and the step is not done.
REFUSED_ON_PURPOSE = {
    AGENT_CALLS["agent-src"]: "TIER_NOT_ASSERTABLE",
    "worker-b claims build-412": "LEASE_HELD",
    "a probe publishes": "UNAVAILABLE",
}


async def story_monitor_halted() -> str | None:
    """ "paused" or "retired" when the Story's monitor is not live (its state says why), else None."""
    r = await ENGINE.call("GET", f"/monitors/{m.STORY_MONITOR}/state", token=m.S.owner_token(m.STORY_MONITOR))
    live = r.body.get("live") if r.ok and isinstance(r.body, dict) else None
    return live.get("reason") if isinstance(live, dict) and live.get("value") is False else None


def as_the_step_says(title: str, reply: Any) -> bool:
    """Whether a call of a step went as the step says: accepted, or refused with the refusal it teaches."""
    if title not in REFUSED_ON_PURPOSE:
        return bool(reply.ok)
    code = reply.body.get("code") if isinstance(reply.body, dict) else None
    return not reply.ok and code == REFUSED_ON_PURPOSE[title]


@action("story-do", answer="story-answer", local_only=True)
async def story_do(_el) -> None:
    i = m.S.step
    if i in m.S.story_done:
        # Done once: again would change what the next steps show (four builds where they say two).
        ui.note(
            "story-answer",
            f"Step {i + 1} is done already; press Next. (Reset, in the top bar, starts over.)",
        )
        return
    pairs, say = await do(STEPS[i])
    failed = [t for t, r in pairs if not as_the_step_says(t, r)]
    if failed and say != MADE_ELSEWHERE:
        say = f"That did not go as the step says ({', '.join(failed)}): the answer says why. Try Do it again."
        halted = await story_monitor_halted()
        if halted:
            say = (
                f"That did not go as the step says ({', '.join(failed)}): the monitor is {halted}, so it "
                "refuses every write. "
                + (
                    "Resume it on the Playground tab, then Do it again."
                    if halted == "paused"
                    else "A retired monitor stays retired: Reset, in the top bar, starts the Story over."
                )
            )
    if pairs:
        show("story-answer", pairs, say)
    elif say:
        ui.note("story-answer", say, ok=not say.startswith("Do step 1"))
    if not failed and not say.startswith("Do step 1"):
        m.S.story_done = sorted(set(m.S.story_done) | {i})
        # The introduction, open at the first step, folds once it is acted on: the token and the answer
        # take its room, and the step still fits one 1280x800 window (its question stays one click away).
        el("intro-box").open = False
    await a.save()
    render()
    LOOK["pending"] = STEPS[i].look  # brought into view by the redraw that ends the action (render)


async def move(delta: int) -> None:
    m.S.step = max(0, min(len(STEPS) - 1, m.S.step + delta))
    box = el("story-answer")
    box.innerHTML = ""
    box.className = "answer"
    if m.S.step > 1:  # the token is shown at the step that minted it and the next, then never again
        m.S.shown_token = None
    await a.save()
    render()
    panels.render_token_box()
    into_view(el("story-title"))  # on a phone, Next from the dock brings the new step's text up


@action("story-up", exclusive=False)
async def story_up(_el) -> None:
    into_view(el("story-title"))


@action("story-reload", exclusive=False, local_only=True)
async def story_reload(_el) -> None:
    """Step 12's reload, for real: the page starts again and says what it found (render, after reload)."""
    js.sessionStorage.setItem(RELOADED_KEY, str(m.S.step))
    js.location.reload()


# ---------------------------------------------------------------------------------------- in view
LOOK: dict[str, str] = {"pending": ""}
DOCK_PX = 64  # the height the phone's step dock takes at the bottom of the screen
EDGE_PX = 4  # how far inside the track's visible edge a marker followed there stops
RELOADED_KEY = "mp-story-reloaded" + (f"--{js.MP.ns}" if str(js.MP.ns or "") else "")


def into_view(node, centre: bool = False) -> None:
    """Scroll the page (and the log's own scroller) just enough that `node` is on screen, clear of the
    step dock; a node out of view vertically is centred. Nothing moves when it is already in view."""
    if not node:
        return
    node.scrollIntoView(ui.js_options(block="nearest", inline="nearest"))
    r = node.getBoundingClientRect()
    if centre or r.top < 0 or r.bottom > js.window.innerHeight - DOCK_PX:
        node.scrollIntoView(ui.js_options(block="center", inline="nearest"))
    track_to_where_it_goes(node)


def still_to_glide(node) -> float:
    """How far `node` has still to travel, in px (negative: to the left): a reader's marker glides to its
    cursor (a transition on `left`), so right after a redraw it is drawn where it was, not where it goes."""
    going, now = str(node.style.left or ""), str(js.window.getComputedStyle(node).left or "")
    if not (going.endswith("px") and now.endswith("px")):
        return 0.0
    try:
        return float(going[:-2]) - float(now[:-2])
    except ValueError:
        return 0.0


def track_to_where_it_goes(node) -> None:
    """Scroll the log's track sideways so that a gliding marker ends on screen (the start of its label
    first, when it cannot all fit); scrollIntoView could only aim at where it was."""
    shift = still_to_glide(node)
    scroller = node.closest(".track")
    if not shift or not scroller:
        return
    r, box = node.getBoundingClientRect(), scroller.getBoundingClientRect()
    left, right = r.left + shift, r.right + shift
    seen_left = box.left + scroller.clientLeft + EDGE_PX  # inside its border, a little clear of it
    seen_right = box.left + scroller.clientLeft + scroller.clientWidth - EDGE_PX
    by = max(0.0, right - seen_right)
    if left - by < seen_left:
        by = left - seen_left
    if by:
        scroller.scrollLeft = scroller.scrollLeft + by


def bring_looked_into_view() -> None:
    selector, LOOK["pending"] = LOOK["pending"], ""
    if not selector:
        return
    found = js.document.querySelectorAll(selector)
    if found.length:
        into_view(found.item(found.length - 1))


@action("story-next", exclusive=False)
async def story_next(_el) -> None:
    await move(1)


@action("story-back", exclusive=False)
async def story_back(_el) -> None:
    await move(-1)


STATE: dict = {"shown": -1, "observer": None, "unfolded_at": -1, "unfolded": set()}  # the step last drawn


def render() -> None:
    i = m.S.step
    step = STEPS[i]
    if STATE["shown"] != i:  # the introduction is open on the first step, folded (one click away) later
        el("intro-box").open = i == 0
        STATE["shown"] = i
    el("story-count").textContent = f"Step {i + 1} of {len(STEPS)}"
    el("story-title").textContent = step.title
    el("story-text").textContent = step.text
    el("story-principle").innerHTML = f"<b>The principle:</b> {esc(step.principle)}"
    done = set(m.S.story_done)
    el("story-dots").innerHTML = "".join(
        f"<span class='{'done' if k in done else ''}{' cur' if k == i else ''}'></span>"
        for k in range(len(STEPS))
    )
    el("story-lesson").textContent = f"✓ Done. {step.lesson}" if i in done and step.lesson else ""
    el("story-next").disabled = i >= len(STEPS) - 1
    el("story-back").disabled = i == 0
    el("story-do").hidden = step.action == "next"
    el("story-reload").hidden = step.action != "pause"
    el("story-links").hidden = step.action != "next"
    el("story-dock-step").textContent = f"{i + 1}/{len(STEPS)} · {step.title}"
    el("story-dock-next").disabled = i >= len(STEPS) - 1
    live = el("live")
    shown = revealed(i)
    if STATE["unfolded_at"] != i:  # a panel shown on request stays shown until the step changes
        STATE["unfolded_at"], STATE["unfolded"] = i, set()
    foldable = folded_at(i)
    for panel in PANELS:
        live.classList.toggle(f"show-{panel}", panel in shown)
        folded = panel in foldable and panel not in STATE["unfolded"]
        live.classList.toggle(f"foldable-{panel}", panel in foldable)
        live.classList.toggle(f"fold-{panel}", folded)
        button = el(f"fold-{panel}")
        button.setAttribute("aria-expanded", "false" if folded else "true")
        button.setAttribute("aria-label", f"{'Show' if folded else 'Hide'} the {panel} panel")
        button.textContent = "show ▾" if folded else "hide ▴"
    bring_looked_into_view()


PANELS = ("readers", "leases", "state")


def folded_at(i: int) -> set[str]:
    """The panels step i folds to their titles: revealed, and not what the step works in."""
    return revealed(i) - set(STEPS[i].works_in)


@action("story-unfold", exclusive=False)
async def story_unfold(button) -> None:
    """A folded panel shown on request (its title's button, which then folds it again), until the step
    changes. The button stays where it is, with the focus on it."""
    STATE["unfolded"] ^= {button.getAttribute("data-panel")}
    render()


async def setup() -> None:
    """The phone's step dock shows while the step's own buttons are off screen; after step 12's reload,
    the Story shows its own monitor again and says what the reload kept."""
    from pyodide.ffi import create_proxy

    def seen(entries, _observer) -> None:
        for entry in entries:
            el("story-dock").hidden = bool(entry.isIntersecting)

    observer = js.IntersectionObserver.new(create_proxy(seen))
    observer.observe(el("story-actions"))
    STATE["observer"] = observer  # held: an observer nobody references may be collected
    reloaded = js.sessionStorage.getItem(RELOADED_KEY)
    if reloaded:
        js.sessionStorage.removeItem(RELOADED_KEY)
        if m.STORY_MONITOR in m.S.owners and m.PIC.exists(m.STORY_MONITOR):
            await ensure_monitor()  # the Playground may have picked another monitor before the reload
        readers = len([r for r in m.S.readers.values() if r.monitor == m.STORY_MONITOR])
        workers = len([w for w in m.S.workers.values() if w.monitor == m.STORY_MONITOR])
        rows = int(((m.PIC.monitor or {}).get("monitor") or {}).get("head") or 0)
        subs = f"{readers} reader(s)" + (f" and {workers} worker(s)" if workers else "")
        ui.note(
            "story-answer",
            f"Reloaded. Everything is still here, read back from IndexedDB: the builds monitor with its "
            f"{rows} row{'' if rows == 1 else 's'}, {subs} with their cursors, and the tokens. Now Do it pauses "
            "the monitor.",
        )
        el("story-answer").setAttribute("data-reloaded", "1")
