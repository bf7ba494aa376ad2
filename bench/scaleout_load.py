"""One load process of bench/scaleout.py: ``python bench/scaleout_load.py '<json spec>'``.

It opens every client's connection, prints ``READY``, waits for ``GO`` on stdin, runs the warm-up, prints
``START`` (the window begins), prints one JSON line when the window ends, and keeps the same load running
until ``END`` on stdin: the orchestrator reads the servers' and PostgreSQL's CPU when it reads ``START`` and
when it reads the result line, so both readings fall inside a steady load. Then it stops its clients and prints
a last JSON line (where each reader got to), and exits.

Spec: workload (publish | ackpull | bare | commit), clients, warmup, duration, and
* bases: one URL prefix of /mp/v0 per server; client i keeps one keep-alive connection to bases[i % len];
* targets (publish, bare): [{monitor, token}], client i publishes to targets[i % len] (the orchestrator
  orders them);
* readers (ackpull): [{sid, token, ack}], client i is reader i: ``POST /subscriptions/{sid}/pull`` with
  ``{"ack": <the previous reply's next>, "limit": 1}`` (the first request of a run carries the ``ack`` the
  orchestrator passes, the reader's last ``next`` of its previous run, or none);
* conninfo (commit): PostgreSQL's own commit limit, one psycopg AsyncConnection per client in autocommit,
  one INSERT per transaction (bench/peer_load.py's statement and row, as in bench/results/peers.json).

The HTTP clients are bench/loadgen.py's raw asyncio HTTP/1.1 client, the cheapest client this repository has
(httpx.AsyncClient costs several times more CPU per request, see docs/bench.md), on uvloop when it is
installed (as mp serve's own loop): on 2 cores the client shares the CPU with the servers and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import OBS, RawClient  # noqa: E402

MAX_OPS = 5_000_000  # a hard bound on every client's loop besides END
MAX_LATENCIES = 200_000


def raise_nofile() -> int:
    """RLIMIT_NOFILE's soft limit up to the hard limit (64 clients are 64 sockets, plus the loop's own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard)
            )
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class State:
    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.empty = 0  # ackpull replies with no observation: the log was not ahead of that reader
        self.first_error: str | None = None
        self.window = False  # latencies are recorded inside the window only
        self.latencies: list[float] = []
        self.go = asyncio.Event()  # GO: every client starts at once
        self.stop = asyncio.Event()  # END

    def done(self, t0: float) -> None:
        self.ok += 1
        if self.window and len(self.latencies) < MAX_LATENCIES:
            self.latencies.append(time.perf_counter() - t0)

    def fail(self, what: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = what[:500]


# ------------------------------------------------------------------------------------------------- clients
async def http_client(spec: dict[str, Any], i: int, st: State, ready: asyncio.Queue[Any]) -> dict[str, Any]:
    bases = spec["bases"]
    c = RawClient(bases[i % len(bases)])
    workload = spec["workload"]
    out: dict[str, Any] = {"client": i}
    try:
        await c.request("GET", "/discover", None)  # the keep-alive connection, opened before READY
    except Exception as exc:  # noqa: BLE001 - reported, the run is refused
        await ready.put(exc)
        return out
    await ready.put(None)
    await st.go.wait()
    if workload in ("publish", "bare"):
        target = spec["targets"][i % len(spec["targets"])]
        path, token = f"/monitors/{target['monitor']}/observations", target["token"]
        for _ in range(MAX_OPS):
            if st.stop.is_set():
                break
            t0 = time.perf_counter()
            try:
                status, body = await c.request("POST", path, token, OBS)
            except Exception as exc:  # noqa: BLE001
                st.fail(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)
                continue
            if status == 201:
                st.done(t0)
            else:
                st.fail(f"{status} {body}")
    elif workload == "ackpull":
        reader = spec["readers"][i]
        path, token = f"/subscriptions/{reader['sid']}/pull", reader["token"]
        ack: int | None = reader.get("ack")
        head = None
        for _ in range(MAX_OPS):
            if st.stop.is_set():
                break
            body_out: dict[str, Any] = {"limit": 1} if ack is None else {"ack": ack, "limit": 1}
            t0 = time.perf_counter()
            try:
                status, body = await c.request("POST", path, token, body_out)
            except Exception as exc:  # noqa: BLE001
                st.fail(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)
                continue
            if status != 200 or not isinstance(body, dict):
                st.fail(f"{status} {body}")
                continue
            head = body.get("head")
            if not body.get("observations"):
                st.empty += 1
                if ack == body.get("next"):
                    await asyncio.sleep(0.01)  # nothing left: do not spin
            else:
                st.done(t0)
            ack = body.get("next", ack)
        out.update(sid=reader["sid"], next=ack, head=head)
    await c.close()
    return out


async def pg_client(spec: dict[str, Any], i: int, st: State, ready: asyncio.Queue[Any]) -> dict[str, Any]:
    import psycopg
    from peer_load import PG_INSERT
    from psycopg.types.json import Jsonb

    try:
        conn = await psycopg.AsyncConnection.connect(spec["conninfo"], autocommit=True)
    except Exception as exc:  # noqa: BLE001
        await ready.put(exc)
        return {"client": i}
    await ready.put(None)
    await st.go.wait()
    sql = PG_INSERT.format(stream="pub")
    try:
        for _ in range(MAX_OPS):
            if st.stop.is_set():
                break
            t0 = time.perf_counter()
            try:
                await conn.execute(sql, (Jsonb(OBS),))  # autocommit: one INSERT, one commit
            except Exception as exc:  # noqa: BLE001
                st.fail(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)
                continue
            st.done(t0)
    finally:
        await conn.close()
    return {"client": i}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _stdin_line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def main_async(spec: dict[str, Any]) -> None:
    st = State()
    n = int(spec["clients"])
    ready: asyncio.Queue[Any] = asyncio.Queue()
    one = pg_client if spec["workload"] == "commit" else http_client
    tasks = [asyncio.create_task(one(spec, i, st, ready)) for i in range(n)]
    for _ in range(n):
        problem = await ready.get()
        if problem is not None:
            raise SystemExit(f"a client could not connect: {problem!r}")
    _say("READY")
    if (await _stdin_line()).strip() != "GO":
        raise SystemExit("expected GO")
    st.go.set()
    await asyncio.sleep(float(spec["warmup"]))
    ok0, err0, empty0 = st.ok, st.errors, st.empty
    cpu0, t0 = time.process_time(), time.monotonic()
    st.window = True
    _say("START")
    await asyncio.sleep(float(spec["duration"]))
    ok1, err1, empty1 = st.ok, st.errors, st.empty
    cpu1, t1 = time.process_time(), time.monotonic()
    st.window = False
    lat = sorted(st.latencies)
    elapsed = t1 - t0
    _say(
        json.dumps(
            {
                "count": ok1 - ok0,
                "errors": err1 - err0,
                "empty": empty1 - empty0,
                "elapsed": elapsed,
                "rate": (ok1 - ok0) / elapsed if elapsed else 0.0,
                "client_cpu": (cpu1 - cpu0) / elapsed if elapsed else 0.0,
                "first_error": st.first_error,
                "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
                "latency_ms": {
                    "p50": _round(_percentile(lat, 0.5)),
                    "p90": _round(_percentile(lat, 0.9)),
                    "p99": _round(_percentile(lat, 0.99)),
                    "max": _round(lat[-1] if lat else None),
                },
            }
        )
    )
    line = await _stdin_line()  # the load goes on until the orchestrator has read the CPU
    st.stop.set()
    outs = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    if line.strip() != "END":
        raise SystemExit(f"expected END, got {line!r}")
    readers = {o["sid"]: {"next": o.get("next"), "head": o.get("head")} for o in outs if "sid" in o}
    _say(json.dumps({"readers": readers, "total_ok": st.ok}))


def _round(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


def main() -> None:
    spec = json.loads(sys.argv[1])
    raise_nofile()
    loop = spec.get("loop", "uvloop")
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            loop = "asyncio"
    if loop == "uvloop":
        uvloop.run(main_async(spec))
    else:
        asyncio.run(main_async(spec))


if __name__ == "__main__":
    main()
