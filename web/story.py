"""The tutorial's eleven steps (PLAYGROUND.md): a sentence or two each, the action its Do-it button runs,
and what the person should take away once it has run."""

STEPS = [
    {
        "title": "Define what is watched",
        "text": "Create the CI monitor: it watches builds, with horizon minute, and readers may observe, react "
        "and act. The owner token is shown once, because only its hash is kept.",
        "action": "define-ci",
        "lesson": "A monitor is a definition plus an append-only log; creating it is itself the log's first row.",
    },
    {
        "title": "A probe reports a failed build",
        "text": "A CI probe publishes build-412: failed. Watch it get appended with its seq, tier measured and "
        "origin probe.",
        "action": "probe",
        "lesson": "Every observation says who saw it (actor, origin) and how much to believe it (tier).",
    },
    {
        "title": "Subscribe a reader",
        "text": "reader-a subscribes. It gets its own cursor at the start of the log: the next seq it will be "
        "given.",
        "action": "subscribe",
        "lesson": "The monitor kept what it saw even though nobody was reading yet.",
    },
    {
        "title": "Pull",
        "text": "reader-a pulls. It now holds a batch (outlined in the log), but its cursor has not moved: "
        "reading is not consuming.",
        "action": "pull",
        "lesson": "Pull never commits. Only ack moves the cursor.",
    },
    {
        "title": "Crash before acknowledging",
        "text": "reader-a crashes while holding the batch, restarts, and pulls again: the same observations come "
        "back, marked redelivered.",
        "action": "crash-restart-pull",
        "lesson": "At-least-once: nothing is lost, so processing must be idempotent by (source, seq).",
    },
    {
        "title": "Process and acknowledge",
        "text": "reader-a processes the batch and acks it. The cursor moves past it; the next pull is empty and "
        "lag is 0.",
        "action": "process-ack-pull",
        "lesson": "Ack commits the reader's place; it never moves backwards.",
    },
    {
        "title": "An agent claims a person's certainty",
        "text": "agent:claude publishes 'passed' with tier src, the tier only a person can assert. It is "
        "refused with TIER_NOT_ASSERTABLE, and the refusal itself is appended to the log.",
        "action": "agent-src",
        "lesson": "A machine cannot give itself a person's certainty, and a refusal is still evidence.",
    },
    {
        "title": "The agent acts on behalf of the owner",
        "text": "The same agent publishes on behalf of human:you, the monitor's owner: accepted, and the record "
        "keeps both names.",
        "action": "agent-owner",
        "lesson": "Delegation is explicit: actor and on_behalf_of are both kept in the provenance.",
    },
    {
        "title": "Two workers, one job",
        "text": "worker-a claims the lease on build-412; worker-b tries too and gets LEASE_HELD naming the "
        "holder. Watch the countdown: when it expires, worker-b can claim it.",
        "action": "lease-contend",
        "lesson": "A lease shares work without doing the same job twice, and it expires by itself.",
    },
    {
        "title": "Read the state",
        "text": "The state panel is computed from the log. Confidence stays null because inputs are missing, "
        "and the gaps say what is not known.",
        "action": "state",
        "lesson": "The state says what it does not know instead of showing a confident zero.",
    },
    {
        "title": "Reload, then pause",
        "text": "Reload the page: everything is still there (IndexedDB). Then pause the monitor: a write is "
        "refused with UNAVAILABLE, and both the pause and the refusal are in the log.",
        "action": "pause-and-publish",
        "lesson": "Configuration is an observation too. Nothing disappears silently.",
    },
]
