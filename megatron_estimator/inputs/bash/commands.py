"""What the shell reader tells its caller: each simple command the script would execute.

The reader runs no program.  Where bash would start one (anything that is not a builtin or a
function of the script), it hands an ``ExecutedCommand`` to the caller's ``CommandVisitor``,
in the order bash would run them, and goes on as if the program had run.  What the caller
makes of a command is none of the reader's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from megatron_estimator.inputs.bash.values import Field, Origin, Var, is_known, text_of


@dataclass(frozen=True)
class ExecutedCommand:
    """One simple command as bash would execute it, every word expanded and located."""

    fields: tuple[Field, ...]        # argv after expansion and word splitting; each character keeps its file:line
    origin: Origin                   # where the command is written
    assignments: Mapping[str, tuple]  # VAR=x written before the command: name -> (segments, origin)
    variables: Mapping[str, Var]     # the shell's variables when it runs (exported ones are its environment)
    conditions: tuple[str, ...]      # the conditions that cannot be decided statically it runs under, outermost first
    resolved: bool = True            # False: the program's own name cannot be known statically
    last_line: Origin | None = None  # the last simple command read: this one, or one inside its $(...)
    stdin: tuple | None = None       # a here-document's text (segments, each character located), expanded as bash does
    cwd: str | None = None           # the working directory it runs in (after the script's cd), None: not known

    @property
    def argv(self) -> tuple[str, ...]:
        """The words' text (an unknown part keeps its source spelling, such as ``$NNODES``)."""
        return tuple(f.text for f in self.fields)

    def exported(self) -> tuple[tuple[str, str], ...]:
        """(name, value) the script itself gives the command: its exports (set in the script and
        fully known), then the ``VAR=x`` written before it."""
        environment = []
        for name, var in self.variables.items():
            if var.exported and var.origin is not None and isinstance(var.value, tuple) and is_known(var.value):
                environment.append((name, text_of(var.value)))
        for name, (segs, _origin) in self.assignments.items():
            if is_known(segs):
                environment.append((name, text_of(segs)))
        return tuple(environment)


    def removed(self, inherited: Iterable[str]) -> tuple[str, ...]:
        """The ``inherited`` environment variables the command does not get: the script ``unset``
        them (or ``export -n``) before it runs."""
        gone = []
        for name in inherited:
            var = self.variables.get(name)
            if var is None or not var.exported:
                gone.append(name)
        return tuple(gone)


class CommandVisitor:
    """The caller's side of the reader: told of every command and note, in execution order."""

    def command(self, command: ExecutedCommand) -> None:
        """A program the script would execute."""

    def note(self, origin: Origin, message: str) -> None:
        """Something the reader could not follow that is not a problem by itself (``eval`` of an unknown string)."""
