"""Share and restore: a monitor's log exported as CloudEvents JSON Lines, and such a file imported into a
NEW monitor (Issue 14, item 3). Standard library only: it runs on Pyodide as well as under CPython.

Export: every retained observation of one monitor, in seq order, one compact JSON object per line, each
exactly the CloudEvent a pull serves (without `redelivered`). Nothing else is in the file: the monitor id and
the time go in the file name (`export_name`).

Import: every line is checked by the rules below, all in `check_log` (one place); if ANY line is refused,
nothing is written and the refusal lists every refused line (`refused: [{line, reason}]`, at most
MAX_REFUSED_LISTED of them, `refused_count` says how many in all). Else one engine call, one store
transaction, writes the monitor and all its rows: a failure half way leaves nothing.

The rules, per line (numbered from 1 as in the file; blank lines are skipped):
  R1  the line is strict JSON (RFC 8259: no NaN, no integer beyond 2^53, at most 32 levels deep);
  R2  it is a JSON object;
  R3  it validates against the project's observation schema (schemas/observation.json, checked here by
      a small validator of the keywords that schema uses, so no jsonschema is needed in the engine);
  R4  `id` is the decimal seq and `sequence` the same seq zero-padded to 20 digits;
  R5  the envelope agrees with its provenance (origin, tier, verified, actor; wasAttributedTo is
      on_behalf_of or actor);
  R6  `source` is `monitor:<id>`, the same on every line (the monitor the log came from);
  R7  seqs are dense: the first line is seq 1 (a log whose start was compacted cannot be copied: its
      counters could not be recomputed) and each line is the previous seq + 1 (a lower or equal seq is
      "not strictly increasing", a higher one means lines are missing);
  R8  the first line is `ai.mentu.monitor.configured` with action `create`; no later line creates again;
      each later configured row's action is one the monitor's lifecycle allows from where it was
      (states.MONITOR_TRANSITIONS), its `after` is an object naming the same id and owner, and the last
      one's definition passes the same validation as a create or update;
  R9  a protocol-written type (ai.mentu.monitor.*, except the publishable contradiction types, and this
      project's python.monitor-protocol.source, the supervision of a source the server ran) is one of
      the server's own, with the server's provenance (origin system, tier measured, machine_verified)
      and a `data.payload` object;
  R10 a published observation makes no claim a publish could not have made: not while the monitor was
      paused or retired, and the publish it stands for (type, subject, data, tags, provenance, time,
      references) passes the publish path's own checks (wire.check, then publishing.validate_publish with
      the monitor's owner and types and this engine's clock): a declared type, names of at most 256
      characters, provenance within the ceilings of section 6 for the owner of that monitor, a `time` at
      most 300 s ahead of now; and at most MAX_PUBLISH_BYTES (1 MiB, the publish path's own limit, whatever
      the door) plus what the row's server-made fields add (IMPORT_SLACK_BYTES). An import never launders
      a claim, nor brings in more than a publish could;
  R11 a protocol row is the server's own record, so it claims only what the server writes: no
      on_behalf_of and no references (source_ref, rule, wasDerivedFrom, supersedes), data.tags exactly
      {"monitor": <id>}, a subject of at most 256 characters, at most MAX_PROTOCOL_ROW_BYTES (16 KiB: the
      largest the server writes is a configured row carrying an 8 KiB definition and a 1 KiB reason), a
      time by a server's clock (not before 1970, at most 300 s ahead of now; a configured row's `created`
      and `updated` too), a configured row written as the owner and a rejected row as system:guard;
  R12 no row claims `attested: true` unless the import itself is attested (it carried this server's
      registration token): a copy cannot vouch for owners this server never checked.

How the copy maps to the new monitor: seq, `id`, `sequence`, type, subject, time, actor, origin, tier,
verified, horizon and data (provenance included) are kept as recorded: an import is a copy of evidence,
not new claims. Only the monitor's address changes: `source` becomes `monitor:<new id>`, and the new id
replaces the old one in `data.tags.monitor` on protocol rows and in `data.payload.after.id` on configured
rows (both address the monitor), so a copy is itself a consistent log that can be exported and copied
again. Every other payload field is kept as recorded (`before_digest` is the digest of the original's
definition, subscription ids name the original's readers).
The monitor: its definition, version, owner, created and updated come from the last configured row; its
status (active, paused, retired) from the lifecycle of its configured rows; a fresh owner token (and a
subscribe token for a shared monitor) is minted and returned once. `attested` is this engine's disclosure,
not a copied claim: true only when the import itself carried this server's registration token.
Counters are recomputed from the rows, as the original computed them: observations (published rows),
rejected, acted (lease completions), contradictions; `last` and `covers_until` come from the time the
server received the last published row, which the copy reads from the log: the row's recorded time, but
never earlier than a protocol row written before it (a publisher's `time` is its claim, and may be old). Not imported: subscriptions, leases (held or dead-lettered), idempotency keys and
the counters of deliveries (`delivered` starts at 0: deliveries to readers are not events in the log), and
this engine never heard from the source itself (`since_last_source_contact_s` is null; a log whose last
published rows say their source did not answer is copied as not answering since the first of them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from monitor_protocol.core import jsonregex, schemas, timefmt, tokens, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.lifecycles import MonitorStatus, monitor_next
from monitor_protocol.core.records import DEFINITION_FIELDS, Counters, LastSeen, Monitor, Observation
from monitor_protocol.core.rules import events
from monitor_protocol.core.rules.lookups import monitor_of
from monitor_protocol.core.rules.monitors import registration_attested, validate_definition
from monitor_protocol.core.rules.publishing import (
    PUBLISHABLE_PROTOCOL_TYPES,
    counted,
    says_no_answer,
    validate_publish,
    with_actor,
)
from monitor_protocol.core.runtime import ServiceCore
from monitor_protocol.core.tx import Tx
from monitor_protocol.core.validation import check_monitor_id, check_name, invalid
from monitor_protocol.core.vocab import (
    MAX_FUTURE_SECONDS,
    MAX_JSON_DEPTH,
    MAX_PUBLISH_BYTES,
    PROTOCOL_PREFIX,
    SERVER_TYPES,
    T_CONFIGURED,
    T_LEASE,
    T_REJECTED,
    T_SOURCE,
)

MAX_IMPORT_BYTES = 8 * 1024 * 1024  # the whole file, as UTF-8
MAX_IMPORT_LINES = 20_000
MAX_REFUSED_LISTED = 100  # refused lines listed in the error body; refused_count has them all
# A published row stands for a publish of at most MAX_PUBLISH_BYTES (checked by the publish path); the publish
# rebuilt from the row (as_publish) also names what the server filled in (actor, origin, tier, verification,
# time, tags): at most this much more.
IMPORT_SLACK_BYTES = 4 * 1024
MAX_PROTOCOL_ROW_BYTES = 16 * 1024  # R11: the largest protocol row the server writes is well under this


def server_row(kind: str) -> bool:
    """A row only the server writes: the protocol's own (but for the two a publisher may write) and this
    project's supervision of a source (`python.monitor-protocol.source`), each checked as the server wrote it."""
    return (kind.startswith(PROTOCOL_PREFIX) and kind not in PUBLISHABLE_PROTOCOL_TYPES) or kind == T_SOURCE


_SERVER_PROVENANCE = {"origin": "system", "tier": "measured", "verified": "machine_verified"}
_SOURCE = jsonregex.compile(r"^monitor:([\w.-]{2,64})$")


# ===================================================================================== export
def export_events(core: ServiceCore, tx: Tx, monitor_id: str) -> list[dict[str, Any]]:
    """Every retained row of the monitor, as served, in seq order (one read: one consistent log)."""
    rec = monitor_of(tx, monitor_id)
    return [o.to_wire() for o in tx.scan(rec.id, max(rec.floor, 1), rec.head)]


def to_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    """One compact JSON object per line, each line ending in a newline (JSON Lines)."""
    return "".join(wire.encode_text(row) + "\n" for row in rows)


def export_name(monitor_id: str, now: float) -> str:
    """`<monitor>-<UTC time>.jsonl`, e.g. ci-20260922T171011Z.jsonl (no colons: every file system takes it)."""
    stamp = timefmt.iso(now)
    return f"{monitor_id}-{stamp[:10].replace('-', '')}T{stamp[11:19].replace(':', '')}Z.jsonl"


# ===================================================================================== the schema
_ANNOTATIONS = {"$id", "$schema", "title", "description"}
_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
_OBSERVATION_SCHEMA: dict[str, Any] | None = None


def observation_schema() -> dict[str, Any]:
    """The project's observation schema, read once (it ships in the engine's wheel)."""
    global _OBSERVATION_SCHEMA
    if _OBSERVATION_SCHEMA is None:
        _OBSERVATION_SCHEMA = schemas.load_schemas()["observation"]
    return _OBSERVATION_SCHEMA


def schema_error(schema: dict[str, Any], value: Any, path: str = "") -> str | None:
    """The first way `value` fails `schema` (JSON Schema 2020-12, the keywords the project's observation
    schema uses), as `path: message`, or None. A keyword this does not know is a bug, never a silent pass."""
    where = path or "<root>"
    for key, rule in schema.items():
        if key in _ANNOTATIONS or key in ("properties", "required", "additionalProperties", "items"):
            continue
        if key == "type":
            names = rule if isinstance(rule, list) else [rule]
            if not any(_TYPES[n](value) for n in names):
                return f"{where}: {_short(value)} is not of type {' or '.join(names)}"
        elif key == "enum":
            if value not in rule:
                return f"{where}: {_short(value)} is not one of {rule}"
        elif key == "const":
            if value != rule:
                return f"{where}: {_short(value)} should be {rule!r}"
        elif key == "pattern":
            if isinstance(value, str) and not jsonregex.search(rule, value):
                return f"{where}: {_short(value)} does not match {rule!r}"
        elif key == "format":
            if rule == "date-time" and isinstance(value, str) and timefmt.parse(value) is None:
                return f"{where}: {_short(value)} is not an RFC 3339 date-time"
        elif key == "anyOf":
            if all(schema_error(alt, value, path) for alt in rule):
                return f"{where}: {_short(value)} matches none of the allowed forms"
        else:
            raise ValueError(f"schema keyword {key!r} is not supported by importing.schema_error")
    if isinstance(value, dict):
        for name in schema.get("required", ()):
            if name not in value:
                return f"{where}: {name!r} is a required property"
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name in value:
                found = schema_error(sub, value[name], f"{path}/{name}" if path else name)
                if found:
                    return found
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                return f"{where}: additional properties {extra[:5]} are not allowed"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            found = schema_error(schema["items"], item, f"{path}/{i}" if path else str(i))
            if found:
                return found
    return None


def _json_detail(text: str, err: ProtocolError) -> str:
    """Where the parser stopped (column), when the refusal was plain syntax; else the wire rule's sentence."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at column {exc.colno}; each line must be one CloudEvent as a JSON object."
    except (ValueError, RecursionError):  # too deep for the parser too: the wire rule's sentence says so
        pass
    return err.message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ===================================================================================== the rules
@dataclass
class Checked:
    """What `check_log` found: the events in order (with their line numbers), the refused lines, and what
    a copy would be made from (the original monitor's id and its last definition)."""

    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    source_id: str | None = None
    after: dict[str, Any] | None = None
    status: MonitorStatus = MonitorStatus.ACTIVE
    now: float = 0.0  # the clock the rows were judged at, and whether as an attested import (R10-R12)
    attested: bool = False

    @property
    def ok(self) -> bool:
        return not self.refused and bool(self.rows)

    def summary(self) -> dict[str, Any]:
        """What the page shows before importing (and the error body's extras on a refusal)."""
        return {
            "lines": len(self.rows) + len(self.refused),
            "accepted": len(self.rows),
            "refused": self.refused[:MAX_REFUSED_LISTED],
            "refused_count": len(self.refused),
            "from_monitor": self.source_id,
        }


class _Refuse(Exception):
    """One line's refusal (internal: collected into Checked.refused, never raised to a caller)."""


def split_lines(source: str | bytes | list[Any]) -> list[tuple[int, Any]]:
    """(line number, raw line or event) for every non-blank line. TOO_LARGE past the stated bounds."""
    if isinstance(source, bytes | bytearray):
        if len(source) > MAX_IMPORT_BYTES:
            raise _too_large(len(source))
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise invalid(
                f"The file is not UTF-8 text (byte {exc.start}); export it again as JSON Lines."
            ) from None
    if isinstance(source, str):
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_IMPORT_BYTES:
            raise _too_large(size)
        items: list[Any] = source.split("\n")
    elif isinstance(source, list):
        items = source
    else:
        raise invalid("Send the log as JSON Lines text (one CloudEvent per line) or a list of events.")
    out = [(n, item) for n, item in enumerate(items, 1) if not (isinstance(item, str) and not item.strip())]
    if len(out) > MAX_IMPORT_LINES:
        raise ProtocolError(
            "TOO_LARGE",
            f"The log has {len(out)} lines; an import takes at most {MAX_IMPORT_LINES}. Export a smaller "
            "monitor, or split the work across monitors.",
            limit=MAX_IMPORT_LINES,
        )
    return out


def _too_large(size: int) -> ProtocolError:
    return ProtocolError(
        "TOO_LARGE",
        f"The file is {size} bytes; an import takes at most {MAX_IMPORT_BYTES} bytes "
        f"({MAX_IMPORT_BYTES // (1024 * 1024)} MiB) of JSON Lines.",
        limit=MAX_IMPORT_BYTES,
    )


def check_log(source: str | bytes | list[Any], now: float | None = None, attested: bool = False) -> Checked:
    """Apply R1-R12 to every line (module docstring); refusals are collected, never raised (except the
    size bounds, which refuse the whole file with TOO_LARGE before any line is read). `now` is the clock
    a publish would be judged by (this engine's; the wall clock when not given); `attested` whether the
    import carries this server's registration token (R12)."""
    check = LogCheck(now, attested)
    check.feed(split_lines(source))
    return check.result()


class LogCheck:
    """check_log a piece at a time, for a caller that must stay responsive over a large file (the
    playground checks 20,000 lines in chunks, repainting and honouring Cancel between them): `feed` the
    (line number, line) pairs of split_lines in order, in as many calls as you like, then `result()`."""

    def __init__(self, now: float | None = None, attested: bool = False) -> None:
        self.out = Checked(now=time.time() if now is None else now, attested=attested)
        self._walk = _Walk(self.out, self.out.now, attested)

    def feed(self, items: Iterable[tuple[int, Any]]) -> None:
        out = self.out
        for number, item in items:
            try:
                event = self._walk.line(number, item)
            except _Refuse as why:
                out.refused.append({"line": number, "reason": str(why)})
                continue
            out.rows.append((number, event))

    def result(self) -> Checked:
        out = self.out
        if not out.rows and not out.refused:
            out.refused.append(
                {"line": 1, "reason": "The file holds no observation: export a monitor's log."}
            )
        if out.rows and not out.refused:
            out.after = self._walk.after
            out.status = self._walk.status
        return out


@dataclass(frozen=True)
class _Clock:
    """What publishing.validate_publish reads of its transaction: the time a publish is judged at."""

    now: float


class _Walk:
    """The state the cross-line rules (R6-R12) follow from one line to the next."""

    def __init__(self, out: Checked, now: float, attested: bool) -> None:
        self.out = out
        self.now = now
        self.attested = attested
        self.expect: int | None = 1  # the seq the next line must have (None: resync after an unreadable line)
        self.first = True
        self.owner: str | None = None
        self.after: dict[str, Any] | None = None
        self.status = MonitorStatus.ACTIVE

    def line(self, number: int, item: Any) -> dict[str, Any]:
        first, self.first = self.first, False
        expect, self.expect = self.expect, None  # an unreadable line leaves the next seq unchecked
        event = self._parse(item)  # R1, R2
        seen = event.get("id")
        if isinstance(seen, str) and seen.isascii() and seen.isdigit() and len(seen) < 17:
            self.expect = int(seen) + 1  # even if the rest is refused, the next line follows this seq
        found = schema_error(observation_schema(), event)  # R3
        if found:
            raise _Refuse(f"Not a valid observation (schemas/observation.json): {found}.")
        event = {k: v for k, v in event.items() if k != "redelivered"}  # a delivery mark, not the record
        seq = int(event["id"])
        if event["sequence"] != events.sequence_of(seq):  # R4
            raise _Refuse(f"id {event['id']} and sequence {event['sequence']} name different seqs.")
        self.expect = seq + 1
        self._provenance_agrees(event)  # R5
        if event["data"]["provenance"]["attested"] is True and not self.attested:  # R12
            raise _Refuse(
                "This row claims attested: true, but this import carries no registration token of this "
                "server: a copy cannot vouch for an owner this server never checked. Import it with the "
                "server's registration token, or export it from an unattested monitor."
            )
        source_id = _SOURCE.match(event["source"]).group(1)  # type: ignore[union-attr]  # R3's pattern
        if self.out.source_id is None:
            self.out.source_id = source_id
        elif source_id != self.out.source_id:  # R6
            raise _Refuse(
                f"source {event['source']} differs from monitor:{self.out.source_id} of the lines before: "
                "a file holds one monitor's log."
            )
        if first and seq != 1:  # R7
            raise _Refuse(
                f"The log starts at seq {seq}, not 1 (rows below it were compacted away or cut): a copy "
                "needs the whole log, from its configured{create} row."
            )
        if expect is not None and seq != expect:
            if seq < expect:
                raise _Refuse(f"seq {seq} comes after seq {expect - 1}: seqs must be strictly increasing.")
            raise _Refuse(f"seq {seq} comes after seq {expect - 1}: the line(s) in between are missing.")
        kind = event["type"]
        if first and kind != T_CONFIGURED:  # R8
            raise _Refuse(f"The first line must be {T_CONFIGURED} with action create, not {kind}.")
        if server_row(kind):
            self._protocol_row(event, first)  # R8, R9
        else:
            self._published_row(event)  # R10
        return event

    @staticmethod
    def _parse(item: Any) -> dict[str, Any]:
        if isinstance(item, str):
            raw = item.encode("utf-8", "surrogatepass")
            if wire.nests_too_deep(raw):
                raise _Refuse(
                    f"Not JSON: the line nests deeper than {MAX_JSON_DEPTH} levels (or its brackets do not "
                    "match); each line must be one CloudEvent as a JSON object."
                )
            try:
                # As bytes: the strict parser then walks the value again only when the text may hold what
                # json.loads lets through (a lone surrogate, deep nesting), as it does for a request body.
                value = wire.loads(raw)
            except ProtocolError as err:
                raise _Refuse(f"Not JSON: {_json_detail(item, err)}") from None
        else:
            problem = wire.problem(item)
            if problem:
                raise _Refuse(f"Not JSON: {problem}")
            value = item
        if not isinstance(value, dict):
            raise _Refuse(f"A line must be one JSON object (a CloudEvent), not {type(value).__name__}.")
        return value

    @staticmethod
    def _provenance_agrees(event: dict[str, Any]) -> None:
        prov = event["data"]["provenance"]
        for top, inner in (
            ("origin", "origin"),
            ("tier", "tier"),
            ("verified", "verification"),
            ("actor", "actor"),
        ):
            if event[top] != prov[inner]:
                raise _Refuse(
                    f"{top} {event[top]!r} disagrees with data.provenance.{inner} {prov[inner]!r}: the "
                    "envelope and its provenance are one record."
                )
        attributed = prov["on_behalf_of"] or prov["actor"]
        if prov["wasAttributedTo"] != attributed:
            raise _Refuse(
                f"data.provenance.wasAttributedTo {prov['wasAttributedTo']!r} should be {attributed!r} "
                "(on_behalf_of, else the actor)."
            )

    def _protocol_row(self, event: dict[str, Any], first: bool) -> None:
        kind = event["type"]
        if kind not in SERVER_TYPES:
            raise _Refuse(
                f"{kind} is not a type the protocol writes, nor one of this server's own; known: "
                f"{list(SERVER_TYPES)}."
            )
        wrong = {k: event[k] for k, v in _SERVER_PROVENANCE.items() if event[k] != v}
        if wrong:
            raise _Refuse(
                f"A protocol row carries the server's measurement (origin system, tier measured, "
                f"machine_verified); this one has {wrong}."
            )
        payload = event["data"].get("payload")
        if not isinstance(payload, dict):
            raise _Refuse(f"A {kind} row needs a data.payload object.")
        self._server_wrote(event)  # R11
        if kind == T_REJECTED and event["actor"] != "system:guard":
            raise _Refuse(
                f"A rejected row is written by the server's guard (actor system:guard), not {event['actor']!r}."
            )
        if kind != T_CONFIGURED:
            return
        action = payload.get("action")
        after = payload.get("after")
        if not isinstance(after, dict) or not isinstance(after.get("owner"), str):
            raise _Refuse("A configured row needs data.payload.after: the monitor as served, with its owner.")
        if first:
            if action != "create":
                raise _Refuse(f"The first line must be a configured row with action create, not {action!r}.")
            self.owner = after["owner"]
        else:
            if self.owner is None:
                raise _Refuse("The log's first line (its configured{create} row) was refused; fix it first.")
            if action == "create":
                raise _Refuse("A monitor is created once: a second configured{create} row cannot be copied.")
            nxt = monitor_next(self.status, action) if isinstance(action, str) else None
            if nxt is None:
                raise _Refuse(
                    f"A {self.status.value} monitor cannot be {action!r}d (its lifecycle forbids it)."
                )
            if after["owner"] != self.owner:
                raise _Refuse(
                    f"after.owner {after['owner']!r} differs from the creating owner {self.owner!r}."
                )
            self.status = nxt
        if after.get("id") != self.out.source_id:
            raise _Refuse(
                f"after.id {after.get('id')!r} is not the monitor of this log ({self.out.source_id})."
            )
        if event["actor"] != after["owner"]:
            raise _Refuse(
                f"A configured row is written as the monitor's owner ({after['owner']}), not "
                f"{event['actor']!r}."
            )
        for name in ("created", "updated"):
            self._server_time(after.get(name), f"after.{name}")
        try:
            definition = {k: after[k] for k in DEFINITION_FIELDS if k in after}
            missing = [k for k in DEFINITION_FIELDS if k not in after]
            if missing:
                raise invalid(f"after lacks {missing}.")
            validate_definition(definition, dict(definition), known_settings=False)
        except ProtocolError as err:
            raise _Refuse(f"The monitor definition in after is not valid: {err.message}") from None
        self.after = after

    def _server_wrote(self, event: dict[str, Any]) -> None:
        """R11: what a protocol row may hold, since only the server writes one."""
        kind = event["type"]
        prov = event["data"]["provenance"]
        claimed = [k for k in ("on_behalf_of", "source_ref", "rule", "supersedes") if prov.get(k) is not None]
        if prov.get("wasDerivedFrom"):
            claimed.append("wasDerivedFrom")
        if claimed:
            raise _Refuse(
                f"A {kind} row is the server's own record: it acts for nobody and cites nothing, but this one "
                f"claims {', '.join(claimed)}; no request can make the server write that."
            )
        extra = sorted(set(event["data"]) - {"payload", "tags", "provenance"})
        if extra:
            raise _Refuse(f"A {kind} row holds data.payload only, not {extra[:5]}.")
        if event["data"]["tags"] != {"monitor": self.out.source_id}:
            raise _Refuse(
                f'A {kind} row\'s data.tags is {{"monitor": "{self.out.source_id}"}} and nothing else.'
            )
        if event.get("subject") is not None:
            try:
                check_name(event["subject"], "subject", '"build-412"')
            except ProtocolError as err:
                raise _Refuse(f"A {kind} row's {err.message}") from None
        size = len(wire.encode(event))
        if size > MAX_PROTOCOL_ROW_BYTES:
            raise _Refuse(
                f"This {kind} row is {size} bytes; the server writes none over {MAX_PROTOCOL_ROW_BYTES} "
                "(its requests are bounded), so it was not written by one."
            )
        self._server_time(event["time"], "time")

    def _server_time(self, value: Any, name: str) -> None:
        """A time the server's own clock gave: not before 1970 (the clock counts from there), not later
        than a publish's time may be (MAX_FUTURE_SECONDS ahead of now)."""
        t = timefmt.parse(value) if isinstance(value, str) else None
        if t is None:
            raise _Refuse(f"{name} {_short(value)} is not an RFC 3339 time.")
        if t < 0 or t > self.now + MAX_FUTURE_SECONDS:
            raise _Refuse(
                f"{name} {value} is not a time the server's clock could have written (it is "
                f"{'before 1970' if t < 0 else 'in the future'}; now is {timefmt.iso(self.now)})."
            )

    def _published_row(self, event: dict[str, Any]) -> None:
        if self.after is None:  # only after a refused first line: R8 already said why
            raise _Refuse("A published row before the monitor's configured{create} row.")
        if self.status is not MonitorStatus.ACTIVE:
            raise _Refuse(f"The monitor was {self.status.value} here: it accepted no observation.")
        body = as_publish(event)
        size = len(wire.encode(body))
        if size > MAX_PUBLISH_BYTES + IMPORT_SLACK_BYTES:
            raise _Refuse(
                f"The publish this row stands for is {size} bytes; a publish is at most "
                f"{MAX_PUBLISH_BYTES} bytes (1 MiB), so no publish could have made it."
            )
        # The monitor as the publish met it: its owner and declared types, its log up to this row (so a
        # `supersedes` names an earlier row), and the publish path's own checks against this engine's clock.
        seq = int(event["id"])
        rec = Monitor(
            id=str(self.out.source_id),
            owner=self.owner or "",
            owner_hash="",
            created=0.0,
            updated=0.0,
            name=str(self.after.get("name") or ""),
            types=list(self.after.get("types") or []),
            head=seq - 1,
        )
        try:  # (wire.check, the publish's first check, already held for the whole line: R1)
            validate_publish(cast(Tx, _Clock(self.now)), rec, body)
        except ProtocolError as err:
            raise _Refuse(f"A publish could not have made this claim ({err.code}): {err.message}") from None


def as_publish(event: dict[str, Any]) -> dict[str, Any]:
    """The publish request a published row stands for: what a publisher sent to make it (its data without
    the server's tags and provenance, the provenance as explicit fields, the recorded time)."""
    data = event["data"]
    prov = data["provenance"]
    body: dict[str, Any] = {
        "type": event["type"],
        "data": {k: v for k, v in data.items() if k not in ("tags", "provenance")},
        "tags": data.get("tags") or {},
        "actor": prov["actor"],
        "origin": prov["origin"],
        "tier": prov["tier"],
        "verification": prov["verification"],
        "time": event["time"],
    }
    if event.get("subject") is not None:
        body["subject"] = event["subject"]
    for key in ("on_behalf_of", "source_ref", "rule", "supersedes"):
        if prov.get(key) is not None:
            body[key] = prov[key]
    if prov.get("wasDerivedFrom"):
        body["wasDerivedFrom"] = prov["wasDerivedFrom"]
    return body


# ===================================================================================== import
def import_log(
    core: ServiceCore, tx: Tx, monitor_id: Any, source: str | bytes | list[Any] | Checked, token: str | None
) -> dict[str, Any]:
    """Write a checked log as the new monitor `monitor_id` (one transaction), or refuse all of it. `source`
    is the file (text, bytes, lines or events), or what LogCheck found in it."""
    attested = registration_attested(core, token, "create (or import) a monitor")
    monitor_id = check_monitor_id(monitor_id, "The new monitor id", '"ci-import"')
    if tx.monitor(monitor_id) is not None:
        raise ProtocolError(
            "DUPLICATE",
            f"A monitor {monitor_id!r} already exists; an import makes a new monitor: choose another id.",
            monitor=monitor_id,
        )
    if isinstance(source, Checked):
        # Checked already, by a caller in this process that had to stay responsive over a large file (the
        # playground feeds LogCheck a chunk at a time). At a clock no later than this one (R10's "not ahead
        # of now" only loosens as now moves on) and as this import is attested, the rows are not walked
        # twice; otherwise its rows are checked again here.
        checked = source
        if source.ok and (source.attested != attested or source.now > tx.now):
            again = LogCheck(tx.now, attested)
            again.feed(source.rows)
            checked = again.result()
    else:
        checked = check_log(source, now=tx.now, attested=attested)
    if not checked.ok:
        n = len(checked.refused)
        raise ProtocolError(
            "INVALID",
            f"{n} line(s) of the log were refused, so nothing was imported; fix or remove them and import "
            "again (each refused line says why).",
            **checked.summary(),
        )
    return _write(tx, monitor_id, checked, attested)


def _write(tx: Tx, monitor_id: str, checked: Checked, attested: bool) -> dict[str, Any]:
    after = checked.after
    assert after is not None
    new_source = events.source_of(monitor_id)
    counters = Counters()
    last: LastSeen | None = None
    actors: tuple[str, ...] = ()
    server_clock = 0.0  # the latest time a protocol row (the server's clock) was written at, so far
    quiet_since: float | None = None  # since when the source has not answered, as the log says
    for _, event in checked.rows:
        row = dict(event)
        row["source"] = new_source
        kind = row["type"]
        seq = int(row["id"])
        protocol = server_row(kind)
        if protocol:
            data = dict(row["data"])
            tags = data.get("tags")
            if isinstance(tags, dict) and "monitor" in tags:
                data["tags"] = {**tags, "monitor": monitor_id}
            if kind == T_CONFIGURED:  # `after` is the monitor as served: its id is the address too
                payload = dict(data["payload"])
                payload["after"] = {**payload["after"], "id": monitor_id}
                data["payload"] = payload
            row["data"] = data
            server_clock = max(server_clock, timefmt.parse(row["time"]) or server_clock)
            if kind == T_REJECTED:
                counters = counters.bump(rejected=1)
            elif kind == T_LEASE and data["payload"].get("action") == "complete":
                counters = counters.bump(acted=1)
        else:  # a published row counts as its publish did
            counters = counted(counters, kind)
            actors = with_actor(actors, row["data"]["provenance"]["actor"])
            received = max(timefmt.parse(row["time"]) or tx.now, server_clock)  # not before the log's clock
            last = LastSeen(seq, received, kind)
            if row.get("origin") == "probe" and says_no_answer(row):  # a source that did not answer
                quiet_since = received if quiet_since is None else quiet_since
            else:
                quiet_since = None
        obs = Observation.of(monitor_id, seq, row)
        tx.append(obs)
        if obs.subject is not None and not protocol:
            tx.add_subject(monitor_id, obs.subject)
    owner_token = tokens.mint("mpo")
    shared = after.get("visibility") == "shared"
    subscribe_token = tokens.mint("mps") if shared else None
    definition = {k: after[k] for k in DEFINITION_FIELDS}
    rec = Monitor(
        id=monitor_id,
        owner=after["owner"],
        owner_hash=tokens.digest(owner_token),
        created=timefmt.parse(str(after.get("created"))) or tx.now,
        updated=timefmt.parse(str(after.get("updated"))) or tx.now,
        version=after["version"] if isinstance(after.get("version"), int) else 1,
        attested=attested,
        status=checked.status,
        subscribe_hash=tokens.digest(subscribe_token) if subscribe_token else None,
        head=int(checked.rows[-1][1]["id"]),
        counters=counters,
        last=last,
        actors=actors,
        quiet_since=quiet_since,
        **definition,
    )
    tx.put_monitor(rec)
    out: dict[str, Any] = {
        "monitor": rec.to_wire(),
        "owner_token": owner_token,
        "imported": len(checked.rows),
        "from_monitor": checked.source_id,
    }
    if subscribe_token:
        out["subscribe_token"] = subscribe_token
    out["notice"] = (
        f"Imported {len(checked.rows)} observations of monitor:{checked.source_id} as monitor:{monitor_id} "
        "(seqs, provenance and data as recorded; no subscriptions or leases). Keep the owner_token: it is "
        "shown once and stored only as a hash."
    )
    return out
