"""Sources that watch (docs/protocol.md section 12), the pure rule book and the engine's side: what a source's
output becomes, the operator's policy, on_change, backoff, cron schedules; a non-answer that is no contact
and the stale_source gap it makes real; the server's runners publishing as the monitor's own source under
every publish rule; supervision rows and the state's `source`; feeds. Each refusal beside its positive
control."""

from __future__ import annotations

import datetime as dt

import pytest
from enginekit import STORE_KINDS, Harness, make_store
from monitor_protocol.core import cron, schemas, sources
from monitor_protocol.core.errors import ProtocolError
from monitor_protocol.core.netguard import sink_refusal
from monitor_protocol.core.vocab import MAX_SOURCE_OUTPUT_BYTES, T_REJECTED, T_SOURCE
from monitor_protocol.store.memory import MemoryStore

pytestmark = pytest.mark.quick

RUN = "com.example.ci.run"


def mon(kind: str, ref: str = "", *, cadence=None, types=(RUN,), **settings) -> dict:
    source: dict = {"kind": kind, "ref": ref}
    if settings:
        source["settings"] = settings
    return {"id": "ci", "source": source, "cadence": cadence or {}, "types": list(types)}


# ======================================================================================== plans
def test_a_shell_source_is_argv_split_like_a_shell_and_never_given_to_one():
    plan = sources.plan_of(
        mon("shell", "gh run list --json 'status,conclusion'", cadence={"event_driven": True})
    )
    assert plan.argv == ("gh", "run", "list", "--json", "status,conclusion")
    assert plan.mode == sources.FOLLOW and not plan.shell
    # settings.argv is the list form; settings.shell hands ref to /bin/sh (and is judged as `sh`, below).
    listed = sources.plan_of(mon("shell", cadence={"heartbeat_seconds": 5}, argv=["echo", "a b"]))
    assert listed.argv == ("echo", "a b") and listed.mode == sources.EVERY and listed.every == 5
    # what runs and what its observations name (source_ref) are one command, given once
    with pytest.raises(sources.SourceRefused, match="once"):
        sources.plan_of(
            mon("shell", "gh run list", cadence={"heartbeat_seconds": 5}, argv=["rm", "-rf", "x"])
        )
    with pytest.raises(sources.SourceRefused, match="no settings.argv"):
        sources.plan_of(mon("shell", "date", cadence={"heartbeat_seconds": 5}, shell=True, argv=["rm"]))
    shelled = sources.plan_of(mon("shell", "echo $HOME | wc", cadence={"heartbeat_seconds": 5}, shell=True))
    assert shelled.argv == ("/bin/sh", "-c", "echo $HOME | wc") and sources.command_word(shelled) == "sh"


@pytest.mark.parametrize("kind", ["ws", "cir", "formula"])
def test_unsupported_kinds_are_refused_with_a_sentence(kind):
    with pytest.raises(sources.SourceRefused, match="not supported"):
        sources.plan_of(mon(kind, "x"))
    # positive control: a supported kind with the same definition runs
    assert sources.plan_of(mon("http", "https://example.com/health")).kind == "http"


def test_a_plan_says_what_is_missing():
    with pytest.raises(sources.SourceRefused, match="how this command runs"):
        sources.plan_of(mon("shell", "date"))  # no cadence: long-lived or periodic?
    with pytest.raises(sources.SourceRefused, match="what type"):
        sources.plan_of(mon("shell", "date", cadence={"event_driven": True}, types=()))
    with pytest.raises(sources.SourceRefused, match="Unknown source.settings"):
        sources.plan_of(mon("http", "https://example.com", command="rm -rf /"))
    with pytest.raises(sources.SourceRefused, match="not one of the monitor's types"):
        sources.plan_of(mon("http", "https://example.com", type="com.example.other"))
    with pytest.raises(sources.SourceRefused, match="written only by the server"):
        sources.plan_of(mon("http", "https://example.com", type=T_SOURCE, types=()))
    # positive controls
    assert sources.plan_of(mon("shell", "date", cadence={"event_driven": True})).type == RUN
    assert (
        sources.plan_of(mon("http", "https://e.com", type="com.example.h", types=())).type == "com.example.h"
    )


def test_a_source_may_not_name_a_person_or_the_system():
    for actor in ("human:you", "system:sweep"):
        with pytest.raises(sources.SourceRefused, match="a source is a machine"):
            sources.plan_of(mon("http", "https://example.com", actor=actor))
    assert sources.plan_of(mon("http", "https://example.com", actor="probe:health")).actor == "probe:health"
    assert sources.plan_of(mon("http", "https://example.com")).actor == "probe:ci"


def test_cadence_schedule_is_read_as_cron_in_utc():
    plan = sources.plan_of(mon("http", "https://example.com", cadence={"schedule": "*/15 * * * *"}))
    at = dt.datetime(2026, 9, 22, 17, 10, 11, tzinfo=dt.UTC).timestamp()
    assert dt.datetime.fromtimestamp(plan.next_run(at), dt.UTC) == dt.datetime(
        2026, 9, 22, 17, 15, tzinfo=dt.UTC
    )
    weekly = cron.parse("30 9 * * 1")  # Mondays 09:30
    monday = dt.datetime.fromtimestamp(weekly.next_after(at), dt.UTC)
    assert (monday.weekday(), monday.hour, monday.minute) == (0, 9, 30)
    both = cron.parse("0 0 13 * 5")  # the 13th or a Friday, as classic cron reads it
    fired = dt.datetime.fromtimestamp(both.next_after(at), dt.UTC)
    assert fired.day == 13 or fired.weekday() == 4
    for bad in ("* * * *", "61 * * * *", "0 0 30 2 *", "@hourly"):
        with pytest.raises(cron.CronError):
            cron.parse(bad)
    with pytest.raises(sources.SourceRefused, match="five"):
        sources.plan_of(mon("http", "https://example.com", cadence={"schedule": "hourly"}))


def test_an_http_source_without_a_cadence_runs_once_a_minute_and_a_file_follows():
    assert sources.plan_of(mon("http", "https://e.com")).every == sources.DEFAULT_HTTP_SECONDS
    assert sources.plan_of(mon("file", "/var/log/app.log")).mode == sources.FOLLOW


# ======================================================================================== the operator's policy
def which(word: str) -> str | None:
    return {"gh": "/usr/bin/gh", "sh": "/bin/sh", "date": "/usr/bin/date"}.get(word)


def test_shell_sources_run_only_when_the_allow_list_matches_the_first_word():
    plan = sources.plan_of(mon("shell", "gh run list", cadence={"event_driven": True}))
    none = sources.parse_policy([])
    assert "does not allow" in sources.policy_refusal(plan, none, which=which)
    other = sources.parse_policy(["shell:date"])
    assert "does not allow" in sources.policy_refusal(plan, other, which=which)
    # positive controls: by the word as written, or by where PATH finds it
    assert sources.policy_refusal(plan, sources.parse_policy(["shell:gh"]), which=which) is None
    assert sources.policy_refusal(plan, sources.parse_policy(["shell:/usr/bin/*"]), which=which) is None
    # a path that only looks allowed is normalised first
    sneaky = sources.plan_of(mon("shell", "/usr/bin/../../tmp/x", cadence={"event_driven": True}))
    assert sources.policy_refusal(sneaky, sources.parse_policy(["shell:/usr/bin/*"]), which=which)


def test_settings_shell_needs_the_shell_itself_allowed():
    plan = sources.plan_of(mon("shell", "gh run list; rm -rf /", cadence={"event_driven": True}, shell=True))
    refusal = sources.policy_refusal(plan, sources.parse_policy(["shell:gh"]), which=which)
    assert refusal and "allows any command" in refusal
    assert sources.policy_refusal(plan, sources.parse_policy(["shell:sh"]), which=which) is None


def test_file_sources_run_only_inside_an_allowed_directory_links_resolved():
    links = {"/srv/logs/app.log": "/srv/logs/app.log", "/srv/logs/evil.log": "/etc/shadow"}
    realpath = lambda p: links.get(p, p)  # noqa: E731
    policy = sources.parse_policy(["file:/srv/logs"])
    assert (
        sources.policy_refusal(sources.plan_of(mon("file", "/srv/logs/app.log")), policy, realpath=realpath)
        is None
    )
    escaped = sources.policy_refusal(
        sources.plan_of(mon("file", "/srv/logs/evil.log")), policy, realpath=realpath
    )
    assert escaped and "/srv/logs/evil.log" in escaped
    assert sources.policy_refusal(sources.plan_of(mon("file", "/srv/logsx/a.log")), policy, realpath=realpath)
    assert sources.policy_refusal(sources.plan_of(mon("file", "relative.log")), policy, realpath=realpath)


def test_http_sources_go_through_the_push_sink_guard():
    policy = sources.parse_policy([])
    internal = sources.plan_of(mon("http", "http://127.0.0.1:9/health"))
    refusal = sources.policy_refusal(internal, policy, sink_refusal=sink_refusal)
    assert refusal and "loopback" in refusal
    public = sources.plan_of(mon("http", "https://93.184.216.34/health"))
    assert sources.policy_refusal(public, policy, sink_refusal=sink_refusal) is None
    allowed = sources.parse_policy([], sinks=["127.0.0.1"])
    assert sources.policy_refusal(internal, allowed, sink_refusal=sink_refusal) is None


def on_path(words: tuple[str, ...]) -> sources.Plan:
    return sources.plan_of(mon("shell", cadence={"event_driven": True}, argv=list(words)))


def test_shell_and_file_sources_run_only_for_attested_monitors_unless_the_operator_says():
    shell = on_path(("gh", "run", "list"))
    file = sources.plan_of(mon("file", "/srv/logs/app.log"))
    policy = sources.parse_policy(["shell:gh", "file:/srv/logs"])
    for plan in (shell, file):
        refusal = sources.policy_refusal(plan, policy, attested=False, which=which)
        assert refusal and "registration token" in refusal and "mp probe" in refusal
        # positive controls: an attested monitor, or the operator's explicit --allow-unattested-sources
        assert sources.policy_refusal(plan, policy, attested=True, which=which) is None
        opened = sources.parse_policy(["shell:gh", "file:/srv/logs"], unattested=True)
        assert sources.policy_refusal(plan, opened, attested=False, which=which) is None
    # an http source is not a command: the sink guard judges it, attested or not
    http = sources.plan_of(mon("http", "https://example.com/health"))
    assert sources.policy_refusal(http, policy, attested=False) is None


def test_a_servers_command_sees_a_minimal_environment_plus_the_names_the_operator_lists():
    env = {
        "PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC", "TMPDIR": "/t",
        "GH_TOKEN": "gh", "AWS_SECRET_ACCESS_KEY": "aws", "MP_ADMIN_TOKEN": "y", "PGPASSWORD": "z",
    }  # fmt: skip
    minimal = {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC", "TMPDIR": "/t"}
    assert sources.minimal_env(env) == minimal
    # positive control: a name the operator lists (--source-env GH_TOKEN) is passed on, and only it
    assert sources.minimal_env(env, sources.parse_policy([], env=["GH_TOKEN"]).env) == {
        **minimal,
        "GH_TOKEN": "gh",
    }
    with pytest.raises(ValueError, match="--source-env"):
        sources.parse_policy([], env=["A=B"])


def test_an_allowance_may_name_an_argv_prefix_matched_word_by_word():
    policy = sources.parse_policy(["shell:gh run list"])
    assert sources.policy_refusal(on_path(("gh", "run", "list", "--limit", "1")), policy, which=which) is None
    assert sources.policy_refusal(on_path(("gh", "run", "list")), policy, which=which) is None
    for refused in (
        ("gh", "api", "/user"),
        ("gh", "run"),
        ("gh", "run", "view"),
        ("gh", "-R", "run", "list"),
    ):
        assert sources.policy_refusal(on_path(refused), policy, which=which), refused
    # a bare first word allows that tool with any arguments (the docs say so)
    bare = sources.parse_policy(["shell:git"])
    assert sources.policy_refusal(on_path(("git", "-c", "alias.x=!env", "x")), bare, which=which) is None
    with pytest.raises(ValueError, match="--allow-source"):
        sources.parse_policy(["shell:gh 'run"])


def test_a_refusal_does_not_tell_the_caller_what_the_operator_allows():
    policy = sources.parse_policy(["shell:deploy-prod", "file:/srv/secret-logs"])
    shell = sources.policy_refusal(on_path(("gh",)), policy, which=which)
    file = sources.policy_refusal(sources.plan_of(mon("file", "/etc/passwd")), policy)
    for refusal in (shell, file):
        assert refusal and "deploy-prod" not in refusal and "secret-logs" not in refusal
    assert "--allow-source shell:<glob>" in shell and "--allow-source file:<directory>" in file
    # the operator sees the list (the server logs it beside the refusal)
    assert "shell:deploy-prod" in policy.describe() and "file:/srv/secret-logs" in policy.describe()


def test_a_command_given_by_path_is_judged_by_its_real_path_never_its_bare_name():
    policy = sources.parse_policy(["shell:gh"])

    def realpath(path: str) -> str:
        return {"/usr/local/bin/gh": "/opt/gh/bin/gh"}.get(path, "/work/" + path.lstrip("./"))

    for sneaky in ("./gh", "tmp/../gh", "bin/gh"):
        refusal = sources.policy_refusal(on_path((sneaky,)), policy, which=which, realpath=realpath)
        assert refusal and "relative path" in refusal, sneaky
    # an absolute path is judged by where it really leads, not by its last word
    assert sources.policy_refusal(on_path(("/tmp/gh",)), policy, which=which, realpath=realpath)
    # positive controls: the bare name PATH finds; a path the allowance names, reached through a link
    assert sources.policy_refusal(on_path(("gh",)), policy, which=which, realpath=realpath) is None
    by_path = sources.parse_policy(["shell:/opt/gh/bin/gh"])
    assert sources.policy_refusal(on_path(("/usr/local/bin/gh",)), by_path, realpath=realpath) is None
    assert sources.policy_refusal(on_path(("/opt/gh/bin/gh",)), by_path, realpath=realpath) is None


def test_nul_characters_and_over_long_refs_are_refused_with_a_sentence():
    for monitor, what in (
        (mon("file", "/srv/logs/a\x00b.log"), "NUL"),
        (mon("http", "https://example.com/\x00"), "NUL"),
        (mon("file", "/srv/logs/" + "a" * sources.MAX_PATH_BYTES), "bytes long"),
        (mon("file", "/srv/logs/" + "é" * (sources.MAX_PATH_BYTES // 2)), "bytes long"),
        (mon("http", "https://example.com/" + "a" * sources.MAX_REF_CHARS), "characters long"),
        (mon("shell", cadence={"event_driven": True}, argv=["gh", "a\x00b"]), "NUL"),
    ):
        with pytest.raises(sources.SourceRefused, match=what):
            sources.plan_of(monitor)
    # positive controls: the longest path a checkpoint can hold plans, and a plain argv
    longest = "/srv/logs/" + "a" * (sources.MAX_PATH_BYTES - len("/srv/logs/"))
    assert sources.plan_of(mon("file", longest)).ref == longest
    assert sources.plan_of(mon("shell", cadence={"event_driven": True}, argv=["gh", "ab"])).argv == (
        "gh",
        "ab",
    )


def test_allow_source_entries_are_checked():
    for bad in ("gh", "shell:", "file:relative", "http:x"):
        with pytest.raises(ValueError, match="--allow-source"):
            sources.parse_policy([bad])
    assert sources.parse_policy(["shell:gh", "file:/var/log/"]).files == ("/var/log",)


def test_a_command_sees_the_operators_environment_minus_tokens():
    env = {"PATH": "/bin", "GH_TOKEN": "gh", "MP_OWNER_TOKEN": "x", "MP_ADMIN_TOKEN": "y", "PGPASSWORD": "z"}
    assert sources.scrubbed_env(env) == {"PATH": "/bin", "GH_TOKEN": "gh"}


# ======================================================================================== what is published
FOLLOW = mon("shell", "tail -f x", cadence={"event_driven": True})


def test_a_line_is_one_observation_with_the_probes_provenance():
    body = sources.line_body(sources.plan_of(FOLLOW), b"build 412 failed\r", "s:run:1")
    assert body == {
        "type": RUN,
        "data": {"answered": True, "line": "build 412 failed"},
        "actor": "probe:ci",
        "origin": "probe",
        "tier": "measured",
        "verification": "machine_verified",
        "source_ref": "tail -f x",
        "idempotency_key": "s:run:1",
    }


def test_a_json_line_is_kept_parsed_and_may_name_its_subject():
    plan = sources.plan_of(mon("shell", "x", cadence={"event_driven": True}, subject="/run/id"))
    body = sources.line_body(plan, b'{"run": {"id": 412}, "status": "failed"}')
    assert body["data"] == {"answered": True, "value": {"run": {"id": 412}, "status": "failed"}}
    assert body["subject"] == "412"
    plain = sources.line_body(plan, b"not json")
    assert "subject" not in plain and plain["data"]["line"] == "not json"


def test_huge_or_non_utf8_output_is_cut_and_says_so():
    plan = sources.plan_of(FOLLOW)
    huge = sources.line_body(plan, b"x" * (MAX_SOURCE_OUTPUT_BYTES * 3))
    assert huge["data"]["cut"] is True and huge["data"]["bytes"] == MAX_SOURCE_OUTPUT_BYTES * 3
    assert len(huge["data"]["line"]) == MAX_SOURCE_OUTPUT_BYTES
    # a cut that falls inside a character keeps the text whole, without a replacement character
    accents = sources.line_body(plan, "é".encode() * MAX_SOURCE_OUTPUT_BYTES)
    assert (
        accents["data"]["line"] == "é" * (MAX_SOURCE_OUTPUT_BYTES // 2)
        and "invalid_utf8" not in accents["data"]
    )
    broken = sources.line_body(plan, b"ok \xff\xfe bytes")
    assert broken["data"]["invalid_utf8"] is True and broken["data"]["line"] == "ok \ufffd\ufffd bytes"
    # positive control: an ordinary line carries neither note
    assert set(sources.line_body(plan, b"fine")["data"]) == {"answered", "line"}


def test_a_periodic_run_publishes_its_output_and_exit_code_and_a_failure_as_not_answering():
    plan = sources.plan_of(mon("shell", "gh run list", cadence={"heartbeat_seconds": 60}))
    ok = sources.run_body(plan, 0, b'[{"status": "completed"}]\n', b"", 120)
    assert ok["data"] == {"answered": True, "exit": 0, "ms": 120, "value": [{"status": "completed"}]}
    failed = sources.run_body(plan, 1, b"", b"error: no network\n", 30)
    assert failed["data"]["answered"] is False and "status 1" in failed["data"]["reason"]
    assert failed["data"]["stderr"] == "error: no network\n" and "value" not in failed["data"]
    lenient = sources.plan_of(mon("shell", "grep x f", cadence={"heartbeat_seconds": 60}, ok_exit=[0, 1]))
    assert sources.run_body(lenient, 1, b"", b"", 5)["data"]["answered"] is True


def test_an_http_fetch_reports_status_time_size_and_a_picked_value_and_5xx_is_not_answering():
    plan = sources.plan_of(mon("http", "https://e.com/health", pick="/checks/db"))
    ok = sources.fetch_body(plan, 200, 12, b'{"checks": {"db": "up"}}', 24)
    assert ok["data"] == {
        "answered": True,
        "status": 200,
        "ms": 12,
        "bytes": 24,
        "pick": "/checks/db",
        "value": "up",
    }
    missing = sources.fetch_body(plan, 200, 12, b'{"checks": {}}', 14)
    assert missing["data"]["value"] is None and "nothing at /checks/db" in missing["data"]["pick_error"]
    down = sources.fetch_body(plan, 503, 40, b"", 0)
    assert down["data"] == {"answered": False, "reason": "HTTP 503", "status": 503, "ms": 40}
    assert sources.fetch_body(plan, 404, 3, b"", 0)["data"]["answered"] is True  # the server answered


async def test_a_guarded_fetch_of_a_name_that_does_not_resolve_is_not_answering_not_refused():
    """Found by a tester: run by the server, an http source whose host did not resolve (a DNS outage, a
    typo) was "refused" by policy and published nothing, so no stale_source ever came; `mp probe` published
    the same failure as not answering (section 12). Control: an internal address is still refused."""
    from monitor_protocol.doors.sources.fetch import Fetcher

    def no_such_host(host: str) -> list[str]:
        raise OSError(-2, "Name or service not known")

    fetcher = Fetcher(guarded=True, resolve=no_such_host)
    try:
        fetched = await fetcher.fetch("https://status.example/health", 5)
        assert fetched.refused is None and fetched.status is None
        assert "could not be resolved" in (fetched.failure or "")
        plan = sources.plan_of(mon("http", "https://status.example/health"))
        silent = sources.silent_body(plan, str(fetched.failure), "h-1", ms=fetched.ms)
        assert silent["data"]["answered"] is False and "could not be resolved" in silent["data"]["reason"]
        inside = Fetcher(guarded=True, resolve=lambda host: ["10.1.2.3"])
        try:
            refused = await inside.fetch("https://intranet.example/health", 5)
        finally:
            await inside.close()
        assert refused.refused and "10.1.2.3" in refused.refused and refused.failure is None
    finally:
        await fetcher.close()


def test_on_change_suppresses_repeats_and_keeps_an_answering_source_fresh():
    plan = sources.plan_of(mon("http", "https://e.com", on_change=True))
    a = sources.change_key(sources.fetch_body(plan, 200, 10, b"", 0))
    b = sources.change_key(sources.fetch_body(plan, 200, 99, b"", 0))  # only the time taken differs
    c = sources.change_key(sources.fetch_body(plan, 500, 10, b"", 0))
    assert a == b != c
    assert sources.should_publish(plan, None, a, None, 100.0, None)
    assert not sources.should_publish(plan, a, b, 100.0, 160.0, None)
    assert sources.should_publish(plan, a, c, 100.0, 160.0, None)
    # with a ttl, an unchanged result goes again once half of it has passed (contact stays fresh)
    assert not sources.should_publish(plan, a, b, 100.0, 120.0, 60)
    assert sources.should_publish(plan, a, b, 100.0, 130.0, 60)
    # positive control: without on_change every result is published
    assert sources.should_publish(sources.plan_of(mon("http", "https://e.com")), a, b, 100.0, 101.0, None)


def test_a_crashed_process_restarts_after_1_s_doubling_to_60():
    assert [sources.backoff(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


# ======================================================================================== the engine's side
@pytest.fixture(params=STORE_KINDS)
def h(request, tmp_path):
    store = make_store(request.param, tmp_path)
    harness = Harness(store)
    yield harness
    store.close()


def http_monitor(h: Harness, **fields) -> str:
    return h.monitor(
        "ci", owner="agent:ops", source={"kind": "http", "ref": "https://e.com/health"}, **fields
    )


def state(h: Harness, token: str) -> dict:
    r = h.call("GET", "/monitors/ci/state", token=token)
    assert r.status == 200, r.body
    assert not schemas.errors_of("state", r.body), schemas.errors_of("state", r.body)  # its `source` too
    return r.body


def test_a_non_answer_is_kept_but_is_no_contact_and_stale_source_becomes_real(h):
    tok = http_monitor(h, ttl_seconds=60)
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0))
    h.clock.advance(30)
    st = state(h, tok)
    assert st["ages"]["since_last_source_contact_s"] == 30 and "stale_source" not in st["confidence"]["gaps"]
    assert st["source"]["answering"] is True
    since = []
    for _ in range(4):  # not answering, every 20 s: each kept in the log, none of them contact
        h.clock.advance(20)
        h.service.publish_as_source("ci", sources.fetch_body(plan, 503, 5, b"", 0))
        since.append(state(h, tok)["source"]["not_answering_since"])
    assert since == [since[0]] * 4  # not answering since the first non-answer, not since the last
    st = state(h, tok)
    assert st["ages"]["since_last_observation_s"] == 0
    assert st["ages"]["since_last_source_contact_s"] == 110
    assert "stale_source" in st["confidence"]["gaps"]
    assert st["source"]["answering"] is False and st["source"]["not_answering_since"] is not None
    # positive control: an answer is contact again, and the gap goes
    h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0))
    st = state(h, tok)
    assert st["ages"]["since_last_source_contact_s"] == 0 and "stale_source" not in st["confidence"]["gaps"]
    assert st["source"]["answering"] is True and st["source"]["not_answering_since"] is None


def test_a_monitor_without_sources_keeps_the_published_stale_source_rule(h):
    tok = h.monitor("ci", ttl_seconds=10)
    assert h.publish("ci", tok, subject="b1").status == 201
    h.clock.advance(5)
    assert "stale_source" not in state(h, tok)["confidence"]["gaps"]
    h.clock.advance(6)
    assert "stale_source" in state(h, tok)["confidence"]["gaps"]
    assert state(h, tok)["source"] == {
        "kind": "log",
        "status": None,
        "reason": "producers publish (source.kind log): nothing runs",
        "since": None,
        "answering": True,
        "not_answering_since": None,
    }


def test_a_source_gets_past_no_rule_a_publisher_cannot(h):
    tok = http_monitor(h, limits={"observations_per_day": 2})
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    body = sources.fetch_body(plan, 200, 5, b"", 0)
    for claim in (
        {"tier": "src"},
        {"actor": "human:you"},
        {"actor": "system:sources"},
        {"type": "ai.mentu.monitor.lease"},
    ):
        with pytest.raises(ProtocolError) as refused:
            h.service.publish_as_source("ci", {**body, **claim})
        assert refused.value.extras.get("rejected_seq"), claim  # refused and logged, as for a publisher
    assert h.service.publish_as_source("ci", {**body, "idempotency_key": "k1"})["idempotent"] is False
    assert h.service.publish_as_source("ci", {**body, "idempotency_key": "k1"})["idempotent"] is True
    assert h.service.publish_as_source("ci", body)["seq"]
    with pytest.raises(ProtocolError) as over:
        h.service.publish_as_source("ci", body)  # the day's budget holds for sources too
    assert over.value.code == "OVER_BUDGET"


def test_a_checkpoint_commits_with_its_publish_even_a_refused_one(h):
    tok = http_monitor(h)
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0), {"offset": 10})
    assert h.service.sources_view("ci")[0]["checkpoint"] == {"offset": 10}
    with pytest.raises(ProtocolError):
        h.service.publish_as_source(
            "ci", {**sources.fetch_body(plan, 200, 5, b"", 0), "tier": "src"}, {"offset": 20}
        )
    assert h.service.sources_view("ci")[0]["checkpoint"] == {"offset": 20}


def test_a_paused_monitors_source_publishes_nothing_and_logs_nothing(h):
    tok = http_monitor(h)
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    assert h.call("POST", "/monitors/ci/pause", {"reason": "maintenance"}, tok).status == 200
    head = h.call("GET", "/monitors/ci", token=tok).body["head"]
    with pytest.raises(ProtocolError) as paused:
        h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0))
    assert paused.value.code == "UNAVAILABLE"
    assert h.call("GET", "/monitors/ci", token=tok).body["head"] == head
    assert h.call("POST", "/monitors/ci/resume", {"reason": "back"}, tok).status == 200
    assert h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0))["seq"] == head + 2


def test_supervision_rows_are_the_servers_own_and_the_state_says_how_the_source_stands(h):
    tok = http_monitor(h)
    assert state(h, tok)["source"]["status"] == "not_run"  # this engine runs no sources
    h.service.sources_here = True
    assert state(h, tok)["source"]["status"] == "pending"
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    h.service.source_event("ci", "refused", sources.supervision("refused", plan, reason="not allowed here"))
    st = state(h, tok)["source"]
    assert (st["status"], st["reason"]) == ("refused", "not allowed here") and st["since"]
    row = h.call("GET", "/monitors/ci/state", token=tok)
    log = h.service.read_log("ci")["observations"]
    last = log[-1]
    assert last["type"] == T_SOURCE and last["actor"] == "system:sources"
    assert (last["origin"], last["tier"], last["verified"]) == ("system", "measured", "machine_verified")
    assert last["data"]["payload"]["action"] == "refused" and row.status == 200
    assert state(h, tok)["counters"]["observations"] == 0  # the server's rows are not the source's answers


def test_a_gap_row_says_lines_may_be_missing_and_leaves_the_status_as_it_was(h):
    tok = http_monitor(h)
    h.service.sources_here = True
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    h.service.source_event("ci", "start", sources.supervision("start", plan))
    before = state(h, tok)["source"]
    h.service.source_event("ci", "gap", sources.supervision("gap", plan, reason="its lines after byte 3 ..."))
    after = state(h, tok)["source"]
    assert (after["status"], after["reason"], after["since"]) == ("running", None, before["since"])
    last = h.service.read_log("ci")["observations"][-1]
    assert last["type"] == T_SOURCE and last["data"]["payload"]["action"] == "gap"
    assert "byte 3" in last["data"]["payload"]["reason"]


def test_a_publisher_cannot_forge_a_supervision_row(h):
    tok = h.monitor("ci", types=[])
    r = h.publish("ci", tok, type=T_SOURCE, data={"payload": {"action": "start"}})
    assert r.status == 400 and r.body["code"] == "UNKNOWN_VOCABULARY" and r.body["rejected_seq"]
    assert h.publish("ci", tok, type="com.example.mine").status == 201  # positive control


def test_a_reader_may_filter_on_supervision_rows(h):
    tok = h.monitor("ci")
    sub = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:ops", "filter": {"types": [T_SOURCE]}},
        tok,
    )
    assert sub.status == 201, sub.body
    bad = h.call(
        "POST",
        "/subscriptions",
        {"monitor": "ci", "subscriber": "agent:x", "filter": {"types": ["com.example.no"]}},
        tok,
    )
    assert bad.status == 400  # positive control: an undeclared type is still refused


def test_a_feed_republishes_what_passes_its_filter_as_derived_once(h):
    src_tok = h.monitor("builds", visibility="public", types=[RUN, "com.example.ci.lint"])
    feed_tok = h.monitor(
        "ci",
        owner="agent:ops",
        source={"kind": "feed", "ref": "builds", "settings": {"from_start": True}},
        filter={"types": [RUN]},
    )
    assert (
        h.publish("builds", src_tok, subject="b1", data={"status": "failed"}, tags={"env": "ci"}).status
        == 201
    )
    assert h.publish("builds", src_tok, type="com.example.ci.lint", subject="l1").status == 201
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=feed_tok).body)
    step = h.service.feed_step("ci", plan)
    assert step["published"] == 1 and step["more"] is False
    again = h.service.feed_step("ci", plan)
    assert again["published"] == 0  # the checkpoint moved with the publish: nothing twice
    log = [o for o in h.service.read_log("ci")["observations"] if o["type"] == RUN]
    assert len(log) == 1
    derived = log[0]
    assert (derived["tier"], derived["origin"], derived["actor"]) == ("derived", "probe", "probe:ci")
    assert derived["data"]["status"] == "failed" and derived["data"]["tags"] == {"env": "ci"}
    assert derived["data"]["provenance"]["wasDerivedFrom"] == [{"source": "monitor:builds", "id": "2"}]


def test_a_feed_reads_only_a_public_monitor(h):
    h.monitor("secret", visibility="private")
    feed_tok = h.monitor("ci", owner="agent:ops", source={"kind": "feed", "ref": "secret"})
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=feed_tok).body)
    with pytest.raises(sources.SourceRefused, match="not public"):
        h.service.feed_step("ci", plan)
    assert [o["type"] for o in h.service.read_log("ci")["observations"]].count(T_REJECTED) == 0


def test_a_feed_of_a_feed_is_refused_so_two_feeds_never_echo_each_other(h):
    h.monitor("fa", visibility="public", source={"kind": "feed", "ref": "fb"})
    h.monitor("fb", visibility="public", source={"kind": "feed", "ref": "fa"})
    for monitor, other in (("fa", "fb"), ("fb", "fa")):
        plan = sources.plan_of({"id": monitor, "source": {"kind": "feed", "ref": other}})
        with pytest.raises(sources.SourceRefused, match="itself a feed"):
            h.service.feed_step(monitor, plan)
    # positive control: a feed of a monitor whose observations are its own reads on
    h.monitor("plain", visibility="public")
    h.monitor("fc", source={"kind": "feed", "ref": "plain"})
    plan = sources.plan_of({"id": "fc", "source": {"kind": "feed", "ref": "plain"}})
    assert h.service.feed_step("fc", plan)["published"] == 0


def test_over_budget_moves_no_checkpoint_and_a_feed_stands_before_the_row(h):
    tok = http_monitor(h, limits={"observations_per_day": 1})
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    body = sources.fetch_body(plan, 200, 5, b"", 0)
    h.service.publish_as_source("ci", body, {"offset": 10})
    with pytest.raises(ProtocolError) as over:
        h.service.publish_as_source("ci", body, {"offset": 20})
    assert over.value.code == "OVER_BUDGET"
    # the line refused for the day is sent again on the next: where the source stands did not move past it
    assert h.service.sources_view("ci")[0]["checkpoint"] == {"offset": 10}
    # positive control: another refusal (a claim no source may make) moves it on, its rejected row the record
    with pytest.raises(ProtocolError) as claimed:
        h.service.publish_as_source("ci", {**body, "tier": "src"}, {"offset": 30})
    assert claimed.value.code != "OVER_BUDGET"
    assert h.service.sources_view("ci")[0]["checkpoint"] == {"offset": 30}
    # a feed over its budget stops before the row it could not publish, and says so
    src = h.monitor("builds", visibility="public")
    h.monitor(
        "feed",
        source={"kind": "feed", "ref": "builds", "settings": {"from_start": True}},
        limits={"observations_per_day": 1},
    )
    for n in range(3):
        assert h.publish("builds", src, subject=f"b{n}").status == 201
    feed_plan = sources.plan_of(
        {"id": "feed", "source": {"kind": "feed", "ref": "builds", "settings": {"from_start": True}}}
    )
    step = h.service.feed_step("feed", feed_plan)
    assert step["published"] == 1 and step["over_budget"] is True
    assert h.service.sources_view("feed")[0]["checkpoint"]["seq"] == step["seq"] < 3


def test_a_checkpoint_too_large_to_keep_is_refused_before_anything_is_logged(h):
    tok = http_monitor(h)
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    head = h.call("GET", "/monitors/ci", token=tok).body["head"]
    with pytest.raises(ProtocolError) as big:
        h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0), {"file": "x" * 5000})
    # no rejected row (the server's runner turns this into the source's refused row, never a silent loss)
    assert not big.value.extras.get("rejected_seq")
    assert h.call("GET", "/monitors/ci", token=tok).body["head"] == head
    # positive control: the same with a checkpoint that fits
    h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0), {"file": "x" * 100})
    assert h.call("GET", "/monitors/ci", token=tok).body["head"] == head + 1


def test_a_log_with_a_sources_rows_is_copied_whole_and_a_forged_supervision_row_is_refused(h):
    import json

    from monitor_protocol.core.rules.importing import to_jsonl

    tok = http_monitor(h, ttl_seconds=60)
    plan = sources.plan_of(h.call("GET", "/monitors/ci", token=tok).body)
    h.service.source_event("ci", "start", sources.supervision("start", plan))
    h.service.publish_as_source("ci", sources.fetch_body(plan, 200, 5, b"", 0))
    h.clock.advance(10)
    h.service.publish_as_source("ci", sources.fetch_body(plan, 503, 5, b"", 0))
    text = to_jsonl(h.service.export_log("ci"))
    out = h.service.import_log("ci-copy", text)
    assert out["imported"] == len(text.splitlines())
    copy = h.call("GET", "/monitors/ci-copy/state", token=out["owner_token"]).body
    assert copy["counters"]["observations"] == 2  # the supervision row is the server's, not an observation
    assert copy["source"]["answering"] is False and copy["source"]["not_answering_since"] is not None
    # a supervision row a publisher wrote itself (origin probe) is refused, and nothing is imported
    rows = [json.loads(x) for x in text.splitlines()]
    start = next(r for r in rows if r["type"] == T_SOURCE)
    start["origin"] = start["data"]["provenance"]["origin"] = "probe"
    forged = "\n".join(json.dumps(r) for r in rows)
    with pytest.raises(ProtocolError) as refused:
        h.service.import_log("ci-forged", forged)
    assert "server's provenance" in str(refused.value.extras) or refused.value.code == "INVALID"
    assert h.call("GET", "/monitors/ci-forged", token=tok).status == 404


def test_a_runnable_source_with_an_unknown_setting_is_refused_at_create_not_later(h):
    """`settings.follow` (the probe's flag, not a setting) was accepted and the source then sat refused in the
    state; it is refused when the monitor is defined, saying where how often it runs is written."""
    bad = {"kind": "shell", "ref": "tail -f x", "settings": {"follow": True}}
    r = h.call("POST", "/monitors", {"id": "typo", "owner": "agent:ops", "source": bad})
    assert r.status == 400 and r.body["code"] == "INVALID" and r.body["invalid"] == ["follow"], r.body
    assert "cadence.event_driven" in r.body["error"] and "on_change" in r.body["error"]
    assert h.call("GET", "/monitors/typo").status == 404  # nothing was created
    tok = h.monitor(
        "ok", owner="agent:ops", source={**bad, "settings": {"on_change": True}}
    )  # positive control
    patched = h.call("POST", "/monitors/ok/update", {"patch": {"source": bad}, "reason": "typo"}, tok)
    assert patched.status == 400 and patched.body["invalid"] == ["follow"]  # an update too
    # a log source runs nothing here: its settings are a producer's own business
    h.monitor("log", source={"kind": "log", "settings": {"follow": True}})


def test_a_log_whose_source_has_a_setting_this_server_does_not_know_still_imports(h):
    """The unknown-setting refusal is for create and update: a log exported before it (or by another
    implementation) keeps the definition it was written with."""
    import json

    from monitor_protocol.core.rules.importing import to_jsonl

    h.monitor("ci", owner="agent:ops", source={"kind": "http", "ref": "https://e.com/health"})
    rows = [json.loads(x) for x in to_jsonl(h.service.export_log("ci")).splitlines()]
    created = next(r for r in rows if r["type"] == "ai.mentu.monitor.configured")
    created["data"]["payload"]["after"]["source"]["settings"] = {"follow": True}
    out = h.service.import_log("ci-old", "\n".join(json.dumps(r) for r in rows))
    assert out["imported"] == len(rows)
    refused = h.call("POST", "/monitors", {"id": "ci-new", "owner": "agent:ops", "source": {
        "kind": "http", "ref": "https://e.com/health", "settings": {"follow": True}}})  # fmt: skip
    assert refused.status == 400  # positive control: defining it anew is refused


def test_the_supervisors_full_look_reads_a_page_an_engine_call(tmp_path, monkeypatch):
    """sources_page: the monitors with a source other than `log`, 500 (here 2) monitors a call, and where the
    next page starts; every sourced monitor is found once across the pages, and no call reads them all."""
    from monitor_protocol.core.rules import sources as sources_rules

    monkeypatch.setattr(sources_rules, "SOURCES_PAGE", 2)
    h = Harness(MemoryStore())
    made = []
    for i in range(5):
        body = {"id": f"m{i}", "types": ["com.example.x"]}
        if i % 2 == 0:
            body["source"] = {"kind": "shell", "ref": "echo hi"}
            made.append(f"m{i}")
        assert h.call("POST", "/monitors", body).status == 201
    found, after, pages = [], "", 0
    while after is not None:
        page = h.service.sources_page(after)
        found += [v["monitor"]["id"] for v in page["views"]]
        after, pages = page["next"], pages + 1
    assert found == made and pages == 3  # m0 m1 | m2 m3 | m4
