"""The `next` of a monitors listing when the page ends on a monitor the caller may not see: that monitor's id
is where the next page starts, and must not be shown (P14: a private monitor's name is listed only with its
token). It travels sealed: `<anchor>!<count><sealed id>`, where the anchor is the last id the caller was
shown (or "" before any), the count numbers the sealed pages since that anchor (six digits: each `next` sorts
after the `after` it answers, as a client following the pages checks), and the sealed part is the boundary,
encrypted and authenticated under the server's listing key (BLAKE2 as a keystream and a MAC over the anchor
and the count too; the id padded to one length, so not even its length shows). `!` sorts below every
character of an id, so `<anchor>!...` comes right after the anchor and before any id that follows it.

A sealed part this server cannot open (another key: a restart, a server without the database's key) starts
the page from the anchor again. Standard library only."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MARK = "!"  # never in a monitor id (2-64 of letters, digits, '_', '.', '-'), and below all of them
_COUNT = 6
_ID_BYTES = 64
_NONCE = 12
_TAG = 16


def new_key() -> bytes:
    return secrets.token_bytes(32)


def _stream(key: bytes, nonce: bytes) -> bytes:
    return hashlib.blake2b(nonce, key=key, digest_size=_ID_BYTES, person=b"mp-list-stream").digest()


def _tag(key: bytes, anchor: str, count: str, nonce: bytes, sealed: bytes) -> bytes:
    msg = anchor.encode() + b"\x00" + count.encode() + b"\x00" + nonce + sealed
    return hashlib.blake2b(msg, key=key, digest_size=_TAG, person=b"mp-list-tag").digest()


def seal(key: bytes, anchor: str, boundary: str, count: int = 1) -> str:
    """`next` for a page that ends on `boundary`, which the caller may not see; `anchor` it may; `count`: the
    how-manieth sealed page since that anchor."""
    nonce = secrets.token_bytes(_NONCE)
    padded = boundary.encode().ljust(_ID_BYTES, b"\x00")[:_ID_BYTES]
    sealed = bytes(a ^ b for a, b in zip(padded, _stream(key, nonce), strict=True))
    number = str(min(count, 10**_COUNT - 1)).zfill(_COUNT)
    blob = nonce + sealed + _tag(key, anchor, number, nonce, sealed)
    return anchor + MARK + number + base64.urlsafe_b64encode(blob).decode().rstrip("=")


def opened(key: bytes, after: str) -> tuple[str, str, int] | None:
    """(the boundary, the anchor, the count) of a sealed `after`; (the anchor, the anchor, 0) when its seal
    does not open under `key`; None for an `after` that is not sealed (an id)."""
    if MARK not in after:
        return None
    anchor, _, rest = after.partition(MARK)
    number, text = rest[:_COUNT], rest[_COUNT:]
    if len(number) != _COUNT or not number.isascii() or not number.isdigit():
        return anchor, anchor, 0
    try:
        blob = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return anchor, anchor, 0
    if len(blob) != _NONCE + _ID_BYTES + _TAG:
        return anchor, anchor, 0
    nonce, sealed, tag = blob[:_NONCE], blob[_NONCE : _NONCE + _ID_BYTES], blob[_NONCE + _ID_BYTES :]
    if not hmac.compare_digest(tag, _tag(key, anchor, number, nonce, sealed)):
        return anchor, anchor, 0  # sealed by another key (a restart, another server): from the anchor again
    boundary = bytes(a ^ b for a, b in zip(sealed, _stream(key, nonce), strict=True)).rstrip(b"\x00")
    try:
        return boundary.decode("ascii"), anchor, int(number)
    except UnicodeDecodeError:
        return anchor, anchor, 0
