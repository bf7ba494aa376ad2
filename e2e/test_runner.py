"""The code runner (web/runner.js) in Chromium: a module Web Worker started by the main playground page
installs the real monitor_protocol.client with micropip from the site's own engine wheel, then runs the
README's Python example (sync Client, long poll included), an AsyncClient snippet and the `mp` CLI against
the page's engine through the service worker. A failing snippet reports its traceback and the worker stays
usable; nothing leaves the origin and the wheel came from the site. Waits are on replies, never sleeps."""

from __future__ import annotations

import json
import re

from conftest import ROOT

BOOT_MS = 120_000  # two cores shared with other runs: a cold Pyodide start can take a while
RUN_MS = 120_000  # one run, start-up of the worker's Pyodide included

# The harness the page gets: start the worker as a docs page would, collect its stages, and turn each
# request into a promise (rejected after RUN_MS rather than waiting forever).
HARNESS = """
(runMs) => {
  const root = new URL("./", location.href);
  const worker = new Worker(new URL("runner.js?mp-ns=" + MP.ns, root), { type: "module" });
  const R = (window.R = { stages: [], errors: [], waiting: new Map(), seq: 0 });
  worker.onmessage = (event) => {
    const m = event.data;
    if (m.type === "stage") R.stages.push(m);
    else if (m.type === "error") R.errors.push(m);
    else if (R.waiting.has(m.id)) { R.waiting.get(m.id)(m); R.waiting.delete(m.id); }
  };
  worker.onerror = (event) => R.errors.push({ stage: "worker", error: String(event.message) });
  R.run = (msg) => new Promise((resolve, reject) => {
    const id = ++R.seq;
    const timer = setTimeout(() => reject(new Error("no reply to run " + id + " in " + runMs + " ms")), runMs);
    R.waiting.set(id, (m) => { clearTimeout(timer); resolve(m); });
    worker.postMessage({ ...msg, id });
  });
  return true;
}
"""


def readme_python_block() -> str:
    """The README's ```python block that uses the client (read, never copied here)."""
    text = (ROOT / "README.md").read_text()
    blocks = [
        m.group(1)
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
        if "from monitor_protocol.client import" in m.group(1)
    ]
    assert len(blocks) == 1, f"expected one client example (```python) in README.md, found {len(blocks)}"
    return blocks[0]


def run(page, msg: dict) -> dict:
    return page.evaluate("msg => R.run(msg)", msg)


def engine_fetch(page, path: str, token: str | None = None) -> dict:
    """A curl-style request from the page itself, answered by its engine through the service worker."""
    return page.evaluate(
        """async ([path, token]) => {
             const r = await fetch('/mp/v0' + path, token ? {headers: {Authorization: 'Bearer ' + token}} : {});
             return {status: r.status, body: await r.json()};
           }""",
        [path, token],
    )


def open_with_runner(browser) -> tuple[object, str, list[str]]:
    """The main playground (namespace ""), ready, with a runner worker started from it; and every URL the
    browser requested (pages, workers and the service worker alike)."""
    requests: list[str] = []
    browser.context.on("request", lambda r: requests.append(r.url))
    page = browser.open("/", timeout=BOOT_MS)
    assert page.evaluate("MP.ns") == ""
    assert page.evaluate(HARNESS, RUN_MS)
    return page, page.evaluate("location.origin"), requests


def test_runner_installs_the_client_with_micropip_and_reaches_the_page_engine(browser):
    page, origin, requests = open_with_runner(browser)

    # (a) the README's Python example, verbatim: the sync Client (synchronous XHR in the worker), with a
    # long poll; MP_BASE is the page's origin (the client adds /mp/v0)
    readme = run(
        page, {"kind": "python", "code": readme_python_block(), "env": {"MP_BASE": origin}, "scope": "a"}
    )
    assert readme["ok"], readme
    assert readme["stdout"].splitlines() == ["handling build-412 failed", "CURSOR_BACKWARDS 409"], readme
    assert page.evaluate("R.errors") == []
    stages = page.evaluate("R.stages")
    assert [s["stage"] for s in stages] == ["runtime", "micropip", "client", "ready"]
    wheel = json.loads(
        page.evaluate("async () => JSON.stringify(await (await fetch('/build-info.json')).json())")
    )
    wheel_url = f"{origin}/pyodide/{wheel['engine_wheel']}"
    assert stages[-1]["install"] == ["import micropip", f"await micropip.install({json.dumps(wheel_url)})"]
    # the same scope still holds the example's names: which layer it used, its monitor and owner token
    names = run(
        page,
        {
            "kind": "python",
            "code": "print(mp.http_layer, reader.http_layer)\nprint(created.monitor.id)\nprint(owner)",
            "scope": "a",
        },
    )
    assert names["ok"], names
    layers, monitor, owner = names["stdout"].split("\n")[:3]
    assert layers == "xhr xhr"
    # positive control: the page's engine really holds that monitor, with the example's subscription
    state = engine_fetch(page, f"/monitors/{monitor}/state", owner)
    assert state["status"] == 200, state
    assert state["body"]["monitor"] == monitor and state["body"]["counters"]["subscriptions_active"] == 1, (
        state
    )

    # timeouts hold in both layers: a long poll of 5 s on the example's (drained) subscription, with a
    # 1 s timeout, is ConnectionFailed after about 1 s (sent=True: the engine did receive it)
    timing = (
        "import time\n"
        "from monitor_protocol.client import AsyncClient, Client, ConnectionFailed\n"
        "pull = f'/subscriptions/{sub_id}/pull'\n"
        "for layer in ('xhr', 'fetch'):\n"
        "    t0 = time.monotonic()\n"
        "    try:\n"
        "        if layer == 'xhr':\n"
        "            Client(base, sub.token).request('GET', pull, params=[('wait', '5')], timeout=1)\n"
        "        else:\n"
        "            async with AsyncClient(base, sub.token) as late:\n"
        "                await late.request('GET', pull, params=[('wait', '5')], timeout=1)\n"
        "    except ConnectionFailed as exc:\n"
        "        print(layer, exc.sent, exc.reason.split(':')[0], round(time.monotonic() - t0))\n"
    )
    timed = run(page, {"kind": "python", "code": timing, "scope": "a"})
    assert timed["ok"], timed
    assert timed["stdout"].splitlines() == ["xhr True TimeoutError 1", "fetch True TimeoutError 1"], timed

    # (b) AsyncClient (fetch), top-level await
    snippet = (
        "import os\n"
        "from monitor_protocol.client import AsyncClient\n"
        "async with AsyncClient(os.environ['MP_BASE']) as mp:\n"
        "    made = await mp.create_monitor('deploys', types=['com.example.deploy'], visibility='public')\n"
        "    done = await mp.publish('deploys', 'com.example.deploy', subject='web-7', token=made.owner_token)\n"
        "    print(mp.http_layer, done.seq)\n"
    )
    async_run = run(page, {"kind": "python", "code": snippet, "env": {"MP_BASE": origin}})
    assert async_run["ok"], async_run
    layer_name, seq = async_run["stdout"].split()
    assert layer_name == "fetch" and int(seq) >= 2
    deploys = engine_fetch(page, "/monitors/deploys/state")
    assert deploys["status"] == 200 and deploys["body"]["monitor"] == "deploys", deploys

    # (d) a failing snippet: its traceback, ending in its own exception, and the worker stays usable
    failing = run(page, {"kind": "python", "code": "print('before')\n1 / 0\n"})
    assert failing["ok"] is False and failing["stdout"] == "before\n", failing
    assert failing["error"].startswith("Traceback") and 'File "<snippet>", line 2' in failing["error"]
    assert failing["error"].rstrip().endswith("ZeroDivisionError: division by zero"), failing["error"]
    assert "_mp_run" not in failing["error"] and "eval_code_async" not in failing["error"]
    after = run(page, {"kind": "python", "code": "print(6 * 7)"})
    assert after == {"id": after["id"], "ok": True, "stdout": "42\n", "stderr": ""}, after

    # a request the browser refuses to send (a header value with a line break) is ConnectionFailed with
    # sent=False, from both layers; nothing reaches the engine
    refused = (
        "import os\n"
        "from monitor_protocol.client import AsyncClient, Client, ConnectionFailed\n"
        "try:\n"
        "    Client(os.environ['MP_BASE'], token='bad\\ntoken').list_monitors()\n"
        "except ConnectionFailed as exc:\n"
        "    print('xhr', exc.sent)\n"
        "async with AsyncClient(os.environ['MP_BASE'], token='bad\\ntoken') as mp:\n"
        "    try:\n"
        "        await mp.list_monitors()\n"
        "    except ConnectionFailed as exc:\n"
        "        print('fetch', exc.sent)\n"
    )
    refusals = run(page, {"kind": "python", "code": refused, "env": {"MP_BASE": origin}})
    assert refusals["ok"] and refusals["stdout"] == "xhr False\nfetch False\n", refusals

    # (e) nothing left the origin (the Guard checks that at teardown too), and micropip fetched the wheel
    # from the site
    assert [
        u for u in requests if not u.startswith(origin + "/") and not u.startswith(("data:", "blob:"))
    ] == []
    assert wheel_url in requests, [u for u in requests if u.endswith(".whl")]
    assert f"{origin}/pyodide/micropip-0.11.1-py3-none-any.whl" in requests  # from the site's own lock


def test_runner_runs_the_mp_cli_against_the_page_engine(browser):
    # (c) the real `mp` CLI (monitor_protocol.cli.main): create a monitor, publish to it with the owner
    # token from the JSON reply, and see both in the page's engine
    page, origin, _ = open_with_runner(browser)
    created = run(
        page,
        {
            "kind": "cli",
            "argv": [
                "monitors",
                "create",
                "jobs",
                "--type",
                "com.example.job",
                "--visibility",
                "public",
                "--json",
            ],
            "env": {"MP_BASE": origin},
        },
    )
    assert created["ok"] and created["exit"] == 0, created
    job_owner = json.loads(created["stdout"])["owner_token"]
    published = run(
        page,
        {
            "kind": "cli",
            "argv": ["mp", "publish", "jobs", "com.example.job", "--subject", "job-1", "--json"],
            "env": {"MP_BASE": origin, "MP_OWNER_TOKEN": job_owner},
        },
    )
    assert published["ok"] and published["exit"] == 0, published
    assert json.loads(published["stdout"])["seq"] >= 2
    jobs = engine_fetch(page, "/monitors/jobs/state")
    assert jobs["status"] == 200 and jobs["body"]["monitor"] == "jobs", jobs
    # a refusal is an exit status and a sentence on stderr, not a traceback
    again = run(page, {"kind": "cli", "argv": ["monitors", "create", "jobs"], "env": {"MP_BASE": origin}})
    assert again["ok"] is False and again["exit"] == 3 and "error: " in again["stderr"], again
    assert "Traceback" not in again["stderr"] and "error" not in again


def test_a_runner_that_cannot_start_says_why_instead_of_hanging(browser):
    browser.guard.expect_http_refusals = True  # the refused build-info.json below is on purpose
    page = browser.open("/", timeout=BOOT_MS)
    # the site's build-info.json (which names the engine wheel) fails for this context from now on
    browser.context.route("**/build-info.json", lambda route: route.fulfill(status=500, body="broken"))
    assert page.evaluate(HARNESS, RUN_MS)
    reply = run(page, {"kind": "python", "code": "print('never runs')"})
    assert reply["ok"] is False and reply["stdout"] == "", reply
    assert reply["error"] == "The Python runner could not start (client): build-info.json: HTTP 500", reply
    assert page.evaluate("R.errors") == [
        {"type": "error", "stage": "client", "error": "build-info.json: HTTP 500"}
    ]
    assert [s["stage"] for s in page.evaluate("R.stages")] == ["runtime", "micropip"]
