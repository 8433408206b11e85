"""Problems found in the input, gathered so that every one is reported at once.

A ``Problem`` is a value: a stable ``code`` (kebab-case, e.g. ``unknown-flag``), a
``location`` (a flag as the user spelled it, ``file:line key`` for files, or ``<command>``),
and a ``message`` for people.  ``ProblemCollector`` gathers them; ``InvalidInput`` carries
them out of the library in one exception.  This module imports nothing of the project's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_text(text: str) -> str:
    """Untrusted text (a value, a file name) made safe for one line of a terminal: newlines,
    tabs and every other non-printable character (terminal escape codes start with one) written
    as visible escapes (``\\n``, ``\\x1b``, ``\\u2028``), never interpreted."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                    else f"\\U{ord(c):08x}") for c in text)


@dataclass(frozen=True)
class Problem:
    """One problem; its location and message are kept on one printable line (``escape_text``)."""

    code: str
    location: str
    message: str

    def __post_init__(self) -> None:
        for name in ("location", "message"):
            value = getattr(self, name)
            if isinstance(value, str) and not value.isprintable():
                object.__setattr__(self, name, escape_text(value))

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def to_json(self) -> dict:
        return {"code": self.code, "location": self.location, "message": self.message}


# The code of a required setting given with a value not known statically (a launch's unset
# variable): config/schema.py reports it; request.py drops it where the input said why already.
OPAQUE_REQUIRED = "opaque-required"


class InvalidInput(Exception):
    """Raised with every problem found; never raised for a single problem while others hide."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid input")


class ProblemCollector:
    """Collects problems in the order found, dropping exact duplicates."""

    def __init__(self) -> None:
        self._problems: list[Problem] = []
        self._seen: set[Problem] = set()    # linear in the problems (a log of 10,000 bad lines)

    def add(self, code: str, location: str, message: str) -> None:
        self.extend((Problem(code, location, message),))

    def extend(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            if problem not in self._seen:
                self._seen.add(problem)
                self._problems.append(problem)

    def __bool__(self) -> bool:
        return bool(self._problems)

    def __len__(self) -> int:
        return len(self._problems)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    @property
    def problems(self) -> tuple[Problem, ...]:
        return tuple(self._problems)

    def raise_if_any(self) -> None:
        if self._problems:
            raise InvalidInput(self._problems)
