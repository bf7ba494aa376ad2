"""Shared helpers for the benchmarks: servers as subprocesses, CPU accounting, statistics, machine facts.

Nothing here is a test. Every loop is bounded (by a deadline and a count) and every server is a child
process that is stopped (SIGTERM, then SIGKILL) when the block using it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
MONITOR = "bench"
OBS_BODY = {"type": "com.example.bench.tick", "subject": "s-1", "actor": "probe:bench", "data": {"n": 1}}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Server:
    """A child process serving HTTP on 127.0.0.1:port; ``base`` is the URL prefix of the API."""

    def __init__(self, proc: subprocess.Popen[str], port: int, base: str, admin: str | None) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base = self.url + base
        self.admin = admin

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)


def _wait_ready(proc: subprocess.Popen[str], url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"server at {url} not ready after {timeout}s")


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    """Stop a child: `sig` (SIGTERM; PostgreSQL's fast shutdown is SIGINT), then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def mp_serve(db: str, *, admin: bool = False, log_level: str = "warning") -> Iterator[Server]:
    """A real `mp serve` on ``db`` (the access log stays off: --log-level warning, see docs/bench.md)."""
    port = free_port()
    token = "bench-admin-token-0123456789abcdef" if admin else None
    cmd = [
        PY,
        "-m",
        "monitor_protocol",
        "serve",
        "--db",
        db,
        "--port",
        str(port),
        "--log-level",
        log_level,
    ]
    if token:
        cmd.append(f"--allow-admin={token}")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/mp/v0/discover")
        yield Server(proc, port, "/mp/v0", token)
    finally:
        _stop(proc)


@contextmanager
def bare_serve(log_level: str = "warning") -> Iterator[Server]:
    """The transport limit: mp serve's own HTTP server with a trivial app behind it (bench/bare_app.py)."""
    port = free_port()
    cmd = [PY, str(BENCH / "bare_app.py"), "--port", str(port), "--log-level", log_level]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/mp/v0/discover")
        yield Server(proc, port, "/mp/v0", None)
    finally:
        _stop(proc)


def create_monitor(server: Server, monitor: str = MONITOR) -> str:
    r = httpx.post(
        f"{server.base}/monitors",
        json={"id": monitor, "visibility": "public", "types": ["com.example.bench.tick"]},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["owner_token"]


def subscribe(server: Server, subscriber: str, monitor: str = MONITOR, start: Any = None) -> tuple[str, str]:
    body: dict[str, Any] = {"monitor": monitor, "subscriber": subscriber}
    if start is not None:
        body["from"] = start
    r = httpx.post(f"{server.base}/subscriptions", json=body, timeout=10)
    r.raise_for_status()
    j = r.json()
    return j["subscription"]["id"], j["token"]


def loadgen(
    server: Server,
    workload: str,
    *,
    tasks: int = 1,
    procs: int = 1,
    duration: float = 2.0,
    client: str = "sync",
    tokens: list[str] | None = None,
    subs: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run bench/loadgen.py in ``procs`` child processes with ``tasks`` concurrent clients each, all
    starting at the same instant; returns the summed count, the window, and the CPU used by the server and
    by the load generators during it."""
    start_at = time.time() + 0.8 + 0.35 * procs
    spec = {
        "base": server.base,
        "workload": workload,
        "tasks": tasks,
        "duration": duration,
        "client": client,
        "start_at": start_at,
        "extra": extra or {},
    }
    children = []
    for p in range(procs):
        s = dict(spec)
        per = tasks
        if tokens is not None:
            s["tokens"] = tokens[p * per : (p + 1) * per] or tokens
        if subs is not None:
            s["subs"] = subs[p * per : (p + 1) * per] or subs
        children.append(
            subprocess.Popen(
                [PY, str(BENCH / "loadgen.py"), json.dumps(s)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    # Server CPU over the measured window (the children all start at start_at and stop at start_at+duration).
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = server.cpu()
    time.sleep(duration)
    cpu1 = server.cpu()
    outs = []
    for c in children:
        out, err = c.communicate(timeout=duration + 60)
        if c.returncode != 0:
            raise RuntimeError(f"loadgen failed ({c.returncode}): {err.strip()[-2000:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    count = sum(o["count"] for o in outs)
    units = sum(o.get("units", o["count"]) for o in outs)
    elapsed = max(o["elapsed"] for o in outs)
    errors = sum(o["errors"] for o in outs)
    return {
        "count": count,
        "units": units,
        "elapsed": elapsed,
        "rate": units / elapsed if elapsed else 0.0,
        "errors": errors,
        "server_cpu": (cpu1 - cpu0) / duration,
        "client_cpu": sum(o["cpu"] for o in outs) / elapsed if elapsed else 0.0,
        "first_error": next((o["first_error"] for o in outs if o.get("first_error")), None),
    }


def summary(values: list[float]) -> dict[str, Any]:
    """Median and spread of repeated runs."""
    vs = sorted(values)
    if not vs:
        return {"median": None, "min": None, "max": None, "runs": 0, "values": []}
    return {
        "median": statistics.median(vs),
        "min": vs[0],
        "max": vs[-1],
        "runs": len(vs),
        "values": [round(v, 4) for v in vs],
    }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (None where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    model = cpu_model()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", "engine"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    import sqlite3

    import httptools

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "httptools": httptools.__version__,
        "httpx": httpx.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "engine_dirty": dirty,
    }


class BenchRun:
    """One benchmark run: its settings (quick, runs, duration), a scratch folder, and `repeat` (runs of one
    load with the server's and the clients' CPU beside the rate). Every section takes one."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick = args.quick
        self.runs = args.runs or (2 if args.quick else 5)
        self.duration = args.duration or (0.7 if args.quick else 2.0)
        self.tmp = Path(tempfile.mkdtemp(prefix="mp-bench-", dir=args.tmpdir))

    def log(self, msg: str) -> None:
        print(f"[bench] {msg}", flush=True)

    def db(self, name: str) -> str:
        path = self.tmp / f"{name}.db"
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(str(path) + suffix).unlink(missing_ok=True)
        return str(path)

    def repeat(
        self, server: Any, workload: str, what: str, runs: int | None = None, **kw: Any
    ) -> dict[str, Any]:
        """``runs`` runs of one load; the figure is the rate, with server and client CPU beside it."""
        rates, scpu, ccpu, errors, first_error = [], [], [], 0, None
        for _ in range(runs or self.runs):
            r = loadgen(server, workload, duration=self.duration, **kw)
            rates.append(r["rate"])
            scpu.append(r["server_cpu"])
            ccpu.append(r["client_cpu"])
            errors += r["errors"]
            first_error = first_error or r["first_error"]
        out = summary(rates)
        out.update(
            what=what,
            unit="ops/s" if workload != "drain" else "observations/s",
            server_cpu_cores=round(sorted(scpu)[len(scpu) // 2], 2),
            client_cpu_cores=round(sorted(ccpu)[len(ccpu) // 2], 2),
            errors=errors,
        )
        if first_error:
            out["first_error"] = first_error
        self.log(
            f"  {what}: {out['median']:.0f}/s (min {out['min']:.0f}, max {out['max']:.0f}); "
            f"server {out['server_cpu_cores']} cores, client {out['client_cpu_cores']} cores"
            + (f", {errors} errors: {first_error}" if errors else "")
        )
        return out


def report(
    args: argparse.Namespace,
    name: str,
    produce: Callable[[], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
) -> int:
    """A section run on its own (--stages, --fanout, --client): with --markdown, print its last stored result;
    otherwise run it, store it as bench/results/<name>.json (unless --no-write) and print its table."""
    path = RESULTS / f"{name}.json"
    if args.markdown:
        print(markdown(json.loads(path.read_text())))
        return 0
    result = produce()
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0
