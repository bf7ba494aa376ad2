"""What the HTTP doors (REST and JSON-RPC) add to a refusal for a missing or wrong credential.

The engine says which credential a call needs (`extras["needs"]`) in words that fit every door; how to send
it depends on the transport. Over HTTP it is a bearer header, so these doors append "Send Authorization:
Bearer <owner token>." (the MCP door appends its own hint: a tool argument or an environment variable).
"""

from __future__ import annotations

from monitor_protocol.core.errors import ProtocolError

# extras["needs"] -> how the credential is named in the sentence
CREDENTIAL_LABELS: dict[str, str] = {
    "owner_token": "owner token",
    "subscribe_token": "subscribe token",
    "reader_token": "reader token",
    "registration_token": "registration token",
    "admin_token": "admin token",
}
BEARER_PHRASE = "authorization: bearer"


def bearer_hint(message: str, needs: object) -> str:
    """`message` with the HTTP way to send the credential `needs`, unless it says so already (the engine's
    older sentences still end with "send Authorization: Bearer <...>"), or `needs` names no credential."""
    label = CREDENTIAL_LABELS.get(needs) if isinstance(needs, str) else None
    if label is None or BEARER_PHRASE in message.lower():
        return message
    return f"{message.rstrip()} Send Authorization: Bearer <{label}>."


def with_bearer_hint(err: ProtocolError) -> ProtocolError:
    """The same refusal, its sentence carrying the HTTP hint (a new error: the engine's stays neutral)."""
    if err.code != "UNAUTHORIZED":
        return err
    message = bearer_hint(err.message, err.extras.get("needs"))
    if message == err.message:
        return err
    # Not rebuilt through the constructor (whose signature is the engine's business): every attribute the
    # engine set is kept, only the sentence changes.
    hinted = type(err).__new__(type(err), message)
    hinted.__dict__.update(vars(err))
    hinted.message = message
    return hinted
