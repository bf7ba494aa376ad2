"""A pull's rows served as their stored JSON text (issue 23, the drain): SQLite and PostgreSQL keep each
event as text, a row read is a StoredObservation whose event is decoded only when something reads it, and a
reply that mp serve's HTTP door only encodes (Request.door_encodes, MonitorService.pull's `raw`) carries
that text as orjson's raw value. What is served is the same JSON; a door that reads the rows (SSE, push,
MCP, an embedder) still gets dicts; the standard library's codec, which has no raw value, decodes as before."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from monitor_protocol.core import wire
from monitor_protocol.core.records import (
    Observation,
    ServedRow,
    StoredObservation,
    evolve,
    stored_observation,
)
from monitor_protocol.core.service import MonitorService
from monitor_protocol.doors.http.server import install_fast_json
from monitor_protocol.store.sqlite import SQLiteStore
from serverutil import bearer, long_polls_parked, running_server

T = "com.example.ci.run"
# What a newcomer's data holds: text in other scripts, escapes, nesting, numbers of every kind.
TRICKY = [
    {"status": "failed", "n": 12345, "ratio": 0.25, "ok": False, "none": None},
    {"text": 'héllo wörld, 日本語, emoji 🎉, quote " backslash \\ tab \t newline \n'},
    {"nested": {"a": [1, 2, {"b": [None, True, "x"]}], "empty": {}, "list": []}},
    {"big": 9007199254740991, "neg": -17, "exp": 1.5e300, "tiny": 5e-324},
    {"separators": "\u2028\u2029", "zero": "\u0000"},
]


def published(observations: list[dict[str, Any]]) -> list[Any]:
    """What each row of type T carries of the data its publisher sent (the engine adds tags and provenance)."""
    keep = [o["data"] for o in observations if o["type"] == T]
    return [{k: v for k, v in d.items() if k not in ("tags", "provenance")} for d in keep]


@pytest.fixture
def orjson_codec() -> Iterator[None]:
    before = wire.codec()
    install_fast_json()
    assert wire.codec().raw is not None, "orjson (the server extra) is a test dependency"
    yield
    wire.use_codec(before)


@pytest.fixture
def stdlib_codec() -> Iterator[None]:
    before = wire.codec()
    wire.use_codec(wire.STDLIB_CODEC)
    yield
    wire.use_codec(before)


def _reader(tmp_path: Path) -> tuple[MonitorService, str, str]:
    service = MonitorService(SQLiteStore(str(tmp_path / "raw.db")))
    owner = service.create_monitor({"id": "raw", "visibility": "public", "types": [T]}, None)["owner_token"]
    for data in TRICKY:
        service.publish("raw", {"type": T, "subject": "build-1", "data": data}, owner)
    sub = service.subscribe({"monitor": "raw", "subscriber": "agent:raw"}, None)
    return service, sub["subscription"]["id"], sub["token"]


@pytest.mark.quick
def test_a_pull_the_door_only_encodes_carries_its_rows_as_stored_text(
    tmp_path: Path, orjson_codec: None
) -> None:
    service, sub, token = _reader(tmp_path)
    first = service.pull(sub, token, limit=200)  # delivered: the next pulls mark every row redelivered
    assert all(type(o) is dict for o in first["observations"])  # control: not asked, dicts as before
    raw = service.pull(sub, token, limit=200, raw=True)
    plain = service.pull(sub, token, limit=200)
    assert raw["observations"] and not any(type(o) is dict for o in raw["observations"])
    assert wire.encode(raw) == wire.encode(plain)  # byte for byte the same reply
    served = json.loads(wire.encode(raw))["observations"]
    assert all(o["redelivered"] is True for o in served)
    assert published(served) == TRICKY
    # ack-and-pull and a replay ask the same way
    acked = service.pull(sub, token, limit=2, ack=int(served[1]["id"]) + 1, raw=True)
    assert not any(type(o) is dict for o in acked["observations"])
    replay = service.pull(sub, token, cursor=1, limit=200, raw=True)
    assert json.loads(wire.encode(replay))["observations"] == json.loads(wire.encode(plain))["observations"]


@pytest.mark.quick
def test_the_standard_librarys_codec_has_no_raw_value_and_decodes(tmp_path: Path, stdlib_codec: None) -> None:
    service, sub, token = _reader(tmp_path)
    raw = service.pull(sub, token, limit=200, raw=True)
    assert all(type(o) is dict for o in raw["observations"])
    assert published(raw["observations"]) == TRICKY


@pytest.mark.quick
def test_a_woken_readers_pull_many_asks_alike(tmp_path: Path, orjson_codec: None) -> None:
    service, sub, token = _reader(tmp_path)
    other = service.subscribe({"monitor": "raw", "subscriber": "agent:other"}, None)
    asks = [(sub, token, None, 200, None), (other["subscription"]["id"], other["token"], None, 200, None)]
    same: list[int] = []
    raw = service.pull_many(asks, same=same, raw=True)
    assert same == [-1, 0]  # the second reader in the first one's place: its reply is the first one's
    assert all(not any(type(o) is dict for o in r["observations"]) for r in raw)  # type: ignore[index]
    assert json.loads(wire.encode(raw[1]))["observations"] == json.loads(wire.encode(raw[0]))["observations"]


# A JSON object of the kind the engine stores (string keys, any JSON values; no NaN, as the rules refuse it).
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_events = st.dictionaries(st.text(max_size=10), _values, min_size=1, max_size=6)


@pytest.mark.quick
@settings(max_examples=200, deadline=None)
@given(event=_events, redelivered=st.booleans())
def test_a_stored_rows_text_serves_what_its_decoded_event_would(
    event: dict[str, Any], redelivered: bool
) -> None:
    before = wire.codec()
    install_fast_json()
    try:
        text = wire.encode_text(event)  # what a store keeps, written by the codec mp serve installs
        row = stored_observation("m", 1, T, None, "", "", "", "", text)
        served = row.to_wire(redelivered=redelivered, raw=True)
        expected = Observation.of("m", 1, {"type": T, **event}).to_wire(redelivered=redelivered)
        expected.pop("type") if "type" not in event else None
        if "redelivered" in text:  # named already (a key, or text anywhere): the decoded merge decides
            assert type(served) is dict
        assert wire.encode(served) == wire.encode(expected)
        # a row read only to be served (a drain's, SQLite's read_range(served=True)) serves the same
        only = ServedRow(1, text)
        assert wire.encode(only.to_wire(redelivered=redelivered, raw=True)) == wire.encode(expected)
        assert only.to_wire(redelivered=redelivered) == row.to_wire(redelivered=redelivered)
        assert only.size == row.size
    finally:
        wire.use_codec(before)


@pytest.mark.quick
def test_a_stored_row_is_an_observation_decoded_when_read() -> None:
    text = (
        '{"type":"com.example.ci.run","actor":"probe:ci","origin":"probe","tier":"signal","horizon":"event",'
        '"id":"1","data":{"n":1},"redelivered":false}'
    )
    row = stored_observation("m", 1, T, None, "probe:ci", "probe", "signal", "event", text)
    same = Observation.of("m", 1, json.loads(text))
    assert row.size == len(text)
    assert row == same and same == row
    assert row != Observation.of("m", 2, json.loads(text))  # control: another seq is another row
    assert row.event == json.loads(text) and row.event is row.event  # decoded once, kept
    assert pickle.loads(pickle.dumps(row)) == same
    assert evolve(row, seq=2).seq == 2 and evolve(row, seq=2).event == row.event
    assert isinstance(row, StoredObservation)
    # a text that names "redelivered" already is served from its decoded form: never a repeated member
    before = wire.codec()
    install_fast_json()
    try:
        fresh = stored_observation("m", 1, T, None, "probe:ci", "probe", "signal", "event", text)
        served = fresh.to_wire(redelivered=True, raw=True)
        assert type(served) is dict and served["redelivered"] is True
    finally:
        wire.use_codec(before)


def test_mp_serve_serves_stored_text_that_parses_to_what_was_published(tmp_path: Path) -> None:
    """Through the real door: a GET pull, an ack-and-pull and a woken long poll, each reply parsed, each row
    the published data, redelivered where it was delivered before."""
    with running_server(tmp_path, "--db", str(tmp_path / "serve.db")) as (base, _proc):
        api = base + "/mp/v0"
        with httpx.Client(timeout=30) as http:
            owner = http.post(f"{api}/monitors", json={"id": "raw", "visibility": "public", "types": [T]})
            token = owner.json()["owner_token"]
            for data in TRICKY:
                r = http.post(
                    f"{api}/monitors/raw/observations", json={"type": T, "data": data}, headers=bearer(token)
                )
                assert r.status_code == 201, r.text
            sub = http.post(f"{api}/subscriptions", json={"monitor": "raw", "subscriber": "agent:raw"}).json()
            sid, reader = sub["subscription"]["id"], sub["token"]
            first = http.get(f"{api}/subscriptions/{sid}/pull", params={"limit": 200}, headers=bearer(reader))
            rows = [o for o in first.json()["observations"] if o["type"] == T]
            assert published(rows) == TRICKY and not any(o.get("redelivered") for o in rows)
            again = http.post(f"{api}/subscriptions/{sid}/pull", json={"limit": 200}, headers=bearer(reader))
            assert again.status_code == 200
            assert published(again.json()["observations"]) == TRICKY
            assert all(o["redelivered"] is True for o in again.json()["observations"])
            woken: list[httpx.Response] = []
            ack = {"ack": again.json()["next"], "wait": 20}
            poll = threading.Thread(
                target=lambda: woken.append(
                    http.post(f"{api}/subscriptions/{sid}/pull", json=ack, headers=bearer(reader))
                )
            )
            poll.start()
            deadline = time.monotonic() + 10
            while long_polls_parked(base) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert long_polls_parked(base) == 1
            late = {"type": T, "data": TRICKY[1]}
            assert (
                http.post(f"{api}/monitors/raw/observations", json=late, headers=bearer(token)).status_code
                == 201
            )
            poll.join(30)
            assert woken and woken[0].status_code == 200, woken
            assert published(woken[0].json()["observations"]) == [TRICKY[1]]


@pytest.mark.quick
def test_a_drain_page_is_read_in_one_statement(tmp_path: Path) -> None:
    """An unfiltered pull of 100 reads its rows with one SELECT (its seqs are dense: the read is bounded to
    them), where it took four (chunks of 8, 16, 32 and 64); a filtered one keeps its windows (the control)."""
    store = SQLiteStore(str(tmp_path / "drain.db"))
    service = MonitorService(store)
    owner = service.create_monitor({"id": "dr", "visibility": "public", "types": [T]}, None)["owner_token"]
    for start in range(0, 300, 100):
        service.publish_many(
            "dr", [{"type": T, "subject": f"b-{i}"} for i in range(start, start + 100)], owner
        )
    sub = service.subscribe({"monitor": "dr", "subscriber": "agent:d"}, None)
    reads: list[str] = []
    store._db.set_trace_callback(lambda sql: reads.append(sql) if "FROM observations" in sql else None)
    page = service.pull(sub["subscription"]["id"], sub["token"], limit=100)
    assert len(page["observations"]) == 100
    assert len([sql for sql in reads if sql.lstrip().upper().startswith("SELECT")]) == 1, reads
    reads.clear()
    subject = {"subjects": ["b-150", "b-151"]}
    picked = service.pull(sub["subscription"]["id"], sub["token"], limit=100, filter=subject)
    assert [o["subject"] for o in picked["observations"]] == ["b-150", "b-151"]
    # a page only served (mp serve's door encodes it) reads each row's seq and text alone
    assert not any(sql.startswith("SELECT seq, event FROM") for sql in reads)  # control: read ones do not
    reads.clear()
    before = wire.codec()
    install_fast_json()
    try:
        drained = json.loads(
            wire.encode(service.pull(sub["subscription"]["id"], sub["token"], raw=True, limit=100))
        )
    finally:
        wire.use_codec(before)
    assert [sql.split(" WHERE")[0] for sql in reads] == ["SELECT seq, event FROM observations"], reads
    again = [{**o, "redelivered": True} for o in page["observations"]]  # (delivered by the first pull)
    assert drained["observations"] == again
    store.close()


@pytest.mark.quick
def test_a_page_read_only_to_be_served_serves_a_reader_in_its_group_too(
    tmp_path: Path, orjson_codec: None
) -> None:
    """In one group commit the same page is read once (the group's memo): a page a raw pull read holds rows
    only served (ServedRow, their text alone), and a pull whose reply is read gets them decoded all the same."""
    service, sub, token = _reader(tmp_path)
    other = service.subscribe({"monitor": "raw", "subscriber": "agent:reads"}, None)
    store = service.store
    reads: list[str] = []
    store._db.set_trace_callback(lambda sql: reads.append(sql) if "FROM observations" in sql else None)  # type: ignore[attr-defined]
    with store.batch():  # type: ignore[attr-defined]
        raw = service.pull(sub, token, limit=200, raw=True)
        read = service.pull(other["subscription"]["id"], other["token"], limit=200)
    assert [sql.split(" WHERE")[0] for sql in reads] == ["SELECT seq, event FROM observations"], reads
    assert raw["observations"] and not any(type(o) is dict for o in raw["observations"])  # control
    assert all(type(o) is dict for o in read["observations"])
    assert published(read["observations"]) == TRICKY


@pytest.mark.quick
def test_the_redelivered_splice_takes_only_a_compact_object(orjson_codec: None) -> None:
    """A reviewer's: the splice assumed a non-empty object ending in `}`; anything else is served decoded."""
    for text in ("{}", '{"a":1} '):
        assert wire.raw_json(text, redelivered=True) is None, text
    assert wire.encode(wire.raw_json('{"a":1}', redelivered=True)) == b'{"a":1,"redelivered":true}'  # control


def test_a_postgresql_rows_size_is_its_bytes(pg: Any) -> None:
    """The page byte budget counts a row's bytes on PostgreSQL, as before rows were decoded lazily (a
    reviewer's: the length of the decoded text undercounted non-ASCII events)."""
    service = MonitorService(pg)
    owner = service.create_monitor({"id": "sz", "visibility": "public", "types": [T]}, None)["owner_token"]
    seq = service.publish("sz", {"type": T, "data": {"text": "日本語" * 50}}, owner)["seq"]
    row = pg.get_observation("sz", seq)
    assert isinstance(row, StoredObservation)
    assert row.size == len(row.text.encode()) > len(row.text)
