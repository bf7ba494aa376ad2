"""Closed vocabularies, error codes and their statuses (docs/protocol.md section 3). Data only, no logic."""

from __future__ import annotations

from monitor_protocol.core import jsonregex

PROTOCOL_VERSION = "0.1"
EXTENSION_ID = "ai.mentu/monitors"
# This server's own extensions (docs/serve.md), advertised in discover's capabilities.extensions: a client
# uses them where advertised and falls back to the protocol's plain calls elsewhere.
EXT_ACK_PULL = "monitor-protocol-python/ack-pull"
EXT_PUBLISH_BATCH = "monitor-protocol-python/publish-batch"
EXT_MONITOR_PAGES = "monitor-protocol-python/monitor-pages"
PROTOCOL_PREFIX = "ai.mentu.monitor."
# This project's own rows (docs/protocol.md section 12): `ai.mentu.monitor.` belongs to the published protocol
# and its closed list of actions, so a source's start, stop, crash and restart are written under this prefix.
PROJECT_PREFIX = "python.monitor-protocol."

HORIZONS = ("event", "minute", "hour", "day", "week", "month")
CAPABILITIES = ("observe", "react", "act")
TIERS = ("src", "measured", "derived", "unverified", "falsified")
ORIGINS = ("human", "agent", "webhook", "probe", "system")
VERIFICATIONS = ("human_verified", "machine_verified", "certified", "reported", "unverified")
VISIBILITIES = ("private", "shared", "public")
SOURCE_KINDS = ("shell", "ws", "http", "file", "feed", "cir", "formula", "log")
RUNNABLE_SOURCE_KINDS = ("shell", "http", "file", "feed")  # what this project runs (section 12)
RESET_POLICIES = ("earliest", "latest", "none")
PROTOCOLS = ("pull", "http", "mcp")
ACTOR_PREFIXES = ("human", "agent", "system", "hook", "probe", "webhook")

# The published patterns (their JSON Schemas' text), matched as a JSON Schema validator matches them: `\w` is
# ASCII and `$` is the end of the text, so "ci\n" or "été" is no monitor id here either.
TYPE_REGEX = r"^[a-z0-9]+(\.[a-z0-9_-]+)+$"
MONITOR_ID_REGEX = r"^[\w.-]{2,64}$"
TAG_KEY_REGEX = r"^#[A-Za-z_][A-Za-z0-9_-]*$"
TYPE_PATTERN = jsonregex.compile(TYPE_REGEX)
MONITOR_ID_PATTERN = jsonregex.compile(MONITOR_ID_REGEX)
TAG_KEY_PATTERN = jsonregex.compile(TAG_KEY_REGEX)
# A filter's type prefix without its `*` (and the dot before it): the start of a reverse-DNS type.
TYPE_PREFIX_PATTERN = jsonregex.compile(r"^[a-z0-9]+(\.[a-z0-9_-]+)*$")
RULE_ACTION_REGEX = r"^(log|annotate|label|escalate:.+|run:.+|notify:human)$"  # a rule's `then`
RULE_ACTION_PATTERN = jsonregex.compile(RULE_ACTION_REGEX)

# The protocol's own observation types.
T_CONFIGURED = PROTOCOL_PREFIX + "configured"
T_SUBSCRIBED = PROTOCOL_PREFIX + "subscribed"
T_SUBSCRIPTION_RETIRED = PROTOCOL_PREFIX + "subscription_retired"
T_LEASE = PROTOCOL_PREFIX + "lease"
T_REJECTED = PROTOCOL_PREFIX + "rejected"
T_BOOKMARK = PROTOCOL_PREFIX + "bookmark"
T_CONTRADICTION = PROTOCOL_PREFIX + "contradiction"
T_CONTRADICTION_RESOLVED = PROTOCOL_PREFIX + "contradiction_resolved"
PROTOCOL_TYPES = (
    T_CONFIGURED,
    T_SUBSCRIBED,
    T_SUBSCRIPTION_RETIRED,
    T_LEASE,
    T_REJECTED,
    T_BOOKMARK,
    T_CONTRADICTION,
    T_CONTRADICTION_RESOLVED,
)

# Rows only the server writes, of this project's own types: a source's supervision (start, stop, crash, ...).
T_SOURCE = PROJECT_PREFIX + "source"
SERVER_TYPES = (*PROTOCOL_TYPES, T_SOURCE)

FILTER_KEYS = (
    "types",
    "sources",
    "subjects",
    "actors",
    "tiers",
    "origins",
    "horizons",
    "since",
    "until",
    "limit",
    "text",
)

# Error code -> HTTP status (section 3).
ERROR_STATUS: dict[str, int] = {
    "INVALID_FILTER": 400,
    "UNKNOWN_VOCABULARY": 400,
    "TIER_NOT_ASSERTABLE": 400,
    "INVALID": 400,
    "UNAUTHORIZED": 401,
    "CAPABILITY_MISSING": 403,
    "PROVENANCE_CEILING": 403,
    "ORIGIN_REFUSED": 403,
    "NOT_FOUND": 404,
    "DUPLICATE": 409,
    "CURSOR_BACKWARDS": 409,
    "LEASE_HELD": 409,
    "LEASE_LOST": 409,
    "EVIDENCE_REQUIRED": 409,
    "UNAVAILABLE": 409,
    "DEAD_LETTERED": 409,
    "CURSOR_EXPIRED": 410,
    "TOO_LARGE": 413,
    "OVER_BUDGET": 429,
}

# JSON-RPC numeric codes: -32000 downwards, in the order section 3 gives.
JSONRPC_ORDER = (
    "INVALID_FILTER",
    "UNKNOWN_VOCABULARY",
    "TIER_NOT_ASSERTABLE",
    "INVALID",
    "CAPABILITY_MISSING",
    "UNAUTHORIZED",
    "NOT_FOUND",
    "DUPLICATE",
    "CURSOR_BACKWARDS",
    "CURSOR_EXPIRED",
    "LEASE_HELD",
    "LEASE_LOST",
    "EVIDENCE_REQUIRED",
    "OVER_BUDGET",
    "PROVENANCE_CEILING",
    "ORIGIN_REFUSED",
    "TOO_LARGE",
    "UNAVAILABLE",
    "DEAD_LETTERED",
)
JSONRPC_CODE: dict[str, int] = {name: -32000 - i for i, name in enumerate(JSONRPC_ORDER)}

GAPS_ORDER = (
    "independence_unknown",
    "no_event_provenance",
    "single_actor",
    "stale_source",
    "no_subscribers",
    "unattested_origin",
)
CONFIDENCE_PRESENT = ("observations", "ages", "actors", "contradictions_open")
CONFIDENCE_MISSING = ("independence", "corroboration", "track_record")

DEFAULT_RETIRE_AFTER_MUTE_SECONDS = 604800  # also the longest an anonymous subscriber may ask for
# Of a monitor's MAX_ACTIVE_SUBSCRIPTIONS, the places only the owner's or the subscribe token may take.
RESERVED_FOR_GRANTED = 1000
# Rows a subscription's own calls (seek, re-subscribe) may write a minute, and subscriptions counted at once.
LOGGED_ACTIONS_PER_MINUTE = 60
ANONYMOUS_ROWS_PER_MINUTE = 600  # per monitor, between all its subscriptions granted without a token
LOGGED_TRACKED_MAX = 100_000
DELIVERY_COUNT_LIMIT = 5
DEFAULT_LEASE_SECONDS = 60
MAX_LEASE_SECONDS = 86400
MAX_LIMIT = 200
DEFAULT_LIMIT = 50
MAX_WAIT_SECONDS = 50
LAG_COUNT_CAP = 100_000
# GET /monitors in pages (EXT_MONITOR_PAGES): at most this many monitors a reply (a definition is at most
# MAX_DEFINITION_BYTES, so a page stays within a pull page's 4 MiB), and MONITORS_PAGE_SCAN records read to
# fill it (monitors the caller may not see are read and skipped; and one more a read, to know if any follow):
# each listing's cost is bounded, however many monitors an open server has been given.
MONITORS_PAGE_MAX = 500
MONITORS_PAGE_SCAN = 2000

# Input limits (docs/protocol.md section 10): every bound on what a request may carry, in one place.
MAX_NAME_CHARS = 256  # ids, subjects, actors, types
MAX_JSON_DEPTH = 32
MAX_FILTER_BYTES = 4096  # a filter, serialized
MAX_FILTER_TEXT_CHARS = 256
MAX_HEARTBEAT_SECONDS = 31 * 86400  # a periodic source runs at least once a month
MAX_FILTER_ALTERNATIVES = 16  # objects in a filter given as an array (each is matched against every row)
MAX_DEFINITION_BYTES = 8192  # a monitor's definable fields, serialized (a configured row carries them)
MAX_REASON_BYTES = 1024  # a seek, configuration, retire or lease reason or note
MAX_OUTCOME_CHARS = 256
MAX_EVIDENCE_BYTES = 4096
MAX_RPC_BATCH = 100
MAX_PUBLISH_BATCH = 100  # observations in one batch publish (a JSON array body)
MAX_ACTIVE_SUBSCRIPTIONS = 10_000  # per monitor
MAX_INTEGER = 2**53  # integers in queries and bodies; larger ones do not survive other JSON clients
MAX_FUTURE_SECONDS = 300  # a publisher's `time` may run ahead of the server's clock by this much
DEFAULT_MAX_BODY = 1 << 20  # a request body, unless the operator says otherwise (mp serve --max-body)
# One observation's publish (its body as compact JSON), whatever the door and its body limit: an engine rule,
# so an embedder's publish is bounded too, and every exported row can be imported (the import's R10 reads it).
MAX_PUBLISH_BYTES = 1 << 20
MAX_RAW_BYTES = 2048  # a rejected row keeps the raw payload whole up to this size, else a bounded excerpt
IDEMPOTENCY_KEY_MAX_CHARS = 128
IDEMPOTENCY_WINDOW_SECONDS = 86400
SCAN_BUDGET = 1000  # rows a filtered pull, or a filtered lag count, examines per request at most
# Seqs a filtered read walks per request when the store may examine rows in vain inside it (a filter it cannot
# answer by seeking one index alone, LogQuery.seeks_alone): a column without an index (tier, origin,
# horizon), a prefix, two terms, alternatives. The rows the store tests there never reach the engine's
# count, so the read is bounded by the stretch of the log it covers instead.
SCAN_SPAN = 8192
# A read of at most this many seqs that no single index answers (a parked reader's re-check after an append,
# usually one row) reads the rows whole and checks the filters in the engine: a tester's 200 parked readers
# with distinct 4 KiB filters cost the store 3.7 ms each per re-check (a statement of hundreds of values
# prepared and run per reader), 0.75 s per publish.
FEW_ROWS = 32
# Bytes, as stored: a page of a pull (or a stream) stops before its observations pass PAGE_BYTES (always at
# least one), and a filtered read stops once the rows it examined in vain pass SCAN_BYTES; so a reply's size
# and a read's cost are bounded by bytes, not only rows (200 rows of ~1 MiB each would be a 200 MiB reply).
PAGE_BYTES = 4 << 20
SCAN_BYTES = 32 << 20
SUBSCRIPTION_ID_HEX = 16

# Sources that watch (docs/protocol.md section 12).
MAX_SOURCE_OUTPUT_BYTES = 16384  # a source's output in one observation (a line, a run's stdout, a body kept)
MAX_SOURCE_STDERR_BYTES = 2048  # the tail of a failed run's stderr kept beside it
MAX_SOURCE_CHECKPOINT_BYTES = 4096  # where a source stands (file offset, feed seq, last result), as JSON
DEFAULT_SOURCE_RATE_PER_MINUTE = 600  # observations a source may publish per minute, unless the operator says
DEFAULT_MAX_SOURCES = 100  # sources one `mp serve --sources` runs at once, unless the operator says
MAX_SOURCES_PER_OWNER = 20  # of those, the sources of monitors declaring one owner
SOURCE_BACKOFF_FIRST_SECONDS = 1.0  # a crashed long-lived process restarts after 1 s, doubling ...
SOURCE_BACKOFF_MAX_SECONDS = 60.0  # ... up to 60 s
