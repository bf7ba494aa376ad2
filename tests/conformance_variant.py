"""A variant server for the conformance tests: this project's engine behind a thin transport that behaves
the way another implementation of the protocol legitimately may, written from the differences issue 24
reports (no other implementation's code was read or fetched).

`VariantTransport` speaks the suite's Transport interface. Underneath is the real engine (a memory store
that also records the order of every append, in-process, fake clock); on the way in and out the transport
rewrites what a different, still conformant, server would do differently (BEHAVIOURS), one switch each:

- `global_seqs`: seqs are numbered across all monitors, with gaps where other tenants' rows took numbers;
  a monitor's seqs jump, its log does not start at 1, and `next` is the last returned seq + 1 (section 8),
  so it may name no row of this monitor. Every seq and cursor in a reply is rewritten, and every cursor,
  seq and `upto_seq` in a request rewritten back (REST only: this variant's /rpc door is the engine's).
- `cursor_floor`: a cursor below the first retained seq is 410 CURSOR_EXPIRED, even on a monitor never
  compacted (its retention_floor is its first seq), so cursor 0 is refused; a new subscription's cursor is
  served as that floor.
- `declared_types`: a filter (at subscribe or inline on a pull) naming a type the monitor did not declare
  is 400 INVALID_FILTER naming known_types, even on a monitor that declares none.
- `text_cursor`: an ack's cursor sent as text of ASCII digits ("3") is read as that integer.
- `vocab_in_error`: UNKNOWN_VOCABULARY names the value in its sentence ("invalid capabilities: fly") and
  `known`, with no `invalid` field.
- `ack_current`: an ack (re-sent or not) answers the monitor's current head and the reader's current lag;
  a re-sent ack's cursor is the prior one.
- `retired_closed`: a retired monitor refuses a new subscription, 409 UNAVAILABLE (section 5 does not list
  it among the subscribe refusals, nor says a retired monitor takes one).
- `time_offset`: times are served as `...+00:00` (RFC 3339 UTC with milliseconds, spelled otherwise).
- `raw_text`: a rejected row keeps `raw` as the request body's JSON text.
- `negative_backwards`: an ack of -1 is 409 CURSOR_BACKWARDS (an integer, below the cursor) and a pull
  `cursor=-1` is read from the beginning.
- `cursor_one`: a pull says `cursor: 1` where the subscription's cursor is 0 (the same place, section 8).

BREAKS are variants that really break a published rule, for the published profile's positive controls:
`ack_backwards` (a lower ack moves the cursor back: P4, C06), `dead_text_cursor` (a cursor "abc" is taken
and leaves a dead subscription whose cursor is null: C27), `pull_commits` (a pull commits like an ack:
P4, C05), `filtered_head` (a filtered reader's head is its last delivered seq: P5, C07),
`tokenless_writes` (an ack, pause or resume without a token is done with the token the variant remembers:
section 5, C23), `disjoint_empty` (an inline filter disjoint from the subscription's is an empty page, not
400 INVALID_FILTER: section 8, C08), `no_subscriber` (subscriptions are served without `subscriber`,
which the published schema requires: C29).

`served_over_http(variant)` puts a variant behind a small HTTP server (standard library, one engine
thread), so `mp conform --base` can judge it over real sockets; give that variant a `WallClock`.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from monitor_protocol.conformance.inprocess import InProcessTransport
from monitor_protocol.conformance.transport import API_PREFIX, Reply
from monitor_protocol.core.store_contract import Changes
from monitor_protocol.store.memory import MemoryStore

BEHAVIOURS = {
    "global_seqs": "seqs numbered across all monitors, with gaps",
    "cursor_floor": "a cursor below the first retained seq (0 included) is 410 CURSOR_EXPIRED",
    "declared_types": "a filter type the monitor did not declare is 400 INVALID_FILTER",
    "text_cursor": 'an ack cursor "3" is read as 3',
    "vocab_in_error": "UNKNOWN_VOCABULARY names the value in its sentence, not in `invalid`",
    "ack_current": "an ack answers the current head and lag",
    "retired_closed": "a retired monitor refuses a new subscription, 409 UNAVAILABLE",
    "time_offset": "times end in +00:00, not Z",
    "raw_text": "a rejected row keeps the refused body as its JSON text",
    "negative_backwards": "an ack of -1 is CURSOR_BACKWARDS; a pull from -1 starts at the beginning",
    "cursor_one": "a pull says cursor 1 where the subscription's cursor is 0",
}
BREAKS = {
    "ack_backwards": "an ack below the cursor moves it back",
    "dead_text_cursor": 'an ack cursor "abc" is taken and leaves a dead subscription',
    "pull_commits": "a pull commits its page like an ack",
    "filtered_head": "a filtered reader's head is the last seq it was delivered",
    "tokenless_writes": "an ack, pause or resume without a token is done anyway",
    "disjoint_empty": "a disjoint inline filter is an empty page",
    "no_subscriber": "subscriptions are served without subscriber",
}
PROTOCOL_PREFIX = "ai.mentu.monitor."
MONITOR_KEYS = {"id", "horizon", "capabilities", "visibility", "owner"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class RecordingStore(MemoryStore):
    """A memory store that tells `on_append(monitor, seq)` about every appended row, in commit order, once
    its transaction commits (a rolled-back call appended nothing)."""

    def __init__(self, on_append: Any) -> None:
        super().__init__()
        self._on_append = on_append
        self._depth = 0
        self._appended: list[tuple[str, int]] = []

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._depth += 1
        try:
            with super().transaction():
                yield
        except BaseException:
            if self._depth == 1:
                self._appended.clear()
            raise
        finally:
            self._depth -= 1
        if self._depth == 0:
            done, self._appended = self._appended, []
            for monitor, seq in done:
                self._on_append(monitor, seq)

    def apply(self, changes: Changes) -> None:
        if self._depth:  # the engine's one apply per call, inside its transaction
            self._appended.extend((o.monitor, o.seq) for o in changes.observations)
        super().apply(changes)


class Numbering:
    """Each monitor's rows in the variant's numbering: `glob[m][l - 1]` is the variant's seq of the
    engine's seq `l`. Without `global_seqs` the numbering is the engine's own."""

    def __init__(self, global_seqs: bool, floor_cursor: bool, start: int = 100) -> None:
        self.global_seqs = global_seqs
        self.floor_cursor = floor_cursor
        self.glob: dict[str, list[int]] = {}
        self.counter = start
        self.appends = 0

    def record(self, monitor: str, seq: int) -> None:
        rows = self.glob.setdefault(monitor, [])
        if seq != len(rows) + 1:
            raise AssertionError(f"the engine appended seq {seq} to {monitor} after {len(rows)}")
        if self.global_seqs:
            self.appends += 1
            self.counter += 1 + self.appends % 2  # every other append, another tenant took a number
            rows.append(self.counter)
        else:
            rows.append(seq)

    def seq(self, m: str | None, local: Any) -> Any:
        """A row's seq (or a head) as the variant serves it."""
        rows = self.glob.get(m or "")
        if not rows or not _is_int(local):
            return local
        if 1 <= local <= len(rows):
            return rows[local - 1]
        return self.cursor(m, local)

    def cursor(self, m: str | None, local: Any) -> Any:
        """A position (the next seq to deliver) as the variant serves it: the lowest of the numbers that
        mean the same position, so `next` is the last returned seq + 1."""
        rows = self.glob.get(m or "")
        if not rows or not _is_int(local):
            return local
        if local <= 1:
            return rows[0] if (self.global_seqs or self.floor_cursor) else local
        if local <= len(rows) + 1:
            return rows[local - 2] + 1
        return rows[-1] + (local - len(rows))

    def to_cursor(self, m: str | None, served: Any) -> Any:
        """A position the client sent, in the engine's numbering (the first row at or after it)."""
        rows = self.glob.get(m or "")
        if not rows or not _is_int(served) or served <= 0:
            return served
        i = bisect.bisect_left(rows, served)
        return i + 1 if i < len(rows) else len(rows) + (served - rows[-1])

    def to_seq(self, m: str | None, served: Any) -> Any:
        """A row's seq the client sent, in the engine's numbering (unchanged when it names no row)."""
        rows = self.glob.get(m or "")
        if not rows or not _is_int(served):
            return served
        i = bisect.bisect_left(rows, served)
        return i + 1 if i < len(rows) and rows[i] == served else served

    def to_upto(self, m: str | None, served: Any) -> Any:
        """An inclusive upper bound (compaction's upto_seq): the last row at or below it."""
        rows = self.glob.get(m or "")
        if not rows or not _is_int(served):
            return served
        n = bisect.bisect_right(rows, served)
        return n if n else served


class VariantTransport:
    """The engine behind the variant's rewrites; `behaviours` and `breaks` are subsets of BEHAVIOURS and
    BREAKS (default: every behaviour, no break)."""

    supports_origin = True
    real_http = False

    def __init__(
        self, behaviours: Iterable[str] | None = None, breaks: Iterable[str] = (), clock: Any = None
    ) -> None:
        self.on = set(BEHAVIOURS if behaviours is None else behaviours)
        self.breaks = set(breaks)
        unknown = (self.on - set(BEHAVIOURS)) | (self.breaks - set(BREAKS))
        if unknown:
            raise ValueError(f"unknown variant switches {sorted(unknown)}")
        self.n = Numbering("global_seqs" in self.on, "cursor_floor" in self.on)
        self.store = RecordingStore(self.n.record)
        self.inner = InProcessTransport.create(store=self.store, clock=clock)
        self.admin_token = self.inner.admin_token
        self.registration_token = self.inner.registration_token
        self.name = "variant(" + ", ".join(sorted(self.on | self.breaks)) + ")"
        self.dead: set[str] = set()
        self.tokens: dict[str, str] = {}  # monitor or subscription id -> its token (tokenless_writes)

    # ---- the Transport interface ---------------------------------------------------------------------
    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)

    async def race(self, requests: list[dict[str, Any]]) -> list[Reply]:
        return [await self.request(**kw) for kw in requests]

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        token: str | None = None,
        query: Any = None,
        headers: dict[str, str] | None = None,
        raw_body: bytes | None = None,
    ) -> Reply:
        method = method.upper()
        parts = path.split("?")[0].strip("/").split("/")
        body = copy.deepcopy(body)
        q = dict(query.items() if isinstance(query, dict) else (query or []))
        m = self._monitor_of(parts, body)
        route = self._route(method, parts)
        echo: dict[str, Any] = {}
        early = self._inbound(route, parts, m, body, q, echo)
        if early is not None:
            return early
        tokenless = token is None and "tokenless_writes" in self.breaks and method == "POST"
        if tokenless and len(parts) == 3 and parts[2] in ("ack", "pause", "resume"):
            token = self.tokens.get(parts[1])
        reply = await self.inner.request(
            method, path, body=body, token=token, query=q or None, headers=headers, raw_body=raw_body
        )
        reply = await self._broken(route, parts, m, body, q, token, reply)
        self._remember(route, parts, reply)
        out = self._out(reply.body, m, echo)
        out = self._respelled(route, out, echo)
        if route == "ack" and reply.status == 200 and "ack_current" in self.on and isinstance(out, dict):
            out["head"] = self.n.seq(m, self.store.get_monitor(m).head)
            info = await self.inner.request("GET", f"/subscriptions/{parts[1]}", token=token)
            out["lag"] = info.get("lag", out.get("lag"))
        if route == "pull" and reply.status == 200 and "filtered_head" in self.breaks:
            sub = self.store.get_subscription(parts[1])
            if sub is not None and sub.filter and out["observations"]:
                out["head"] = int(out["observations"][-1]["id"])
        if "vocab_in_error" in self.on:
            out = self._vocab(out)
        return Reply(reply.status, out, reply.headers)

    # ---- requests ------------------------------------------------------------------------------------
    @staticmethod
    def _route(method: str, parts: list[str]) -> str:
        if parts[0] == "subscriptions" and len(parts) == 3 and parts[2] in ("ack", "pull", "seek"):
            return parts[2] if (parts[2] != "pull" or method == "GET") else "pull-post"
        if parts == ["subscriptions"] and method == "POST":
            return "subscribe"
        if parts[0] == "monitors" and len(parts) == 3 and parts[2] == "observations":
            return "publish"
        if parts == ["admin", "compact"]:
            return "compact"
        return ""

    def _monitor_of(self, parts: list[str], body: Any) -> str | None:
        if parts[0] == "monitors" and len(parts) >= 2:
            return parts[1]
        if parts[0] == "subscriptions" and len(parts) >= 2:
            sub = self.store.get_subscription(parts[1])
            return sub.monitor if sub is not None else None
        if isinstance(body, dict) and isinstance(body.get("monitor"), str):
            return body["monitor"]
        return None

    def _inbound(
        self, route: str, parts: list[str], m: str | None, body: Any, q: dict[str, Any], echo: dict[str, Any]
    ) -> Reply | None:
        """Rewrite a request into the engine's numbering; answer at once where the variant refuses."""
        if route == "ack" and isinstance(body, dict):
            c = body.get("cursor")
            if "negative_backwards" in self.on and _is_int(c) and c < 0:
                sub = self.store.get_subscription(parts[1])
                if sub is not None:
                    return Reply(
                        409,
                        {
                            "code": "CURSOR_BACKWARDS",
                            "error": f"ack {c} is below the cursor; acks only move forward",
                            "done": [],
                            "cursor": self.n.cursor(m, sub.cursor),
                            "requested": c,
                            "head": self.n.seq(m, self.store.get_monitor(m).head),
                        },
                    )
            if "text_cursor" in self.on and isinstance(c, str) and c.isascii() and c.isdigit():
                c = int(c)
            if "dead_text_cursor" in self.breaks and not _is_int(c):
                self.dead.add(parts[1])
                return Reply(200, {"subscription": parts[1], "cursor": None, "head": None, "lag": None})
            if _is_int(c):
                echo["requested"] = c
                c = self.n.to_cursor(m, c)
            body["cursor"] = c
        elif route == "pull":
            if parts[1] in self.dead:
                return Reply(200, {"subscription": parts[1], "monitor": m, "cursor": None, "next": None,
                                   "head": None, "lag": None, "observations": []})  # fmt: skip
            c = q.get("cursor")
            if "negative_backwards" in self.on and c == "-1":
                c = q["cursor"] = 0 if "cursor_floor" not in self.on else self.n.cursor(m, 1)
                echo["negative"] = True
            if isinstance(c, str) and c.isascii() and c.isdigit():
                c = int(c)
            if _is_int(c):
                echo["requested"] = c
                rec = self.store.get_monitor(m) if m else None
                floor = self.n.cursor(m, rec.floor) if rec is not None else None
                if "cursor_floor" in self.on and floor is not None and c < floor:
                    return self._expired(m, floor, c)
                q["cursor"] = self.n.to_cursor(m, c)
            if "declared_types" in self.on and "types" in q:
                types = q["types"] if isinstance(q["types"], list) else [q["types"]]
                refused = self._undeclared(m, types)
                if refused is not None:
                    return refused
            if "disjoint_empty" in self.breaks and "types" in q:
                sub = self.store.get_subscription(parts[1])
                wanted = set(q["types"] if isinstance(q["types"], list) else [q["types"]])
                theirs = (sub.filter or {}).get("types") if sub is not None else None
                if isinstance(theirs, list) and theirs and not wanted & set(theirs):
                    q["types"] = theirs  # read as the subscription's own, then nothing is delivered
                    echo["empty"] = True
        elif route == "seek" and isinstance(body, dict):
            body["cursor"] = self.n.to_cursor(m, body.get("cursor"))
        elif route == "subscribe" and isinstance(body, dict):
            rec = self.store.get_monitor(m) if m else None
            if "retired_closed" in self.on and rec is not None and rec.status.value == "retired":
                return Reply(
                    409,
                    {
                        "code": "UNAVAILABLE",
                        "error": f"monitor {m} is retired: no new subscriptions",
                        "done": [],
                    },
                )
            if _is_int(body.get("from")):
                body["from"] = self.n.to_cursor(m, body["from"])
            if "declared_types" in self.on:
                filters = body.get("filter")
                for flt in filters if isinstance(filters, list) else [filters]:
                    if isinstance(flt, dict) and isinstance(flt.get("types"), list):
                        refused = self._undeclared(m, flt["types"])
                        if refused is not None:
                            return refused
        elif route == "publish" and isinstance(body, dict) and isinstance(body.get("supersedes"), dict):
            sup = body["supersedes"]
            src, sid = sup.get("source"), sup.get("id")
            if isinstance(src, str) and src.startswith("monitor:") and isinstance(sid, str) and sid.isdigit():
                sup["id"] = str(self.n.to_seq(src[len("monitor:") :], int(sid)))
        elif route == "compact" and isinstance(body, dict):
            body["upto_seq"] = self.n.to_upto(m, body.get("upto_seq"))
        return None

    def _expired(self, m: str | None, floor: int, requested: int) -> Reply:
        return Reply(
            410,
            {
                "code": "CURSOR_EXPIRED",
                "error": f"cursor {requested} is below the retention floor {floor} of {m}; relist.",
                "done": [],
                "retention_floor": floor,
                "relist": f"monitors/state?id={m}",
                "requested": requested,
            },
        )

    def _undeclared(self, m: str | None, types: list[Any]) -> Reply | None:
        rec = self.store.get_monitor(m) if m else None
        if rec is None:
            return None  # the engine says NOT_FOUND
        declared = list(rec.types)
        bad = [
            t for t in types if not (isinstance(t, str) and (t in declared or t.startswith(PROTOCOL_PREFIX)))
        ]
        if not bad:
            return None
        return Reply(
            400,
            {
                "code": "INVALID_FILTER",
                "error": f"filter types {bad} are not declared by monitor {m}",
                "done": [],
                "known_types": declared,
            },
        )

    async def _broken(
        self,
        route: str,
        parts: list[str],
        m: str | None,
        body: Any,
        q: dict[str, Any],
        token: str | None,
        reply: Reply,
    ) -> Reply:
        if route == "ack" and reply.code == "CURSOR_BACKWARDS" and "ack_backwards" in self.breaks:
            seek = {"cursor": body["cursor"], "reason": "the variant moves an ack back"}
            await self.inner.request("POST", f"/subscriptions/{parts[1]}/seek", body=seek, token=token)
            head = self.store.get_monitor(m).head
            return Reply(200, {"subscription": parts[1], "cursor": body["cursor"], "head": head, "lag": 0})
        if route == "pull" and reply.status == 200 and "pull_commits" in self.breaks and "cursor" not in q:
            ack = {"cursor": reply.body["next"]}
            await self.inner.request("POST", f"/subscriptions/{parts[1]}/ack", body=ack, token=token)
        return reply

    def _remember(self, route: str, parts: list[str], reply: Reply) -> None:
        body = reply.body if isinstance(reply.body, dict) else {}
        if reply.status == 201 and parts == ["monitors"] and isinstance(body.get("monitor"), dict):
            self.tokens[body["monitor"]["id"]] = body["owner_token"]
        if reply.status == 201 and route == "subscribe" and isinstance(body.get("subscription"), dict):
            self.tokens[body["subscription"]["id"]] = body["token"]

    def _respelled(self, route: str, out: Any, echo: dict[str, Any]) -> Any:
        """What the reply's other spellings change, after the numbering (time, raw, cursor, subscriber)."""
        if route == "pull" and isinstance(out, dict):
            if echo.get("empty"):
                out["observations"] = []
            if "cursor_one" in self.on and out.get("cursor") == 0:
                out["cursor"] = 1
        if {"time_offset", "raw_text"} & self.on or "no_subscriber" in self.breaks:
            out = self._walk(out)
        return out

    def _walk(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self._walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        node = {k: self._walk(v) for k, v in node.items()}
        if "specversion" in node:
            t = node.get("time")
            if "time_offset" in self.on and isinstance(t, str) and t.endswith("Z"):
                node["time"] = t[:-1] + "+00:00"
            p = (node.get("data") or {}).get("payload")
            if "raw_text" in self.on and isinstance(p, dict) and "raw" in p and not isinstance(p["raw"], str):
                p["raw"] = json.dumps(p["raw"])
        if "no_subscriber" in self.breaks and str(node.get("id", "")).startswith("sub-") and "cursor" in node:
            node.pop("subscriber", None)
        return node

    # ---- replies -------------------------------------------------------------------------------------
    def _out(self, node: Any, m: str | None, echo: dict[str, Any]) -> Any:
        if isinstance(node, list):
            return [self._out(x, m, echo) for x in node]
        if not isinstance(node, dict):
            return node
        if "specversion" in node:
            return self._observation(node)
        node = dict(node)
        if node.keys() >= MONITOR_KEYS:
            node["head"] = self.n.seq(node["id"], node.get("head"))
            return node
        if "as_of" in node and "confidence" in node:
            mm = node.get("monitor")
            for key in ("head", "as_of_seq"):
                node[key] = self.n.seq(mm, node.get(key))
            node["retention_floor"] = self.n.cursor(mm, node.get("retention_floor"))
            if isinstance(node.get("last"), dict):
                node["last"] = {**node["last"], "seq": self.n.seq(mm, node["last"].get("seq"))}
            if isinstance(node.get("computed_from"), dict):
                cf = node["computed_from"]
                node["computed_from"] = {
                    "seq_from": self.n.cursor(mm, cf.get("seq_from")),
                    "seq_to": self.n.seq(mm, cf.get("seq_to")),
                }
            return node
        mm = node["monitor"] if isinstance(node.get("monitor"), str) else m
        for key, value in node.items():
            if key in ("cursor", "next", "retention_floor", "cursor_kept"):
                node[key] = self.n.cursor(mm, value)
            elif key in ("head", "seq", "rejected_seq"):
                node[key] = self.n.seq(mm, value)
            elif key == "requested":
                node[key] = echo.get("requested", self.n.cursor(mm, value))
            elif key in ("observation", "observations", "monitor", "monitors", "subscription", "compacted"):
                node[key] = self._out(value, mm, echo)
        return node

    def _observation(self, obs: dict[str, Any]) -> dict[str, Any]:
        obs = copy.deepcopy(obs)
        src = obs.get("source") or ""
        m = src[len("monitor:") :] if src.startswith("monitor:") else None
        if isinstance(obs.get("id"), str) and obs["id"].isdigit():
            served = self.n.seq(m, int(obs["id"]))
            obs["id"], obs["sequence"] = str(served), str(served).zfill(20)
        data = obs.get("data") if isinstance(obs.get("data"), dict) else {}
        sup = (data.get("provenance") or {}).get("supersedes")
        if isinstance(sup, dict) and isinstance(sup.get("id"), str) and sup["id"].isdigit():
            other = sup.get("source") or ""
            target = other[len("monitor:") :] if other.startswith("monitor:") else m
            sup["id"] = str(self.n.seq(target, int(sup["id"])))
        p = data.get("payload")
        if str(obs.get("type", "")).startswith(PROTOCOL_PREFIX) and isinstance(p, dict):
            if "cursor" in p:
                p["cursor"] = self.n.cursor(m, p["cursor"])
            if isinstance(p.get("seek"), dict):
                p["seek"] = {k: self.n.cursor(m, v) for k, v in p["seek"].items()}
            if obs["type"] == PROTOCOL_PREFIX + "bookmark":
                p["from"], p["to"] = self.n.cursor(m, p.get("from")), self.n.seq(m, p.get("to"))
            if isinstance(p.get("after"), dict):
                p["after"] = self._out(p["after"], m, {})
        return obs

    def _vocab(self, node: Any) -> Any:
        if isinstance(node, dict) and node.get("code") == "UNKNOWN_VOCABULARY" and "invalid" in node:
            node = dict(node)
            field = node.pop("field", "value")
            node["error"] = f"invalid {field}: {node.pop('invalid')}"
        return node


class WallClock:
    """The real time, for a variant served over HTTP (the suite really waits there; nothing advances it)."""

    def __call__(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        """Real time passes by itself."""


def _body_of(raw: bytes) -> tuple[Any, bytes | None]:
    """A request body as JSON the variant can rewrite, or the raw bytes where it is not plain JSON."""
    if not raw:
        return None, None

    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(raw, parse_constant=refuse), None
    except (ValueError, UnicodeDecodeError):
        return None, raw


@contextmanager
def served_over_http(variant: VariantTransport) -> Iterator[str]:
    """Serve `variant` at http://127.0.0.1:<port> (routes under /mp/v0) until the block ends. Every request
    runs on one event-loop thread, one at a time, as the engine expects."""
    loop = asyncio.new_event_loop()
    engine = threading.Thread(target=loop.run_forever, name="variant-engine", daemon=True)
    engine.start()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet: the suite's report says what happened
            pass

        def _answer(self) -> None:
            url = urlsplit(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not url.path.startswith(API_PREFIX):
                reply = Reply(
                    404, {"code": "NOT_FOUND", "error": f"routes live under {API_PREFIX}", "done": []}
                )
            else:
                auth = self.headers.get("Authorization") or ""
                token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() in ("origin", "access-control-request-method")
                }
                query: dict[str, Any] = {}
                for key, value in parse_qsl(url.query, keep_blank_values=True):
                    query[key] = (
                        [*query[key], value]
                        if isinstance(query.get(key), list)
                        else ([query[key], value] if key in query else value)
                    )
                body, raw_body = _body_of(raw)
                call = variant.request(
                    self.command, url.path[len(API_PREFIX) :] or "/", body=body, raw_body=raw_body,
                    token=token, query=query, headers=headers,
                )  # fmt: skip
                reply = asyncio.run_coroutine_threadsafe(call, loop).result(timeout=60)
            data = b"" if reply.body is None else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                if key.lower() not in ("content-length", "content-type", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_OPTIONS = do_PUT = do_DELETE = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.serve_forever, name="variant-http", daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)
        engine.join(timeout=10)
