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
