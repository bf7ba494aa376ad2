"""Durability (docs/protocol.md section 8): `kill -9` in the middle of a stream of publishes and acks loses nothing
a client was told had succeeded, redelivers nothing that was acknowledged, and a producer that retries the
publish whose reply the crash swallowed, with its idempotency key, appends it exactly once."""

from __future__ import annotations

import signal
import threading

import httpx
from serverutil import bearer, running_server, start_server

RUN = "com.example.load.item"
PUBLISHERS = 4
KILL_AFTER = 300  # confirmed publishes before the SIGKILL lands


def test_kill9_mid_stream_keeps_every_confirmed_write(tmp_path):
    db = tmp_path / "kill9.db"
    base, proc = start_server(tmp_path, "--db", str(db))
    api = base + "/mp/v0"
    with httpx.Client(base_url=api, timeout=30) as mp:
        r = mp.post("/monitors", json={"id": "load", "types": [RUN], "visibility": "public"})
        assert r.status_code == 201, r.text
        owner = r.json()["owner_token"]
        r = mp.post(
            "/subscriptions",
            json={"monitor": "load", "subscriber": "agent:worker", "filter": {"types": [RUN]}},
        )
        assert r.status_code == 201, r.text
        sub_id, reader = r.json()["subscription"]["id"], r.json()["token"]

    lock = threading.Lock()
    confirmed: dict[str, int] = {}  # subject -> seq, for every publish answered 201
    acked: list[int] = []  # every cursor an ack was answered 200 for
    in_flight: dict[int, tuple[str, dict]] = {}  # publisher -> the publish the crash left without a reply
    failures: list[str] = []
    enough = threading.Event()
    stop = threading.Event()

    def guarded(fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # surfaced by the main thread below
            failures.append(repr(exc))
            enough.set()

    def publisher(n: int) -> None:
        with httpx.Client(base_url=api, timeout=30) as client:
            i = 0
            while not stop.is_set():
                subject = f"p{n}-{i}"
                body = {
                    "type": RUN,
                    "subject": subject,
                    "actor": "probe:load",
                    "data": {"n": n, "i": i},
                    "idempotency_key": f"key-{subject}",
                }
                try:
                    reply = client.post("/monitors/load/observations", json=body, headers=bearer(owner))
                except httpx.HTTPError:
                    in_flight[n] = (subject, body)  # its fate is unknown: the producer will retry it
                    return
                assert reply.status_code == 201, reply.text
                with lock:
                    confirmed[subject] = reply.json()["seq"]
                    if len(confirmed) >= KILL_AFTER:
                        enough.set()
                i += 1

    def acker() -> None:
        with httpx.Client(base_url=api, timeout=30) as client:
            while not stop.is_set():
                try:
                    page = client.get(
                        f"/subscriptions/{sub_id}/pull", params={"limit": 7}, headers=bearer(reader)
                    )
                    assert page.status_code == 200, page.text
                    nxt = page.json()["next"]
                    reply = client.post(
                        f"/subscriptions/{sub_id}/ack", json={"cursor": nxt}, headers=bearer(reader)
                    )
                except httpx.HTTPError:
                    return
                assert reply.status_code == 200, reply.text
                with lock:
                    acked.append(reply.json()["cursor"])

    threads = [threading.Thread(target=guarded, args=(publisher, n)) for n in range(PUBLISHERS)]
    threads.append(threading.Thread(target=guarded, args=(acker,)))
    for thread in threads:
        thread.start()
    enough.wait(timeout=120)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stop.set()
    for thread in threads:
        thread.join()

    assert not failures, failures
    assert len(confirmed) >= KILL_AFTER, "the server died before the stream got going"
    assert acked, "no ack was confirmed before the kill"
    committed = max(acked)

    with (
        running_server(tmp_path, "--db", str(db)) as (base, _again),
        httpx.Client(base_url=base + "/mp/v0") as mp,
    ):
        # The producers retry what the crash left unanswered, with the same idempotency keys: whatever
        # had landed is answered 200 with its first seq, the rest is appended now, nothing twice.
        for subject, body in in_flight.values():
            retried = mp.post("/monitors/load/observations", json=body, headers=bearer(owner))
            assert retried.status_code in (200, 201), retried.text
            assert retried.json()["idempotent"] is (retried.status_code == 200)
            confirmed[subject] = retried.json()["seq"]
            again = mp.post("/monitors/load/observations", json=body, headers=bearer(owner))
            assert again.status_code == 200 and again.json()["seq"] == confirmed[subject]
        # Every confirmed publish is in the log, with the seq it was confirmed with, exactly once.
        monitor = mp.get("/monitors/load", headers=bearer(owner)).json()
        seen: dict[str, int] = {}
        copies: dict[str, int] = {}
        cursor = 1
        while cursor <= monitor["head"]:
            page = mp.get(
                f"/subscriptions/{sub_id}/pull",
                params={"cursor": cursor, "limit": 200},
                headers=bearer(reader),
            ).json()
            for observation in page["observations"]:
                seen[observation["subject"]] = int(observation["id"])
                if observation["type"] == RUN:
                    copies[observation["subject"]] = copies.get(observation["subject"], 0) + 1
            cursor = page["next"]
        missing = {s: q for s, q in confirmed.items() if seen.get(s) != q}
        assert not missing, f"confirmed publishes lost or moved by the crash: {sorted(missing.items())[:10]}"
        duplicated = {s: n for s, n in copies.items() if n > 1}
        assert not duplicated, f"retried publishes appended twice: {sorted(duplicated.items())[:10]}"
        assert in_flight, "no publish was in flight when the server died: the retry path went untested"

        # The committed cursor survived; nothing at or below it comes back, everything above it does.
        pull = mp.get(f"/subscriptions/{sub_id}/pull", params={"limit": 200}, headers=bearer(reader)).json()
        assert pull["cursor"] >= committed
        assert all(int(o["id"]) >= committed for o in pull["observations"])
        pending = {s for s, q in confirmed.items() if q >= pull["cursor"]}
        delivered: set[str] = set()
        cursor = pull["cursor"]
        while True:
            page = mp.get(
                f"/subscriptions/{sub_id}/pull",
                params={"cursor": cursor, "limit": 200},
                headers=bearer(reader),
            )
            body = page.json()
            delivered |= {o["subject"] for o in body["observations"]}
            if not body["observations"]:
                break
            cursor = body["next"]
        assert pending <= delivered

        # The restarted server keeps taking writes where the log left off.
        r = mp.post(
            "/monitors/load/observations",
            json={"type": RUN, "subject": "after-restart"},
            headers=bearer(owner),
        )
        assert r.status_code == 201 and r.json()["seq"] == monitor["head"] + 1
