"""The `next` of a monitors listing when the page ends on a monitor the caller may not see: that monitor's id
is where the next page starts, and must not be shown (P14: a private monitor's name is listed only with its
token). It travels sealed: `<anchor>~<sealed id>`, where the anchor is the last id the caller was shown (or
the `after` it sent), and the sealed part the boundary, encrypted and authenticated under the server's
listing key (BLAKE2 as a keystream and a MAC; the id padded to one length, so not even its length shows).
A sealed part this server cannot open (another key: a restart, another server) is not an error: the next
page starts from the anchor again, reading again what it skipped. Standard library only."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

MARK = "~"  # never in a monitor id (2-64 of letters, digits, '_', '.', '-')
_ID_BYTES = 64
_NONCE = 12
_TAG = 16


def new_key() -> bytes:
    return secrets.token_bytes(32)


def _stream(key: bytes, nonce: bytes) -> bytes:
    return hashlib.blake2b(nonce, key=key, digest_size=_ID_BYTES, person=b"mp-list-stream").digest()


def _tag(key: bytes, anchor: str, nonce: bytes, sealed: bytes) -> bytes:
    msg = anchor.encode() + b"\x00" + nonce + sealed
    return hashlib.blake2b(msg, key=key, digest_size=_TAG, person=b"mp-list-tag").digest()


def seal(key: bytes, anchor: str, boundary: str) -> str:
    """`next` for a page that ends on `boundary`, which the caller may not see; `anchor` it may."""
    nonce = secrets.token_bytes(_NONCE)
    padded = boundary.encode().ljust(_ID_BYTES, b"\x00")[:_ID_BYTES]
    sealed = bytes(a ^ b for a, b in zip(padded, _stream(key, nonce), strict=True))
    blob = nonce + sealed + _tag(key, anchor, nonce, sealed)
    return anchor + MARK + base64.urlsafe_b64encode(blob).decode().rstrip("=")


def start_of(key: bytes, after: str) -> tuple[str, str]:
    """(where the page starts, the anchor: the last id the caller was shown) for a listing's `after`."""
    if MARK not in after:
        return after, after
    anchor, _, text = after.partition(MARK)
    try:
        blob = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return anchor, anchor
    if len(blob) != _NONCE + _ID_BYTES + _TAG:
        return anchor, anchor
    nonce, sealed, tag = blob[:_NONCE], blob[_NONCE : _NONCE + _ID_BYTES], blob[_NONCE + _ID_BYTES :]
    if not hmac.compare_digest(tag, _tag(key, anchor, nonce, sealed)):
        return anchor, anchor  # sealed by another key (a restart, another server): from the anchor again
    boundary = bytes(a ^ b for a, b in zip(sealed, _stream(key, nonce), strict=True)).rstrip(b"\x00")
    try:
        return boundary.decode(), anchor
    except UnicodeDecodeError:
        return anchor, anchor
