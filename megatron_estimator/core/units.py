"""Byte units: the binary multiples, byte sizes as people write them, figures as reports print them.

Estimates are integers of bytes throughout; a figure becomes GiB only when it is rendered
(``gib``, ``format_bytes``).  ``parse_bytes`` reads sizes as people write them (``80GiB``,
``80GB`` = 80e9, ``81920MiB``, ``1.5 TiB``, ``85520809984B``); a bare number is GiB, the
project's rule.  This module imports nothing of the project's but ``core.problems``.
"""

from __future__ import annotations

from megatron_estimator.core.problems import InvalidInput, Problem

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

# The largest byte size accepted: 1 EiB, far above any device, and small enough that every
# figure derived from it stays a finite float when reported.
MAX_BYTE_SIZE = 1 << 60

_UNITS: dict[str, int] = {
    "": GiB,                                  # the project's rule: a bare number is GiB
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "ki": KiB, "mi": MiB, "gi": GiB, "ti": TiB,
}
_UNIT_HELP = ("B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB (powers of 2); "
              "a number without a unit is GiB")


def _split_number(text: str) -> tuple[str, str]:
    """``"1.5 TiB"`` -> ``("1.5", "TiB")``: the leading decimal number and what follows it."""
    end = 0
    while end < len(text) and (text[end].isdigit() or text[end] in "._"):
        end += 1
    if end < len(text) and text[end] in "eE" and end > 0:
        # an exponent only when digits follow: "1e9B" is 1e9 bytes, "1EiB" would be a unit
        exp_end = end + 1
        if exp_end < len(text) and text[exp_end] in "+-":
            exp_end += 1
        digits_start = exp_end
        while exp_end < len(text) and text[exp_end].isdigit():
            exp_end += 1
        if exp_end > digits_start:
            end = exp_end
    return text[:end], text[end:].strip()


def _exact_ratio(number: str) -> tuple[int, int] | None:
    """A decimal number as an exact fraction (numerator, denominator), or None when malformed."""
    mantissa, _, exponent = number.lower().partition("e")
    if "_" in mantissa:
        groups = mantissa.replace(".", "_").split("_")
        if any(not group for group in groups):
            return None                           # "1__000", "_5", "5_"
        mantissa = mantissa.replace("_", "")
    whole, dot, fraction = mantissa.partition(".")
    if not (whole + fraction).isdigit() or "." in fraction:
        return None
    numerator = int(whole + fraction)
    denominator = 10 ** len(fraction)
    if exponent:
        try:
            power = int(exponent)
        except ValueError:
            return None
        if power >= 0:
            numerator *= 10 ** power
        else:
            denominator *= 10 ** -power
    return numerator, denominator


def byte_size(value: object) -> int:
    """Bytes, or ValueError with a message for people (``parse_bytes`` without the problem)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"a byte size must be text such as 80GiB, not {type(value).__name__} {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a byte size")
        if value < 0:
            raise ValueError(f"a byte size cannot be negative ({value!r})")
        text = repr(value) if isinstance(value, float) else str(value)
    else:
        text = value.strip()
    if not text:
        raise ValueError(f"an empty value is not a byte size (write e.g. 80GiB; units: {_UNIT_HELP})")
    if text[0] in "+-":
        if text[0] == "-":
            raise ValueError(f"a byte size cannot be negative ({text!r})")
        text = text[1:]
    number, unit = _split_number(text)
    ratio = _exact_ratio(number) if number else None
    if ratio is None:
        raise ValueError(f"{text!r} is not a byte size (write a number and a unit: {_UNIT_HELP})")
    folded = unit.lower()
    if folded not in _UNITS:
        if folded in ("k", "m", "g", "t"):
            hint = f"write {unit.upper()}B for powers of 10 or {unit.upper()}iB for powers of 2"
        else:
            hint = f"units: {_UNIT_HELP}"
        raise ValueError(f"{text!r}: unknown unit {unit!r} ({hint})")
    numerator, denominator = ratio
    numerator *= _UNITS[folded]
    if folded == "b" and numerator % denominator:
        raise ValueError(f"{text!r}: a count of bytes must be a whole number")
    size = (2 * numerator + denominator) // (2 * denominator)      # to the nearest byte
    if size > MAX_BYTE_SIZE:
        raise ValueError(f"{text!r} is more than 1 EiB, more memory than any device has")
    return size


def parse_bytes(text: str | int | float, location: str = "", code: str = "invalid-budget") -> int:
    """Bytes from ``80GiB``, ``80GB`` (80e9), ``81920MiB``, ``1.5 TiB``, ``85520809984B``; a bare number is GiB.

    Units are case-insensitive: KB/MB/GB/TB are powers of 10, KiB/MiB/GiB/TiB (or Ki/Mi/Gi/Ti)
    powers of 2, B bytes; ``_`` may group digits.  Fractions round to the nearest byte.
    Bad text raises InvalidInput with one problem (``code``, ``location``).
    """
    try:
        return byte_size(text)
    except ValueError as error:
        raise InvalidInput([Problem(code, location, str(error))]) from None


def gib(n: int) -> str:
    """Bytes as GiB with two decimals, the figure every report prints: ``"79.18"``."""
    return f"{n / GiB:.2f}"


def format_bytes(n: int, exact: bool = False) -> str:
    """``"79.18 GiB"``; with ``exact``, ``"79.18 GiB (85,021,245,440 bytes)"``."""
    text = f"{gib(n)} GiB"
    return f"{text} ({n:,} bytes)" if exact else text
