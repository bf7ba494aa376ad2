"""Doors' shared binding: transport-free request/response messages, the REST router and JSON-RPC."""
