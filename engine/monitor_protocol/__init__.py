"""The Monitor Protocol v0 in Python: a pure engine (`service.MonitorService`, standard library only) and its
doors (REST and JSON-RPC binding, `mp serve`, client, watch, MCP, HTTP push, conformance suite)."""

__version__ = "0.1.0"
