"""JSON Schema checks of the normalized configuration (``schemas/config.schema.json``).

Types, ranges and choices are data in the schema; this module only runs ``jsonschema`` and
turns each error into a ``Problem`` located where the user set the value.
"""

from __future__ import annotations

from typing import Any, Mapping

from megatron_estimator.core.hints import PYTHON, describe_value
from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.rawargs import RawArgs
from megatron_estimator.core.resources import load_schema, schema_validator

REQUIRED_MESSAGES = {
    "seq_length": "the sequence length is required (--seq-length)",
}


_SCALARS = (str, int, float, bool)


def _is_default(value: Any, default: Any) -> bool:
    # The same type too: True == 1 and 1 == 1.0, but JSON Schema tells them apart.
    return type(value) is type(default) and type(value) in _SCALARS and value == default


def check_config_schema(namespace: Mapping[str, Any], raw: RawArgs, bad_dests: set | None = None,
                        defaults: Mapping[str, Any] | None = None) -> list[Problem]:
    """Problems with the types, ranges and choices of the settings in ``namespace``; the dests
    whose values are unusable go into ``bad_dests`` when given.  With ``defaults`` (the flag
    table's) a scalar equal to its default is not checked: every release's defaults pass the
    schema (tests/test_validation.py), and the schema's properties are independent (no keyword
    relates two), so the answer is the same with fewer values to check."""
    schema = load_schema("config.schema.json")
    properties = schema["properties"]
    if defaults is None:
        document = {k: namespace[k] for k in properties if namespace.get(k) is not None}
    else:
        document = {k: value for k in properties
                    if (value := namespace.get(k)) is not None and not _is_default(value, defaults.get(k))}
    problems: list[Problem] = []
    for error in sorted(schema_validator("config.schema.json").iter_errors(document), key=lambda e: list(e.path)):
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
