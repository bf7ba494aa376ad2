"""The browser door: the engine hosted in a playground tab (Pyodide), durable through IndexedDB, answering
the page's own UI and the service-worker shim with the same REST router the HTTP server uses."""

from .host import EngineHost, Reply, parse_shim_request

__all__ = ["EngineHost", "Reply", "parse_shim_request"]
