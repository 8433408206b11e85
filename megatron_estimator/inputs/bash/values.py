"""Located text and shell values: every character keeps the ``file:line`` it was written at.

A value the reader cannot know statically is never guessed: it is a ``Cause`` (why, and where
the thing that cannot be resolved is written), carried by the segment of text it stands for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

UNRESOLVED = "unresolved-variable"
UNSUPPORTED = "unsupported-shell-construct"

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")        # a shell name
MAX_LOOP_ITERATIONS = 10_000
MAX_DEPTH = 64


@dataclass(frozen=True)
class Origin:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Cause:
    """Why a piece of text cannot be known statically."""

    code: str              # UNRESOLVED or UNSUPPORTED
    origin: Origin         # where the thing that cannot be resolved is written
    subject: str           # NNODES, $1, $(hostname), LAYER_ARGS
    message: str
    fallback: str | None = None   # what bash would read in a condition (unset -> '')


@dataclass(frozen=True)
class Seg:
    text: str
    origins: tuple[Origin, ...]      # one per character (one for an unknown segment)
    cause: Cause | None = None       # unknown: ``text`` is the source spelling
    via: str | None = None           # the inherited variable (from the environment the caller gave) it came from


Scalar = tuple  # tuple[Seg, ...]


@dataclass(frozen=True)
class Field:
    """One word after expansion."""

    segs: tuple[Seg, ...]
    uncertain: bool = False          # an unquoted unknown expansion: may be any number of words
    word_origin: Origin | None = None

    @property
    def causes(self) -> tuple[Cause, ...]:
        return tuple(s.cause for s in self.segs if s.cause is not None)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segs)


@dataclass(frozen=True)
class ArrayValue:
    elems: tuple[tuple[int, Field], ...] = ()

    def values(self) -> list[Field]:
        return [f for _, f in self.elems]

    def as_dict(self) -> dict[int, Field]:
        return dict(self.elems)

    @staticmethod
    def of(mapping: Mapping[int, Field]) -> "ArrayValue":
        return ArrayValue(tuple(sorted(mapping.items())))


@dataclass(frozen=True)
class Var:
    value: object                       # Scalar (tuple of Seg), ArrayValue, or Cause (wholly unknown)
    exported: bool = False
    integer: bool = False
    origin: Origin | None = None        # where the script last set it; None: inherited


def is_known(segs: Iterable[Seg]) -> bool:
    return all(s.cause is None for s in segs)


def text_of(segs: Iterable[Seg]) -> str:
    return "".join(s.text for s in segs)


def fallback_text(segs: Iterable[Seg]) -> str | None:
    out = []
    for s in segs:
        if s.cause is None:
            out.append(s.text)
        elif s.cause.fallback is not None:
            out.append(s.cause.fallback)
        else:
            return None
    return "".join(out)


def causes_of(segs: Iterable[Seg]) -> list[Cause]:
    return [s.cause for s in segs if s.cause is not None]


def at_use(segs: tuple, origin: Origin, via: str | None = None) -> tuple:
    """Text that came from outside the script (the environment, the arguments), placed at its use."""
    return tuple(Seg(s.text, (origin,) * len(s.origins), s.cause, via or s.via) for s in segs)


def lit_seg(text: str, origin: Origin) -> Seg:
    return Seg(text, (origin,) * len(text))


def unknown_seg(cause: Cause, spelling: str, at: Origin) -> Seg:
    return Seg(spelling, (at,), cause)


def value_key(value: object) -> object:
    """What decides whether two values are the same (origins do not)."""
    if isinstance(value, Cause):
        return ("cause", value.origin, value.subject)
    if isinstance(value, ArrayValue):
        return ("array", tuple((i, text_of(f.segs), f.uncertain, tuple(c.subject for c in f.causes)) for i, f in value.elems))
    return ("scalar", text_of(value), tuple(c.subject for c in causes_of(value)))

