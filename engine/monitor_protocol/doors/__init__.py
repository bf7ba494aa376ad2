"""The ways in: HTTP (mp serve), MCP, HTTP push, the browser host, and the one registry where long polls, streams and MCP subscriptions wait for an append."""
