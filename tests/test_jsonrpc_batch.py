"""A JSON-RPC batch is one group commit on SQLite, and a failing call in it still rolls back alone."""

from __future__ import annotations

import pytest
from enginekit import Harness
from monitor_protocol.store.sqlite import SQLiteStore

# The quick lane (python3 build.py test --quick): no server, no browser.
pytestmark = pytest.mark.quick


def rpc(method: str, id_: int, **params):
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def test_batch_is_one_commit_and_failures_stay_local(tmp_path):
    store = SQLiteStore(str(tmp_path / "rpc.db"))
    h = Harness(store)
    tok = h.monitor("ci")
    for _ in range(3):
        h.publish("ci", tok, actor="probe:ci")
    sub, rt = h.subscribe("ci", tok)
    first = h.pull(sub, rt).body
    commits: list[str] = []
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    batch = [
        rpc("feeds/ack", 1, subscription=sub, cursor=first["next"], token=rt),
        rpc(
            "monitors/publish", 2, id="ci", type="com.example.ci.run", tier="src", actor="agent:x", token=tok
        ),
        rpc("monitors/publish", 3, id="ci", type="com.example.ci.run", actor="probe:ci", token=tok),
        rpc("feeds/pull", 4, subscription=sub, limit=1, token=rt),
    ]
    r = h.call("POST", "/rpc", batch)
    store._db.set_trace_callback(None)
    assert r.status == 200 and [x["id"] for x in r.body] == [1, 2, 3, 4]
    assert r.body[0]["result"]["cursor"] == first["next"]
    assert (
        r.body[1]["error"]["code"] == -32002 and r.body[1]["error"]["data"]["code"] == "TIER_NOT_ASSERTABLE"
    )
    rejected_seq = r.body[1]["error"]["data"]["rejected_seq"]
    pulled = r.body[3]["result"]["observations"]
    assert [int(o["id"]) for o in pulled] == [rejected_seq]  # the refusal's evidence committed in the batch
    assert commits == ["COMMIT"]  # four calls, one fsync'd commit
    # control: a single call that writes is its own durable commit; one that only reads writes nothing
    before = store.stats.commits
    h.call("POST", "/rpc", rpc("monitors/publish", 5, id="ci", type="com.example.ci.run", token=tok))
    assert store.stats.commits == before + 1
    h.call("POST", "/rpc", rpc("monitors/state", 6, id="ci", token=tok))
    assert store.stats.commits == before + 1
    store.close()


def test_json_rpc_params_are_json_integers_and_a_token_param_is_a_string():
    """Found by a tester: feeds/pull took {"cursor": "5"} and {"limit": "5"}, and monitors/list
    {"limit": "2"}, which REST's JSON body refuses (a query's text is another matter); a params.token of
    another type was dropped for the bearer, so monitors/get said NOT_FOUND. Controls: the integers pass."""
    from monitor_protocol.store.memory import MemoryStore

    h = Harness(MemoryStore())
    tok = h.monitor("ci")
    h.publish("ci", tok, actor="probe:ci")
    sub, rt = h.subscribe("ci", tok)
    for method, params in (
        ("feeds/pull", {"subscription": sub, "cursor": "1", "token": rt}),
        ("feeds/pull", {"subscription": sub, "limit": "5", "token": rt}),
        ("monitors/list", {"limit": "2"}),
    ):
        error = h.call("POST", "/rpc", rpc(method, 1, **params)).body["error"]
        assert error["data"]["code"] == "INVALID" and "JSON integer" in error["message"], (method, error)
    for bad in (5, ["x"], {}):
        error = h.call("POST", "/rpc", rpc("monitors/get", 1, id="ci", token=bad)).body["error"]
        assert error["code"] == -32602 and "params.token must be a string" in error["message"], error
    assert (
        "result"
        in h.call("POST", "/rpc", rpc("feeds/pull", 1, subscription=sub, cursor=1, limit=5, token=rt)).body
    )
    assert "result" in h.call("POST", "/rpc", rpc("monitors/list", 1, limit=2)).body
    assert "result" in h.call("POST", "/rpc", rpc("monitors/get", 1, id="ci", token=tok)).body
