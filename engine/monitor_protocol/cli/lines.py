"""The watch's line format (docs/protocol.md section 9): every line printable ASCII, one physical line under any
splitter, at most LINE_MAX_BYTES; words percent-encoded and cut, data cut as valid JSON. `mp watch` writes
these lines, and the client commands print observations the same way."""

from __future__ import annotations

import json
from typing import Any

LINE_MAX_BYTES = 4096  # every line, its LF included
DATA_MAX_CHARS = 400
CUT = "..."
WORD_MAX_CHARS = {"type": 300, "subject": 1200, "actor": 700}
OTHER_WORD_MAX_CHARS = 64
FREE_TEXT_MAX_CHARS = 1000  # DOWN reasons, UP URLs
SPACE = "\\u0020"  # a space inside the text line's data JSON


def ascii_json(value: Any) -> str:
    """Compact JSON, ASCII only: json escapes controls and non-ASCII; DEL is escaped too."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).replace("\x7f", "\\u007f")


def percent(ch: str) -> str:
    code = ord(ch)
    if 0x21 <= code <= 0x7E and ch not in "%=":
        return ch
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def encode_word(value: Any, max_chars: int = OTHER_WORD_MAX_CHARS) -> tuple[str, bool]:
    """A value as one percent-encoded word (see the module's docstring) and whether it was cut."""
    if value is None:
        return "-", False
    text = value if isinstance(value, str) else str(value)
    if text == "-":
        return "%2D", False
    pieces: list[str] = []
    size = 0
    for ch in text:
        piece = percent(ch)
        if size + len(piece) > max_chars:
            # Cut: drop pieces until the marker fits too.
            while pieces and size + len(CUT) > max_chars:
                size -= len(pieces.pop())
            return "".join(pieces) + CUT, True
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces), False


def encode_json_string(value: str, max_chars: int, *, spaceless: bool = False) -> tuple[str, bool]:
    """`value` as an ASCII JSON string of at most `max_chars` characters (quotes included); a longer one
    keeps its first characters and ends with `...`. Returns (JSON text, whether it was cut). `spaceless`:
    a space is written `\u0020` (see encode_data)."""
    whole_limit = max_chars - 2
    pieces: list[str] = []
    size = 0
    for ch in value:
        piece = SPACE if spaceless and ch == " " else ascii_json(ch)[1:-1]
        if size + len(piece) > whole_limit:
            while pieces and size + len(CUT) > whole_limit:
                size -= len(pieces.pop())
            return '"' + "".join(pieces) + CUT + '"', True
        pieces.append(piece)
        size += len(piece)
    return '"' + "".join(pieces) + '"', False


def encode_data(data: Any, *, spaceless: bool = False) -> tuple[str, bool]:
    """`data` as ASCII JSON of at most 400 characters: the object itself, or a JSON string holding the
    first characters of its JSON followed by `...` (an observation's data is always an object). `spaceless`
    (the text line): every space, which compact JSON has only inside strings, is written `\u0020`, so that
    nothing after `data=` splits into words a parser of `key=value` words would read as the line's own
    (`tier=src` inside a string)."""
    text = ascii_json(data)
    whole = text.replace(" ", SPACE) if spaceless else text
    if len(whole) <= DATA_MAX_CHARS:
        return whole, False
    return encode_json_string(text, DATA_MAX_CHARS, spaceless=spaceless)


def shown_data(data: Any) -> Any:
    """What `data=` shows: the observation's data without its `provenance` (tier, origin and actor are the
    line's own words; the rest stays in the observation: `mp pull --json` prints it whole) and without empty
    `tags`, so that what the publisher sent fits the 400 characters."""
    if not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if k != "provenance" and not (k == "tags" and not v)}


def free_text(value: Any) -> str:
    """A free sentence (DOWN reason, UP URL): spaces kept, anything else outside 0x20..0x7E percent-encoded."""
    out = "".join(ch if 0x20 <= ord(ch) <= 0x7E else percent(ch) for ch in str(value))
    return out if len(out) <= FREE_TEXT_MAX_CHARS else out[: FREE_TEXT_MAX_CHARS - len(CUT)] + CUT


def one_sentence(text: Any) -> str:
    """A message for stderr on one line, at most FREE_TEXT_MAX_CHARS: a reply that is not the protocol's (a
    proxy's HTML page) carries its body in the message, line breaks and all."""
    said = " ".join(str(text).split())
    return said if len(said) <= FREE_TEXT_MAX_CHARS else said[: FREE_TEXT_MAX_CHARS - len(CUT)] + CUT


def seq_of(obs: dict[str, Any]) -> int:
    try:
        return int(obs.get("id") or obs.get("sequence") or 0)
    except (TypeError, ValueError):
        return 0


def obs_text(obs: dict[str, Any]) -> str:
    """The OBS line (text format)."""
    parts = ["OBS"]
    seq = obs.get("id") or obs.get("sequence")
    try:
        seq = int(seq)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    for key, value in (
        ("seq", seq),
        ("type", obs.get("type")),
        ("subject", obs.get("subject")),
        ("tier", obs.get("tier")),
        ("origin", obs.get("origin")),
        ("actor", obs.get("actor")),
    ):
        word, _cut = encode_word(value, WORD_MAX_CHARS.get(key, OTHER_WORD_MAX_CHARS))
        parts.append(f"{key}={word}")
    parts.append("redelivered=" + ("true" if obs.get("redelivered") else "false"))
    parts.append("data=" + encode_data(shown_data(obs.get("data")), spaceless=True)[0])
    return " ".join(parts)


def obs_jsonl(obs: dict[str, Any]) -> str:
    """The OBS event as one JSON object (jsonl format), assembled from bounded ASCII pieces."""
    cut: list[str] = []
    fields = ['"kind":"OBS"']
    seq = obs.get("id") or obs.get("sequence")
    try:
        fields.append(f'"seq":{int(seq)}')  # type: ignore[arg-type]
    except (TypeError, ValueError):
        text, was_cut = encode_json_string(str(seq), OTHER_WORD_MAX_CHARS)
        fields.append(f'"seq":{text}')
    for key in ("type", "subject", "tier", "origin", "actor"):
        value = obs.get(key)
        if value is None:
            fields.append(f'"{key}":null')
            continue
        text, was_cut = encode_json_string(str(value), WORD_MAX_CHARS.get(key, OTHER_WORD_MAX_CHARS))
        fields.append(f'"{key}":{text}')
        if was_cut:
            cut.append(key)
    fields.append('"redelivered":' + ("true" if obs.get("redelivered") else "false"))
    data, was_cut = encode_data(shown_data(obs.get("data")))
    fields.append(f'"data":{data}')
    if was_cut:
        cut.append("data")
    if cut:
        fields.append('"cut":' + ascii_json(cut))
    return "{" + ",".join(fields) + "}"
