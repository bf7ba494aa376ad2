"""The JSON Schemas of every served object, and validators built on them.

The schemas ship inside the wheel as `monitor_protocol/schemas/` (pyproject force-includes the top-level
`schemas/` there); an editable install reads the repository's `schemas/` instead. jsonschema is imported
lazily, inside the functions that need it: the engine itself imports with the standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitor_protocol.core import jsonregex

SCHEMA_NAMES = ("monitor", "observation", "state", "subscription", "lease", "error", "filter")
SCHEMA_BASE = "https://monitor-protocol.dev/schemas/0.1/"


def schema_dir() -> Path:
    """The directory holding the project's schemas: the installed package's, else the repository's."""
    package = Path(__file__).resolve().parents[1]  # monitor_protocol/
    installed = package / "schemas"
    if (installed / "monitor.json").is_file():
        return installed
    repo = package.parents[1] / "schemas"
    if (repo / "monitor.json").is_file():
        return repo
    raise FileNotFoundError(f"no schemas found in {installed} or {repo}")


def load_schemas(directory: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Every `<name>.json` in `directory` (default: the project's schemas), keyed by name."""
    d = Path(directory) if directory is not None else schema_dir()
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(d.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:  # not JSON, or not UTF-8: say which file
            raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not out:
        raise FileNotFoundError(f"no *.json schemas in {d}")
    return out


def registry(directory: str | Path | None = None):
    """A referencing.Registry holding every schema of `directory` under its own `$id`. Each is held as a
    Draft 2020-12 resource without its `$schema`: jsonschema picks the validator class of a `$ref`'s target
    by its `$schema`, and would leave the ECMA-262 class below for its stock one there (a subscription's
    `filter` would be read with Python's patterns again)."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    resources = []
    for schema in load_schemas(directory).values():
        contents = {k: v for k, v in schema.items() if k != "$schema"}
        resources.append((schema.get("$id", ""), DRAFT202012.create_resource(contents)))
    return Registry().with_resources(resources)


def ecma_validator_class():
    """Draft 2020-12 with its regular expressions read as the draft says (ECMA-262: core/jsonregex.py),
    not as Python's `re` reads them: jsonschema would take "ci\\n" for a monitor id, which a validator in
    any other language refuses. `pattern`, `patternProperties` and `additionalProperties` (which asks
    which keys the patterns cover) are the keywords that read them in these schemas."""
    global _ECMA_VALIDATOR
    if _ECMA_VALIDATOR is None:
        from jsonschema import Draft202012Validator, ValidationError, validators

        def pattern(v: Any, regex: str, instance: Any, schema: dict[str, Any]) -> Any:
            if v.is_type(instance, "string") and not jsonregex.search(regex, instance):
                yield ValidationError(f"{instance!r} does not match {regex!r}")

        def pattern_properties(
            v: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
        ) -> Any:
            if v.is_type(instance, "object"):
                for regex, subschema in patterns.items():
                    for key, value in instance.items():
                        if jsonregex.search(regex, key):
                            yield from v.descend(value, subschema, path=key, schema_path=regex)

        def additional_properties(v: Any, allowed: Any, instance: Any, schema: dict[str, Any]) -> Any:
            if not v.is_type(instance, "object"):
                return
            known, regexes = schema.get("properties", {}), list(schema.get("patternProperties", {}))
            extras = sorted(
                k for k in instance if k not in known and not any(jsonregex.search(r, k) for r in regexes)
            )
            if v.is_type(allowed, "object"):
                for key in extras:
                    yield from v.descend(instance[key], allowed, path=key)
            elif allowed is False and extras:
                yield ValidationError(
                    f"Additional properties are not allowed ({', '.join(map(repr, extras))})"
                )

        _ECMA_VALIDATOR = validators.extend(
            Draft202012Validator,
            {
                "pattern": pattern,
                "patternProperties": pattern_properties,
                "additionalProperties": additional_properties,
            },
        )
    return _ECMA_VALIDATOR


_ECMA_VALIDATOR: Any = None


def validator(name: str, schema_dir: str | Path | None = None):
    """A Draft 2020-12 validator (ECMA-262 patterns) for schema `name` of `schema_dir` (default: the
    project's), with every sibling schema reachable by `$ref` through its `$id`; formats are checked where
    jsonschema can."""
    from jsonschema import FormatChecker

    schemas = load_schemas(schema_dir)
    if name not in schemas:
        raise KeyError(f"no schema {name!r} in {schema_dir or 'the project schemas'}; have {sorted(schemas)}")
    cls = ecma_validator_class()
    return cls(schemas[name], registry=registry(schema_dir), format_checker=FormatChecker())


def validators(schema_dir: str | Path | None = None) -> dict[str, Any]:
    """One validator per schema of `schema_dir`, sharing one registry."""
    from jsonschema import FormatChecker

    schemas = load_schemas(schema_dir)
    reg = registry(schema_dir)
    checker = FormatChecker()
    cls = ecma_validator_class()
    return {name: cls(schema, registry=reg, format_checker=checker) for name, schema in schemas.items()}


def errors_of(name: str, instance: Any, schema_dir: str | Path | None = None) -> list[str]:
    """Readable validation errors of `instance` against schema `name` (empty when valid)."""
    v = validator(name, schema_dir)
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(v.iter_errors(instance), key=lambda e: list(map(str, e.absolute_path)))
    ]
