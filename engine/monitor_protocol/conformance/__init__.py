"""The conformance suite: docs/protocol.md section 11 as runnable checks, over any transport.

Two profiles (see docs/conformance.md): `published` runs the section 11 checklist (C01..C34, C20b) written
to be fair to any implementation; `project` adds this project's own choices and limits (X01..); `all`,
the default, runs both.

Standard library only at import time, so it runs in-process, over HTTP (`http.HttpTransport`, which
imports httpx itself) and inside the browser under Pyodide.
"""

from monitor_protocol.conformance.runner import ALL, PROFILE_CHOICES, Report, Result, checks_in, run_suite
from monitor_protocol.conformance.transport import Reply, Transport

__all__ = ["ALL", "PROFILE_CHOICES", "Reply", "Report", "Result", "Transport", "checks_in", "run_suite"]
