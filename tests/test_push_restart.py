"""HTTP push through a real `mp serve`: the server delivers a protocol http subscription to a local receiver
that fails, verifies every signature and recovers, across a server restart. Waits are hang guards only."""

from __future__ import annotations

from pathlib import Path

from monitor_protocol.client import Client
from serverutil import start_server, stop_server
from test_push import GUARD_SECONDS, Receiver, serve_receiver
from waiting import eventually

TYPE = "com.example.ci.run"


def committed(base: str, sub_id: str, token: str) -> int:
    with Client(base, token) as reader:
        return reader.pull(sub_id, cursor=0, limit=1).cursor  # a read-only replay: changes nothing


def test_mp_serve_pushes_signed_batches_and_commits_only_what_was_received(tmp_path: Path) -> None:
    receiver = Receiver(script=[500, 502])
    sink_server = serve_receiver(receiver)
    sink = f"http://127.0.0.1:{sink_server.server_address[1]}/hook"
    base, proc = start_server(tmp_path, "--allow-sink", "127.0.0.1")  # the receiver is on loopback
    port = base.rsplit(":", 1)[1]
    try:
        with Client(base) as c:
            owner = c.create_monitor("ci", types=[TYPE]).owner_token
            sub = c.subscribe(
                "ci", "hook:ci", protocol="http", sink=sink, filter={"types": [TYPE]}, token=owner
            )
            assert sub.sink_secret and sub.sink_secret.startswith("whsec_")
            receiver.secret = sub.sink_secret
            first = [c.publish("ci", TYPE, subject=s, token=owner).seq for s in ("a", "b")]
        receiver.wait_for(lambda: receiver.seqs() == first)
        # a retried batch is unchanged (same seqs, same webhook-id): "a" may fail twice alone, then "b" follows
        assert receiver.attempts in (3, 4) and receiver.bad_signatures == 0

        # The sink goes down with an observation pending; the server stops and starts again meanwhile.
        receiver.script = [503] * 1_000_000
        with Client(base, owner) as c:
            pending = [c.publish("ci", TYPE, subject="c").seq]
        seen = receiver.attempts
        receiver.wait_for(lambda: receiver.attempts > seen)
        stop_server(proc)
        assert receiver.seqs() == first
        base, proc = start_server(tmp_path, "--port", port, "--allow-sink", "127.0.0.1")
        assert (
            committed(base, sub.subscription.id, sub.token) == first[-1] + 1
        )  # nothing committed unreceived
        receiver.script = []
        receiver.wait_for(lambda: receiver.seqs() == first + pending)
        eventually(
            lambda: committed(base, sub.subscription.id, sub.token) == pending[-1] + 1,
            timeout=GUARD_SECONDS,
            what="the delivered batch is committed",
        )
        assert receiver.seqs() == first + pending and receiver.bad_signatures == 0
    finally:
        stop_server(proc)
        sink_server.shutdown()
