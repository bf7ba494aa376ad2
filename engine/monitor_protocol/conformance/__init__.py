"""The conformance suite: PROTOCOL.md section 11 as runnable checks, over any transport.

Standard library only at import time, so it runs in-process, over HTTP (`http.HttpTransport`, which
imports httpx itself) and inside the browser under Pyodide.
"""

from .runner import Report, Result, run_suite
from .transport import Reply, Transport

__all__ = ["Reply", "Report", "Result", "Transport", "run_suite"]
