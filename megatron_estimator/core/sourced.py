"""A value with where it came from: the world size, the budget (``Sourced(80 * 2**30, "--gpu H100")``)."""
from __future__ import annotations

from typing import Any, NamedTuple


class Sourced(NamedTuple):
    """``value`` (an int, a size, a name) and ``source``: the flag, setting, file:line or
    environment variable that gave it, as a report names it (None: not said)."""
    value: Any
    source: str | None = None
