"""Message helpers: 'did you mean' for misspelled keys and choices, values in words."""

from __future__ import annotations

import re
from typing import Any, Iterable


def closest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate nearest to ``word`` (case-insensitively), or None when none is close."""
    import difflib

    by_folded: dict[str, str] = {}
    for candidate in candidates:
        by_folded.setdefault(candidate.lower(), candidate)
    folded = word.lower()
    if folded in by_folded:
        return by_folded[folded]
    match = difflib.get_close_matches(folded, list(by_folded), n=1, cutoff=cutoff)
    return by_folded[match[0]] if match else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` or an empty string."""
    match = closest(word, candidates)
    return f"; did you mean {match}?" if match is not None and match != word else ""


def describe_value(value: Any) -> str:
    """A YAML value in words, for 'must be X, not Y' messages."""
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


_LOOKS_LIKE_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def yaml_float_hint(value: Any) -> str:
    """For a string such as ``1e-5``, which YAML 1.1 does not read as a number: how to write it."""
    if not (isinstance(value, str) and _LOOKS_LIKE_FLOAT.match(value.strip())):
        return ""
    mantissa, exponent = re.split("[eE]", value.strip())
    mantissa += "" if "." in mantissa else ".0"
    exponent = exponent if exponent[0] in "+-" else "+" + exponent
    return (f" (YAML 1.1, which PyYAML and Megatron read, takes {value} for a string; "
            f"write {mantissa}e{exponent})")
