"""Problems found in the input, gathered so that every one is reported at once.

A ``Problem`` is a value: a stable ``code`` (kebab-case, e.g. ``unknown-flag``), a
``location`` (a flag as the user spelled it, ``file:line key`` for files, or ``<command>``),
and a ``message`` for people.  ``ProblemCollector`` gathers them; ``InvalidInput`` carries
them out of the library in one exception.  This module imports nothing of the project's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator


@dataclass(frozen=True)
class Problem:
    code: str
    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def to_json(self) -> dict:
        return {"code": self.code, "location": self.location, "message": self.message}


class InvalidInput(Exception):
    """Raised with every problem found; never raised for a single problem while others hide."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid input")


class ProblemCollector:
    """Collects problems in the order found, dropping exact duplicates."""

    def __init__(self) -> None:
        self._problems: list[Problem] = []

    def add(self, code: str, location: str, message: str) -> None:
        problem = Problem(code, location, message)
        if problem not in self._problems:
            self._problems.append(problem)

    def extend(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            if problem not in self._problems:
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
