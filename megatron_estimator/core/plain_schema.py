"""A quick, one-sided JSON Schema check: "certainly valid", or "ask jsonschema".

``plainly_valid(value, schema)`` is True only when ``value`` passes every keyword of ``schema``
and every keyword is one this check understands (the subset the project's schemas use:
type, enum, the four bounds, items, minItems, uniqueItems, oneOf, properties, required,
additionalProperties).  False means "not sure": a failure, a keyword it does not know, or a
case where JSON Schema's equality differs from Python's (``True == 1``, ``1 == 1.0``); the
caller then runs jsonschema, which reports the problems.  It spares importing jsonschema
(a tenth of a second) on the valid inputs of every launch, and cannot change what is reported:
a True answer is one jsonschema would give too (JSON Schema 2020-12, "Validation" sections 6.1-6.5).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from typing import Any, Mapping

# JSON Schema's type names -> the test of a value read from JSON / YAML / flags.
JSON_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_ANNOTATIONS = ("description", "title", "default", "$schema", "$id")
_SCALARS = (str, int, float, bool, type(None))


def _type_rejects(value: Any, schema: Mapping[str, Any]) -> bool:
    """True when the schema's ``type`` certainly rejects ``value`` (an integer-valued float may
    still be a JSON "integer", so a float is never rejected by "integer" here)."""
    expected = schema.get("type")
    if expected is None:
        return False
    names = expected if isinstance(expected, list) else [expected]
    if any(name not in JSON_TYPES for name in names):
        return False
    if isinstance(value, float) and "integer" in names:
        return False
    return not any(JSON_TYPES[name](value) for name in names)


def plainly_valid(value: Any, schema: Mapping[str, Any]) -> bool:
    for key, expected in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            names = expected if isinstance(expected, list) else [expected]
            if not any(JSON_TYPES[name](value) for name in names if name in JSON_TYPES):
                return False
        elif key == "enum":
            # Same type and equal: JSON Schema tells true from 1, which Python's == does not.
            if type(value) not in _SCALARS or not any(type(c) is type(value) and c == value for c in expected):
                return False
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if not JSON_TYPES["number"](value):
                continue  # bounds apply to numbers only; "type" decides the rest
            if ((key == "minimum" and value < expected) or (key == "maximum" and value > expected)
                    or (key == "exclusiveMinimum" and value <= expected)
                    or (key == "exclusiveMaximum" and value >= expected)):
                return False
        elif key == "items":
            if isinstance(value, list) and not all(plainly_valid(item, expected) for item in value):
                return False
        elif key == "minItems":
            if isinstance(value, list) and len(value) < expected:
                return False
        elif key == "uniqueItems":
            if isinstance(value, list) and expected and (
                    not all(isinstance(item, str) for item in value) or len(set(value)) != len(value)):
                return False
        elif key == "oneOf":
            valid = [plainly_valid(value, option) for option in expected]
            if valid.count(True) != 1 or not all(ok or _type_rejects(value, option)
                                                 for ok, option in zip(valid, expected)):
                return False
        elif key == "properties":
            if isinstance(value, dict) and not all(plainly_valid(value[name], sub)
                                                   for name, sub in expected.items() if name in value):
                return False
        elif key == "required":
            if isinstance(value, dict) and not all(name in value for name in expected):
                return False
        elif key == "additionalProperties":
            if isinstance(value, dict):
                known = schema.get("properties", {})
                extra = [name for name in value if name not in known]
                if expected is False and extra:
                    return False
                if isinstance(expected, dict) and not all(plainly_valid(value[name], expected) for name in extra):
                    return False
                if expected is not False and not isinstance(expected, dict) and expected is not True:
                    return False
        else:
            return False
    return True
