"""The site's other pages (not a test): a docs page, its Python runner, and embeds, in headless Chromium.

Per run, on a fresh profile: the README's docs page from navigation to interactive (`mp:ready`); its first
Python block (the worker starts Pyodide, loads micropip, micropip-installs the site's engine wheel, then the
README's client example runs against the page's engine) and the same block again on a warm worker (a fresh
monitor id each time, so it never collides); one embed (`embed.html?scene=redelivery`) to interactive; and a
host page with two embeds (`embedding.html?scenes=redelivery,lease`) until both frames are interactive.

    .venv/bin/python bench/pages_bench.py [--runs 3] [--out FILE]

The load average and the CPUs' busy share (other work, measured while no benchmark browser runs) are recorded
before the run and before every sample, beside every figure (bench/playground_bench.py's helpers).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import playground_bench as pb  # noqa: E402

RUN_MS = 180_000
# The README's client example with its own monitor id: a warm run must not collide with the first.
PYTHON_RUN = """async (id) => {
  const fig = [...document.querySelectorAll("figure.block")].find((f) => f.dataset.kind === "python");
  const button = fig.querySelector("button.run");
  const before = MP.actionsDone;
  const t0 = performance.now();
  button.click();
  while (MP.actionsDone === before) await new Promise((r) => setTimeout(r, 20));
  return {ms: performance.now() - t0, state: fig.dataset.state, id};
}"""


def frames_ready(page, n: int) -> None:
    page.wait_for_function(
        "n => [...document.querySelectorAll('iframe')].filter((f) => {"
        "  try { return f.contentDocument.body.classList.contains('ready'); } catch (e) { return false; }"
        "}).length >= n",
        arg=n,
        timeout=RUN_MS,
        polling=50,
    )


def one_run(p, url: str, run: int) -> dict:
    sample: dict = {"run": run, "loadavg_before": pb.loadavg(), "cpu_before": pb.cpu_busy(0.5)}
    profile = Path(tempfile.mkdtemp(prefix="mp-pages-"))
    ctx = pb.launch(p, profile)
    try:
        ctx.add_init_script(pb.PROBE)
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(url + "/docs/readme.html")
        page.wait_for_function(pb.READY, timeout=RUN_MS, polling=50)
        sample["docs_cold_ready_ms"] = page.evaluate(pb.COLLECT)["ready"]
        sample["docs_cold_wall_s"] = round(time.perf_counter() - t0, 3)
        first = page.evaluate(PYTHON_RUN, "first")
        sample["python_first_ms"] = round(first["ms"])
        sample["python_first_state"] = first["state"]
        # The block creates `ci-py`: Reset is a reload, so retire nothing and run on a fresh page engine.
        page.evaluate("MP.idb.clear()")
        page.reload()
        page.wait_for_function(pb.READY, timeout=RUN_MS, polling=50)
        sample["docs_reload_ready_ms"] = page.evaluate(pb.COLLECT)["ready"]
        again = page.evaluate(PYTHON_RUN, "again")  # a new worker: Pyodide's files are in the HTTP cache now
        sample["python_after_reload_ms"] = round(again["ms"])
        sample["python_after_reload_state"] = again["state"]

        page.goto(url + "/embed.html?scene=redelivery")
        page.wait_for_function(pb.READY, timeout=RUN_MS, polling=50)
        sample["embed_ready_ms"] = page.evaluate(pb.COLLECT)["ready"]
        t1 = time.perf_counter()
        page.goto(url + "/embedding.html?scenes=redelivery,lease")
        frames_ready(page, 2)
        sample["two_embeds_wall_s"] = round(time.perf_counter() - t1, 3)
        sample["loadavg_after"] = pb.loadavg()
    finally:
        ctx.close()
        shutil.rmtree(profile, ignore_errors=True)
    return sample


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pages.json")
    args = ap.parse_args()
    site = pb.build.build()
    server, url = pb.serve(site)
    load_before, busy_before = pb.loadavg(), pb.cpu_busy(1.0)
    samples = []
    with sync_playwright() as p:
        for run in range(args.runs):
            s = one_run(p, url, run)
            samples.append(s)
            print(
                f"run {run + 1}/{args.runs}: docs {s['docs_cold_ready_ms'] / 1000:.2f} s, first Python block "
                f"{s['python_first_ms'] / 1000:.2f} s ({s['python_first_state']}), after reload "
                f"{s['python_after_reload_ms'] / 1000:.2f} s, embed {s['embed_ready_ms'] / 1000:.2f} s, two "
                f"embeds {s['two_embeds_wall_s']:.2f} s, load before {s['loadavg_before'][0]:.2f}",
                flush=True,
            )
    server.shutdown()

    def figure(key: str, scale: float = 1.0) -> dict:
        return pb.summary([s[key] * scale for s in samples if s.get(key) is not None], 2)

    result = {
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": pb.machine_facts(),
        "loadavg_before": load_before,
        "loadavg_after": pb.loadavg(),
        "cpu_before": busy_before,
        "runs": args.runs,
        "docs_cold_ready_s": figure("docs_cold_ready_ms", 1 / 1000),
        "docs_reload_ready_s": figure("docs_reload_ready_ms", 1 / 1000),
        "python_first_block_s": figure("python_first_ms", 1 / 1000),
        "python_after_reload_s": figure("python_after_reload_ms", 1 / 1000),
        "embed_ready_s": figure("embed_ready_ms", 1 / 1000),
        "two_embeds_s": figure("two_embeds_wall_s"),
        "samples": samples,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_s")}, indent=1))
    print(f"load average before {load_before}, after {result['loadavg_after']}; other work kept the CPUs "
          f"{(busy_before or {}).get('busy_share')} busy; result in {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
