"""Sources that watch (docs/protocol.md section 12): the one rule book `mp probe`, `mp serve --sources` and
the playground share. Pure: standard library only, no I/O (what needs the machine, such as resolving a
command on PATH or a path's symbolic links, is passed in as a function).

* `plan_of(monitor)` reads a monitor's `source`, `cadence`, `types` and `budget` into a `Plan`: what runs,
  how often, and what each observation will say; a source that cannot run raises `SourceRefused` with a
  sentence that says what to send instead.
* `Policy` and `policy_refusal` are the operator's allow-list (`--allow-source shell:<glob>`,
  `--allow-source file:<directory>`; `http` through the push sink guard).
* `line_body`, `run_body`, `fetch_body`, `silent_body`, `feed_body` turn what a source gave into a publish
  body: `actor probe:<monitor>`, `origin probe`, `tier measured` (`derived` for a feed), `machine_verified`,
  `source_ref`, the type and subject; output bounded and cut, bytes that are not UTF-8 replaced, and both
  said in `data` (`cut`, `bytes`, `invalid_utf8`). A source that did not answer is `data.answered: false`
  with the reason, never a zero (P3).
* `should_publish` is `settings.on_change`; `backoff` the restart delay of a crashed process.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor_protocol.core import cron, wire
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.vocab import (
    MAX_HEARTBEAT_SECONDS,
    MAX_NAME_CHARS,
    MAX_SOURCE_OUTPUT_BYTES,
    MAX_SOURCE_STDERR_BYTES,
    MONITOR_ID_PATTERN,
    PROJECT_PREFIX,
    PROTOCOL_PREFIX,
    RUNNABLE_SOURCE_KINDS,
    SOURCE_BACKOFF_FIRST_SECONDS,
    SOURCE_BACKOFF_MAX_SECONDS,
    TYPE_PATTERN,
)

FOLLOW = "follow"  # a long-lived process (a line each), a file's appended lines, a feed
EVERY = "every"  # once per period: heartbeat_seconds or a schedule
DEFAULT_HTTP_SECONDS = 60.0  # an http source without a cadence is fetched once a minute
DEFAULT_RUN_TIMEOUT = 30.0  # a periodic command, unless settings.timeout_seconds
DEFAULT_FETCH_TIMEOUT = 10.0  # an http fetch, unless settings.timeout_seconds
MAX_ARGV = 64
MAX_ARG_CHARS = 4096
MAX_REF_CHARS = 4096  # a command line or a URL
MAX_PATH_BYTES = (
    1024  # a file source's path, as JSON: its checkpoint (MAX_SOURCE_CHECKPOINT_BYTES) must hold it
)
# What a command run by the server sees of the operator's environment, besides the names the operator lists
# (--source-env NAME): never the operator's tokens and keys, which an allowed tool could print.
MINIMAL_ENV = ("PATH", "HOME", "LANG", "TZ", "TMPDIR")
SHELL_WORD = "sh"  # settings.shell runs `/bin/sh -c ref`, judged as this command: allowing it allows any
SETTINGS_KEYS = frozenset(
    {
        "type", "subject", "actor", "on_change", "ok_exit", "pick", "timeout_seconds", "shell", "argv",
        "from_start",
    }
)  # fmt: skip
# The actions of a source's supervision rows (python.monitor-protocol.source) and what each makes its status.
STATUS_OF_ACTION = {
    "start": "running",
    "restart": "running",
    "crash": "restarting",
    "stop": "stopped",
    "refused": "refused",
    "throttled": "running",
    "gap": "running",
}
# Actions that say something of a running source without changing its status or its reason.
NOTE_ACTIONS = frozenset({"throttled", "gap"})


class SourceRefused(Exception):
    """This source cannot run (a definition it cannot follow, or the operator's policy): the sentence says why
    and what to send instead. The source stays defined; the monitor's state shows the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Plan:
    """A monitor's source as it will run: what, how often, and what each observation says."""

    monitor: str
    kind: str
    ref: str
    mode: str  # FOLLOW or EVERY
    every: float | None = None  # seconds between runs (EVERY with heartbeat_seconds)
    schedule: cron.Cron | None = None  # EVERY with a cron schedule
    argv: tuple[str, ...] = ()  # shell: the command, never given to a shell unless `shell`
    shell: bool = False
    type: str | None = None  # None only for a feed, which keeps each original's type
    subject: str | None = None  # a literal subject ...
    subject_pointer: str | None = None  # ... or a JSON pointer into the output (settings.subject "/...")
    actor: str = ""
    on_change: bool = False
    ok_exit: tuple[int, ...] = (0,)
    pick: str | None = None  # http: a JSON pointer into the body
    timeout: float = DEFAULT_RUN_TIMEOUT
    from_start: bool = False  # file: read the lines already there the first time, not only new ones
    rate: int | None = None  # observations per minute from budget.observations_per_minute
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def source_ref(self) -> str:
        return bounded_ref(self.ref)

    def next_run(self, now: float) -> float:
        """When a periodic source runs next, after a run at `now`."""
        if self.schedule is not None:
            return self.schedule.next_after(now)
        return now + float(self.every or DEFAULT_HTTP_SECONDS)


# ======================================================================================== reading a plan
class NoCadence(SourceRefused):
    """A command source whose definition does not say how it runs (once per period, or long-lived): a door
    that knows a better way to say so (mp probe's flags) may catch this one."""


def _refuse(reason: str) -> SourceRefused:
    return SourceRefused(reason)


def bounded_ref(ref: str) -> str:
    """The ref as `source_ref` (at most 256 characters): a longer one keeps its start and a digest of all."""
    if len(ref) <= MAX_NAME_CHARS:
        return ref
    digest = hashlib.sha256(ref.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return ref[: MAX_NAME_CHARS - 28] + "...sha256:" + digest


def _number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _refuse(f"{name} must be a number of seconds from {low:g} to {high:g}, not {value!r}.")
    return float(value)


def _pointer(value: Any, name: str) -> str:
    if not isinstance(value, str) or not (value == "" or value.startswith("/")) or len(value) > 256:
        raise _refuse(f'{name} must be a JSON pointer such as "/status" (RFC 6901), not {str(value)[:80]!r}.')
    return value


def _argv(ref: Any, settings: Mapping[str, Any]) -> tuple[str, ...]:
    given = settings.get("argv")
    if given is not None:
        if (
            not isinstance(given, list)
            or not 1 <= len(given) <= MAX_ARGV
            or not all(isinstance(a, str) and 0 < len(a) <= MAX_ARG_CHARS and "\x00" not in a for a in given)
        ):
            raise _refuse(
                f"settings.argv must be a list of 1 to {MAX_ARGV} non-empty strings without NUL characters, "
                f'at most {MAX_ARG_CHARS} characters each: the command and its arguments, e.g. ["gh", "run", '
                '"list"].'
            )
        return tuple(given)
    if not isinstance(ref, str) or not ref.strip():
        raise _refuse(
            'A shell source needs its command: source.ref such as "gh run list --limit 1", or '
            "settings.argv as a list of words."
        )
    try:
        words = shlex.split(ref)
    except ValueError as exc:
        raise _refuse(f"source.ref cannot be split into words the way a shell splits them ({exc}).") from None
    if not words or len(words) > MAX_ARGV or any(len(w) > MAX_ARG_CHARS for w in words):
        raise _refuse(
            f"source.ref must split into 1 to {MAX_ARGV} words of at most {MAX_ARG_CHARS} characters."
        )
    return tuple(words)


def _type(monitor: Mapping[str, Any], settings: Mapping[str, Any], kind: str) -> str | None:
    declared = [t for t in monitor.get("types") or [] if isinstance(t, str)]
    chosen = settings.get("type")
    if chosen is None:
        if kind == "feed":
            return None  # each original keeps its own type
        if not declared:
            raise _refuse(
                "Say what type this source publishes: settings.type (reverse-DNS, e.g. com.example.ci.run) "
                "or the monitor's types (the first is used)."
            )
        chosen = declared[0]
    if not isinstance(chosen, str) or len(chosen) > MAX_NAME_CHARS or not TYPE_PATTERN.match(chosen):
        raise _refuse(
            f"settings.type must be reverse-DNS such as com.example.ci.run, not {str(chosen)[:80]!r}."
        )
    if chosen.startswith((PROTOCOL_PREFIX, PROJECT_PREFIX)):
        raise _refuse(f"settings.type {chosen} is written only by the server; name a type of your own.")
    if declared and chosen not in declared:
        raise _refuse(
            f"settings.type {chosen} is not one of the monitor's types {declared}; declare it first."
        )
    return chosen


def _actor(monitor_id: str, settings: Mapping[str, Any]) -> str:
    actor = settings.get("actor", f"probe:{monitor_id}")
    if (
        not isinstance(actor, str)
        or not actor
        or len(actor) > MAX_NAME_CHARS
        or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in actor)
    ):
        raise _refuse("settings.actor must be a name without whitespace, such as probe:ci-health.")
    if actor.startswith(("human:", "system:")):
        raise _refuse(
            f"settings.actor {actor} names a person or the system: a source is a machine, so name it "
            "probe:<something> (the default is probe:<monitor id>)."
        )
    return actor


def _cadence(kind: str, cadence: Mapping[str, Any]) -> tuple[str, float | None, cron.Cron | None]:
    if kind in ("file", "feed"):
        return FOLLOW, None, None  # a file's appended lines and a feed's observations as they come
    event_driven = cadence.get("event_driven")
    heartbeat = cadence.get("heartbeat_seconds")
    schedule = cadence.get("schedule")
    if event_driven is not None and not isinstance(event_driven, bool):
        raise _refuse("cadence.event_driven must be true or false.")
    if kind == "shell" and event_driven:
        return FOLLOW, None, None
    if schedule is not None:
        try:
            return EVERY, None, cron.parse(schedule)
        except cron.CronError as exc:
            raise _refuse(str(exc)) from None
    if heartbeat is not None:
        return EVERY, _number(heartbeat, "cadence.heartbeat_seconds", 1, MAX_HEARTBEAT_SECONDS), None
    if kind == "http":
        return EVERY, DEFAULT_HTTP_SECONDS, None
    raise NoCadence(
        "Say how this command runs: cadence.event_driven true (a long-lived process, one observation per "
        "line of its output) or cadence.heartbeat_seconds / cadence.schedule (one run per period, its output "
        "and exit code one observation)."
    )


def plan_of(monitor: Mapping[str, Any]) -> Plan:
    """The plan of a monitor as served (its `id`, `source`, `cadence`, `types`, `budget`); SourceRefused when
    it cannot run. A `log` source runs nothing: it is refused too (the caller usually skips it first)."""
    monitor_id = str(monitor.get("id") or "")
    source = monitor.get("source") or {}
    if not isinstance(source, Mapping):
        raise _refuse('source must be an object such as {"kind": "http", "ref": "https://..."}.')
    kind = source.get("kind", "log")
    if kind == "log":
        raise _refuse("source.kind is log: producers publish, nothing runs.")
    if kind not in RUNNABLE_SOURCE_KINDS:
        raise _refuse(
            f"source.kind {kind} is not supported by this server: it runs {', '.join(RUNNABLE_SOURCE_KINDS)} "
            "sources; publish from your own producer instead (source.kind log)."
        )
    settings = source.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise _refuse("source.settings must be an object.")
    unknown = sorted(set(settings) - SETTINGS_KEYS)
    if unknown:
        raise _refuse(f"Unknown source.settings {unknown[:8]}; known: {sorted(SETTINGS_KEYS)}.")
    cadence = monitor.get("cadence") or {}
    if not isinstance(cadence, Mapping):
        raise _refuse("cadence must be an object.")
    ref = source.get("ref")
    if ref is not None and not isinstance(ref, str):
        raise _refuse("source.ref must be a string.")
    ref = ref or ""
    if "\x00" in ref:
        raise _refuse("source.ref holds a NUL character, which no command, path or URL can: remove it.")
    if len(ref) > MAX_REF_CHARS:
        raise _refuse(f"source.ref is {len(ref)} characters long; a source's ref may have {MAX_REF_CHARS}.")
    if kind == "file":
        size = len(json.dumps(ref, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2
        if size > MAX_PATH_BYTES:
            raise _refuse(
                f"source.ref is {size} bytes long (as JSON); a file source's path may have {MAX_PATH_BYTES}, "
                "so that where the source stands fits its checkpoint."
            )
    argv: tuple[str, ...] = ()
    shell = settings.get("shell", False)
    if not isinstance(shell, bool):
        raise _refuse("settings.shell must be true or false.")
    if kind == "shell":
        if shell:
            if not ref.strip() or settings.get("argv") is not None:
                raise _refuse(
                    "settings.shell runs source.ref with /bin/sh -c: give the command line in ref, and no "
                    "settings.argv."
                )
            argv = ("/bin/sh", "-c", ref)
        else:
            argv = _argv(ref, settings)
            if settings.get("argv") is not None and ref and ref != shlex.join(argv):
                # What runs and what the observations name (source_ref) must be the same command.
                raise _refuse("Give the command once: source.ref or settings.argv, not both.")
            ref = ref or shlex.join(argv)
    elif kind == "http":
        if not ref.lower().startswith(("http://", "https://")):
            raise _refuse(f"An http source's ref must be an http:// or https:// URL, not {ref[:80]!r}.")
    elif kind == "file":
        if not ref:
            raise _refuse("A file source's ref is the path of the file to follow.")
    elif kind == "feed":
        if not MONITOR_ID_PATTERN.match(ref):
            raise _refuse("A feed's ref is the id of another monitor on this server.")
        if ref == monitor_id:
            raise _refuse("A feed cannot read its own monitor; name another one in source.ref.")
    mode, every, schedule = _cadence(kind, cadence)
    subject = settings.get("subject")
    pointer = None
    if subject is not None:
        if not isinstance(subject, str) or not subject or len(subject) > MAX_NAME_CHARS:
            raise _refuse(
                'settings.subject must be a subject such as "api", or a JSON pointer such as "/run".'
            )
        if subject.startswith("/"):
            pointer, subject = _pointer(subject, "settings.subject"), None
    on_change = settings.get("on_change", False)
    if not isinstance(on_change, bool):
        raise _refuse("settings.on_change must be true or false.")
    ok_exit = settings.get("ok_exit", [0])
    if (
        not isinstance(ok_exit, list)
        or not ok_exit
        or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in ok_exit)
    ):
        raise _refuse("settings.ok_exit must be a list of exit codes 0-255, such as [0, 1].")
    pick = settings.get("pick")
    if pick is not None:
        pick = _pointer(pick, "settings.pick")
    from_start = settings.get("from_start", False)
    if not isinstance(from_start, bool):
        raise _refuse("settings.from_start must be true or false.")
    default_timeout = DEFAULT_FETCH_TIMEOUT if kind == "http" else DEFAULT_RUN_TIMEOUT
    timeout = settings.get("timeout_seconds", default_timeout)
    timeout = _number(timeout, "settings.timeout_seconds", 1, 600)
    budget = monitor.get("budget") or {}
    rate = budget.get("observations_per_minute") if isinstance(budget, Mapping) else None
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 1):
        raise _refuse("budget.observations_per_minute must be a whole number of at least 1.")
    return Plan(
        monitor=monitor_id,
        kind=kind,
        ref=ref,
        mode=mode,
        every=every,
        schedule=schedule,
        argv=argv,
        shell=shell,
        type=_type(monitor, settings, kind),
        subject=subject,
        subject_pointer=pointer,
        actor=_actor(monitor_id, settings),
        on_change=on_change,
        ok_exit=tuple(ok_exit),
        pick=pick,
        timeout=timeout,
        from_start=from_start,
        rate=rate,
        settings=dict(settings),
    )


# ======================================================================================== the operator's policy
@dataclass(frozen=True)
class Policy:
    """What `mp serve --sources` may run.

    * `--allow-source shell:<glob> [word ...]`: a command whose first word matches the glob (as written, or
      where PATH finds it; a command given by path is judged by its real path only) and whose next words are
      exactly the words that follow; a bare first word allows that tool with any arguments;
    * `--allow-source file:<directory>`: a file inside it, symbolic links resolved;
    * http through the push sink guard (`--allow-sink`).

    Shell and file sources run only for attested monitors (made with the registration token), unless the
    operator says `--allow-unattested-sources` (`unattested`). `env` names what the commands see of the
    operator's environment besides MINIMAL_ENV (`--source-env NAME`)."""

    shell: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    unattested: bool = False
    env: tuple[str, ...] = ()

    def describe(self) -> str:
        """The allow-list, for the operator's log (never for the caller)."""
        listed = [f"shell:{g}" for g in self.shell] + [f"file:{d}" for d in self.files]
        return ", ".join(listed) or "no shell or file source"


def parse_policy(
    entries: Iterable[str], sinks: Iterable[str] = (), *, unattested: bool = False, env: Iterable[str] = ()
) -> Policy:
    """`--allow-source` entries into a Policy; ValueError with the operator's sentence for a bad one."""
    shell: list[str] = []
    files: list[str] = []
    for entry in entries:
        kind, sep, rest = str(entry).partition(":")
        if not sep or not rest.strip():
            raise ValueError(
                f"--allow-source {entry!r}: write shell:<glob of a command's first word> [next words] (e.g. "
                "shell:gh, or shell:'gh run list') or file:<absolute directory> (e.g. file:/var/log/app)"
            )
        rest = rest.strip()
        if kind == "shell":
            try:
                words = shlex.split(rest)
            except ValueError as exc:
                raise ValueError(f"--allow-source {entry!r}: its words cannot be split ({exc})") from None
            if not words:
                raise ValueError(f"--allow-source {entry!r}: name a command, e.g. shell:gh")
            shell.append(rest)
        elif kind == "file":
            if not rest.startswith("/"):
                raise ValueError(
                    f"--allow-source {entry!r}: a file directory must be absolute, e.g. file:/var/log"
                )
            files.append(posixpath.normpath(rest))
        else:
            raise ValueError(
                f"--allow-source {entry!r}: unknown kind {kind!r}; the allow-list names shell:<glob> and "
                "file:<directory> (http sources go through the push sink guard, --allow-sink)"
            )
    names: list[str] = []
    for name in env:
        name = str(name).strip()
        if not name or "=" in name or "\x00" in name:
            raise ValueError(
                f"--source-env {name!r}: give the name of an environment variable, e.g. GH_TOKEN"
            )
        names.append(name)
    return Policy(tuple(shell), tuple(files), tuple(sinks), unattested, tuple(names))


def command_word(plan: Plan) -> str:
    """The word the shell allow-list judges: the command's first word, or `sh` for settings.shell."""
    if plan.shell:
        return SHELL_WORD
    return plan.argv[0]


def command_words(plan: Plan) -> tuple[str, ...]:
    """The whole command as the allow-list judges it (settings.shell: `sh -c <ref>`)."""
    return (SHELL_WORD, "-c", plan.ref) if plan.shell else plan.argv


def _has_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def _allows(
    entry: str, words: tuple[str, ...], candidates: list[str], realpath: Callable[[str], str]
) -> bool:
    """Whether one `shell:` allowance lets `words` run: its first word (a glob) matches one of the command's
    candidates, and each of its next words is the command's word at that place, exactly."""
    allowed = shlex.split(entry)
    first, rest = allowed[0], allowed[1:]
    if len(words) < len(allowed) or tuple(words[1 : len(allowed)]) != tuple(rest):
        return False
    if any(fnmatch.fnmatchcase(c, first) for c in candidates):
        return True
    # An allowance naming one program by its path matches that program however it is reached (a link).
    return first.startswith("/") and not _has_glob(first) and realpath(first) in candidates


def policy_refusal(
    plan: Plan,
    policy: Policy,
    *,
    attested: bool = True,
    which: Callable[[str], str | None] = lambda word: None,
    realpath: Callable[[str], str] = posixpath.normpath,
    sink_refusal: Callable[[str, tuple[str, ...]], str | None] | None = None,
) -> str | None:
    """None when the operator's policy lets this source run on the server, else the sentence the state shows
    (it never lists what the operator allows: the server's log does). `attested`: the monitor was made with
    the registration token. `which` finds a command on PATH, `realpath` resolves symbolic links,
    `sink_refusal` is the push guard."""
    if plan.kind in ("shell", "file") and not attested and not policy.unattested:
        return (
            f"mp serve runs {plan.kind} sources only for monitors registered with the server's registration "
            "token (attested), and this monitor is not: register it with the token, or run the source on "
            "your own machine with mp probe"
        )
    if plan.kind == "shell":
        words = command_words(plan)
        word = command_word(plan)
        if "/" in word:
            # A word with a slash is a path, never the bare name it ends with (./gh is not gh): it must be
            # absolute, and only where it really leads is judged.
            if not word.startswith("/"):
                return (
                    f"the command {word[:200]!r} is a relative path: give a command name PATH finds, or an "
                    "absolute path"
                )
            candidates = [realpath(word)]
        else:
            found = which(word)
            candidates = [word] + ([posixpath.normpath(found), realpath(found)] if found else [])
        if any(_allows(entry, words, candidates, realpath) for entry in policy.shell):
            return None
        what = "settings.shell runs /bin/sh, which allows any command" if plan.shell else f"command {word!r}"
        return (
            f"the operator does not allow this shell source ({what[:300]}): mp serve runs a command only "
            "when an --allow-source shell:<glob> [words] entry matches it"
        )
    if plan.kind == "file":
        if not plan.ref.startswith("/"):
            return "a file source run by the server needs an absolute path in source.ref"
        real = realpath(plan.ref)
        for directory in policy.files:
            root = realpath(directory)
            if real == root or real.startswith(root.rstrip("/") + "/"):
                return None
        return (
            f"the operator does not allow reading {plan.ref[:300]}: mp serve follows a file only inside a "
            "directory given with --allow-source file:<directory>"
        )
    if plan.kind == "http" and sink_refusal is not None:
        refusal = sink_refusal(plan.ref, policy.sinks)
        if refusal is not None:
            return f"the sink guard refuses this http source: {refusal}"
    return None


def scrubbed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a source's command sees under `mp probe` (run by its user, on their machine): theirs,
    minus this project's settings and tokens (every `MP_*` variable: owner, reader, admin, registration and
    metrics tokens, the database URL) and the PostgreSQL password."""
    return {
        k: v for k, v in environ.items() if not k.startswith("MP_") and k not in ("PGPASSWORD", "PGPASSFILE")
    }


def minimal_env(environ: Mapping[str, str], names: Iterable[str] = ()) -> dict[str, str]:
    """The environment a command run by `mp serve --sources` sees: PATH, HOME, LANG, LC_*, TZ and TMPDIR, and
    only the other names the operator listed (`--source-env`); nothing else of the server's environment (its
    tokens, cloud keys, database password), which an allowed tool could be asked to print."""
    keep = set(MINIMAL_ENV) | set(names)
    return {k: v for k, v in environ.items() if k in keep or k.startswith("LC_")}


# ======================================================================================== what is published
def bounded_text(
    raw: bytes, limit: int = MAX_SOURCE_OUTPUT_BYTES, *, total: int | None = None
) -> tuple[str, dict]:
    """`raw` as text, at most `limit` bytes of it (cut at a character boundary), bytes that are not UTF-8
    replaced by U+FFFD; the notes say what happened: `cut` and `bytes` (the whole size), `invalid_utf8`.
    `total` is the whole size when `raw` is already a cut prefix."""
    notes: dict[str, Any] = {}
    size = len(raw) if total is None else total
    if size > limit or len(raw) > limit:
        raw = raw[:limit]
        notes.update({"cut": True, "bytes": size})
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if notes.get("cut") and exc.start >= len(raw) - 3 and exc.reason == "unexpected end of data":
            text = raw[: exc.start].decode("utf-8", "replace")  # the cut fell inside a character
        else:
            text = raw.decode("utf-8", "replace")
            notes["invalid_utf8"] = True
    return text, notes


def pointer_get(doc: Any, pointer: str) -> tuple[bool, Any]:
    """RFC 6901: (found, value)."""
    if pointer == "":
        return True, doc
    node = doc
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isascii() and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False, None
    return True, node


def parse_json(text: str) -> Any:
    """The text as JSON under the wire's rules (nesting, numbers, surrogates), or None when it is not."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return wire.loads(stripped.encode("utf-8"))
    except (ProtocolError, ValueError):
        return None


def _subject(plan: Plan, parsed: Any) -> str | None:
    if plan.subject is not None:
        return plan.subject
    if plan.subject_pointer is None or parsed is None:
        return None
    found, value = pointer_get(parsed, plan.subject_pointer)
    if not found or value is None or isinstance(value, dict | list):
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    if not text:
        return None
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 3] + "..."


def _body(plan: Plan, data: dict[str, Any], subject: str | None, key: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": plan.type,
        "data": data,
        "actor": plan.actor,
        "origin": "probe",
        "tier": "measured",
        "verification": "machine_verified",
        "source_ref": plan.source_ref,
    }
    if subject is not None:
        body["subject"] = subject
    if key is not None:
        body["idempotency_key"] = key
    return body


def _output(text: str, notes: dict[str, Any], name: str) -> tuple[dict[str, Any], Any]:
    """A line or a run's output as data: a JSON object or array is kept parsed (`value`), anything else as
    text under `name`; with the notes of bounded_text."""
    parsed = None if notes.get("cut") else parse_json(text)
    data: dict[str, Any] = {"value": parsed} if parsed is not None else {name: text}
    data.update(notes)
    return data, parsed


def line_body(plan: Plan, raw: bytes, key: str | None = None, *, total: int | None = None) -> dict[str, Any]:
    """One line of a long-lived command's stdout, or one line appended to a file (without its newline)."""
    text, notes = bounded_text(raw.rstrip(b"\r"), total=total)
    data, parsed = _output(text, notes, "line")
    return _body(plan, {"answered": True, **data}, _subject(plan, parsed), key)


def run_body(
    plan: Plan,
    exit_code: int,
    stdout: bytes,
    stderr: bytes,
    ms: int,
    key: str | None = None,
    *,
    stdout_total: int | None = None,
    stderr_total: int | None = None,
) -> dict[str, Any]:
    """One run of a periodic command: its output and exit code; an exit code outside settings.ok_exit is the
    source not answering, with the tail of its stderr."""
    if exit_code not in plan.ok_exit:
        reason = f"exited with status {exit_code} (settings.ok_exit: {list(plan.ok_exit)})"
        return silent_body(plan, reason, key, exit=exit_code, ms=ms, **stderr_fields(stderr, stderr_total))
    text, notes = bounded_text(stdout, total=stdout_total)
    data, parsed = _output(text, notes, "output")
    return _body(plan, {"answered": True, "exit": exit_code, "ms": ms, **data}, _subject(plan, parsed), key)


def stderr_fields(stderr: bytes, total: int | None = None) -> dict[str, Any]:
    """The tail of a command's stderr, as a failed run carries it (its size when only the end is kept)."""
    if not stderr:
        return {}
    tail = stderr[-MAX_SOURCE_STDERR_BYTES:]
    text, notes = bounded_text(tail, MAX_SOURCE_STDERR_BYTES)
    size = len(stderr) if total is None else total
    out: dict[str, Any] = {"stderr": text}
    if size > len(tail):
        out["stderr_bytes"] = size  # only its end is kept
    if notes.get("invalid_utf8"):
        out["invalid_utf8"] = True
    return out


def fetch_body(
    plan: Plan, status: int, ms: int, body: bytes, size: int, key: str | None = None, *, capped: bool = False
) -> dict[str, Any]:
    """One fetch of an http source: status, time taken, size and, with settings.pick, a value picked out of
    a JSON body. An HTTP 5xx is the source not answering."""
    if status >= 500:
        return silent_body(plan, f"HTTP {status}", key, status=status, ms=ms)
    data: dict[str, Any] = {"answered": True, "status": status, "ms": ms, "bytes": size}
    if capped:
        data["bytes_capped"] = True  # the body was longer than the server reads: `bytes` is a lower bound
    parsed = None
    if plan.pick is not None or plan.subject_pointer is not None:
        text, notes = bounded_text(body)
        parsed = None if notes.get("cut") else parse_json(text)
    if plan.pick is not None:
        found, value = pointer_get(parsed, plan.pick) if parsed is not None else (False, None)
        data["pick"] = plan.pick
        if found:
            data["value"] = value
        else:
            data["value"] = None  # P3: not picked is unknown, never zero
            data["pick_error"] = (
                "the body is not JSON (or longer than the server reads)"
                if parsed is None
                else f"the body has nothing at {plan.pick}"
            )
    return _body(plan, data, _subject(plan, parsed), key)


def silent_body(plan: Plan, reason: str, key: str | None = None, **extra: Any) -> dict[str, Any]:
    """The source did not answer (it could not start, timed out, was refused a connection, answered 5xx,
    exited with a code settings.ok_exit does not list): said so, with the reason, never as a zero (P3)."""
    data = {"answered": False, "reason": reason[:1024], **extra}
    return _body(plan, data, plan.subject, key)


def feed_body(plan: Plan, original: Mapping[str, Any], key: str | None = None) -> dict[str, Any] | None:
    """Another monitor's observation republished here (a feed): its data, tags, subject and time, tier
    `derived` and `wasDerivedFrom` naming it. None for a row only a server writes (it is not evidence of the
    other monitor's source)."""
    kind = original.get("type")
    if not isinstance(kind, str) or kind.startswith((PROTOCOL_PREFIX, PROJECT_PREFIX)):
        return None
    if original.get("origin") == "system":
        return None
    data = dict(original.get("data") or {})
    tags = data.pop("tags", {}) or {}
    data.pop("provenance", None)
    body = _body(plan, data, plan.subject or original.get("subject"), key)
    body["type"] = plan.type or kind
    body["tier"] = "derived"
    body["tags"] = tags
    body["wasDerivedFrom"] = [{"source": str(original.get("source")), "id": str(original.get("id"))}]
    if isinstance(original.get("time"), str):
        body["time"] = original["time"]
    return body


# ======================================================================================== on_change, backoff
def change_key(body: Mapping[str, Any]) -> str:
    """What settings.on_change compares: the type, subject and data of a result, without the time it took."""
    data = {k: v for k, v in (body.get("data") or {}).items() if k != "ms"}
    text = json.dumps([body.get("type"), body.get("subject"), data], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def should_publish(
    plan: Plan, previous: str | None, key: str, last_published: float | None, now: float, ttl: int | None
) -> bool:
    """settings.on_change: a periodic result is published only when it differs from the previous one, except
    that, with the monitor's ttl_seconds set, an unchanged one is published again once half of it has passed,
    so that an answering source never looks stale."""
    if not plan.on_change or previous != key:
        return True
    return bool(ttl) and last_published is not None and now - last_published >= float(ttl) / 2


def backoff(failures: int) -> float:
    """The delay before restarting a long-lived process after its `failures`-th crash in a row: 1 s doubling
    up to 60 s."""
    return min(SOURCE_BACKOFF_MAX_SECONDS, SOURCE_BACKOFF_FIRST_SECONDS * 2 ** max(0, failures - 1))


def supervision(action: str, plan_or_source: Plan | Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The payload of a supervision row (python.monitor-protocol.source): the action, what runs, and why."""
    if isinstance(plan_or_source, Plan):
        kind, ref = plan_or_source.kind, plan_or_source.source_ref
    else:
        kind = str(plan_or_source.get("kind", "log"))
        raw_ref = plan_or_source.get("ref")
        ref = bounded_ref(raw_ref) if isinstance(raw_ref, str) else None
    payload: dict[str, Any] = {"action": action, "kind": kind, "ref": ref, "run_by": "server"}
    for name, value in extra.items():
        if value is None:
            continue
        payload[name] = value[:1024] if isinstance(value, str) else value
    return payload
