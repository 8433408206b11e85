"""JSON Schema checks of the normalized configuration (``schemas/config.schema.json``).

Types, ranges and choices are data in the schema; this module only runs ``jsonschema`` and
turns each error into a ``Problem`` located where the user set the value.
"""

from __future__ import annotations

from functools import lru_cache
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any, Mapping

from megatron_estimator.core.hints import PYTHON, describe_value
from megatron_estimator.core.plain_schema import JSON_TYPES, plainly_valid
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import schema_file

REQUIRED_MESSAGES = {
    "seq_length": "the sequence length is required (--seq-length)",
}


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    if name == "config.schema.json":    # every estimate checks it: its copy as Python loads without json
        from megatron_estimator.config.schema_data import CONFIG_SCHEMA

        return CONFIG_SCHEMA
    import json

    with open(schema_file(name), encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


# check_config_schema's answers for scalar settings, by (dest, type, value): the schema is
# read once, so a setting's answer never changes, and most of an estimate's settings are
# Megatron's defaults, the same on every estimate.  The type is part of the key (True == 1).
_SCALARS = (str, int, float, bool, type(None))
_ANSWERS: dict[tuple[str, type, Any], bool] = {}      # a list's value as a tuple
_ANSWERS_MAX = 1 << 14


def _plainly_valid(value: Any, schema: Mapping[str, Any], dest: str | None = None) -> bool:
    """True only when ``value`` certainly passes ``schema``; otherwise jsonschema decides and
    reports (core/plain_schema.py).  It spares importing jsonschema on valid inputs.  With
    ``dest`` (``schema`` is that setting's in config.schema.json) the answer for a scalar or
    a list of integers (a layer pattern) is kept."""
    if dest is None:
        return plainly_valid(value, schema)
    kind = type(value)
    if kind is list and all(type(item) is int for item in value):
        key = (dest, kind, tuple(value))
    elif kind in _SCALARS:
        key = (dest, kind, value)
    else:
        return plainly_valid(value, schema)
    answer = _ANSWERS.get(key)
    if answer is None:
        if len(_ANSWERS) >= _ANSWERS_MAX:
            _ANSWERS.clear()
        answer = _ANSWERS[key] = plainly_valid(value, schema)
    return answer


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def compiled_check(schema: Mapping[str, Any], dest: str):
    """``plainly_valid(value, schema)`` as one function of ``value`` for the shapes the config
    schema's settings have (a type with bounds, a type, an enum); other shapes ask
    ``_plainly_valid`` (its answers kept).  tests/test_plain_schema.py holds each property's
    function to ``plainly_valid``."""
    keys = [k for k in schema if k not in ("description", "title", "default", "$schema", "$id")]
    if keys == ["enum"]:
        allowed = frozenset((type(c), c) for c in schema["enum"] if type(c) in _SCALARS)
        return lambda v: type(v) in _SCALARS and (type(v), v) in allowed
    if "type" in keys and all(k == "type" or k in _BOUNDS for k in keys):
        expected = schema["type"]
        names = expected if isinstance(expected, list) else [expected]
        tests = tuple(JSON_TYPES[name] for name in names if name in JSON_TYPES)
        lo, hi = schema.get("minimum"), schema.get("maximum")
        xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        exact = frozenset(t for name, t in (("integer", int), ("number", int), ("number", float),
                                            ("string", str), ("boolean", bool), ("null", type(None)))
                          if name in names)

        def check(v):
            if type(v) not in exact and not any(test(v) for test in tests):
                return False
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if ((lo is not None and v < lo) or (hi is not None and v > hi)
                        or (xlo is not None and v <= xlo) or (xhi is not None and v >= xhi)):
                    return False
            return True
        return check
    return lambda v: _plainly_valid(v, schema, dest)


@lru_cache(maxsize=None)
def _compiled(name: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    schema = load_schema(name)
    return (tuple((dest, compiled_check(sub, dest)) for dest, sub in schema["properties"].items()),
            tuple(schema.get("required", ())))


def _certainly_valid(namespace: Mapping[str, Any]) -> bool:
    checks, required = _compiled("config.schema.json")
    get = namespace.get
    for dest, check in checks:
        value = get(dest)
        if value is not None and not check(value):
            return False
    for dest in required:
        if get(dest) is None:
            return False
    return True


def check_config_schema(namespace: Mapping[str, Any], raw: RawArgs, bad_dests: set | None = None) -> list[Problem]:
    """Problems with the types, ranges and choices of the settings in ``namespace``; the dests
    whose values are unusable go into ``bad_dests`` when given."""
    if _certainly_valid(namespace):
        return []
    schema = load_schema("config.schema.json")
    properties = schema["properties"]
    document = {k: namespace[k] for k in properties if namespace.get(k) is not None}
    problems: list[Problem] = []
    for error in sorted(_validator("config.schema.json").iter_errors(document), key=lambda e: list(e.path)):
        if error.validator == "required":
            continue  # reported below, one message per missing setting
        dest = str(error.path[0]) if error.path else ""
        if dest and bad_dests is not None:
            bad_dests.add(dest)
        location = raw.location(dest) if dest else raw.source
        value = namespace.get(dest)
        if error.validator == "enum":
            choices = ", ".join(str(c) for c in error.validator_value if c is not None)
            problems.append(Problem("invalid-choice", location,
                                    f"{describe_value(value, PYTHON)} is not one of: {choices}"))
        elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            bound = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">",
                     "exclusiveMaximum": "<"}[error.validator]
            reason = properties.get(dest, {}).get("description") if error.validator == "maximum" else None
            problems.append(Problem("out-of-range", location,
                                    f"{describe_value(value, PYTHON)} is out of range: must be {bound} {error.validator_value}"
                                    + (f" ({reason})" if reason else "")))
        elif error.validator == "type":
            expected = error.validator_value
            expected = " or ".join(t for t in expected if t != "null") if isinstance(expected, list) else expected
            problems.append(Problem("wrong-type", location,
                                    f"{describe_value(value, PYTHON)} has the wrong type: expected {expected}"))
        else:
            problems.append(Problem("invalid-value", location, error.message))
    for dest in schema.get("required", ()):
        if namespace.get(dest) is None and dest not in raw.opaque:
            flag = "--" + dest.replace("_", "-")
            location = raw.location(dest)
            message = REQUIRED_MESSAGES.get(dest, f"{flag} is required")
            if not location.startswith("--"):          # a file's key: say the key, then the flag
                message = f"{dest} is required (Megatron's {flag})"
            problems.append(Problem("missing-required", location, message))
    return problems
