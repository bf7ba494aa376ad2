"""The tutorial's eleven steps (PLAYGROUND.md): a sentence or two each, the principle it shows in plain
words (always on screen), the action its Do-it button runs, and what the person should take away once it
has run."""

STEPS = [
    {
        "title": "Define what is watched",
        "text": "Create the CI monitor: it watches builds, with horizon minute, and readers may observe, react "
        "and act. The owner token is shown once, because only its hash is kept.",
        "principle": "A monitor says up front what it watches and how often (its horizon), and even creating it "
        "is written in its log: configuration is an observation.",
        "action": "define-ci",
        "lesson": "A monitor is a definition plus an append-only log; creating it is itself the log's first row.",
    },
    {
        "title": "A probe reports a failed build",
        "text": "A CI probe publishes build-412: failed. Watch it get appended with its seq, tier measured and "
        "origin probe.",
        "principle": "Every observation says who saw it and how much to believe it: a probe's measurement is "
        "'measured', never a person's certainty.",
        "action": "probe",
        "lesson": "Every observation says who saw it (actor, origin) and how much to believe it (tier).",
    },
    {
        "title": "Subscribe a reader",
        "text": "reader-a subscribes. It gets its own cursor at the start of the log: the next seq it will be "
        "given.",
        "principle": "Registering is not reading, and the log does not wait for readers: it kept the build before "
        "anyone subscribed. Until this reader came, the state said so with the gap no_subscribers.",
        "action": "subscribe",
        "lesson": "The monitor kept what it saw even though nobody was reading yet.",
    },
    {
        "title": "Pull",
        "text": "reader-a pulls. It now holds a batch (outlined in the log), but its cursor has not moved: "
        "reading is not consuming.",
        "principle": "Reading is not consuming: a pull hands out observations but never moves the reader's place. "
        "Only an acknowledgement does.",
        "action": "pull",
        "lesson": "Pull never commits. Only ack moves the cursor.",
    },
    {
        "title": "Crash before acknowledging",
        "text": "reader-a crashes while holding the batch, restarts, and pulls again: the same observations come "
        "back, marked redelivered.",
        "principle": "Nothing is lost when a reader dies: whatever it had not acknowledged comes back, marked "
        "redelivered (at-least-once). So the work must be safe to do twice.",
        "action": "crash-restart-pull",
        "lesson": "At-least-once: nothing is lost, so processing must be idempotent by (source, seq).",
    },
    {
        "title": "Process and acknowledge",
        "text": "reader-a processes the batch and acks it. The cursor moves past it; the next pull is empty and "
        "lag is 0.",
        "principle": "Acknowledging commits the reader's place, after the work is done, and the place only ever "
        "moves forward.",
        "action": "process-ack-pull",
        "lesson": "Ack commits the reader's place; it never moves backwards.",
    },
    {
        "title": "An agent claims a person's certainty",
        "text": "agent:claude publishes 'passed' with tier src, the tier only a person can assert. It is "
        "refused with TIER_NOT_ASSERTABLE, and the refusal itself is appended to the log.",
        "principle": "A machine cannot give itself a person's certainty, and a refusal is itself evidence: the "
        "refused payload is kept in the log.",
        "action": "agent-src",
        "lesson": "A machine cannot give itself a person's certainty, and a refusal is still evidence.",
    },
    {
        "title": "The agent acts on behalf of the owner",
        "text": "The same agent publishes on behalf of human:you, the monitor's owner: accepted, and the record "
        "keeps both names.",
        "principle": "Delegation is explicit: an agent may speak for the owner only by naming them, and the "
        "record keeps both names.",
        "action": "agent-owner",
        "lesson": "Delegation is explicit: actor and on_behalf_of are both kept in the provenance.",
    },
    {
        "title": "Two workers, one job",
        "text": "worker-a claims the lease on build-412; worker-b tries too and gets LEASE_HELD naming the "
        "holder. Watch the countdown: when it expires, worker-b can claim it.",
        "principle": "A lease lets two workers share work without doing the same job twice: one holder at a time, "
        "and it expires by itself if the holder goes quiet.",
        "action": "lease-contend",
        "lesson": "A lease shares work without doing the same job twice, and it expires by itself.",
    },
    {
        "title": "Read the state",
        "text": "The state panel is computed from the log. Confidence stays null because inputs are missing, "
        "and the gaps say what is not known.",
        "principle": "The state is computed from the log and says what it does not know: an unknown value is "
        "null, never a confident 0, and each missing input is named.",
        "action": "state",
        "lesson": "The state says what it does not know instead of showing a confident zero.",
    },
    {
        "title": "Reload, then pause",
        "text": "Reload the page: everything is still there (IndexedDB). Then pause the monitor: a write is "
        "refused with UNAVAILABLE, and both the pause and the refusal are in the log.",
        "principle": "Nothing disappears silently: it survives a reload, a pause is itself recorded, and even a "
        "write refused while paused is kept.",
        "action": "pause-and-publish",
        "lesson": "Configuration is an observation too. Nothing disappears silently.",
    },
]
