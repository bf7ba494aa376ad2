"""The log as a track of cards, and every reader as a marker at its cursor, drawn from the engine's picture.

Cards have fixed widths, so a cursor's place on the track is known without measuring the page; the lanes
under the cards are kept from one redraw to the next, so a marker slides to its new place when an ack moves
the cursor (a CSS transition, off under prefers-reduced-motion). The batch a reader was given and has not
acknowledged is a bracket in its lane: solid while the reader holds it, dashed once it crashed."""

from __future__ import annotations

import json
from typing import Any

import model as m
import words
from ui import doc, el, esc, js_options, put

CARD_W = 156  # a user observation's card, px
SUBJECT_FITS = 18  # characters of a subject a card shows on its line; a longer one can be focused to read it
PROTO_W = 96  # a protocol row's card: quieter and narrower
GAP = 8
WINDOW = 80  # cards drawn; older ones are summarised at the left end
# What the track says with no monitor on screen (an embed, which makes its own, says so instead).
EMPTY = "No monitor on screen yet: create one (Story step 1, or the Playground), or pick one above."


def seq_of(o: dict[str, Any]) -> int:
    return int(o.get("id", 0))


def payload(o: dict[str, Any]) -> dict[str, Any]:
    return (o.get("data") or {}).get("payload") or {}


def short_type(t: str) -> str:
    return t[len(m.PROTO) :] if t.startswith(m.PROTO) else t


def summary(o: dict[str, Any]) -> str:
    t = o.get("type", "")
    p = payload(o)
    if t == m.PROTO + "rejected":
        raw = p.get("raw") if isinstance(p.get("raw"), dict) else {}
        sent = ", ".join(f"{k} {raw[k]}" for k in ("actor", "on_behalf_of", "origin", "tier") if k in raw)
        return f"⚠ {p.get('code')}: {p.get('reason', '')}" + (f" (sent: {sent})" if sent else "")
    if t == m.PROTO + "configured":
        return f"{p.get('action')}" + (f" · {p.get('reason')}" if p.get("reason") else "")
    if t == m.PROTO + "subscribed":
        if p.get("seek"):
            return f"seek {p['seek']}"
        return f"{p.get('subscriber')}"
    if t == m.PROTO + "lease":
        dead = " · DEAD LETTER" if p.get("dead_letter") else ""
        return f"{p.get('action')} {p.get('subject')}{dead}"
    if t == m.PROTO + "subscription_retired":
        return f"{p.get('subscriber')} retired"
    if t == m.SOURCE_ROW:
        return f"⚙ source {p.get('action')}" + (f" · {p.get('reason')}" if p.get("reason") else "")
    d = {k: v for k, v in (o.get("data") or {}).items() if k not in ("provenance", "tags")}
    if o.get("origin") == "probe" and d.get("answered") is False:  # a source that did not answer
        return f"✗ not answering: {d.get('reason', '')}"[:120]
    if o.get("origin") == "probe" and d.get("answered") is True and "status" in d:  # a fetch that answered
        value = f" · {json.dumps(d['value'], ensure_ascii=False)}" if "value" in d else ""
        return f"✓ HTTP {d['status']} · {d.get('ms')} ms{value}"[:120]
    return json.dumps(d, ensure_ascii=False)[:120]


def width(o: dict[str, Any]) -> int:
    return PROTO_W if o.get("type", "").startswith(m.PROTO) else CARD_W


class Geometry:
    """Where each drawn card sits on the track, and so where a cursor or a batch sits."""

    def __init__(self, cards: list[dict[str, Any]]) -> None:
        self.lefts: list[tuple[int, int, int]] = []  # (seq, left, width)
        x = 0
        for o in cards:
            w = width(o)
            self.lefts.append((seq_of(o), x, w))
            x += w + GAP
        self.end = x

    def cursor_x(self, cursor: int) -> tuple[int, str]:
        """The marker's x for a cursor (the next seq to be given), and where it is if not on the track."""
        if not self.lefts:
            return 0, ""
        if cursor < self.lefts[0][0]:  # before the first drawn card: older cards are cut off, or none
            return 0, "before" if self.lefts[0][0] > 1 else ""
        for seq, left, _w in self.lefts:
            if seq >= cursor:
                return max(0, left - GAP // 2), ""
        return max(0, self.end - GAP // 2), ""

    def span(self, seqs: list[int]) -> tuple[int, int] | None:
        """The bracket under a batch: from its first drawn card to the end of its last."""
        shown = [(left, w) for seq, left, w in self.lefts if seq in set(seqs)]
        if not shown:
            return None
        start = shown[0][0]
        return start, shown[-1][0] + shown[-1][1] - start


def reader_of(sub_id: str) -> m.Reader | None:
    return m.S.readers.get(sub_id)


def lane_label(view: dict[str, Any]) -> str:
    sub = view["subscription"]
    rd = reader_of(sub["id"])
    worker = next((k.split(":", 1)[1] for k, w in m.S.workers.items() if w.sub_id == sub["id"]), None)
    name = rd.name if rd else (worker or sub["subscriber"])
    return name


def render() -> None:
    box = el("log")
    head = el("log-head")
    if not m.S.monitor or m.PIC.monitor is None:
        put(box, f"<li class='empty muted'>{esc(EMPTY)}</li>")
        head.textContent = ""
        el("lanes").innerHTML = ""
        el("track-inner").style.width = "100%"
        return
    scroller = el("track")
    at_end = scroller.scrollWidth - scroller.scrollLeft - scroller.clientWidth < 80
    log = m.PIC.log
    cards = log[-WINDOW:]
    geo = Geometry(cards)
    held: dict[int, list[str]] = {}
    redelivered: set[int] = set()
    for rd in m.S.readers.values():
        if rd.monitor != m.S.monitor or rd.crashed:
            continue
        for s in rd.held:
            held.setdefault(s, []).append(rd.name)
        redelivered.update(rd.redelivered)
    unacked: set[int] = set()
    for view in m.PIC.subscriptions():
        rd = reader_of(view["subscription"]["id"])
        if rd is None or rd.crashed or not rd.held:
            unacked.update(view["unacked"])
    parts = []
    if len(log) > len(cards) or m.PIC.log_skipped:
        parts.append(f"<li class='more muted small'>{len(log) - len(cards) + m.PIC.log_skipped} earlier</li>")
    for o in cards:
        parts.append(card(o, held, unacked, redelivered))
    put(box, "".join(parts) or "<li class='empty muted'>The log is empty.</li>")
    el("track-inner").style.width = f"{max(geo.end + 40, 200)}px"
    render_lanes(geo)
    mon = m.PIC.monitor["monitor"]
    head.textContent = f"{mon['id']} · head {mon['head']}"
    flashing = [left for seq, left, _w in geo.lefts if m.flashing(seq)]
    if flashing:  # a redelivery just arrived: bring its first card into view, wherever the track was
        scroller.scrollLeft = max(0, flashing[0] - 24)
    elif at_end:
        scroller.scrollLeft = scroller.scrollWidth
    follow_edges(scroller)


_EDGES: list[Any] = []  # the scroll listener's proxy, made once and held (a proxy nobody holds is collected)


def follow_edges(scroller: Any) -> None:
    """A marker scrolled off the track's left side (a phone shows two cards, the newest) is said at that
    side instead: its lane's `edge` label, stuck to the left edge, shows while its marker is out of view."""
    if not _EDGES:
        from pyodide.ffi import create_proxy

        _EDGES.append(create_proxy(lambda _event: edges(scroller)))
        scroller.addEventListener("scroll", _EDGES[0], js_options(passive=True))
    edges(scroller)


def edges(scroller: Any) -> None:
    left = float(scroller.scrollLeft or 0)
    for lane in scroller.querySelectorAll(".lane"):
        x = float(lane.getAttribute("data-x") or 0)
        lane.classList.toggle("off-left", x + 6 < left)


def card(o: dict[str, Any], held: dict[int, list[str]], unacked: set[int], redelivered: set[int]) -> str:
    s = seq_of(o)
    t = o.get("type", "")
    protocol = t.startswith(m.PROTO)
    cls = ["obs"]
    if protocol:
        cls.append("protocol")
    if t == m.PROTO + "rejected":
        cls.append("rejected")
    if s in held:
        cls.append("held")
    elif s in unacked:
        cls.append("unacked")
    if m.flashing(s):
        cls.append("flash")
    prov = (o.get("data") or {}).get("provenance") or {}
    tier = o.get("tier", "")
    who = f"{esc(o.get('origin', ''))} · {esc(o.get('actor', ''))}"
    if prov.get("on_behalf_of"):
        who += f" <b>for</b> {esc(prov['on_behalf_of'])}"
    tags = ""
    if s in redelivered and s in held:
        tags += f"<span class='tag redelivered' title='{words.title('redelivered')}'>↻ redelivered</span>"
    if s in held:
        tags += (
            f"<span class='tag held' title='{words.title('held')}'>held by {esc(', '.join(held[s]))}</span>"
        )
    elif s in unacked:
        tags += f"<span class='tag unacked' title='{words.title('unacked')}'>not acked</span>"
    subject = ""
    if o.get("subject"):
        text = str(o["subject"])
        # One line, cut with an ellipsis; the whole subject on hover (title) and on keyboard focus (CSS).
        focus = " tabindex='0'" if len(text) > SUBJECT_FITS else ""
        subject = f"<span class='subject' title='{esc(text)}'{focus}>{esc(text)}</span>"
    refused = t == m.PROTO + "rejected"
    kind = "protocol" if protocol else "observation"
    if refused:  # the refusal is the point, not the server's own tier (it measured that it refused)
        badge = f"<span class='badge t-refused' title='{words.title('rejected')}'>⚠ refused</span>"
    elif protocol:  # the protocol's own record: no trust level to weigh, so no tier badge
        badge = f"<span class='badge t-protocol' title='{words.title('protocol')}'>⚙ protocol</span>"
    else:
        badge = f"<span class='badge t-{esc(tier)}' title='{words.title(tier)}'>{esc(tier)}</span>"
    # codes such as TIER_NOT_ASSERTABLE wrap at their underscores, never mid-word
    said = esc(summary(o)).replace("_", "_<wbr>")
    return (
        f"<li class='{' '.join(cls)}' data-seq='{s}' data-type='{esc(t)}' title='{words.title(kind)}'>"
        f"<div class='top'><span class='seq'>#{s}</span>{badge}</div>"
        f"<div class='type'>{esc(short_type(t))}</div>{subject}"
        f"<div class='who'>{who}</div><div class='sum'>{said}</div>"
        f"{('<div class=tags>' + tags + '</div>') if tags else ''}</li>"
    )


LABEL_PX_PER_CHAR = 7.5  # a marker label's width per character, generously: the track is made that wide


def at_end(sub: dict[str, Any]) -> str:
    """A cursor that is head + 1 says so: the reader has everything (the next seq is not written yet)."""
    head = (m.PIC.monitor or {}).get("monitor", {}).get("head")
    return " = head+1" if isinstance(head, int) and sub.get("cursor") == head + 1 else ""


def render_lanes(geo: Geometry) -> None:
    lanes = el("lanes")
    keep = set()
    reach = 0.0  # the right end of the widest marker label: the track is made at least that wide
    for view in m.PIC.subscriptions():
        sub = view["subscription"]
        if not sub.get("active", True):
            continue
        sid = sub["id"]
        keep.add(sid)
        lane = el(f"lane-{sid}")
        if lane is None:
            lane = doc.createElement("li")
            lane.id = f"lane-{sid}"
            lane.className = "lane"
            lane.innerHTML = (
                "<span class='bracket'></span><span class='mark'><span class='label'></span></span>"
                "<span class='edge' aria-hidden='true'></span>"
            )
            lanes.appendChild(lane)
        rd = reader_of(sid)
        crashed = bool(rd and rd.crashed)
        lane.className = "lane" + (" crashed" if crashed else "") + ("" if rd else " foreign")
        lane.setAttribute("data-reader", lane_label(view))
        lane.setAttribute("data-cursor", str(sub["cursor"]))
        x, where = geo.cursor_x(int(sub["cursor"]))
        mark = lane.querySelector(".mark")
        mark.style.left = f"{x}px"
        label = f"{'◀ ' if where == 'before' else ''}{lane_label(view)} · cursor {sub['cursor']}{at_end(sub)} · lag {sub.get('lag')}"
        if crashed:
            label += " · ✖ crashed"
        lane.querySelector(".label").textContent = label
        lane.setAttribute("data-x", str(x))
        lane.querySelector(".edge").textContent = "◀ " + label.removeprefix("◀ ")
        # its drawn width when the track is on screen (0 while its tab is hidden: then the estimate)
        reach = max(reach, x + max(LABEL_PX_PER_CHAR * (len(label) + 4), float(mark.offsetWidth or 0) + 4))
        bracket = lane.querySelector(".bracket")
        batch = rd.held if rd and rd.held and not crashed else view["unacked"]
        span = geo.span(batch)
        if span is None:
            bracket.className = "bracket"
            bracket.style.width = "0px"
        else:
            bracket.className = "bracket on" + (" held" if rd and rd.held and not crashed else " dashed")
            bracket.style.left = f"{span[0]}px"
            bracket.style.width = f"{span[1]}px"
    for lane in list(lanes.querySelectorAll(".lane")):
        if lane.id[len("lane-") :] not in keep:
            lane.remove()
    inner = el("track-inner")
    width = str(inner.style.width or "")
    drawn = float(width[:-2]) if width.endswith("px") else 0.0
    if reach + 16 > drawn:
        inner.style.width = f"{int(reach) + 16}px"  # a marker at the end keeps its whole label, its name
