"""The simple commands a ``sh -c STRING`` would run, read by the static shell reader."""

from __future__ import annotations

import os
from typing import Callable, Mapping, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.bash.commands import CommandVisitor, ExecutedCommand
from megatron_estimator.inputs.bash.reader import ShellReader, start_directory
from megatron_estimator.inputs.bash.values import Field, Origin
from megatron_estimator.inputs.launch.command import SplitCommand


class CommandCollector(CommandVisitor):
    """Keeps every command a string runs as a ``SplitCommand``; ``token`` makes each word's
    location (its text is the word's), ``on_note`` takes the reader's notes."""

    def __init__(self, token: Callable[[Field], object], on_note: Callable[[Origin, str], None] | None = None):
        self.token = token
        self.on_note = on_note
        self.commands: list[SplitCommand] = []

    def command(self, command: ExecutedCommand) -> None:
        tokens = [self.token(f) for f in command.fields]
        self.commands.append(SplitCommand(tuple(command.argv), tuple(tokens), command.exported()))

    def note(self, origin: Origin, message: str) -> None:
        if self.on_note is not None:
            self.on_note(origin, message)


def split_command_string(
    string: str,
    environ: Mapping[str, str],
    positional: Sequence[str] = (),
    location: str | None = None,
) -> tuple[tuple[SplitCommand, ...], tuple[Problem, ...]]:
    """The simple commands a ``sh -c STRING`` would run, expanded as bash would expand them.

    ``positional``: the words after the string (``$0``, ``$1``, ...).  Used by
    ``walk.parse_launch_command`` for ``bash -c`` / ``sh -c`` wrappers.
    """
    display = location or "sh -c"
    collector = CommandCollector(lambda f: None)
    environ = dict(environ)
    # the sh -c process starts in this process's directory (run execs the launch from it)
    environ["PWD"] = start_directory(environ.get("PWD"), os.getcwd())
    reader = ShellReader(display, environ["PWD"], collector, ProblemCollector())
    origin = Origin(display, 1)
    problems = reader.run_string(string, [origin] * len(string), environ, positional, collector)
    plain = tuple(SplitCommand(c.tokens, None, c.environment) for c in collector.commands)
    return plain, problems
