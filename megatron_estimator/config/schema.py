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
from megatron_estimator.core.plain_schema import plainly_valid
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


def check_config_schema(namespace: Mapping[str, Any], raw: RawArgs, bad_dests: set | None = None) -> list[Problem]:
    """Problems with the types, ranges and choices of the settings in ``namespace``; the dests
    whose values are unusable go into ``bad_dests`` when given."""
    schema = load_schema("config.schema.json")
    properties = schema["properties"]
    document = {k: namespace[k] for k in properties if namespace.get(k) is not None}
    if (all(_plainly_valid(value, properties[key], key) for key, value in document.items())
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
        if namespace.get(dest) is None and dest not in raw.opaque:
            flag = "--" + dest.replace("_", "-")
            location = raw.location(dest)
            message = REQUIRED_MESSAGES.get(dest, f"{flag} is required")
            if not location.startswith("--"):          # a file's key: say the key, then the flag
                message = f"{dest} is required (Megatron's {flag})"
            problems.append(Problem("missing-required", location, message))
    return problems
