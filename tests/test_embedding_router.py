"""An embedder's Request through RestRouter.handle (docs/ENGINE_API.md): header names as a framework passes
them ("Origin", "Authorization", "Host") are judged as the doors' lower-cased ones, and a badly typed Request
gets a 400 naming what to send, never an exception out of `handle` (found by an embedder)."""

from __future__ import annotations

import json

import pytest
from monitor_protocol.api.messages import Request
from monitor_protocol.api.rest import RestRouter
from monitor_protocol.core.service import MonitorService
from monitor_protocol.store.memory import MemoryStore

pytestmark = pytest.mark.quick

DISCOVER = "/mp/v0/discover"


def router(**kw) -> RestRouter:
    return RestRouter(MonitorService(MemoryStore()), **kw)


def test_a_capitalised_origin_is_judged_as_the_origin() -> None:
    r = router()
    refused = r.handle(Request("GET", DISCOVER, headers={"Origin": "http://evil.example"}))
    assert refused.status == 403 and refused.body["code"] == "ORIGIN_REFUSED"
    assert r.handle(Request("GET", DISCOVER, headers={"origin": "http://evil.example"})).status == 403
    assert r.handle(Request("GET", DISCOVER, headers={"Accept": "application/json"})).status == 200  # control


def test_a_capitalised_authorization_and_idempotency_key_are_read() -> None:
    r = router()
    made = r.handle(
        Request("POST", "/mp/v0/monitors", body=json.dumps({"id": "ci", "types": ["com.example.x"]}).encode())
    )
    owner = made.body["owner_token"]
    path = "/mp/v0/monitors/ci/observations"
    body = json.dumps({"type": "com.example.x"}).encode()
    headers = {
        "Authorization": f"Bearer {owner}",
        "Idempotency-Key": "k-1",
        "Content-Type": "application/json",
    }
    first = r.handle(Request("POST", path, headers=dict(headers), body=body))
    again = r.handle(Request("POST", path, headers=dict(headers), body=body))
    assert first.status == 201 and again.body["seq"] == first.body["seq"] and again.body["idempotent"] is True
    anonymous = r.handle(Request("POST", path, headers={"Content-Type": "application/json"}, body=body))
    assert anonymous.status == 401  # control: without the header, refused


def test_a_capitalised_host_is_judged_and_a_refusal_names_the_hosts_allowed() -> None:
    r = router(allowed_hosts=("mp.example.com",))
    assert r.handle(Request("GET", DISCOVER, headers={"Host": "mp.example.com"})).status == 200
    refused = r.handle(Request("GET", DISCOVER, headers={"Host": "127.0.0.1:8080"}))
    assert refused.status == 403 and refused.body["code"] == "ORIGIN_REFUSED"
    assert "send one of mp.example.com as the Host" in refused.body["error"]
    assert "use localhost" not in refused.body["error"]  # not allowed here: not advised


@pytest.mark.parametrize(
    "request_",
    [
        Request("GET", DISCOVER, headers=None),  # type: ignore[arg-type]
        Request("GET", DISCOVER, headers="accept: x"),  # type: ignore[arg-type]
        Request("GET", DISCOVER, headers={1: "x"}),  # type: ignore[dict-item]
        Request("POST", "/mp/v0/monitors", body="{}"),  # type: ignore[arg-type]
    ],
    ids=["headers None", "headers text", "a name not text", "body text"],
)
def test_a_badly_typed_request_is_a_400_not_an_exception(request_: Request) -> None:
    got = router().handle(request_)
    assert got.status == 400 and got.body["code"] == "INVALID", got.body
    assert "Request." in got.body["error"]


def test_bytes_headers_are_read_as_latin_1_and_judged() -> None:
    """A reviewer's: ASGI's raw pairs of bytes became a dict with bytes names, which the Origin and Host
    checks did not see (200), and a bytes Origin value raised out of `handle`."""
    r = router(allowed_hosts=("mp.example.com",))
    raw = [(b"origin", b"http://evil.example"), (b"host", b"mp.example.com")]
    assert r.handle(Request("GET", DISCOVER, headers=raw)).status == 403  # type: ignore[arg-type]
    assert (
        r.handle(
            Request("GET", DISCOVER, headers={"Origin": b"http://evil.example", "Host": "mp.example.com"})
        ).status
        == 403
    )  # type: ignore[dict-item]
    assert r.handle(Request("GET", DISCOVER, headers=[(b"host", b"mp.example.com")])).status == 200  # type: ignore[arg-type]
    for value in (5, None, ["x"]):
        got = r.handle(Request("GET", DISCOVER, headers={"origin": value, "host": "mp.example.com"}))  # type: ignore[dict-item]
        assert got.status == 400 and got.body["code"] == "INVALID", got.body


def test_a_refused_request_is_refused_alike_through_the_groups_way_in() -> None:
    """A reviewer's: a refused check emptied the Request's headers, so `handle_publishes` (which checks, then
    hands what it does not take to `handle`) routed it as a request without headers (401)."""
    r = router()
    for headers in (None, "x", {1: "a"}):
        req = Request("POST", "/mp/v0/monitors/ci/observations", headers=headers, body=b'{"type": "a.b"}')  # type: ignore[arg-type]
        alone = r.handle(req)
        grouped = r.handle_publishes([req])[0]
        assert alone.status == grouped.status == 400 and grouped.body["code"] == "INVALID", grouped.body


def test_a_body_of_none_or_a_bytearray_and_header_pairs_are_read() -> None:
    r = router()
    pairs = r.handle(Request("GET", DISCOVER, headers=[("Origin", "http://evil.example")]))  # type: ignore[arg-type]
    assert pairs.status == 403  # read as the dict they make
    assert r.handle(Request("GET", DISCOVER, body=None)).status == 200  # type: ignore[arg-type]
    made = r.handle(Request("POST", "/mp/v0/monitors", body=bytearray(b'{"id": "ci"}')))  # type: ignore[arg-type]
    assert made.status == 201, made.body


def test_a_token_that_is_not_text_is_refused_as_a_wrong_token() -> None:
    """`svc.publish("ci", {...}, 5)` raised AttributeError out of the service; now 401 as any wrong token
    (the control: the owner's token publishes)."""
    from monitor_protocol.core.errors import ProtocolError

    service = MonitorService(MemoryStore())
    owner = service.create_monitor({"id": "ci", "types": ["com.example.x"]}, None)["owner_token"]

    class Token(str):  # a framework's own text type is text (the control of the refusals below)
        pass

    assert service.publish("ci", {"type": "com.example.x"}, Token(owner))["seq"] >= 1
    for wrong in (5, b"token", ["x"]):
        with pytest.raises(ProtocolError) as caught:
            service.publish("ci", {"type": "com.example.x"}, wrong)  # type: ignore[arg-type]
        assert caught.value.code == "UNAUTHORIZED", caught.value
    assert service.publish("ci", {"type": "com.example.x"}, owner)["seq"] >= 1


def test_the_client_refuses_an_empty_id_before_sending() -> None:
    """`get_monitor("")` asked GET /monitors/, the listing, and returned an empty Monitor as if found."""
    from monitor_protocol.client import Client

    with Client("http://127.0.0.1:9") as c:  # nothing listens there: refused before any connection
        for call in (lambda: c.get_monitor(""), lambda: c.state(""), lambda: c.pull("")):
            with pytest.raises(ValueError, match="non-empty"):
                call()


def test_an_observation_is_at_most_1_mib_whatever_the_door_and_every_export_imports() -> None:
    """Found by an embedder: the engine took a 3 MiB publish (only the HTTP door's body limit bounded it), and
    then refused its own export on import ("no publish could have made it"). The publish path refuses it
    (413 TOO_LARGE, logged as a rejection); the control: a publish just under the limit is taken, exported
    and imported whole."""
    from monitor_protocol.core.errors import ProtocolError
    from monitor_protocol.core.rules import importing
    from monitor_protocol.core.vocab import MAX_PUBLISH_BYTES

    service = MonitorService(MemoryStore())
    owner = service.create_monitor({"id": "big", "types": ["com.example.x"]}, None)["owner_token"]
    with pytest.raises(ProtocolError) as caught:
        service.publish("big", {"type": "com.example.x", "data": {"blob": "y" * (3 << 20)}}, owner)
    assert caught.value.code == "TOO_LARGE" and "at most 1048576 bytes" in caught.value.message
    rejected = [o for o in service.export_log("big") if o["type"].endswith("rejected")]
    assert rejected, "the refusal is logged (P2)"
    just_under = {"type": "com.example.x", "data": {"blob": "y" * (MAX_PUBLISH_BYTES - 200)}}
    assert service.publish("big", just_under, owner)["seq"] > 1
    copy = service.import_log("big-copy", importing.to_jsonl(service.export_log("big")))
    assert copy["monitor"]["id"] == "big-copy", copy


def test_a_door_body_over_the_limit_is_refused_by_the_engine_too() -> None:
    """An operator's --max-body of 4 MiB lets the body through the door; the engine's rule still holds (a
    batch may be that large, one observation may not)."""
    r = router(max_body=4 << 20)
    made = r.handle(
        Request(
            "POST", "/mp/v0/monitors", body=json.dumps({"id": "big", "types": ["com.example.x"]}).encode()
        )
    )
    owner = made.body["owner_token"]
    body = json.dumps({"type": "com.example.x", "data": {"blob": "y" * (2 << 20)}}).encode()
    got = r.handle(
        Request(
            "POST",
            "/mp/v0/monitors/big/observations",
            headers={"authorization": f"Bearer {owner}"},
            body=body,
        )
    )
    assert got.status == 413 and got.body["code"] == "TOO_LARGE", got.body


def test_a_closed_sqlite_store_says_so(tmp_path) -> None:
    """A call after `store.close()` raised AttributeError ('NoneType' ... 'in_transaction')."""
    from monitor_protocol.store.sqlite import SQLiteStore

    store = SQLiteStore(str(tmp_path / "closed.db"))
    service = MonitorService(store)
    assert service.create_monitor({"id": "ci"}, None)["monitor"]["id"] == "ci"  # control
    store.close()
    with pytest.raises(RuntimeError, match="is closed; open it again"):
        service.state("ci", None)


def test_the_client_says_what_is_not_json_before_sending() -> None:
    """NaN, a set, and a batch item that is not a mapping raised json's or dict()'s own words."""
    from monitor_protocol.client import Client

    with Client("http://127.0.0.1:9") as c:  # nothing listens there: each is refused before connecting
        with pytest.raises(ValueError, match="not JSON .*NaN and Infinity are not JSON numbers"):
            c.publish("ci", "com.example.x", data={"x": float("nan")})
        with pytest.raises(TypeError, match="not JSON .*a set to a list"):
            c.publish("ci", "com.example.x", data={"x": {1}})
        with pytest.raises(TypeError, match="publish_many: item 1 must be a mapping"):
            c.publish_many("ci", [{"type": "com.example.x"}, 5])  # type: ignore[list-item]
