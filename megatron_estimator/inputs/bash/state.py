"""The interpreter's state (variables, positional parameters, functions, directory) and the
exceptions that carry ``exit``, ``return``, ``break``/``continue`` and impure ``$(...)`` out."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass
class ShellState:
    vars: dict
    positional: object             # list[Field] or Cause
    functions: dict
    cwd: str | None
    allexport: bool = False
    status: int | None = 0
    nounset: object = None         # the Origin of the `set -u` in effect, or None

    def fork(self) -> "ShellState":
        return ShellState(dict(self.vars), list(self.positional) if isinstance(self.positional, list) else self.positional,
                          dict(self.functions), self.cwd, self.allexport, self.status, self.nounset)


