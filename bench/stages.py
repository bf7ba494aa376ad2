"""The stage profile of mp serve's hot calls: where the server's CPU goes per durable publish and per
pull(1)+ack, and per item of a 100-item batched publish, against issue 23's budgets.
``python build.py bench --stages [--quick]``.

Each stage is measured alone, in this process, as CPU time (user + system: the commit's fsync is system time)
per operation over many operations, the median of ``--runs`` repeats:

  transport   bytes of a request to a parsed Request and a Response back to bytes: mp serve's HTTP/1.1
              connection (doors/http/protocol.py) fed the request, its reply a prepared Response
  door        the router on the engine's seat (Origin/Host/size checks, route, bearer, the body parsed, the
              reply built, the wake registry's mark): MonitorApp.handle_job minus the engine call it makes
  rules       the engine call alone (MonitorService.publish / .pull) on the in-memory store
  sql         the same call on SQLite (WAL, synchronous=FULL, a file in a temporary directory) minus rules:
              its statements and its commit with the fsync, alone (1 client) or shared by 16 publishes run
              as one engine call (16 clients: what one loop turn's requests become, doors/merging.py)
  loop        what is left of a real `mp serve` run's CPU per operation (read from /proc while a raw
              keep-alive client drives it): the event loop, the socket reads and writes, the wake-ups

The real run drives `mp serve` from this tree's venv with 1 and with 16 raw keep-alive connections (prebuilt
request bytes, one request in flight per connection), and with 1 connection sending 100-item batches
(`batch_100`: every figure of that row is per item). Results: bench/results/stages.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from common import machine, mp_serve, report  # noqa: E402
from monitor_protocol.api.messages import Request, Response  # noqa: E402
from monitor_protocol.api.rest import RestRouter  # noqa: E402
from monitor_protocol.core.service import MonitorService  # noqa: E402
from monitor_protocol.doors.engines import LoopEngine  # noqa: E402
from monitor_protocol.doors.http.app import MonitorApp  # noqa: E402
from monitor_protocol.doors.http.protocol import HttpConnection, HttpServer  # noqa: E402
from monitor_protocol.doors.http.server import install_fast_json  # noqa: E402
from monitor_protocol.store.memory import MemoryStore  # noqa: E402
from monitor_protocol.store.sqlite import SQLiteStore  # noqa: E402

# issue 23's budgets, µs of server CPU per operation
BUDGETS = {
    "publish_1": {"transport": 30, "door": 20, "rules": 80, "sql": 40, "total": 250},
    "publish_16": {"total": 80},
    "ackpull_1": {"total": 300},
    "batch_100": {"total": 20},  # per item of a 100-item batch (issue 23, item 4)
}
MONITOR = "stages"
TYPE = "com.example.ci.run"
OBS = {"type": TYPE, "subject": "build-412", "actor": "probe:ci", "data": {"status": "failed"}}
OBS_BYTES = json.dumps(OBS, separators=(",", ":")).encode()
BATCH = 100  # items per batched publish; its figures are per item
BATCH_BYTES = json.dumps([OBS] * BATCH, separators=(",", ":")).encode()


def cpu_us_per_op(fn: Callable[[], None], n: int) -> float:
    """CPU time (user + system) per call of fn, over n calls."""
    t0 = time.process_time_ns()
    for _ in range(n):
        fn()
    return (time.process_time_ns() - t0) / n / 1000


def median_of(runs: int, measure: Callable[[], float]) -> dict[str, float]:
    xs = [measure() for _ in range(runs)]
    return {"median": round(statistics.median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1)}


# ---------------------------------------------------------------------------------------------- setups
class Setup:
    """A service on a store with one monitor (and one subscription for pulls), ready for calls."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.service = MonitorService(store)
        created = self.service.create_monitor({"id": MONITOR, "visibility": "public", "types": [TYPE]}, None)
        self.owner: str = created["owner_token"]
        sub = self.service.subscribe({"monitor": MONITOR, "subscriber": "agent:stages"}, None)
        self.sub: str = sub["subscription"]["id"]
        self.sub_token: str = sub["token"]
        self.router = RestRouter(self.service, allowed_hosts=None)
        self.app = MonitorApp(self.service, self.router, store=store, engine=LoopEngine(store))
        self.next = 1

    def publish(self) -> None:
        self.service.publish(MONITOR, dict(OBS), self.owner)

    def publish_each(self, n: int) -> None:
        """n lone publishes as the server's group runs them: one engine call (MonitorService.publish_each)."""
        self.service.publish_each([(MONITOR, dict(OBS), self.owner, None) for _ in range(n)])

    def publish_batch(self) -> None:
        self.service.publish_many(MONITOR, [dict(OBS) for _ in range(BATCH)], self.owner)

    def ack_pull(self) -> None:
        body = self.service.pull(self.sub, self.sub_token, limit=1, ack=self.next)
        self.next = body["next"]

    def publish_request(self, body: bytes = OBS_BYTES) -> Request:
        return Request(
            "POST",
            f"/mp/v0/monitors/{MONITOR}/observations",
            [],
            {
                "host": "127.0.0.1",
                "authorization": f"Bearer {self.owner}",
                "content-type": "application/json",
            },
            body,
            door_encodes=True,  # as mp serve's HTTP door makes it
        )

    def ack_pull_request(self) -> Request:
        body = json.dumps({"ack": self.next, "limit": 1}).encode()
        return Request(
            "POST",
            f"/mp/v0/subscriptions/{self.sub}/pull",
            [],
            {
                "host": "127.0.0.1",
                "authorization": f"Bearer {self.sub_token}",
                "content-type": "application/json",
            },
            body,
            door_encodes=True,
        )

    def job_publish(self) -> None:
        response, _mark = self.app.handle_job(self.publish_request())
        assert response.status == 201, response.body

    def job_publishes(self, n: int) -> None:
        """n publish requests through the door as the server's group runs them (MonitorApp.handle_publishes)."""
        request = self.publish_request()
        for ok, (response, _mark) in self.app.handle_publishes([(request,)] * n):
            assert ok and response.status == 201, response.body

    def job_publish_batch(self) -> None:
        response, _mark = self.app.handle_job(self.publish_request(BATCH_BYTES))
        assert response.status == 207 and response.body["refused"] == 0, response.body

    def job_ack_pull(self) -> None:
        response, _mark = self.app.handle_job(self.ack_pull_request())
        assert response.status == 200, response.body
        self.next = response.body["next"]


def memory() -> Setup:
    return Setup(MemoryStore())


def sqlite(tmp: str, name: str) -> Setup:
    return Setup(SQLiteStore(os.path.join(tmp, name), synchronous="FULL"))


# ---------------------------------------------------------------------------------------------- transport
class _Transport:
    """What the connection writes to, kept in memory."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def transport_us(setup: Setup, request: bytes, reply: Response, n: int) -> float:
    """The connection fed `request` n times, each answered at once with `reply`."""

    async def measure() -> float:
        server = HttpServer(setup.app, header_timeout=30, body_timeout=60, keep_alive=65)
        server.dispatch = lambda conn, pending: conn.reply(pending, reply)  # type: ignore[method-assign]
        conn = HttpConnection(server)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(request)
        assert transport.out and transport.out[-1].startswith(b"HTTP/1.1 2"), transport.out[-1][:80]
        us = cpu_us_per_op(lambda: (conn.data_received(request), transport.out.clear()), n)
        server._sweeper.cancel()
        return us

    return asyncio.run(measure())


def door_reply(setup: Setup, request: Request, status: int) -> Response:
    """The door's reply to `request`, as the server would write it."""
    response, _mark = setup.app.handle_job(request)
    assert response.status == status and response.route is not None, (response.status, response.body)
    return response


def raw_request(req: Request) -> bytes:
    head = f"{req.method} {req.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
    return head.encode() + b"content-length: %d\r\n\r\n" % len(req.body) + req.body


# ---------------------------------------------------------------------------------------------- real run
def real_run(clients: int, secs: float, workload: str) -> dict[str, Any]:
    """Drive a real mp serve with `clients` raw keep-alive connections; its CPU per operation from /proc."""
    with (
        tempfile.TemporaryDirectory(prefix="mp-stages-real-") as tmp,
        mp_serve(os.path.join(tmp, "real.db")) as server,
    ):
        import httpx

        base = server.base
        owner = httpx.post(
            f"{base}/monitors", json={"id": MONITOR, "visibility": "public", "types": [TYPE]}, timeout=10
        ).json()["owner_token"]
        subs = []
        if workload == "ackpull":
            for i in range(clients):
                j = httpx.post(
                    f"{base}/subscriptions",
                    json={"monitor": MONITOR, "subscriber": f"agent:s{i}"},
                    timeout=10,
                ).json()
                subs.append((j["subscription"]["id"], j["token"]))
            batch = [dict(OBS) for _ in range(100)]
            for _ in range(200):  # 20,000 observations to read
                httpx.post(
                    f"{base}/monitors/{MONITOR}/observations",
                    json=batch,
                    headers={"authorization": f"Bearer {owner}"},
                    timeout=30,
                ).raise_for_status()
        pid = server.proc.pid
        port = server.port
        path = f"/mp/v0/monitors/{MONITOR}/observations"

        def stat() -> tuple[float, float]:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            tck = os.sysconf("SC_CLK_TCK")
            return int(fields[11]) / tck, int(fields[12]) / tck

        async def one(i: int, stop: float) -> int:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            count = 0
            nxt = 1
            while time.monotonic() < stop:
                if workload in ("publish", "batch"):
                    sent = OBS_BYTES if workload == "publish" else BATCH_BYTES
                    req = (
                        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {owner}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(sent)}\r\n\r\n"
                    ).encode() + sent
                else:
                    sub, token = subs[i]
                    body = b'{"ack":%d,"limit":1}' % nxt
                    req = (
                        f"POST /mp/v0/subscriptions/{sub}/pull HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                        f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(body)}\r\n\r\n"
                    ).encode() + body
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                at = head.lower().find(b"content-length:")
                payload = await reader.readexactly(int(head[at + 15 : head.index(b"\r\n", at)]))
                if head[9:12] not in (b"200", b"201", b"207"):
                    raise RuntimeError(head[:200] + payload[:200])
                if workload == "ackpull":
                    nxt = json.loads(payload)["next"]
                if workload == "batch" and json.loads(payload)["refused"]:
                    raise RuntimeError(payload[:400])
                count += BATCH if workload == "batch" else 1
            writer.close()
            return count

        async def drive() -> int:
            stop = time.monotonic() + secs
            return sum(await asyncio.gather(*(one(i, stop) for i in range(clients))))

        def engine() -> tuple[float, float, float]:
            """The server's own count of its engine: CPU seconds, calls, batches (its /metrics)."""
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            found = {
                name: float(value)
                for name, value in (
                    line.split(" ", 1) for line in text.splitlines() if line.startswith("mp_engine")
                )
            }
            return (
                found["mp_engine_cpu_seconds_total"],
                found["mp_engine_calls_total"],
                found["mp_engine_commit_seconds_count"],
            )

        e0 = engine()
        u0, s0 = stat()
        t0 = time.monotonic()
        ops = asyncio.run(drive())
        elapsed = time.monotonic() - t0
        u1, s1 = stat()
        e1 = engine()
        return {
            "ops_per_s": round(ops / elapsed),
            "server_us_per_op": round((u1 - u0 + s1 - s0) / ops * 1e6, 1),
            "user_us_per_op": round((u1 - u0) / ops * 1e6, 1),
            "system_us_per_op": round((s1 - s0) / ops * 1e6, 1),
            # Measured inside the server (mp_engine_cpu_seconds_total): its engine calls and their commits,
            # per operation, and how many calls shared a batch (a group commit).
            "engine_us_per_op": round((e1[0] - e0[0]) / ops * 1e6, 1),
            "calls_per_batch": round((e1[1] - e0[1]) / max(1.0, e1[2] - e0[2]), 1),
            "load": round(os.getloadavg()[0], 2),
        }


# ---------------------------------------------------------------------------------------------- the profile
def profile(quick: bool, runs: int) -> dict[str, Any]:
    install_fast_json()  # as mp serve does
    n = 400 if quick else 2000
    secs = 1.5 if quick else 4.0
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mp-stages-") as tmp:
        mem, disk = memory(), sqlite(tmp, "stages.db")
        for s in (mem, disk):  # a log to read, so that pulls always find an observation
            for _ in range(n * runs * 8 + 64):
                s.publish()

        # The replies the door itself made, so that they carry what the server's carry (the route the router
        # matched, which the request counter reads instead of matching the path again).
        reply_pub = door_reply(mem, mem.publish_request(), 201)
        reply_pull = door_reply(mem, mem.ack_pull_request(), 200)

        transport = median_of(
            runs, lambda: transport_us(mem, raw_request(mem.publish_request()), reply_pub, n)
        )
        out["publish_1"] = {
            "transport": transport,
            "door_and_rules": median_of(runs, lambda: cpu_us_per_op(mem.job_publish, n)),
            "rules": median_of(runs, lambda: cpu_us_per_op(mem.publish, n)),
            "rules_and_sql": median_of(runs, lambda: cpu_us_per_op(disk.publish, n)),
        }
        # 16 clients: the requests of one loop turn are one group, and its lone publishes one engine call
        # (doors/merging.py), so the in-process stages run 16 publishes as that call.
        per, g = n // 16, 16
        out["publish_16"] = {
            "transport": median_of(
                runs, lambda: transport_us(mem, raw_request(mem.publish_request()), reply_pub, n)
            ),
            "door_and_rules": median_of(runs, lambda: cpu_us_per_op(lambda: mem.job_publishes(g), per) / g),
            "rules": median_of(runs, lambda: cpu_us_per_op(lambda: mem.publish_each(g), per) / g),
            "rules_and_sql": median_of(runs, lambda: cpu_us_per_op(lambda: disk.publish_each(g), per) / g),
        }
        ack = {
            "transport": median_of(
                runs, lambda: transport_us(mem, raw_request(mem.ack_pull_request()), reply_pull, n)
            ),
            "door_and_rules": median_of(runs, lambda: cpu_us_per_op(mem.job_ack_pull, n)),
            "rules": median_of(runs, lambda: cpu_us_per_op(mem.ack_pull, n)),
            "rules_and_sql": median_of(runs, lambda: cpu_us_per_op(disk.ack_pull, n)),
        }
        out["ackpull_1"] = ack
        nb = max(10, n // 20)  # batches per measure; every figure below is per item
        reply_batch = door_reply(mem, mem.publish_request(BATCH_BYTES), 207)
        batch_request = raw_request(mem.publish_request(BATCH_BYTES))
        out["batch_100"] = {
            "transport": median_of(runs, lambda: transport_us(mem, batch_request, reply_batch, nb) / BATCH),
            "door_and_rules": median_of(runs, lambda: cpu_us_per_op(mem.job_publish_batch, nb) / BATCH),
            "rules": median_of(runs, lambda: cpu_us_per_op(mem.publish_batch, nb) / BATCH),
            "rules_and_sql": median_of(runs, lambda: cpu_us_per_op(disk.publish_batch, nb) / BATCH),
        }

    real = {
        "publish_1": real_run(1, secs, "publish"),
        "publish_16": real_run(16, secs, "publish"),
        "ackpull_1": real_run(1, secs, "ackpull"),
        "batch_100": real_run(1, secs, "batch"),
    }
    table: dict[str, Any] = {}
    for key, stages in out.items():
        transport = stages["transport"]["median"]
        rules = stages["rules"]["median"]
        door = stages["door_and_rules"]["median"] - rules
        sql = stages["rules_and_sql"]["median"] - rules
        whole = real[key]["server_us_per_op"]
        loop = whole - transport - door - rules - sql
        # The same split measured in the running server: what its engine calls and commits took there (door,
        # rules and sql of the stages above), and the rest (transport and the loop).
        in_engine = real[key]["engine_us_per_op"]
        table[key] = {
            "stages_us": {
                "transport": round(transport, 1),
                "door": round(door, 1),
                "rules": round(rules, 1),
                "sql": round(sql, 1),
                "loop": round(loop, 1),
                "total": round(whole, 1),
            },
            "in_server_us": {
                "engine": in_engine,
                "outside_engine": round(whole - in_engine, 1),
                "engine_stages": round(door + rules + sql, 1),
            },
            "raw": stages,
            "real": real[key],
            "budgets_us": BUDGETS.get(key, {}),
        }
    return table


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"Machine: {m['nproc']} x {m['cpu_model']}, Python {m['python']}; date {m['date']}, commit {m['commit']}; "
        f"load average {result['load_before']} before, {result['load_after']} after.",
        "",
        "| µs of server CPU per operation | transport | door | rules | sql | loop | total | real run |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    inside = [
        "",
        "Measured inside the real run's server (its /metrics, `mp_engine_cpu_seconds_total`): its engine calls",
        "with their commits, beside what the stages above give the same work (door + rules + sql):",
        "",
        "| µs of server CPU per operation | engine, in the server | door + rules + sql (stages) | outside the "
        "engine (transport, loop) | calls per batch |",
        "|---|---:|---:|---:|---:|",
    ]
    budgets = {"transport": "≤30", "door": "≤20", "rules": "≤80", "sql": "≤40"}
    for key, row in result["stages"].items():
        s = row["stages_us"]
        real = row["real"]
        lines.append(
            f"| {key} | {s['transport']} | {s['door']} | {s['rules']} | {s['sql']} | {s['loop']} | {s['total']} | "
            f"{real['ops_per_s']:,}/s, user {real['user_us_per_op']} + sys {real['system_us_per_op']}, load {real['load']} |"
        )
        inner = row.get("in_server_us")
        if inner is not None:
            inside.append(
                f"| {key} | {inner['engine']} | {inner['engine_stages']} | {inner['outside_engine']} | "
                f"{real['calls_per_batch']} |"
            )
    lines.append(
        f"| budget (publish, 1 client) | {budgets['transport']} | {budgets['door']} | {budgets['rules']} | "
        f"{budgets['sql']} | | ≤250 (16 clients ≤80; pull+ack ≤300; a batch's item ≤20) | |"
    )
    if len(inside) > 6:
        lines += inside
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--markdown", action="store_true", help="print the last result as a table")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results")
    args = ap.parse_args(argv)

    def produce() -> dict[str, Any]:
        load_before = round(os.getloadavg()[0], 2)
        stages = profile(args.quick, 3 if args.quick else args.runs)
        return {
            "machine": machine(),
            "load_before": load_before,
            "load_after": round(os.getloadavg()[0], 2),
            "stages": stages,
        }

    return report(args, "stages", produce, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
