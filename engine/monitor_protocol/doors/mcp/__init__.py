"""The MCP door (docs/protocol.md section 9, extension `ai.mentu/monitors`), on the official MCP Python SDK.

Two backends behind the same tools and resources:

* embedded (`EmbeddedBackend`): a `MonitorService` on a SQLite file, entered by one engine thread (the store
  is opened on it). The mute sweep and lease expiry run on a one-second timer; appends reach the shared
  `Waiters` registry (doors/parking.py) through `service.add_listener`: it wakes resource subscribers, and a pull
  asked to `wait` is parked there until an append.
* remote (`RemoteBackend`): an `mp serve` reached through `monitor_protocol.client.AsyncClient`. A subscribed
  resource is followed by a watch subscription of this process (`mcp:resources-<hex>`, observe only, from the
  head) held in a long poll against the server; it is retired when nobody listens any more.

Tools take their token as the `token` argument; when absent, the environment supplies it by role, as for the
CLI: owner tools (publish, configure, subscribe) MP_OWNER_TOKEN then MP_TOKEN, reader tools (pull, ack, seek,
renew, retire_subscription, lease_*) MP_READER_TOKEN then MP_TOKEN, the rest (discover, list, get, state,
create, and resources) MP_TOKEN then MP_OWNER_TOKEN. Every tool declares an output schema and its
annotations; arguments are checked against the input schema (bounds included) before anything runs. A
protocol refusal comes back as a tool error (`isError: true`) whose text starts with the code and whose
structured content is the REST error body.

Resource updates reach both MCP eras: `resources/subscribe` (handshake era) gets
`notifications/resources/updated` on its session, and `subscriptions/listen` (2026-07-28) streams get the same
notification through the SDK's subscription bus; at most one per resource per 250 ms, the last change always
notified. A subscription the environment's token cannot serve (no such monitor, an invisible one) is refused.
Notifications are wake-ups only; delivery is pull + ack.
"""
