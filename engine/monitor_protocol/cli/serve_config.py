"""`mp serve`'s settings: every one comes from, in this order, its flag, its environment variable, the --config
file (TOML, the flag's name as key, `-` or `_`), the default; tokens can so stay off argv (which `ps` shows to
every user). What is checked before the server starts (`validate`), and what SIGHUP reloads (`Reloader`)."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
from typing import Any

from monitor_protocol.core.netguard import LOOPBACK_NAMES, is_loopback


class ConfigError(Exception):
    """A setting from the environment or the config file that cannot be used (exit status 2)."""


# -- configuration ---------------------------------------------------------------------------------------
#
# Every setting comes from, in this order: its flag, its environment variable, the --config file (TOML, the
# flag's name as key, `-` or `_`), the default. Tokens can so stay off argv (which `ps` shows to every user).

LIST_SETTINGS = ("allow_origin", "allow_host", "allow_sink", "allow_source", "source_env")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# Where a shared store's engine calls run: greenlets on the event loop's thread, or threads (doors/green_lanes.py).
DB_LANES = ("green", "threads")
# setting -> (environment variable, kind)
SETTINGS: dict[str, tuple[str, str]] = {
    "host": ("MP_HOST", "str"),
    "port": ("MP_PORT", "int"),
    "db": ("MP_DB", "filled"),
    "registration_token": ("MP_REGISTRATION_TOKEN", "filled"),
    "allow_admin": ("MP_ADMIN_TOKEN", "admin"),
    "metrics_token": ("MP_METRICS_TOKEN", "filled"),
    "allow_origin": ("MP_ALLOW_ORIGIN", "list"),
    "allow_host": ("MP_ALLOW_HOST", "list"),
    "allow_sink": ("MP_ALLOW_SINK", "list"),
    "max_body": ("MP_MAX_BODY", "int"),
    "header_timeout": ("MP_HEADER_TIMEOUT", "float"),
    "body_timeout": ("MP_BODY_TIMEOUT", "float"),
    "keep_alive": ("MP_KEEP_ALIVE", "float"),
    "db_connections": ("MP_DB_CONNECTIONS", "int"),
    "db_lanes": ("MP_DB_LANES", "lanes"),
    "retire_after_mute": ("MP_RETIRE_AFTER_MUTE", "int"),
    "log_level": ("MP_LOG_LEVEL", "level"),
    "access_log": ("MP_ACCESS_LOG", "bool"),
    "sources": ("MP_SOURCES", "bool"),
    "allow_source": ("MP_ALLOW_SOURCE", "list"),
    "source_rate": ("MP_SOURCE_RATE", "int"),
    "allow_unattested_sources": ("MP_ALLOW_UNATTESTED_SOURCES", "bool"),
    "source_env": ("MP_SOURCE_ENV", "list"),
    "max_sources": ("MP_MAX_SOURCES", "int"),
}
CONFIG_ENV = "MP_CONFIG"
CONFIG_ALIASES = {"admin_token": "allow_admin"}  # the file may say admin_token, like MP_ADMIN_TOKEN
RELOADABLE = ("allow_origin", "allow_host", "metrics_token")  # what SIGHUP applies (Reloader)
RESTART_ONLY = (
    "host",
    "port",
    "db",
    "registration_token",
    "allow_admin",
    "allow_sink",
    "max_body",
    "header_timeout",
    "body_timeout",
    "keep_alive",
    "db_connections",
    "db_lanes",
    "retire_after_mute",
    "log_level",
    "access_log",
    "sources",
    "allow_source",
    "source_rate",
    "allow_unattested_sources",
    "source_env",
    "max_sources",
)


def _mark_given(namespace: argparse.Namespace, dest: str) -> None:
    given = set(getattr(namespace, "_given", ()) or ())
    given.add(dest)
    namespace._given = given


class StoreGiven(argparse.Action):
    """argparse's store, remembering that the flag was on the command line (flags win over env and file)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, values)
        _mark_given(namespace, self.dest)


class TrueGiven(argparse.Action):
    """A flag that switches a setting on, remembering that it was given (flags win over env and file)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        setattr(namespace, self.dest, True)
        _mark_given(namespace, self.dest)


class AppendGiven(argparse.Action):
    """argparse's append (a fresh list, never the default's), remembering that the flag was given."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None):
        given = self.dest in (getattr(namespace, "_given", ()) or ())
        items = list(getattr(namespace, self.dest) or []) if given else []
        items.append(values)
        setattr(namespace, self.dest, items)
        _mark_given(namespace, self.dest)


# What an environment variable or a TOML string may spell for a number (Python's own words stay out of the
# sentence: "invalid literal for int() with base 10").
_WHOLE = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# A --db that is a URL: its scheme (only postgresql:// and postgres:// are opened; anything else was taken for
# a file path, "./mysql:/x@h/db").
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _convert(name: str, kind: str, value: Any, where: str) -> Any:
    """One setting's value from a string (environment) or a TOML value (config file)."""
    text = isinstance(value, str)
    try:
        if kind in ("str", "filled"):
            if not text:
                raise ValueError("expected a string")
            if kind == "filled" and not value.strip():
                # an unfilled template's "": a token left empty must not mean "none", a db "" no file
                raise ValueError("expected a non-empty string (leave the setting out to have none)")
            return value
        if kind == "admin":  # a token, or true to mint one, or false for off
            if isinstance(value, bool):
                return "" if value else None
            if not text or not value:
                raise ValueError("expected a token (a non-empty string), or true to mint one")
            return value
        if kind == "list":
            items = value.split(",") if text else value
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError("expected a list of strings (or one comma-separated string)")
            return [i.strip() for i in items if i.strip()]
        if kind == "int":
            if isinstance(value, bool) or not (
                isinstance(value, int) or (text and _WHOLE.fullmatch(value.strip()))
            ):
                raise ValueError("expected a whole number")
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not (
                isinstance(value, int | float) or (text and _NUMBER.fullmatch(value.strip()))
            ):
                raise ValueError("expected a number (seconds, such as 30 or 2.5)")
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            word = value.strip().lower() if text else None
            if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError("expected true or false (1/0, yes/no, on/off)")
            return word in ("1", "true", "yes", "on")
        if kind == "lanes":
            lanes = str(value).lower() if text else None
            if lanes not in DB_LANES:
                raise ValueError(f"expected one of {', '.join(DB_LANES)}")
            return lanes
        if kind == "level":
            level = str(value).lower() if text else None
            if level not in LOG_LEVELS:
                raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}")
            return level
    except ValueError as exc:
        # Never echo what might be a token (a mistyped one is still a secret): name its type only.
        secret = "token" in name.lower() or "admin" in name.lower() or "token" in where.lower()
        shown = f"a value of type {type(value).__name__}" if secret else repr(value)
        raise ConfigError(f"{where}: {exc} (got {shown})") from None
    raise AssertionError(kind)


def read_config_file(path: str) -> dict[str, Any]:
    """The TOML config file as settings (keys are the flags' names; `[serve]` may hold them too)."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path} is not valid TOML: {exc}") from None
    if isinstance(data.get("serve"), dict):
        data = {**{k: v for k, v in data.items() if k != "serve"}, **data["serve"]}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        name = CONFIG_ALIASES.get(name, name)
        if name not in SETTINGS:
            known = ", ".join(sorted({*SETTINGS, *CONFIG_ALIASES}))
            raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
        out[name] = _convert(name, SETTINGS[name][1], value, f"{path}: {key}")
    return out


def resolve_settings(
    args: argparse.Namespace, environ: Any = None
) -> tuple[argparse.Namespace, dict[str, str]]:
    """The settings in force and where each came from ("--flag", "MP_X", "config FILE" or "default")."""
    environ = os.environ if environ is None else environ
    given = set(getattr(args, "_given", ()) or ())
    config_path = getattr(args, "config", None) or environ.get(CONFIG_ENV) or None
    from_file = read_config_file(config_path) if config_path else {}
    settings = argparse.Namespace(**vars(args))
    settings.config = config_path
    sources: dict[str, str] = {}
    for name, (env, kind) in SETTINGS.items():
        if name == "allow_admin" and name in given and args.allow_admin == "":
            # A bare --allow-admin switches the admin routes on; the token is the one the environment or the
            # file holds, if either does (minting another would leave the operator's token refused).
            if environ.get(env, "") != "":
                settings.allow_admin = _convert(name, kind, environ[env], env)
                sources[name] = env
                continue
            if isinstance(from_file.get(name), str):
                settings.allow_admin = from_file[name]
                sources[name] = f"config {config_path}"
                continue
        if name in given:
            sources[name] = "--" + name.replace("_", "-")
        elif environ.get(env, "") != "":
            setattr(settings, name, _convert(name, kind, environ[env], env))
            sources[name] = env
        elif name in from_file:
            setattr(settings, name, from_file[name])
            sources[name] = f"config {config_path}"
        else:
            sources[name] = "default"
        if name in LIST_SETTINGS:
            setattr(settings, name, list(getattr(settings, name, None) or []))
    return settings, sources


def fingerprint(token: str) -> str:
    """A short, stable name for a token in logs (never the token): the first 8 hex digits of its SHA-256."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:8]


def public_hosts(allow_host: list[str]) -> list[str]:
    """The names of --allow-host that are not loopback ones: a reverse proxy's set-up, or a public bind's
    (then no loopback request is taken for a local one: doors/http/ops.py)."""
    return [h for h in allow_host if not is_loopback(h.strip().lower())]


def metrics_said(before: str | None, now: str | None, source: str, public: bool = False) -> str:
    """What a reload log says of the metrics token: whether one is in force, where from, its fingerprint,
    and whether it changed (never the token). `public`: --allow-host names a public host."""
    if not now:
        who = "no one but the admin token: a public host is allowed" if public else "loopback clients only"
        return f"no metrics token ({who})" + (", the token removed" if before else "")
    change = "unchanged" if now == before else ("changed" if before else "new")
    return f"metrics token {fingerprint(now)} from {source} ({change})"


def allowed_hosts_for(host: str, extra: list[str]) -> set[str] | None:
    """The Host names accepted: local names on a loopback bind (DNS rebinding), else only what was allowed
    (as a request's Host is read: lower case, without the root's dot)."""
    hosts = {h.strip().lower().removesuffix(".") for h in extra if h.strip().removesuffix(".")}
    if is_loopback(host):
        return hosts | set(LOOPBACK_NAMES) | {host.strip("[]").lower()}
    if hosts:
        if host not in ("0.0.0.0", "::", ""):
            hosts.add(host.strip("[]").lower())
        return hosts
    return None


def setting_name(name: str, sources: dict[str, str] | None) -> str:
    """How a sentence names a setting: where its value came from (resolve_settings' sources), so a bad
    MP_DB_CONNECTIONS is not blamed on a --db-connections nobody typed."""
    where = (sources or {}).get(name, "default")
    if where.startswith("config "):
        return f"{where.removeprefix('config ')}: {name}"
    if where.startswith("MP_"):
        return where
    return "--" + name.replace("_", "-")


def validate(cfg: argparse.Namespace, sources: dict[str, str] | None = None) -> str | None:
    """The first problem with the settings (an operator's sentence naming the flag, variable or file key
    the value came from), or None."""
    from monitor_protocol.core import netguard

    def named(setting: str) -> str:
        return setting_name(setting, sources)

    if not (0 <= cfg.port <= 65535):
        return f"{named('port')} must be between 0 and 65535"
    scheme = _URL_SCHEME.match(cfg.db or "")
    if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
        return (
            f"{named('db')} names a {scheme.group(1)}:// database, which mp serve does not open: give a SQLite "
            "file path, ':memory:', or a postgresql:// (or postgres://) URL"
        )
    if cfg.max_body < 1:
        return f"{named('max_body')} must be a positive number of bytes"
    if cfg.retire_after_mute is not None and cfg.retire_after_mute < 1:
        return f"{named('retire_after_mute')} must be a positive number of seconds"
    for flag in ("header_timeout", "body_timeout", "keep_alive"):
        value = getattr(cfg, flag)
        if not (value > 0 and value < 1e7):
            return f"{named(flag)} must be a positive number of seconds"
    if cfg.body_timeout < cfg.header_timeout:
        return f"{named('body_timeout')} must be at least {named('header_timeout')}"
    if not 1 <= cfg.db_connections <= 64:
        return f"{named('db_connections')} must be between 1 and 64 (engine calls at once on PostgreSQL)"
    for entry in cfg.allow_sink:
        problem = netguard.check_allow_entry(entry)
        if problem is not None:
            return problem
    if getattr(cfg, "source_rate", 1) < 1:
        return f"{named('source_rate')} must be a whole number of observations per minute, at least 1"
    try:
        source_policy(cfg)
    except ValueError as exc:
        return str(exc)
    if getattr(cfg, "allow_source", None) and not getattr(cfg, "sources", False):
        return "--allow-source says what --sources may run: add --sources (or MP_SOURCES=true)"
    if getattr(cfg, "max_sources", 1) < 1:
        return f"{named('max_sources')} must be a whole number of sources, at least 1"
    runs_commands = any(
        str(e).startswith(("shell:", "file:")) for e in getattr(cfg, "allow_source", None) or []
    )
    if (
        getattr(cfg, "sources", False)
        and runs_commands
        and not cfg.registration_token
        and not getattr(cfg, "allow_unattested_sources", False)
    ):
        return (
            "--allow-source shell:/file: lets --sources run commands and read files, and they run only for "
            "monitors made with the registration token, but registration is open (no --registration-token): "
            "set --registration-token, or pass --allow-unattested-sources to let any monitor's source run "
            "what --allow-source allows (anyone who can create a monitor could then run it)"
        )
    return None


def source_policy(cfg: argparse.Namespace) -> Any:
    """The operator's allow-list for --sources (core/sources.py Policy); ValueError naming a bad entry."""
    from monitor_protocol.core.sources import parse_policy

    return parse_policy(
        getattr(cfg, "allow_source", None) or [],
        getattr(cfg, "allow_sink", None) or [],
        unattested=bool(getattr(cfg, "allow_unattested_sources", False)),
        env=getattr(cfg, "source_env", None) or [],
    )


def sources_line(cfg: argparse.Namespace) -> str:
    """What `mp serve` prints about the sources it runs."""
    if not getattr(cfg, "sources", False):
        return "sources: not run (--sources runs the sources of the monitors; mp probe runs one elsewhere)"
    allowed = ", ".join(cfg.allow_source) or "no shell or file source"
    who = (
        "for any monitor (--allow-unattested-sources)"
        if getattr(cfg, "allow_unattested_sources", False)
        else "for monitors made with the registration token"
    )
    env = ", ".join(getattr(cfg, "source_env", None) or []) or "none"
    return (
        f"sources: run by this server (allowed: {allowed}, {who}; commands see PATH, HOME, LANG, LC_*, TZ, "
        f"TMPDIR and: {env}; http through the push sink guard; feeds of public monitors; at most "
        f"{getattr(cfg, 'max_sources', 0)} sources, {cfg.source_rate} observations per minute each at most)"
    )


def _same(a: Any, b: Any) -> bool:
    """Two values of a setting alike (a list's order does not matter: origins and hosts are sets)."""
    if isinstance(a, list) and isinstance(b, list):
        return set(a) == set(b)
    return a == b


class Reloader:
    """SIGHUP: re-read the environment and the --config file and apply what can change while serving
    (allowed origins and hosts, the metrics token) without dropping a connection; the rest is reported
    as needing a restart. A file that does not parse changes nothing."""

    def __init__(self, flags: argparse.Namespace, cfg: argparse.Namespace, router: Any, app: Any) -> None:
        self.flags, self.cfg, self.router, self.app = flags, cfg, router, app
        self.log = logging.getLogger("monitor_protocol.serve")
        self.count = 0

    def __call__(self) -> None:
        try:
            fresh, sources = resolve_settings(self.flags)
            in_file = read_config_file(fresh.config) if fresh.config else {}
        except ConfigError as exc:
            self.log.error("SIGHUP: configuration not reloaded, the running one stays in force: %s", exc)
            return
        self.count += 1
        origins = {o.rstrip("/") for o in fresh.allow_origin}
        hosts = allowed_hosts_for(self.cfg.host, fresh.allow_host)
        # Whole new sets, swapped in one assignment each: the engine thread sees the old or the new one.
        self.router.allowed_origins = origins
        self.router.allowed_hosts = {h.lower() for h in hosts} if hosts is not None else None
        self.app.metrics_token = fresh.metrics_token
        pending = [
            name for name in RESTART_ONLY if getattr(fresh, name, None) != getattr(self.cfg, name, None)
        ]
        before = self.cfg.metrics_token
        self.cfg.allow_origin, self.cfg.allow_host = fresh.allow_origin, fresh.allow_host
        self.cfg.metrics_token = fresh.metrics_token
        self.log.info(
            "SIGHUP: configuration reloaded; origins allowed: %s; hosts allowed: %s; metrics: %s",
            ", ".join(sorted(origins)) or "none",
            ", ".join(sorted(hosts)) if hosts is not None else "any",
            metrics_said(
                before,
                fresh.metrics_token,
                sources.get("metrics_token", "default"),
                bool(public_hosts(fresh.allow_host)),
            ),
        )
        if pending:
            self.log.warning(
                "SIGHUP: changed settings that need a restart were not applied: %s", ", ".join(pending)
            )
        for name in RELOADABLE:
            # the file's value is read, and not in force: a flag or the environment (fixed at start) wins
            if (
                name in in_file
                and not sources[name].startswith("config ")
                and not _same(in_file[name], getattr(fresh, name))
            ):
                self.log.warning(
                    "SIGHUP: %s in %s is not in force: %s wins over the config file and is read only at "
                    "start (remove it there to manage %s in the file)",
                    name,
                    fresh.config,
                    sources[name],
                    name,
                )
