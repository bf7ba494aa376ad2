"""Playground benchmark (not a test): cold start to interactive in headless Chromium, a warm reload, and
observations published per second through the in-page engine into IndexedDB (each publish is one router
call plus one committed IndexedDB transaction, exactly what the UI and the service-worker shim do).

    .venv/bin/python bench/playground_bench.py [--runs 5] [--publishes 300]

Writes bench/results/playground.json and prints a table. Target: cold start <= 4 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MP_SERVE_QUIET", "1")
import build  # noqa: E402

CHROMIUM = build.CHROMIUM
ARGS = build.CHROMIUM_ARGS
TARGET_COLD_S = 4.0

PUBLISH_LOOP = """async ([n, parallel]) => {
  // exactly the service worker's path: MP.serve answers after the IndexedDB commit
  const call = async (method, path, body, token) => MP.serve(JSON.stringify({
      method, path, query: [], body: body ? JSON.stringify(body) : "",
      headers: Object.assign({"content-type": "application/json"}, token ? {authorization: "Bearer " + token} : {})}));
  const id = "bench-" + Math.random().toString(36).slice(2, 8);
  const made = await call("POST", "/mp/v0/monitors", {id, types: ["com.example.bench"]});
  const token = JSON.parse(made.body).owner_token;
  const before = await MP.idb.count();
  const t0 = performance.now();
  let ok = 0;
  for (let i = 0; i < n; i += parallel) {
    const batch = [];
    for (let j = 0; j < parallel && i + j < n; j++)
      batch.push(call("POST", `/mp/v0/monitors/${id}/observations`,
                      {type: "com.example.bench", subject: "s" + (i + j), actor: "probe:bench"}, token));
    for (const r of await Promise.all(batch)) if (r.status === 201) ok++;
  }
  const seconds = (performance.now() - t0) / 1000;
  const after = await MP.idb.count();
  return {ok, seconds, stored: after - before};
}"""


def serve():
    server = build.make_server(0, build.SITE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def launch(p, profile):
    for attempt in range(2):
        try:
            return p.chromium.launch_persistent_context(
                str(profile),
                executable_path=CHROMIUM,
                args=ARGS,
                headless=True,
                viewport={"width": 1280, "height": 800},
            )
        except Exception:
            if attempt:
                raise
    raise RuntimeError("unreachable")


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--publishes", type=int, default=300)
    args = ap.parse_args()
    build.build()
    server, url = serve()
    cold, warm, stages, rates = [], [], [], []
    foreign: list[str] = []
    with sync_playwright() as p:
        for _ in range(args.runs):
            profile = Path(tempfile.mkdtemp(prefix="mp-bench-"))
            ctx = launch(p, profile)
            try:
                page = ctx.new_page()
                page.on("request", lambda r: None if r.url.startswith(url) else foreign.append(r.url))
                t0 = time.perf_counter()
                page.goto(url + "/")
                page.wait_for_selector("body.ready", timeout=60_000)
                cold.append(time.perf_counter() - t0)
                stages.append(page.evaluate("MP.marks"))
                t0 = time.perf_counter()
                page.reload()
                page.wait_for_selector("body.ready", timeout=60_000)
                warm.append(time.perf_counter() - t0)
                for parallel in (1, 10):
                    r = page.evaluate(PUBLISH_LOOP, [args.publishes, parallel])
                    rates.append({"parallel": parallel, **r, "per_second": r["ok"] / r["seconds"]})
            finally:
                ctx.close()
                shutil.rmtree(profile, ignore_errors=True)
    server.shutdown()

    def summary(xs):
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}

    by_par = {}
    for r in rates:
        by_par.setdefault(r["parallel"], []).append(r["per_second"])
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # the machine is shared
        },
        "site": json.loads((build.SITE / "build-info.json").read_text()),
        "runs": args.runs,
        "cold_start_to_interactive_s": summary(cold),
        "cold_start_target_s": TARGET_COLD_S,
        "cold_start_within_target": statistics.median(cold) <= TARGET_COLD_S,
        "reload_to_interactive_s": summary(warm),
        "stage_marks_ms_median": {
            k: round(statistics.median(m[k] for m in stages if k in m))
            for k in ("runtime", "engine", "imports", "storage", "ready")
        },
        "publish_into_indexeddb_per_s": {str(k): summary(v) for k, v in by_par.items()},
        "publish_samples": rates,
        "requests_to_other_hosts": foreign,
    }
    out = ROOT / "bench" / "results" / "playground.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    rows = [
        ("cold start to interactive (s)", result["cold_start_to_interactive_s"]),
        ("reload to interactive (s)", result["reload_to_interactive_s"]),
        ("publish/s into IndexedDB, 1 in flight", result["publish_into_indexeddb_per_s"]["1"]),
        ("publish/s into IndexedDB, 10 in flight", result["publish_into_indexeddb_per_s"]["10"]),
    ]
    print(f"\n{'measure':<42} {'median':>9} {'min':>9} {'max':>9}")
    for name, s in rows:
        print(f"{name:<42} {s['median']:>9.2f} {s['min']:>9.2f} {s['max']:>9.2f}")
    print(f"stage marks (ms from boot.js, median): {result['stage_marks_ms_median']}")
    verdict = "within" if result["cold_start_within_target"] else "OVER"
    print(f"cold start target {TARGET_COLD_S:.1f} s: {verdict}; requests to other hosts: {len(foreign)}")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
