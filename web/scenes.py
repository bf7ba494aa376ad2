"""The embeddable scenes (embed.html?scene=<name>): each one lesson of the playground, on its own monitor,
driven by the playground's own code (actions for the calls, track for the picture, panels for the lease
workers, compare for the race). A scene says what it teaches, how it sets itself up, and its moves: the
buttons, each disabled with its reason when it cannot act now, the next one to try highlighted."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import actions as a
import compare
import model as m
import ui
from monitor_protocol.core import sources
from monitor_protocol.doors.browser import Reply

Pairs = list[tuple[str, Reply]]
READER = "reader-a"
QUIET = "-quiet"  # no element has this id: the reused actions' own answer lines stay unwritten, the
# scene shows all of a move's answers at once in its own line


@dataclass(frozen=True)
class Move:
    key: str  # data-move of its button
    label: str
    run: Callable[[], Awaitable[tuple[Pairs, str]]]  # the calls' answers and a sentence about them
    why_not: Callable[[], str] = lambda: ""  # why it cannot act now ("" when it can)


@dataclass(frozen=True)
class Scene:
    name: str
    title: str
    text: str
    monitor: str
    answer: str  # the answer line's id: the reused modules write to their own (race-answer, lease-answer)
    setup: Callable[[], Awaitable[Pairs]]  # makes the scene's monitor (and readers, workers): the calls made
    moves: tuple[Move, ...] = ()
    suggest: Callable[[], str] = lambda: ""  # the key of the move to try next
    body: str = ""  # controls of a reused module (the race's button, the two workers)
    refused_on_purpose: frozenset[str] = field(default_factory=frozenset)  # calls whose refusal is the lesson


async def ensure_monitor(monitor_id: str, name: str) -> Pairs:
    """The scene's monitor, made once per namespace; then it is the one on screen."""
    if m.PIC.exists(monitor_id) and monitor_id in m.S.owners:
        a.select(monitor_id)
        return []
    r = await a.define({**a.CI_MONITOR, "id": monitor_id, "name": name}, answer=QUIET, show_token=False)
    return [("create the scene's monitor", r)]


# ---------------------------------------------------------------------------------------- redelivery
def reader() -> m.Reader | None:
    return m.S.reader_named(READER, "redelivery")


def lag() -> int:
    rd = reader()
    view = m.PIC.subscription(rd.sub_id) if rd else None
    return int((view or {}).get("subscription", {}).get("lag") or 0)


async def redelivery_setup() -> Pairs:
    pairs = await ensure_monitor("redelivery", "Redelivery after a crash")
    rd = reader()
    view = m.PIC.subscription(rd.sub_id) if rd else None
    if view is None or not view["subscription"].get("active", True):
        pairs.append(("subscribe reader-a", await a.add_reader(READER, a.BUILD_FILTER, answer=QUIET)))
    return pairs


async def publish_builds() -> tuple[Pairs, str]:
    head = int(((m.PIC.monitor or {}).get("monitor") or {}).get("head") or 0)
    pairs = []
    for k in range(3):
        body = {
            "type": m.CI_TYPE,
            "subject": f"build-{500 + head + k}",
            "actor": "probe:ci",
            "data": {"status": "failed" if k == 0 else "passed"},
        }
        pairs.append((f"publish {body['subject']}", await a.publish(body, answer=QUIET)))
    return pairs, "Three builds appended. reader-a's cursor has not moved: nothing was given to it yet."


async def pull() -> tuple[Pairs, str]:
    rd = reader()
    r = await a.pull(rd, answer=QUIET)
    return [
        ("reader-a pulls", r)
    ], f"reader-a holds {len(rd.held)}; its cursor did not move: reading is not consuming."


async def crash() -> tuple[Pairs, str]:
    rd = reader()
    held = len(rd.held)
    r = await a.crash(rd, answer=QUIET)
    return [("reader-a crashes", r)], (
        f"Crashed holding {held}, before acknowledging: its memory is gone, its cursor (in the engine) is not."
    )


async def restart_pull() -> tuple[Pairs, str]:
    rd = reader()
    pairs = [("reader-a restarts", await a.restart(rd, answer=QUIET))]
    pairs.append(("reader-a pulls again", await a.pull(rd, answer=QUIET)))
    return pairs, f"The same {len(rd.redelivered)} came back, marked redelivered: nothing was lost."


async def process_ack() -> tuple[Pairs, str]:
    rd = reader()
    pairs = [("reader-a processes", a.process(rd, answer=QUIET))]
    pairs.append(("reader-a acks", await a.ack(rd, answer=QUIET)))
    return pairs, "Acknowledged after the work: the cursor moved past them, and they will not come back."


def why_pull() -> str:
    rd = reader()
    if rd is None:
        return "the scene is still setting up"
    if rd.crashed:
        return "it crashed: restart it"
    if rd.held:
        return "it already holds a batch: crash or ack"
    return "" if lag() else "nothing to pull: publish first"


def why_crash() -> str:
    rd = reader()
    if rd is None or rd.crashed:
        return "it is down already" if rd else "the scene is still setting up"
    return "" if rd.held else "it holds nothing: pull first"


def why_restart() -> str:
    rd = reader()
    return "" if rd is not None and rd.crashed else "it is running"


def why_ack() -> str:
    rd = reader()
    if rd is None or rd.crashed:
        return "it crashed: restart it" if rd else "the scene is still setting up"
    return "" if rd.held else "nothing held: pull first"


def redelivery_next() -> str:
    rd = reader()
    if rd is None:
        return ""
    if rd.crashed:
        return "restart-pull"
    if rd.held:
        return "ack" if rd.redelivered else "crash"
    return "pull" if lag() else "publish"


# ---------------------------------------------------------------------------------------- refused src
SRC_MONITOR = "refused-src"
SRC_CALL = "agent:claude asserts tier src"
OWNER_CALL = "agent:claude publishes for human:you"
STRANGER_CALL = "agent:claude names human:mallory"


def refusals() -> list[dict[str, Any]]:
    return [o for o in m.PIC.log if o.get("type") == m.PROTO + "rejected"]


def tier_refused() -> bool:
    return any(
        ((o.get("data") or {}).get("payload") or {}).get("code") == "TIER_NOT_ASSERTABLE" for o in refusals()
    )


def delegated() -> bool:
    return any(
        ((o.get("data") or {}).get("provenance") or {}).get("on_behalf_of") == m.OWNER
        for o in m.PIC.log
        if not o.get("type", "").startswith(m.PROTO)
    )


def src_next() -> str:
    """The refusal first, then the delegation; after both, any button is as good as another."""
    if not tier_refused():
        return "agent-src"
    return "" if delegated() else "agent-owner"


async def preset(name: str, title: str) -> tuple[Pairs, str]:
    _what, body = a.PRESETS[name]
    r = await a.publish(body, answer=QUIET)
    if r.ok:
        say = "Accepted: the card keeps both names, agent:claude for human:you, at tier src."
    elif r.body and r.body.get("rejected_seq"):
        say = f"Refused with {a.code(r)}, and the refusal itself is in the log (the ⚠ card, seq {r.body['rejected_seq']})."
    else:
        say = f"Refused: {a.code(r)}."
    return [(title, r)], say


# ---------------------------------------------------------------------------------------- lease
LEASE_MONITOR = "lease"
LEASE_SUBJECT = "build-412"  # the job both workers want (the hidden #lease-subject the reused panel reads)


async def lease_setup() -> Pairs:
    pairs = await ensure_monitor(LEASE_MONITOR, "Two workers, one job")
    if not any(o.get("subject") == LEASE_SUBJECT for o in m.PIC.log):  # a lease covers a published job only
        job = {"type": m.CI_TYPE, "subject": LEASE_SUBJECT, "actor": "probe:ci", "data": {"status": "failed"}}
        pairs.append((f"publish {LEASE_SUBJECT}", await a.publish(job, answer=QUIET)))
    failed = await a.ensure_workers()
    if failed is not None:
        pairs.append(("subscribe the workers", failed))
    return pairs


# ---------------------------------------------------------------------------------------- race
async def race_setup() -> Pairs:
    await compare.setup(answer=QUIET)  # its monitor and cursor reader, kept in the session across reloads
    if compare.RACE.monitor:
        a.select(compare.RACE.monitor)
    return []


# ---------------------------------------------------------------------------------------- stale source
STALE_MONITOR = "stale-source"
HEALTH_TYPE = "com.example.health.check"
STALE_TTL = 5  # seconds: the monitor's ttl_seconds, short so the gap appears while you watch
SILENT_CHECKS = 4  # checks the simulated probe makes while the URL does not answer, CHECK_EVERY apart
CHECK_EVERY = 2  # whole seconds: cadence.heartbeat_seconds is an integer (the published schema)
HEALTH_URL = "https://status.example/healthz"


async def stale_setup() -> Pairs:
    """The health monitor: an http source, checked every 2 s, whose state goes stale after 5 s without an
    answer. The page runs no sources (it is no server): its probe is simulated, below."""
    if m.PIC.exists(STALE_MONITOR) and STALE_MONITOR in m.S.owners:
        a.select(STALE_MONITOR)
        return []
    body = {
        **a.CI_MONITOR,
        "id": STALE_MONITOR,
        "name": "Health check",
        "description": "A probe fetches a health URL every 2 s (simulated in this page)",
        "types": [HEALTH_TYPE],
        "ttl_seconds": STALE_TTL,
        "cadence": {"heartbeat_seconds": CHECK_EVERY},
        "source": {"kind": "http", "ref": HEALTH_URL, "settings": {"pick": "/status"}},
    }
    r = await a.define(body, answer=QUIET, show_token=False)
    return [("create the health monitor", r)]


def health_plan() -> sources.Plan:
    """The plan mp probe would run for this monitor: the same rule book makes the same observations."""
    fallback = {"id": STALE_MONITOR, "types": [HEALTH_TYPE], "source": {"kind": "http", "ref": HEALTH_URL}}
    return sources.plan_of((m.PIC.monitor or {}).get("monitor") or fallback)


def health_rows() -> list[dict[str, Any]]:
    return [o for o in m.PIC.log if o.get("type") == HEALTH_TYPE]


def answered_ever() -> bool:
    return any((o.get("data") or {}).get("answered") is True for o in health_rows())


def quiet_now() -> bool:
    rows = health_rows()
    return bool(rows) and (rows[-1].get("data") or {}).get("answered") is False


def stale() -> bool:
    return "stale_source" in ((m.PIC.state() or {}).get("confidence") or {}).get("gaps", [])


async def check_answers() -> tuple[Pairs, str]:
    ms = random.randint(8, 60)
    body = sources.fetch_body(health_plan(), 200, ms, b'{"status": "up"}', 16)
    r = await a.publish(body, answer=QUIET)
    return [("the probe checks: 200", r)], (
        f"Answered in {ms} ms: one observation, and contact with the source (since_last_source_contact is 0)."
    )


async def check_silent() -> tuple[Pairs, str]:
    """The URL stops answering: the simulated probe goes on checking, every 2 s, and publishes each check
    as not answering. Rows keep arriving, yet the source is quiet: past the ttl, stale_source appears."""
    pairs: Pairs = []
    plan = health_plan()
    for n in range(SILENT_CHECKS):
        if n:
            await asyncio.sleep(CHECK_EVERY)  # the probe's period (simulated): the point of the scene
        body = sources.silent_body(plan, "cannot connect: connection refused (simulated)")
        pairs.append((f"the probe checks: no answer ({n + 1})", await a.publish(body, answer=QUIET)))
        await ui.refresh()  # each check on screen as it lands, and the state read again
    gap = "stale_source is among the gaps" if stale() else "stale_source appears once the ttl has passed"
    return pairs, (
        f"{SILENT_CHECKS} checks, each published as not answering (answered: false, with the reason), never as "
        f"a zero. New rows keep arriving, but none is contact with the source: {gap} (ttl {STALE_TTL} s)."
    )


def why_silent() -> str:
    return "" if answered_ever() else "let the source answer once first"


def why_back() -> str:
    return "" if quiet_now() else "it is answering"


def stale_next() -> str:
    if not answered_ever():
        return "answer"
    return "back" if quiet_now() else "silent"


SCENES: dict[str, Scene] = {
    s.name: s
    for s in (
        Scene(
            "redelivery",
            "Redelivery after a crash",
            "A reader pulls builds, crashes before acknowledging, restarts and pulls again: the same builds "
            "come back, marked redelivered, because only an acknowledgement moves its cursor.",
            "redelivery",
            "scene-answer",
            redelivery_setup,
            (
                Move("publish", "Publish 3 builds", publish_builds),
                Move("pull", "Pull", pull, why_pull),
                Move("crash", "Crash before ack", crash, why_crash),
                Move("restart-pull", "Restart and pull", restart_pull, why_restart),
                Move("ack", "Process and ack", process_ack, why_ack),
            ),
            redelivery_next,
        ),
        Scene(
            "race",
            "Notifications or a cursor?",
            "A producer publishes builds; two readers crash at random. One only hears notifications as they "
            "are sent, the other pulls from its cursor and acks after the work. Count what each loses.",
            "race",
            "race-answer",
            race_setup,
            body=(
                "<div class='row'><button data-act='race-toggle' id='race-btn' class='primary'>Start the race"
                "</button><h2 class='race-h'>The two readers</h2></div><div id='race'></div>"
            ),
        ),
        Scene(
            "lease",
            "Two workers, one job",
            "worker-a claims the lease on build-412; worker-b tries too and is refused with LEASE_HELD, "
            "naming the holder. When worker-a releases it, or the countdown runs out, worker-b can claim it.",
            LEASE_MONITOR,
            "lease-answer",
            lease_setup,
            body=(
                "<div class='row'><input type='hidden' id='lease-subject' value='" + LEASE_SUBJECT + "'>"
                "<label class='small'>lease seconds <input id='lease-seconds' value='8' size='3' "
                "inputmode='numeric'></label></div><div id='workers' class='cards workers'></div>"
            ),
        ),
        Scene(
            "stale-source",
            "A source that stops answering",
            "A probe checks a health URL every 2 s (simulated in this page; the observations are what mp probe "
            "would publish, made by the same rule book). While the URL answers, each check is contact with "
            "the source. When it stops answering, the checks are still published, as not answering, but the "
            "state's age of the last contact grows, and past the monitor's ttl (5 s) the stale_source gap "
            "appears: the state says what it does not know.",
            STALE_MONITOR,
            "scene-answer",
            stale_setup,
            (
                Move("answer", "Check: the URL answers", check_answers),
                Move("silent", "The URL stops answering", check_silent, why_silent),
                Move("back", "The URL answers again", check_answers, why_back),
            ),
            stale_next,
            body="<section class='panel state-brief' aria-labelledby='state-h'><h2 id='state-h'>State</h2>"
            "<div id='state-brief' aria-live='polite'></div></section>",
        ),
        Scene(
            "refused-src",
            "A refused claim of certainty",
            "Tier src is a person's own certainty. An agent that asserts it is refused with "
            "TIER_NOT_ASSERTABLE, and the refusal is kept in the log; the same agent acting on behalf of the "
            "owner, naming them, is accepted.",
            SRC_MONITOR,
            "scene-answer",
            lambda: ensure_monitor(SRC_MONITOR, "A refused src claim"),
            (
                Move("agent-src", "Agent asserts src", lambda: preset("agent-src", SRC_CALL)),
                Move("agent-owner", "Agent for the owner", lambda: preset("agent-owner", OWNER_CALL)),
                Move(
                    "agent-stranger", "Agent for a stranger", lambda: preset("agent-stranger", STRANGER_CALL)
                ),
            ),
            src_next,
            refused_on_purpose=frozenset({SRC_CALL, STRANGER_CALL}),
        ),
    )
}


def moves_markup(scene: Scene) -> str:
    """The scene's buttons: the next one to try is the primary one; a disabled one says why beside it."""
    nxt = scene.suggest()
    btns, why = [], []
    for mv in scene.moves:
        reason = mv.why_not()
        cls = "primary" if mv.key == nxt and not reason else ""
        btns.append(ui.button("scene-move", mv.label, reason, cls, move=mv.key))
        why.append((mv.label, reason))
    return f"<div class='btns'>{''.join(btns)}</div>" + ui.reasons(
        [w for w in why if w[1]][:2]
    )  # two at most


async def run_move(scene: Scene, key: str) -> None:
    mv = next(x for x in scene.moves if x.key == key)
    if mv.why_not():  # the page changed since it was drawn (another tab, a reload): say so, call nothing
        ui.note(scene.answer, f"{mv.label}: not now, {mv.why_not()}.", ok=False)
        return
    pairs, say = await mv.run()
    failed = [t for t, r in pairs if not r.ok and t not in scene.refused_on_purpose]
    if failed:
        say = f"That did not go as planned ({', '.join(failed)}): the answer says why."
    ui.show(scene.answer, pairs, say)


def monitor_of(scene: Scene) -> str:
    return (
        (compare.RACE.monitor or m.S.race_monitor or scene.monitor) if scene.name == "race" else scene.monitor
    )
