"""Message helpers: 'did you mean' for misspelled keys and choices, values and kinds in words.

Every reader and front words its messages through these, so that one input's mistake reads
the same wherever it is made.  Each helper takes the few differences between formats as
parameters (case folding, the format whose words a value is described in); the texts are
part of the project's message contract.
"""

from __future__ import annotations

from typing import Any, Iterable

import re


def close_matches(word: str, candidates: Iterable[str], n: int = 1, cutoff: float = 0.6, *,
                  fold_case: bool = True) -> list[str]:
    """Up to ``n`` candidates nearest to ``word``, best first, by difflib's similarity ratio
    (at least ``cutoff``).  With ``fold_case`` case is ignored, and a candidate that differs from
    ``word`` only in case comes first; without it this is ``difflib.get_close_matches``."""
    import difflib

    if not fold_case:
        return difflib.get_close_matches(word, list(candidates), n=n, cutoff=cutoff)
    by_folded: dict[str, str] = {}
    for candidate in candidates:
        by_folded.setdefault(candidate.lower(), candidate)
    folded = word.lower()
    found = [folded] if folded in by_folded else []
    for match in difflib.get_close_matches(folded, list(by_folded), n=n, cutoff=cutoff):
        if match not in found:
            found.append(match)
    return [by_folded[match] for match in found[:n]]


def closest(word: str, candidates: Iterable[str], cutoff: float = 0.6, *, fold_case: bool = True) -> str | None:
    """The candidate nearest to ``word`` (case-insensitively unless ``fold_case`` is false), or
    None when none is close."""
    matches = close_matches(word, candidates, 1, cutoff, fold_case=fold_case)
    return matches[0] if matches else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` or an empty string."""
    match = closest(word, candidates)
    return f"; did you mean {match}?" if match is not None and match != word else ""


# ---------------------------------------------------------------------------------------
# Values and kinds in words

YAML, TOML, JSON, PYTHON = "yaml", "toml", "json", "python"


def describe_value(value: Any, words: str = YAML) -> str:
    """A value in words, for 'must be X, not Y' messages, in the words of the format it was
    written in:

    ``YAML``    null, the boolean true, a mapping, a list, the string 'x', the number 1.5,
                the integer 3
    ``TOML``    the boolean true, 'x', a table, an array, int 3
    ``JSON``    the value as JSON writes it ("x", [1], true, null); other numbers as Python
                writes them (1e-05, nan)
    ``PYTHON``  a string as Python writes it ('x'), anything else as JSON text
    """
    if words == JSON:
        import json

        return json.dumps(value) if isinstance(value, (dict, list, str, bool)) or value is None else repr(value)
    if words == PYTHON:
        import json

        return repr(value) if isinstance(value, str) else json.dumps(value)
    if words == TOML:
        if isinstance(value, bool):
            return "the boolean " + ("true" if value else "false")
        if isinstance(value, str):
            return repr(value)
        if isinstance(value, dict):
            return "a table"
        if isinstance(value, list):
            return "an array"
        return f"{type(value).__name__} {value!r}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "the boolean " + ("true" if value else "false")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, int):
        return f"the integer {value}"
    return f"a {type(value).__name__} ({value!r})"


# What a value must be, by JSON Schema type name: "must be an integer".
KIND_WORDS = {"integer": "an integer", "number": "a number", "boolean": "true or false",
              "string": "a string", "object": "a mapping", "array": "a list", "null": "null"}


def expected_kind(types: str | Iterable[str]) -> str:
    """A JSON Schema ``type`` (one name or a list) in words: ``"an integer (or null)"``."""
    if isinstance(types, str):
        return KIND_WORDS.get(types, types)
    types = list(types)
    real = [KIND_WORDS.get(t, t) for t in types if t != "null"]
    return " or ".join(real) + (" (or null)" if "null" in types else "")


_LOOKS_LIKE_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def yaml_float_hint(value: Any) -> str:
    """For a string such as ``1e-5``, which YAML 1.1 does not read as a number: how to write it."""
    if not (isinstance(value, str) and _LOOKS_LIKE_FLOAT.match(value.strip())):
        return ""
    import re

    mantissa, exponent = re.split("[eE]", value.strip())
    mantissa += "" if "." in mantissa else ".0"
    exponent = exponent if exponent[0] in "+-" else "+" + exponent
    return (f" (YAML 1.1, which PyYAML and Megatron read, takes {value} for a string; "
            f"write {mantissa}e{exponent})")
