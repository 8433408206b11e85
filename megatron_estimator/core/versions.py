"""Version strings as tuples of integers, for comparing releases."""

from __future__ import annotations

import re

# ``2.7.4.post1``, ``v2.4``, ``2.6.3+cu124``: up to three numbers, then any local suffix.
_VERSION = re.compile(r"v?(\d+(?:\.\d+){0,2})(?:[.+-]?[a-z0-9.+-]*)?")


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``2.7.4.post1`` -> ``(2, 7, 4)``; None when ``text`` is not a version."""
    found = _VERSION.fullmatch(text)
    return tuple(int(x) for x in found.group(1).split(".")) if found else None
