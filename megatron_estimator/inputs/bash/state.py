"""The interpreter's state (variables, positional parameters, functions, directory) and the
exceptions that carry ``exit``, ``return``, ``break``/``continue`` and impure ``$(...)`` out."""

from __future__ import annotations

from dataclasses import dataclass, field


class ScriptExit(Exception):
    def __init__(self, status):
        self.status = status


class FunctionReturn(Exception):
    def __init__(self, status):
        self.status = status


class LoopJump(Exception):
    def __init__(self, kind: str, levels: int):
        self.kind = kind
        self.levels = levels


class ImpureCommand(Exception):
    """A command inside $(...) whose output cannot be known without running it."""

    def __init__(self, command: str):
        self.command = command


class ShellBudget:
    """The reader's bounds on the work one script may ask for (README.md, "Limits"), shared by
    every fork of the state: commands run (loops, function calls and branches all count), and
    the size of one command's words or one variable's value.  Past a bound the script is one
    located ``unsupported-shell-construct`` problem, as when it nests calls too deeply."""

    MAX_STEPS = 200_000
    MAX_FIELDS = 100_000       # words of one command, elements of one value
    MAX_CHARS = 1 << 24        # characters of one command's words, of one value
    MAX_WORK = 20_000_000      # words and pieces of values expanded over the whole script
    MAX_SOURCED = 4 << 20      # characters of sourced files parsed in all (each file parsed once)

    def __init__(self) -> None:
        self.steps = 0
        self.work = 0
        self.sourced = 0

    def step(self) -> str | None:
        """Count one command; the sentence to refuse it with past the bound."""
        self.steps += 1
        if self.steps > self.MAX_STEPS:
            return f"the script runs more than {self.MAX_STEPS:,} commands, the limit of what this tool follows"
        return None

    def source(self, chars: int) -> str | None:
        """Count the characters of one sourced file to parse; the sentence past the bound."""
        self.sourced += chars
        if self.sourced > self.MAX_SOURCED:
            return (f"the script sources more than {self.MAX_SOURCED:,} characters of shell text in all, the "
                    "limit of what this tool follows")
        return None

    def size(self, parts, what: str) -> str | None:
        """``parts``: the fields or segments of ``what`` (their ``text``); the sentence past the bound."""
        self.work += len(parts)
        if self.work > self.MAX_WORK:
            return (f"the script expands more than {self.MAX_WORK:,} words and pieces of values in all (a value "
                    "that grows line by line), the limit of what this tool follows")
        if (len(parts) > self.MAX_FIELDS
                or sum(len(getattr(part, "text", "") or "") for part in parts) > self.MAX_CHARS):
            return (f"{what} is larger than this tool follows ({self.MAX_FIELDS:,} words or "
                    f"{self.MAX_CHARS >> 20} MiB of text)")
        return None


@dataclass
class ShellState:
    vars: dict
    positional: object             # list[Field] or Cause
    functions: dict
    cwd: str | None
    allexport: bool = False
    status: int | None = 0
    nounset: object = None         # the Origin of the `set -u` in effect, or None
    budget: ShellBudget = field(default_factory=ShellBudget)     # shared by every fork
    unset_names: frozenset = frozenset()   # variables the script itself unset (bash reads '', the job cannot set them)

    def fork(self) -> "ShellState":
        return ShellState(dict(self.vars), list(self.positional) if isinstance(self.positional, list) else self.positional,
                          dict(self.functions), self.cwd, self.allexport, self.status, self.nounset, self.budget,
                          self.unset_names)


