"""JSON Schema checks of the workflow config, paper YAML and scale YAML, with short errors.

Every schema lives in ``config/schema/<name>.schema.yaml`` (JSON Schema 2020-12).
An error is one line naming the file and the key, plus the valid choices where
the schema knows them, e.g.::

    config/papers/fednoro.yaml: tables[0].rows[2]: unknown key 'methd'; valid keys: key, label, method, note, status, training

never the schema itself. Where a value is wrong the message says what it must be
(``must be an integer``, ``must be >= 0``); a schema may add the fix in words with the
extension keyword ``x-fix`` (ignored by JSON Schema), which ends the message.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "config" / "schema"


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    with open(SCHEMA_DIR / f"{name}.schema.yaml") as fh:
        return yaml.safe_load(fh)


def load_yaml(path: str | Path) -> dict:
    """A YAML file that must hold a mapping (config, paper, scale); a syntax error is one line
    naming the file, line and column (:func:`yaml_error`)."""
    with open(path) as fh:
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as err:
            raise yaml_error(path, err) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the file must be a mapping of keys to values")
    return data


def yaml_error(path: str | Path, err: yaml.YAMLError) -> ConfigError:
    """``<file>:<line>:<column>: YAML syntax error: <problem> (<context>); fix the file there`` (1-based)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return ConfigError(f"{where}: YAML syntax error: {detail}; fix the file at that line and column")


def check(doc: Any, schema_name: str, where: str, set_defaults: bool = False) -> Any:
    """Validate ``doc`` against a schema; raise ConfigError naming ``where`` and the key."""
    import jsonschema  # lazy: jsonschema is absent where the device check runs

    schema = load_schema(schema_name)
    cls = jsonschema.validators.validator_for(schema)
    if set_defaults:
        cls = _with_defaults(cls)
    validator = cls(schema, registry=_registry())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        first = _describe(errors[0])
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ConfigError(f"{where}: {first}{more}")
    return doc


@lru_cache(maxsize=None)
def _registry():
    """Every schema of SCHEMA_DIR under its ``$id``: one file's ``$ref: "training.schema.yaml"``
    resolves to another's (the training block is declared once for papers and scales)."""
    from referencing import Registry, Resource  # lazy: jsonschema is absent where the device check runs

    names = sorted(p.name[: -len(".schema.yaml")] for p in SCHEMA_DIR.glob("*.schema.yaml"))
    return Registry().with_resources(
        (load_schema(n)["$id"], Resource.from_contents(load_schema(n))) for n in names
    )


def coerce_cli_strings(config: dict, schema_name: str = "config") -> dict:
    """``--config key=[0,1]`` reaches Snakemake as the string '[0,1]': parse such strings
    as YAML where the schema wants a list or a mapping (top-level keys and one level below)."""
    props = load_schema(schema_name).get("properties", {})
    for key, sub in props.items():
        if isinstance(config.get(key), str) and _wants_container(sub):
            config[key] = _parse(key, config[key])
        inner = sub.get("properties", {})
        if isinstance(config.get(key), dict):
            for k2, s2 in inner.items():
                if isinstance(config[key].get(k2), str) and _wants_container(s2):
                    config[key][k2] = _parse(f"{key}.{k2}", config[key][k2])
    return config


def _wants_container(sub: dict) -> bool:
    t = sub.get("type")
    return t in ("array", "object") or (isinstance(t, list) and bool({"array", "object"} & set(t)))


def _parse(key: str, text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(
            f"{key}: {text!r} is not a list or mapping; give nested values in a file with --configfile"
        ) from None
    return value


def _location(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "a mapping", "null": "null"}
_BOUND_OPS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _describe(e) -> str:
    """One line: the key, what is wrong, and the fix (a schema's ``x-fix`` where it has one)."""
    text = _problem(e)
    fix = e.schema.get("x-fix") if isinstance(e.schema, dict) else None
    return f"{text}; {fix}" if fix else text


def _problem(e) -> str:
    loc = _location(e.absolute_path)
    prefix = f"{loc}: " if loc else ""
    v = e.validator
    if v == "additionalProperties" and isinstance(e.instance, dict):
        valid = sorted(e.schema.get("properties", {}))
        unknown = sorted(k for k in e.instance if k not in valid)
        keys = ", ".join(repr(k) for k in unknown)
        return f"{prefix}unknown key{'s' if len(unknown) > 1 else ''} {keys}; valid keys: {', '.join(valid)}"
    if v == "required":
        return f"{prefix}{e.message.replace(' is a required property', '')} is missing (a required key)"
    if v == "enum":
        return f"{prefix}{e.instance!r} is not valid; valid: {', '.join(map(repr, e.validator_value))}"
    if v == "type":
        wanted = [e.validator_value] if isinstance(e.validator_value, str) else list(e.validator_value)
        return f"{prefix}{e.instance!r} must be {' or '.join(_TYPE_NAMES.get(t, t) for t in wanted)}"
    if v in _BOUND_OPS:
        return f"{prefix}{e.instance!r} must be {_BOUND_OPS[v]} {e.validator_value!r}"
    if v == "uniqueItems" and isinstance(e.instance, list):
        seen, twice = set(), []
        for x in e.instance:
            key = repr(x)
            if key in seen and x not in twice:
                twice.append(x)
            seen.add(key)
        return (f"{prefix}{e.instance!r} lists {', '.join(map(repr, twice))} more than once; list each value once "
                "(a repeated seed would be the same run twice)")
    if v in ("oneOf", "anyOf"):
        if "x-fix" in e.schema:
            return f"{prefix}{e.instance!r} is not valid here"
        return f"{prefix}{e.instance!r} is not valid here" + _schema_hint(e.schema)
    msg = e.message if len(e.message) <= 160 else e.message[:157] + "..."
    return f"{prefix}{msg}"


def _schema_hint(schema: dict) -> str:
    d = schema.get("description")
    return f" ({d.strip()})" if d else ""


def _with_defaults(validator_cls):
    """A validator that fills ``default`` values while validating (as Snakemake's validate does)."""
    import jsonschema  # lazy: jsonschema is absent where the device check runs

    validate_props = validator_cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, sub in properties.items():
                if "default" in sub and prop not in instance:
                    instance[prop] = copy.deepcopy(sub["default"])
        yield from validate_props(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_cls, {"properties": set_defaults})
