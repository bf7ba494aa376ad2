"""The Conformance tab: the project's conformance suite (docs/protocol.md section 11 and the project profile),
run in this page against a fresh in-page engine, never the person's log."""

from __future__ import annotations

from pyodide.ffi import to_js
from ui import action, doc, esc


@action("conformance-run", exclusive=False)
async def run_conformance(_el) -> None:
    btn = doc.getElementById("conf-btn")
    btn.disabled = True
    total = doc.getElementById("conf-total")
    tbody = doc.querySelector("#conf-table tbody")
    total.textContent = "loading jsonschema…"
    import pyodide_js

    loaded = await pyodide_js.loadPackage(to_js(["jsonschema"]))
    if loaded is not None and len(loaded.to_py()) == 0 and not _has_jsonschema():
        total.textContent = "FAILED: jsonschema could not be loaded from this site"
        btn.disabled = False
        return
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
