"""JSON Schema checks of the normalized configuration (``schemas/config.schema.json``).

Types, ranges and choices are data in the schema; this module only runs ``jsonschema`` and
turns each error into a ``Problem`` located where the user set the value.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping

from megatron_estimator.core.hints import PYTHON, describe_value
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import schema_path

REQUIRED_MESSAGES = {
    "seq_length": "the sequence length is required (--seq-length)",
}


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    with open(schema_path(name), encoding="utf-8") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema

    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _plainly_valid(value: Any, schema: Mapping[str, Any]) -> bool:
    """True only when ``value`` passes every keyword of ``schema`` and every keyword is one this
    check understands; anything else (a failure, or a keyword it does not know) is left to
    jsonschema, which then reports the problems.  It spares importing jsonschema (a tenth of a
    second) on the valid inputs of every launch."""
    for key, expected in schema.items():
        if key in ("description", "title", "default"):
            continue
        if key == "type":
            names = expected if isinstance(expected, list) else [expected]
            if not any(_TYPES[name](value) for name in names if name in _TYPES):
                return False
        elif key == "enum":
            if value not in expected:
                return False
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if not _TYPES["number"](value):
                continue  # jsonschema ignores bounds for non-numbers; "type" decides
            if ((key == "minimum" and value < expected) or (key == "maximum" and value > expected)
                    or (key == "exclusiveMinimum" and value <= expected)
                    or (key == "exclusiveMaximum" and value >= expected)):
                return False
        elif key == "items":
            if isinstance(value, list) and not all(_plainly_valid(item, expected) for item in value):
                return False
        elif key == "minItems":
            if isinstance(value, list) and len(value) < expected:
                return False
        elif key == "oneOf":
            if sum(_plainly_valid(value, option) for option in expected) != 1:
                return False
        else:
            return False
    return True


def check_config_schema(namespace: Mapping[str, Any], raw: RawArgs, bad_dests: set | None = None) -> list[Problem]:
    """Problems with the types, ranges and choices of the settings in ``namespace``; the dests
    whose values are unusable go into ``bad_dests`` when given."""
    schema = load_schema("config.schema.json")
    properties = schema["properties"]
    document = {k: namespace[k] for k in properties if namespace.get(k) is not None}
    if (all(_plainly_valid(value, properties[key]) for key, value in document.items())
            and all(document.get(key) is not None for key in schema.get("required", ()))):
        return []
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
        if namespace.get(dest) is None:
            flag = "--" + dest.replace("_", "-")
            location = raw.location(dest)
            message = REQUIRED_MESSAGES.get(dest, f"{flag} is required")
            if not location.startswith("--"):          # a file's key: say the key, then the flag
                message = f"{dest} is required (Megatron's {flag})"
            problems.append(Problem("missing-required", location, message))
    return problems
