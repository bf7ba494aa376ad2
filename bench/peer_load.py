"""One load process of bench/peers.py: ``python bench/peer_load.py '<json spec>'``.

It connects and sets up (its readers: consumer groups, cursor rows, durable consumers, subscriptions), prints
``READY``, waits for ``GO`` on stdin, runs its workload until the deadline (or until the log is drained),
prints one JSON line with what it completed, then removes its readers and exits. The orchestrator measures the
server's CPU between GO and that line, so set-up and tear-down are outside the window.

Spec: system (mp | redis | postgres | nats), workload (prepare | publish | batch | pullack | drain | wake),
tasks (1 = one client, the system's synchronous client where it has one, sequential; N > 1 = N asyncio tasks in
this process, each with its own connection and, for readers, its own reader), duration, conn (where to
connect), ctx (what prepare returned: names, tokens, sizes), run (unique name prefix for this run's readers),
limit (items per pull), one_call (mp: pull(ack=n), the acknowledgement riding on the next pull).

Every system is driven by its usual Python client: redis-py, psycopg 3, nats-py (asyncio only, so its single
client is one asyncio task) and the project's own ``monitor_protocol.client``. Each client class below is one
connection with the same methods, so a workload is written once for all of them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

OBS: dict[str, Any] = {
    "type": "com.example.bench.tick",
    "subject": "s-1",
    "actor": "probe:bench",
    "data": {"n": 1},
}
BATCH = 100  # observations per batched request / pipeline / INSERT / async batch
MAX_OPS = 5_000_000  # a hard bound on every loop besides its deadline
WAKE_WAIT_S = 30  # how long a waiting reader is parked at most
PARK_S = 0.02  # after the reader says it is about to wait, let its request reach the server and park


def payload() -> str:
    # Encoded per operation, as the mp client encodes its request body per call.
    return json.dumps(OBS, separators=(",", ":"))


# ============================================================================================ Redis
class RedisSync:
    """redis-py, one connection. Streams: XADD; a reader is a consumer group (XREADGROUP + XACK)."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any]) -> None:
        import redis

        self.r = redis.Redis(host=conn["host"], port=conn["port"])
        self.r.ping()
        self.group = ""
        self.stream = "feed"
        self.waited: bytes | None = None

    def publish(self) -> int:
        self.r.xadd("pub", {"body": payload()})
        return 1

    def batch(self) -> int:
        pipe = self.r.pipeline(transaction=True)  # MULTI ... EXEC: one AOF write and fsync
        for _ in range(BATCH):
            pipe.xadd("pub", {"body": payload()})
        pipe.execute()
        return BATCH

    def open_reader(self, name: str, stream: str = "feed", start: str = "0") -> None:
        self.group, self.stream = name, stream
        self.r.xgroup_create(stream, name, id=start, mkstream=True)

    def pull_ack(self, limit: int) -> int:
        got = self.r.xreadgroup(self.group, "c", {self.stream: ">"}, count=limit)
        ids = [entry_id for _, entries in got or [] for entry_id, _ in entries]
        if ids:
            self.r.xack(self.stream, self.group, *ids)
        return len(ids)

    def close_reader(self) -> None:
        self.r.xgroup_destroy(self.stream, self.group)

    def open_waiter(self, name: str) -> None:
        self.open_reader(name, "wake", "$")

    def wait_one(self) -> Any:
        got = self.r.xreadgroup(self.group, "c", {"wake": ">"}, count=1, block=WAKE_WAIT_S * 1000)
        self.waited = got[0][1][0][0] if got else None
        return self.waited

    def ack_waited(self) -> None:
        if self.waited is not None:
            self.r.xack("wake", self.group, self.waited)

    def publish_wake(self) -> Any:
        return self.r.xadd("wake", {"body": payload()})

    def close(self) -> None:
        self.r.close()


class RedisAsync:
    """redis.asyncio, one connection per task; the same commands as RedisSync."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any]) -> None:
        import redis.asyncio

        self.r = redis.asyncio.Redis(host=conn["host"], port=conn["port"])
        self.group = ""

    async def connect(self) -> None:
        await self.r.ping()

    async def publish(self) -> int:
        await self.r.xadd("pub", {"body": payload()})
        return 1

    async def batch(self) -> int:
        pipe = self.r.pipeline(transaction=True)
        for _ in range(BATCH):
            pipe.xadd("pub", {"body": payload()})
        await pipe.execute()
        return BATCH

    async def open_reader(self, name: str) -> None:
        self.group = name
        await self.r.xgroup_create("feed", name, id="0")

    async def pull_ack(self, limit: int) -> int:
        got = await self.r.xreadgroup(self.group, "c", {"feed": ">"}, count=limit)
        ids = [entry_id for _, entries in got or [] for entry_id, _ in entries]
        if ids:
            await self.r.xack("feed", self.group, *ids)
        return len(ids)

    async def close_reader(self) -> None:
        await self.r.xgroup_destroy("feed", self.group)

    async def close(self) -> None:
        await self.r.aclose()


# ============================================================================================ PostgreSQL
# The log is a table with a bigserial id; a reader is a row of `cursors`. Pull+ack is the usual "Postgres as a
# log with per-reader cursors": in one transaction, lock the reader's cursor row (FOR UPDATE, so two workers of
# one reader cannot take the same rows), read the rows after it, move the cursor past them, commit.
PG_PULL = (
    "SELECT id, body FROM log_{stream} WHERE id > "
    "(SELECT pos FROM cursors WHERE reader = %s FOR UPDATE) ORDER BY id LIMIT %s"
)
PG_ACK = "UPDATE cursors SET pos = %s WHERE reader = %s"
PG_INSERT = "INSERT INTO log_{stream} (body) VALUES (%s)"
PG_BATCH = "INSERT INTO log_pub (body) VALUES " + ", ".join(["(%s)"] * BATCH)


def pg_schema(fill: int) -> list[str]:
    tables = [
        f"CREATE TABLE log_{s} (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), body jsonb NOT NULL)"
        for s in ("pub", "feed", "wake")
    ]
    return [
        *tables,
        "CREATE TABLE cursors (reader text PRIMARY KEY, pos bigint NOT NULL)",
        f"INSERT INTO log_feed (body) SELECT '{payload()}'::jsonb FROM generate_series(1, {int(fill)})",
    ]


class PgSync:
    """psycopg 3, one connection in autocommit: each INSERT is its own commit (fsync'd: synchronous_commit=on)."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any]) -> None:
        import psycopg
        from psycopg.types.json import Jsonb

        self.jsonb = Jsonb
        self.c = psycopg.connect(conn["conninfo"], autocommit=True)
        self.reader = ""
        self.stream = "feed"
        self.waited: int | None = None

    def publish(self) -> int:
        self.c.execute(PG_INSERT.format(stream="pub"), (self.jsonb(OBS),))
        return 1

    def batch(self) -> int:
        self.c.execute(PG_BATCH, [self.jsonb(OBS) for _ in range(BATCH)])  # one multi-row INSERT, one commit
        return BATCH

    def open_reader(self, name: str, stream: str = "feed") -> None:
        self.reader, self.stream = name, stream
        start = "0" if stream == "feed" else f"(SELECT coalesce(max(id), 0) FROM log_{stream})"
        self.c.execute(f"INSERT INTO cursors (reader, pos) VALUES (%s, {start})", (name,))

    def pull_ack(self, limit: int) -> int:
        with self.c.transaction():
            rows = self.c.execute(PG_PULL.format(stream=self.stream), (self.reader, limit)).fetchall()
            if rows:
                self.c.execute(PG_ACK, (rows[-1][0], self.reader))
        return len(rows)

    def close_reader(self) -> None:
        self.c.execute("DELETE FROM cursors WHERE reader = %s", (self.reader,))

    # Wake: LISTEN/NOTIFY. The producer inserts and notifies in one transaction (the notification leaves at
    # commit); the waiting reader gets it, then reads the row after its cursor: the reply is the row.
    def open_waiter(self, name: str) -> None:
        self.open_reader(name, "wake")
        self.c.execute("LISTEN wake")

    def wait_one(self) -> Any:
        for _ in self.c.notifies(timeout=WAKE_WAIT_S, stop_after=1):
            pass
        rows = self.c.execute(PG_PULL.format(stream="wake"), (self.reader, 1)).fetchall()
        self.waited = rows[0][0] if rows else None
        return self.waited

    def ack_waited(self) -> None:
        if self.waited is not None:
            self.c.execute(PG_ACK, (self.waited, self.reader))

    def publish_wake(self) -> Any:
        with self.c.transaction():
            row = self.c.execute(
                PG_INSERT.format(stream="wake") + " RETURNING id", (self.jsonb(OBS),)
            ).fetchone()
            self.c.execute("SELECT pg_notify('wake', %s)", (str(row[0]),))
        return row[0]

    def close(self) -> None:
        self.c.close()


class PgAsync:
    """psycopg 3 AsyncConnection, one per task; the same statements as PgSync."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any]) -> None:
        from psycopg.types.json import Jsonb

        self.jsonb = Jsonb
        self.conninfo = conn["conninfo"]
        self.reader = ""

    async def connect(self) -> None:
        import psycopg

        self.c = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)

    async def publish(self) -> int:
        await self.c.execute(PG_INSERT.format(stream="pub"), (self.jsonb(OBS),))
        return 1

    async def batch(self) -> int:
        await self.c.execute(PG_BATCH, [self.jsonb(OBS) for _ in range(BATCH)])
        return BATCH

    async def open_reader(self, name: str) -> None:
        self.reader = name
        await self.c.execute("INSERT INTO cursors (reader, pos) VALUES (%s, 0)", (name,))

    async def pull_ack(self, limit: int) -> int:
        async with self.c.transaction():
            cur = await self.c.execute(PG_PULL.format(stream="feed"), (self.reader, limit))
            rows = await cur.fetchall()
            if rows:
                await self.c.execute(PG_ACK, (rows[-1][0], self.reader))
        return len(rows)

    async def close_reader(self) -> None:
        await self.c.execute("DELETE FROM cursors WHERE reader = %s", (self.reader,))

    async def close(self) -> None:
        await self.c.close()


# ============================================================================================ NATS
class NatsAsync:
    """nats-py (asyncio only), one connection per task. JetStream streams on file storage; every publish
    awaits its PubAck. A reader is a durable pull consumer: fetch, then ack_sync (the ack's reply awaited)."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any]) -> None:
        self.url = conn["url"]
        self.feed_size = int(ctx.get("feed") or 0)
        self.name = ""
        self.stream = "FEED"
        self.ack_all = False
        self.got = 0
        self.waited: Any = None

    async def connect(self) -> None:
        import nats

        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()

    async def publish(self) -> int:
        await self.js.publish("pub", payload().encode())
        return 1

    async def batch(self) -> int:
        # 100 asynchronous publishes, then all their PubAcks awaited.
        futures = [await self.js.publish_async("pub", payload().encode()) for _ in range(BATCH)]
        await asyncio.gather(*futures)
        return BATCH

    async def open_reader(self, name: str, drain: bool = False) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        # A drain acks its batch at once: AckPolicy.ALL acknowledges everything up to the message acked,
        # like an acknowledged cursor. A single pull acks its message explicitly.
        self.ack_all = drain
        policy = AckPolicy.ALL if drain else AckPolicy.EXPLICIT
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=policy, max_ack_pending=10_000)
        self.name, self.stream = name, "FEED"
        self.sub = await self.js.pull_subscribe("feed", durable=name, stream="FEED", config=config)

    async def pull_ack(self, limit: int) -> int:
        if self.feed_size and self.got >= self.feed_size:
            return 0  # drained: a fetch now would wait for its timeout
        try:
            msgs = await self.sub.fetch(limit, timeout=2)
        except TimeoutError:
            return 0
        if self.ack_all:
            await msgs[-1].ack_sync()
        else:
            await asyncio.gather(*(m.ack_sync() for m in msgs))
        self.got += len(msgs)
        return len(msgs)

    async def close_reader(self) -> None:
        await self.sub.unsubscribe()
        await self.js.delete_consumer(self.stream, self.name)

    async def open_waiter(self, name: str) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT)
        self.name, self.stream = name, "WAKE"
        self.sub = await self.js.pull_subscribe("wake", durable=name, stream="WAKE", config=config)

    async def wait_one(self) -> Any:
        try:
            msgs = await self.sub.fetch(1, timeout=WAKE_WAIT_S)
        except TimeoutError:
            self.waited = None
            return None
        self.waited = msgs[0]
        return msgs[0].metadata.sequence.stream

    async def ack_waited(self) -> None:
        if self.waited is not None:
            await self.waited.ack_sync()

    async def publish_wake(self) -> Any:
        return (await self.js.publish("wake", payload().encode())).seq

    async def close(self) -> None:
        await self.nc.close()


# ============================================================================================ mp serve
def _mp_pull_has_ack() -> bool:
    import inspect

    from monitor_protocol.client import Client

    return "ack" in inspect.signature(Client.pull).parameters


class MpSync:
    """monitor_protocol.client.Client, one keep-alive connection. A reader is a subscription: pull, then ack
    its `next`; with one_call, pull(ack=n) acknowledges the previous pull's `next` and pulls in one request."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any], one_call: bool = False) -> None:
        from monitor_protocol.client import Client

        self.c = Client(conn["url"], timeout=60.0)
        self.ctx = ctx
        self.one_call = one_call
        self.sid = self.tok = ""
        self.pending: int | None = None  # one_call: the `next` to acknowledge with the next pull
        self.batched: bool | None = None  # publish_many: whether the server's batch call was used
        self.waited: Any = None

    def publish(self) -> int:
        self.c.publish(
            "pub", OBS["type"], subject=OBS["subject"], data=OBS["data"], actor=OBS["actor"],
            token=self.ctx["tokens"]["pub"],
        )  # fmt: skip
        return 1

    def batch(self) -> int:
        if not hasattr(self.c, "publish_many"):
            return sum(self.publish() for _ in range(BATCH))  # the fallback the label says
        reply = self.c.publish_many("pub", [OBS] * BATCH, token=self.ctx["tokens"]["pub"])
        self.batched = reply.batched
        if reply.refused:
            raise RuntimeError(f"publish_many refused {len(reply.refused)} items: {reply.refused[0].error!r}")
        return reply.published

    def open_reader(self, name: str, monitor: str | None = None, start: str = "earliest") -> None:
        made = self.c.subscribe(monitor or self.ctx["feed_monitor"], name, from_=start)
        self.sid, self.tok = made.subscription.id, made.token

    def pull_ack(self, limit: int) -> int:
        if self.one_call:
            if self.pending is None:
                r = self.c.pull(self.sid, limit=limit, token=self.tok)
            else:
                r = self.c.pull(self.sid, limit=limit, ack=self.pending, token=self.tok)
            if r.observations:
                self.pending = r.next
            return len(r.observations)
        r = self.c.pull(self.sid, limit=limit, token=self.tok)
        if r.observations:
            self.c.ack(self.sid, r.next, token=self.tok)
        return len(r.observations)

    def close_reader(self) -> None:
        if self.pending is not None:
            self.c.ack(self.sid, self.pending, token=self.tok)
        self.c.retire_subscription(self.sid, token=self.tok)

    def open_waiter(self, name: str) -> None:
        self.open_reader(name, "wake", "head")
        # Subscribing appends a `subscribed` row: skip it (and anything older) so the reader waits.
        first = self.c.pull(self.sid, limit=200, token=self.tok)
        if first.observations:
            self.c.ack(self.sid, first.next, token=self.tok)

    def wait_one(self) -> Any:
        r = self.c.pull(self.sid, limit=1, wait=WAKE_WAIT_S, token=self.tok)
        self.waited = r.next if r.observations else None
        return int(r.observations[0]["id"]) if r.observations else None

    def ack_waited(self) -> None:
        if self.waited is not None:
            self.c.ack(self.sid, self.waited, token=self.tok)

    def publish_wake(self) -> Any:
        return self.c.publish(
            "wake", OBS["type"], subject=OBS["subject"], data=OBS["data"], actor=OBS["actor"],
            token=self.ctx["tokens"]["wake"],
        ).seq  # fmt: skip

    def close(self) -> None:
        self.c.close()


class MpAsync:
    """monitor_protocol.client.AsyncClient, one per task; the same calls as MpSync."""

    def __init__(self, conn: dict[str, Any], ctx: dict[str, Any], one_call: bool = False) -> None:
        from monitor_protocol.client import AsyncClient

        self.c = AsyncClient(conn["url"], timeout=60.0)
        self.ctx = ctx
        self.one_call = one_call
        self.sid = self.tok = ""
        self.pending: int | None = None
        self.batched: bool | None = None

    async def connect(self) -> None:
        await self.c.discover()  # opens the keep-alive connection before the window

    async def publish(self) -> int:
        await self.c.publish(
            "pub", OBS["type"], subject=OBS["subject"], data=OBS["data"], actor=OBS["actor"],
            token=self.ctx["tokens"]["pub"],
        )  # fmt: skip
        return 1

    async def batch(self) -> int:
        if not hasattr(self.c, "publish_many"):
            return sum([await self.publish() for _ in range(BATCH)])
        reply = await self.c.publish_many("pub", [OBS] * BATCH, token=self.ctx["tokens"]["pub"])
        self.batched = reply.batched
        return reply.published

    async def open_reader(self, name: str) -> None:
        made = await self.c.subscribe(self.ctx["feed_monitor"], name, from_="earliest")
        self.sid, self.tok = made.subscription.id, made.token

    async def pull_ack(self, limit: int) -> int:
        if self.one_call:
            if self.pending is None:
                r = await self.c.pull(self.sid, limit=limit, token=self.tok)
            else:
                r = await self.c.pull(self.sid, limit=limit, ack=self.pending, token=self.tok)
            if r.observations:
                self.pending = r.next
            return len(r.observations)
        r = await self.c.pull(self.sid, limit=limit, token=self.tok)
        if r.observations:
            await self.c.ack(self.sid, r.next, token=self.tok)
        return len(r.observations)

    async def close_reader(self) -> None:
        if self.pending is not None:
            await self.c.ack(self.sid, self.pending, token=self.tok)
        await self.c.retire_subscription(self.sid, token=self.tok)

    async def close(self) -> None:
        await self.c.aclose()


SYNC: dict[str, Any] = {"redis": RedisSync, "postgres": PgSync, "mp": MpSync}
ASYNC: dict[str, Any] = {"redis": RedisAsync, "postgres": PgAsync, "nats": NatsAsync, "mp": MpAsync}


# ============================================================================================ prepare
def prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Once per system, before the rounds: the streams / tables / monitors, the pre-filled log, versions."""
    system, conn, fill = spec["system"], spec["conn"], int(spec["fill"])
    if system == "redis":
        import redis

        r = redis.Redis(host=conn["host"], port=conn["port"])
        for start in range(0, fill, 1000):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(1000, fill - start)):
                pipe.xadd("feed", {"body": payload()})
            pipe.execute()
        info = r.info("persistence")
        r.close()
        return {
            "feed": fill,
            "client": f"redis-py {redis.__version__}",
            "aof_enabled": info.get("aof_enabled"),
        }
    if system == "postgres":
        import psycopg

        with psycopg.connect(conn["conninfo"], autocommit=True) as c:
            for stmt in pg_schema(fill):
                c.execute(stmt)
            settings = {
                k: c.execute(f"SHOW {k}").fetchone()[0]
                for k in ("fsync", "synchronous_commit", "wal_sync_method")
            }  # type: ignore[index]
            server = c.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        libpq = psycopg.pq.version()
        return {"feed": fill, "client": f"psycopg {psycopg.__version__} (libpq {libpq // 10000}.{libpq % 100})",
                "server_version": server, "server_settings": settings}  # fmt: skip
    if system == "nats":
        return asyncio.run(_prepare_nats(conn, fill))
    return _prepare_mp(conn, spec["ctx"])


async def _prepare_nats(conn: dict[str, Any], fill: int) -> dict[str, Any]:
    import nats
    from nats.aio.client import __version__
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(conn["url"])
    js = nc.jetstream()
    for name in ("PUB", "FEED", "WAKE"):
        await js.add_stream(StreamConfig(name=name, subjects=[name.lower()], storage=StorageType.FILE))
    for start in range(0, fill, 1000):
        futures = [await js.publish_async("feed", payload().encode()) for _ in range(min(1000, fill - start))]
        await asyncio.gather(*futures)
    info = await js.stream_info("FEED")
    await nc.close()
    return {
        "feed": info.state.messages,
        "client": f"nats-py {__version__}",
        "storage": str(info.config.storage),
    }


def _prepare_mp(conn: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    import monitor_protocol
    from monitor_protocol.client import Client
    from monitor_protocol.client.keepalive import AsyncPool

    tokens = {}
    with Client(conn["url"]) as c:
        for monitor in ("pub", "wake"):
            made = c.create_monitor(monitor, visibility="public", types=[OBS["type"]])
            tokens[monitor] = made.owner_token
        caps = c.discover().raw.get("capabilities") or {}
    return {
        **ctx,
        "version": f"monitor_protocol {getattr(monitor_protocol, '__version__', '?')} (this tree)",
        "tokens": tokens,
        # The client's HTTP layers are this tree's (the commit is in the machine record).
        "client": f"monitor_protocol.client {getattr(monitor_protocol, '__version__', '?')} "
        f"(Client on {c.http_layer}, AsyncClient on {AsyncPool.http_layer})",
        "server_extensions": sorted((caps.get("extensions") or {}) if isinstance(caps, dict) else {}),
        "client_has_publish_many": hasattr(Client, "publish_many"),
        "client_pull_has_ack": _mp_pull_has_ack(),
    }


# ============================================================================================ harness
class Tally:
    def __init__(self) -> None:
        self.ops = 0
        self.units = 0
        self.errors = 0
        self.first_error: str | None = None
        self.samples: list[float] = []
        self.batched: bool | None = None  # mp publish_many: whether the server's batch call was used

    def fail(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = repr(exc)[:500]


def handshake(said: str = "READY", expect: str = "GO") -> None:
    print(said, flush=True)
    line = sys.stdin.readline()
    if line.strip() != expect:
        raise SystemExit(f"expected {expect}, got {line!r}")


def op_of(client: Any, workload: str, limit: int) -> Callable[[], Any]:
    if workload in ("pullack", "drain"):
        return lambda: client.pull_ack(limit)
    return getattr(client, workload)


def run_sync(spec: dict[str, Any]) -> tuple[Tally, float, float, Callable[[], None]]:
    """One synchronous client, sequential operations."""
    kwargs = {"one_call": True} if spec.get("one_call") else {}
    client = SYNC[spec["system"]](spec["conn"], spec["ctx"], **kwargs)
    reader = spec["workload"] in ("pullack", "drain")
    if reader:
        client.open_reader(f"{spec['run']}-0")
    op = op_of(client, spec["workload"], int(spec.get("limit") or 1))
    tally = Tally()
    handshake()
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + float(spec["duration"])
    for _ in range(MAX_OPS):
        if time.monotonic() >= deadline:
            break
        try:
            n = op()
        except Exception as exc:  # counted and reported; the run goes on until its deadline
            tally.fail(exc)
            continue
        if n == 0:
            break  # drained: the log is exhausted
        tally.ops += 1
        tally.units += n
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    tally.batched = getattr(client, "batched", None)

    def teardown() -> None:
        if reader:
            client.close_reader()
        client.close()

    return tally, elapsed, cpu, teardown


async def run_async(spec: dict[str, Any]) -> tuple[Tally, float, float, Callable[[], Awaitable[None]]]:
    """``tasks`` asyncio tasks in this process, each with its own client (connection) and reader."""
    kwargs = {"one_call": True} if spec.get("one_call") else {}
    cls = ASYNC[spec["system"]]
    clients = [cls(spec["conn"], spec["ctx"], **kwargs) for _ in range(int(spec["tasks"]))]
    await asyncio.gather(*(c.connect() for c in clients))
    reader = spec["workload"] in ("pullack", "drain")
    if reader:
        if spec["system"] == "nats":
            await asyncio.gather(
                *(
                    c.open_reader(f"{spec['run']}-{i}", spec["workload"] == "drain")
                    for i, c in enumerate(clients)
                )
            )
        else:
            await asyncio.gather(*(c.open_reader(f"{spec['run']}-{i}") for i, c in enumerate(clients)))
    limit = int(spec.get("limit") or 1)
    tally = Tally()
    await asyncio.get_running_loop().run_in_executor(None, handshake)
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + float(spec["duration"])

    async def task(client: Any) -> None:
        op = op_of(client, spec["workload"], limit)
        for _ in range(MAX_OPS):
            if time.monotonic() >= deadline:
                return
            try:
                n = await op()
            except Exception as exc:
                tally.fail(exc)
                continue
            if n == 0:
                return
            tally.ops += 1
            tally.units += n

    await asyncio.gather(*(task(c) for c in clients))
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    tally.batched = getattr(clients[0], "batched", None)

    async def teardown() -> None:
        if reader:
            await asyncio.gather(*(c.close_reader() for c in clients))
        await asyncio.gather(*(c.close() for c in clients))

    return tally, elapsed, cpu, teardown


# -------------------------------------------------------------------------------------------- wake
def wake_sync(spec: dict[str, Any]) -> tuple[Tally, float, float, Callable[[], None]]:
    """A reader thread parks a blocking read; 20 ms later the main thread publishes; the sample is the time from
    the publish being sent to the waiting read's reply (perf_counter, one process, two connections)."""
    cls = SYNC[spec["system"]]
    reader, producer = cls(spec["conn"], spec["ctx"]), cls(spec["conn"], spec["ctx"])
    reader.open_waiter(f"{spec['run']}-w")
    parked, arrived, done = threading.Event(), threading.Event(), threading.Event()
    got: list[tuple[float, Any]] = []
    tally = Tally()

    def read_loop() -> None:
        for _ in range(MAX_OPS):
            parked.set()
            try:
                seen = reader.wait_one()
                got.append((time.perf_counter(), seen))
                arrived.set()
                reader.ack_waited()
            except Exception as exc:
                tally.fail(exc)
                arrived.set()
                return
            if done.is_set():
                return

    th = threading.Thread(target=read_loop, daemon=True)
    th.start()
    handshake()
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + float(spec["duration"])
    while time.monotonic() < deadline and th.is_alive():
        if not parked.wait(WAKE_WAIT_S + 5):
            tally.fail(RuntimeError("the reader never parked"))
            break
        parked.clear()
        time.sleep(PARK_S)
        arrived.clear()
        t_send = time.perf_counter()
        sent = producer.publish_wake()
        if not arrived.wait(WAKE_WAIT_S + 5):
            tally.fail(RuntimeError("the waiting reader never answered"))
            break
        _sample(tally, got[-1], t_send, sent)
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    done.set()

    def teardown() -> None:
        # Release the reader, which sees `done`: it may be parked, or about to park, or already gone; one more
        # publish a second until it is gone covers all three without waiting for its 30 s.
        for _ in range(WAKE_WAIT_S):
            if not th.is_alive():
                break
            producer.publish_wake()
            th.join(1.0)
        reader.close_reader()
        reader.close()
        producer.close()

    return tally, elapsed, cpu, teardown


def _sample(tally: Tally, got: tuple[float, Any], t_send: float, sent: Any) -> None:
    t_recv, seen = got
    if seen is None or _text(seen) != _text(sent):
        tally.fail(RuntimeError(f"expected {sent!r}, the reader got {seen!r}"))
        return
    tally.ops += 1
    tally.units += 1
    tally.samples.append((t_recv - t_send) * 1000)


def _text(v: Any) -> str:
    # Redis ids arrive as bytes from both sides; the other systems' are ints.
    return v.decode() if isinstance(v, bytes) else str(v)


async def wake_async(spec: dict[str, Any]) -> tuple[Tally, float, float, Callable[[], Awaitable[None]]]:
    """The same as wake_sync for an asyncio-only client: a reader task and the producer, one event loop."""
    cls = ASYNC[spec["system"]]
    reader, producer = cls(spec["conn"], spec["ctx"]), cls(spec["conn"], spec["ctx"])
    await asyncio.gather(reader.connect(), producer.connect())
    await reader.open_waiter(f"{spec['run']}-w")
    parked, arrived = asyncio.Event(), asyncio.Event()
    got: list[tuple[float, Any]] = []
    tally = Tally()
    state = {"done": False}

    async def read_loop() -> None:
        for _ in range(MAX_OPS):
            parked.set()
            try:
                seen = await reader.wait_one()
                got.append((time.perf_counter(), seen))
                arrived.set()
                await reader.ack_waited()
            except Exception as exc:
                tally.fail(exc)
                arrived.set()
                return
            if state["done"]:
                return

    loop_task = asyncio.create_task(read_loop())
    await asyncio.get_running_loop().run_in_executor(None, handshake)
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline = t0 + float(spec["duration"])
    while time.monotonic() < deadline and not loop_task.done():
        await asyncio.wait_for(parked.wait(), WAKE_WAIT_S + 5)
        parked.clear()
        await asyncio.sleep(PARK_S)
        arrived.clear()
        t_send = time.perf_counter()
        sent = await producer.publish_wake()
        await asyncio.wait_for(arrived.wait(), WAKE_WAIT_S + 5)
        _sample(tally, got[-1], t_send, sent)
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    state["done"] = True

    async def teardown() -> None:
        for _ in range(WAKE_WAIT_S):  # as in wake_sync
            if loop_task.done():
                break
            await producer.publish_wake()
            await asyncio.wait([loop_task], timeout=1.0)
        await reader.close_reader()
        await asyncio.gather(reader.close(), producer.close())

    return tally, elapsed, cpu, teardown


# -------------------------------------------------------------------------------------------- main
def report(tally: Tally, elapsed: float, cpu: float) -> None:
    out = {
        "ops": tally.ops,
        "units": tally.units,
        "elapsed": elapsed,
        "rate": tally.units / elapsed if elapsed else 0.0,
        "errors": tally.errors,
        "first_error": tally.first_error,
        "client_cpu": cpu / elapsed if elapsed else 0.0,
        "samples_ms": [round(s, 4) for s in tally.samples],
        "batched": tally.batched,
    }
    # Then wait until the orchestrator has read the server's CPU: tearing down first would end connections
    # (PostgreSQL backends) in the middle of that reading.
    handshake(json.dumps(out), "END")


async def main_async(spec: dict[str, Any]) -> None:
    runner = wake_async if spec["workload"] == "wake" else run_async
    tally, elapsed, cpu, teardown = await runner(spec)
    await asyncio.get_running_loop().run_in_executor(None, report, tally, elapsed, cpu)
    await teardown()


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["workload"] == "prepare":
        print(json.dumps(prepare(spec)), flush=True)
        return
    sync = int(spec.get("tasks") or 1) == 1 and spec["system"] in SYNC
    if not sync:
        asyncio.run(main_async(spec))
        return
    runner = wake_sync if spec["workload"] == "wake" else run_sync
    tally, elapsed, cpu, teardown = runner(spec)
    report(tally, elapsed, cpu)
    teardown()


if __name__ == "__main__":
    main()
