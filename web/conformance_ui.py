"""The Conformance tab: the project's conformance suite (docs/protocol.md section 11 and the project profile),
run in this page against a fresh in-page engine, never the person's log."""

from __future__ import annotations

import js
from pyodide.ffi import create_proxy, to_js
from ui import action, doc, esc


@action("conformance-run", exclusive=False)
async def run_conformance(_el) -> None:
    btn = doc.getElementById("conf-btn")
    btn.disabled = True
    total = doc.getElementById("conf-total")
    tbody = doc.querySelector("#conf-table tbody")
    total.textContent = "loading jsonschema…"
    import pyodide_js

    # Pyodide's own reports go to this tab, not to the page's error output: offline, a failed download made
    # one red box per package under every tab, kept after a later run passed (found by a tester).
    said: list[str] = []
    told = create_proxy(lambda message: said.append(str(message)))
    try:
        options = to_js(
            {"messageCallback": told, "errorCallback": told}, dict_converter=js.Object.fromEntries
        )
        loaded = await pyodide_js.loadPackage(to_js(["jsonschema"]), options)
    finally:
        told.destroy()
    if loaded is not None and len(loaded.to_py()) == 0 and not _has_jsonschema():
        why = next((line for line in said if "fail" in line.lower()), said[-1] if said else "")
        total.textContent = (
            "Not run: jsonschema could not be loaded from this site (it is fetched the first time the suite "
            f"runs: offline? run it again once online){': ' + why if why else ''}"
        )
        btn.disabled = False
        return
    js.MP.keepLoaded()  # the service worker keeps jsonschema's files too: the suite runs offline from now on
    from monitor_protocol.conformance import run_suite
    from monitor_protocol.conformance.inprocess import InProcessTransport

    total.textContent = "running…"
    transport = InProcessTransport.create()  # a fresh in-page memory engine, not the person's log
    report = await run_suite(transport)
    rows = []
    for r in report.results:
        status = r.status.upper()
        rows.append(
            f"<tr data-id='{esc(r.id)}'><td>{esc(r.id)}</td><td>{esc(r.title)}</td>"
            f"<td class='{status}'>{'✓ ' if status == 'PASS' else ('✗ ' if status == 'FAIL' else '– ')}{status}</td>"
            f"<td class='small'>{esc(r.note)}</td></tr>"
        )
    tbody.innerHTML = "".join(rows)
    total.textContent = (
        f"{report.passed} passed, {report.failed} failed, {report.skipped} skipped · {report.seconds:.1f} s"
    )
    total.setAttribute("data-failed", str(report.failed))
    total.setAttribute("data-passed", str(report.passed))
    btn.disabled = False


def _has_jsonschema():
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        return False
    return True
