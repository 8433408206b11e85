"""JSON Schema checks of the normalized configuration (``schemas/config.schema.json``).

Types, ranges and choices are data in the schema; this module only runs ``jsonschema`` and
turns each error into a ``Problem`` located where the user set the value.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

import jsonschema

from megatron_estimator.core.hints import PYTHON, describe_value
from megatron_estimator.core.problems import OPAQUE_REQUIRED, Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import load_schema, schema_validator

REQUIRED_MESSAGES = {
    "seq_length": "the sequence length is required (--seq-length)",
}


@lru_cache(maxsize=None)
def _property_validators() -> dict[str, Any]:
    """A jsonschema validator for each property of config.schema.json (its top level relates
    no two settings: only ``properties`` and ``required``)."""
    schema = load_schema("config.schema.json")
    cls = jsonschema.validators.validator_for(schema)
    return {dest: cls(sub) for dest, sub in schema["properties"].items()}


@lru_cache(maxsize=1 << 14)
def _setting_valid(dest: str, kind: type, value: Any) -> bool:
    """jsonschema's answer for one setting, kept: most of an estimate's settings are Megatron's
    defaults, the same on every estimate.  ``kind`` keys the type (True == 1 and 1 == 1.0
    hash alike; JSON Schema tells them apart); a list comes as a tuple."""
    return _property_validators()[dest].is_valid(list(value) if kind is list else value)


def _all_settings_valid(document: Mapping[str, Any]) -> bool:
    try:
        return all(_setting_valid(dest, type(value), tuple(value) if type(value) is list else value)
                   for dest, value in document.items())
    except TypeError:               # an unhashable value: let jsonschema report on the document
        return False


def check_config_schema(namespace: Mapping[str, Any], raw: RawArgs, bad_dests: set | None = None) -> list[Problem]:
    """Problems with the types, ranges and choices of the settings in ``namespace``; the dests
    whose values are unusable go into ``bad_dests`` when given."""
    schema = load_schema("config.schema.json")
    properties = schema["properties"]
    document = {k: namespace[k] for k in properties if namespace.get(k) is not None}
    problems: list[Problem] = []
    errors = [] if _all_settings_valid(document) else schema_validator("config.schema.json").iter_errors(document)
    for error in sorted(errors, key=lambda e: list(e.path)):
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
        if namespace.get(dest) is None and dest in raw.opaque:
            # Given, but its value is not known statically (a launch's unset variable): the
            # reader reported the cause; this only stops the estimate, which needs the value.
            flag = "--" + dest.replace("_", "-")
            problems.append(Problem(OPAQUE_REQUIRED, raw.location(dest),
                                    f"{flag} has no value known before the launch; the estimate needs it"))
        elif namespace.get(dest) is None:
            flag = "--" + dest.replace("_", "-")
            location = raw.location(dest)
            message = REQUIRED_MESSAGES.get(dest, f"{flag} is required")
            if not location.startswith("--"):          # a file's key: say the key, then the flag
                message = f"{dest} is required (Megatron's {flag})"
            problems.append(Problem("missing-required", location, message))
    return problems
