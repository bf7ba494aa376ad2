"""Tokens: random, URL-safe, shown once, stored only as a hash, compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets


def mint(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def digest(token: str) -> str:
    # surrogatepass: a token that is not Unicode text (a lone surrogate from an in-page door) still hashes,
    # to a digest no minted token has, so it is a plain 401, never a crash.
    if not isinstance(token, str):  # an embedder's 5 or b"...": no minted token is that, so a plain 401
        token = f"\x00{type(token).__name__}:{token!r}"
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def matches(token: str | None, stored_hash: str | None) -> bool:
    if not token or not stored_hash:
        return False
    return hmac.compare_digest(digest(token), stored_hash)


def digest_matches(token_digest: str, stored_hash: str | None) -> bool:
    """`matches` for a token already hashed (a caller asking about many records hashes it once)."""
    return bool(stored_hash) and hmac.compare_digest(token_digest, stored_hash)  # type: ignore[arg-type]


def new_id(prefix: str, length: int = 8) -> str:
    return f"{prefix}-{secrets.token_hex(length // 2)}"


def mint_sink_secret() -> str:
    """A Standard Webhooks signing secret: whsec_ and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def check_sink_secret(value: object) -> str:
    from monitor_protocol.core.errors import ProtocolError

    if isinstance(value, str) and value.startswith("whsec_"):
        try:
            if len(base64.b64decode(value[6:], validate=True)) >= 24:
                return value
        except (binascii.Error, ValueError):
            pass
    raise ProtocolError(
        "INVALID", "sink_secret must be whsec_ followed by the base64 of at least 24 random bytes."
    )
