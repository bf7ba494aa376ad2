"""Words for newcomers: the first screen's introduction, and what every badge, tag and state field means
(shown on hover and on keyboard focus). One place, so the Story, the log and the state say the same."""

from __future__ import annotations

import html

INTRO = (
    "A <b>monitor</b> watches something (here: CI builds) and keeps everything it sees in an append-only "
    "log, even when nobody is reading. Each entry is an <b>observation</b>: what was seen, by whom, for "
    "whom, and how much to believe it. Every reader has its own <b>cursor</b>, its place in the log: "
    "reading does not move it, only acknowledging does, so a reader that crashes gets the same observations "
    "again."
)

TIPS: dict[str, str] = {
    # the objects
    "monitor": "A monitor watches one thing and keeps an append-only log of what it saw.",
    "observation": "One entry of a monitor's log: what was seen, who saw it, for whom, and how far to trust it.",
    "cursor": "A reader's place in the log: the next seq it will be given. Pulling does not move it; "
    "acknowledging does.",
    "seq": "The observation's number in this monitor's log: 1, 2, 3... with no gaps.",
    "lag": "How many observations (through this reader's filter) are after its cursor, waiting to be "
    "acknowledged.",
    "held": "Delivered to this reader and not acknowledged yet: if it crashes now, these come back.",
    "unacked": "Delivered, never acknowledged: the reader crashed holding them. The next pull gives them again.",
    "redelivered": "Given before and not acknowledged, so given again: at-least-once. Processing must be "
    "safe to repeat, by (source, seq).",
    "protocol": "A row the protocol itself wrote (ai.mentu.monitor.*: created, subscribed, lease, refused...): "
    "configuration and refusals are observations too. It is the server's own record (origin system), so it "
    "is drawn quieter, with ⚙ instead of a trust badge. A reader without a filter is given these rows too; "
    "filter on the monitor's types to get only yours.",
    "rejected": "A refused write, kept in the log as evidence of what was tried: the refusal's code, and "
    "what the request claimed (sent: ...). The row itself is the server's record, so it carries no trust "
    "level of its own: the claim it refused is what matters.",
    "owner token": "The monitor owner's key, shown once: the engine keeps only its hash.",
    "lease": "A claim on one subject, so two workers never do the same job at once. It expires by itself "
    "if the holder goes quiet.",
    # tiers (how much an observation can carry)
    "tier": "How much an observation can carry, from strongest to weakest: src, measured, derived, "
    "unverified, falsified.",
    "src": "src: a person's own certainty. Only a person (or an agent acting on a person's behalf) can "
    "assert it.",
    "measured": "measured: a machine measured it (a probe, a webhook).",
    "derived": "derived: computed from other observations.",
    "unverified": "unverified: said, but nothing backs it.",
    "falsified": "falsified: shown to be wrong.",
    # provenance
    "origin": "What kind of actor saw it: human, agent, webhook, probe or system.",
    "actor": "Who saw it and published it.",
    "on_behalf_of": "The person an agent acted for: delegation is explicit, and both names are kept.",
    # the state
    "live": "Whether the monitor accepts writes: not live while paused or retired.",
    "head": "The highest seq in the log.",
    "as_of_seq": "The last seq the state was computed from.",
    "observations": "How many observations publishers added: the protocol's own rows and refused writes are "
    "not counted.",
    "delivered": "How many times observations were handed to readers (redeliveries included).",
    "acted": "How many lease jobs were completed.",
    "subscriptions_active": "How many readers are subscribed and active.",
    "since_last_observation": "Seconds since the last observation was appended (null: never).",
    "since_last_pull": "Seconds since any reader last pulled (null: nobody has pulled yet).",
    "since_last_source_contact": "Seconds since the watched source last answered (null: never). A check "
    "published as not answering is kept in the log, but it is no contact.",
    "source": "What the monitor watches (source.kind), and whether it answered last: a probe (mp probe) or "
    "the server (mp serve --sources) runs it.",
    "answering": "Whether the source answered its last check. A source that does not answer is published as "
    "not answering, with the reason: never as a zero.",
    "confidence": "How far the state can be trusted. It stays null (unknown) while any input is missing: "
    "never a confident number made up.",
    "present": "An input the confidence is computed from, and known.",
    "missing": "An input the confidence needs and this engine does not have yet.",
    "gaps": "What the state does not know, named instead of hidden.",
    "independence_unknown": "Nobody has checked whether the observers are independent of each other.",
    "no_event_provenance": "Some observations do not say where they came from.",
    "single_actor": "Everything came from one actor: nothing corroborates it.",
    "stale_source": "The source has been quiet for longer than the monitor's ttl.",
    "no_subscribers": "Nobody is reading this monitor.",
    "unattested_origin": "The monitor was not created with the server's registration token, so who "
    "created it is not attested.",
    "contradictions_open": "Contradictions published and not resolved yet.",
}


_ids = ["tip", 0]  # the scope being drawn and its counter: the same panel drawn twice gets the same ids


def scope(name: str) -> None:
    """Start numbering tooltips for one panel (called before drawing it)."""
    _ids[0], _ids[1] = name, 0


def tip(label: str, key: str | None = None, cls: str = "") -> str:
    """A term that explains itself on hover and on keyboard focus: a small button described by its tooltip
    (so a screen reader reads the explanation too)."""
    text = TIPS.get(key or label)
    if text is None:
        return html.escape(label)
    _ids[1] += 1
    tid = f"tip-{_ids[0]}-{_ids[1]}"
    return (
        f"<span class='gloss-wrap'><button type='button' class='gloss {cls}' aria-describedby='{tid}'>"
        f"{html.escape(label)}</button><span role='tooltip' id='{tid}' class='tip-text'>"
        f"{html.escape(text)}</span></span>"
    )


def title(key: str) -> str:
    """The explanation as a title attribute's value (cards, which are many and not focusable one by one)."""
    return html.escape(TIPS.get(key, ""), quote=True)
