"""A static reader of bash: ``ShellReader`` runs a script as bash would, without running any
program, and tells the caller of each program the script would execute.

It keeps variables (``VAR=value``, ``export``, ``declare``, ``local``, arrays built over many
lines and grown with ``+=``), expands words (``$VAR``, ``${VAR}``, ``${VAR:-default}``,
``${VAR:=default}``, ``${VAR#prefix}``..., ``"${ARGS[@]}"``, ``${ARGS[*]}``, ``$(( ... ))``),
follows ``if``/``case``/``&&``/``||`` whose conditions it can evaluate, ``for`` loops over known
words, functions, ``source``d files and ``eval`` strings, and splits words as bash does
(unquoted expansions are split on whitespace, quoted ones are not, quotes inside values stay
literal).  Every character keeps the ``file:line`` it was written at.

What cannot be known without running the script -- a ``$(command)`` whose output depends on the
machine, an unset variable with no default, a script argument not given, an array built in a
``while`` loop, a value decided by a condition such as ``[ -f file ]`` -- is never guessed: the
text that depends on it carries a ``Cause`` naming the ``file:line`` and the variable.  A few
commands with no side effects are evaluated inside ``$(...)``: ``dirname``, ``basename``,
``echo``, ``printf %s``, ``pwd`` and ``cd`` (``$(cd "$(dirname "$0")" && pwd)``).

The interface (see DEVELOPERS.md): the caller makes a ``ShellReader`` with a ``CommandVisitor``
and a ``ProblemCollector``, calls ``run_script`` (or ``run_string`` for a ``sh -c`` string), and
gets each program the script would execute as an ``ExecutedCommand``, in order.  This package
knows nothing of what the commands are for.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.core.resources import read_input_text
from megatron_estimator.inputs.bash.commands import CommandVisitor
from megatron_estimator.inputs.bash.interpreter import Interpreter
from megatron_estimator.inputs.bash.parser import parse, source_origins
from megatron_estimator.inputs.bash.state import FunctionReturn, LoopJump, ScriptExit, ShellState
from megatron_estimator.inputs.bash.syntax import ShellSyntaxError, Simple
from megatron_estimator.inputs.bash.values import UNSUPPORTED, Cause, Field, Origin, Var, is_known, lit_seg, text_of


def start_directory(inherited_pwd: str | None, cwd: str) -> str:
    """The directory a shell started in ``cwd`` takes for ``$PWD``: the inherited ``PWD`` only
    when it is absolute and names that very directory (same device and inode: a path through a
    symbolic link is kept as written), else ``cwd`` itself.  bash does this at start-up
    (variables.c ``set_pwd``, bash 4.x-5.2), so a stale ``PWD`` (a caller that changed directory
    without updating it, ``env PWD=/elsewhere``) is not trusted over the real directory."""
    if inherited_pwd and inherited_pwd.startswith("/"):
        try:
            if os.path.samefile(inherited_pwd, cwd):
                return inherited_pwd
        except OSError:
            pass
    return cwd


class ShellReader:
    """One read of a script: the file, what it sources, and the problems found on the way.

    ``display``: the script's name in messages (and ``$0``); ``cwd``: the directory it starts in.
    ``visitor``: told of each program the script would execute (``CommandVisitor``).
    ``problems``: where the reader adds the problems it finds (a ``${VAR:?}`` that fails, a
    syntax error, a construct it cannot follow), in the order found, shared with the caller.
    """

    def __init__(self, display: str, cwd: str, visitor: CommandVisitor, problems: ProblemCollector):
        self.display = display
        self.cwd = cwd
        self.visitor = visitor
        self.problems = problems
        self.missing_sources: list[str] = []
        # the files sourced and followed (paths), and those that stopped the read (syntax errors), in words
        self.sourced_files: list[str] = []
        self.broken_sources: list[str] = []
        self.source_depth = 0
        # sourced files parsed: (path, spelling, text) -> tree; a file sourced again (by itself, in a loop)
        # is parsed once, and the parsing is bounded in all (ShellBudget.source)
        self.parsed_sources: dict[tuple[str, str, str], object] = {}
        self.exit_note: str | None = None      # 'the script exits at f:3 (because ...)', when it does
        self.assumed_guards: list[str] = []    # guards on unset variables assumed to pass, file:line first
        # the caller's answer for a command that reads the machine (the node's GPU count):
        # (command text, 'file:line `spelling`') -> (output or None, why not known) or None: not such a command
        self.machine_output = None

    def inherited(self, environ: Mapping[str, str], at: Origin) -> dict[str, Var]:
        """The variables a shell starts with: the environment, exported, set outside the script."""
        return {name: Var((lit_seg(value, at),), True, False, None) for name, value in environ.items()}

    def run_script(self, text: str, environ: Mapping[str, str], positional: Sequence[str] | None = None,
                   *, unknown_args_advice: str = "") -> bool:
        """Run the script ``text`` in ``environ``; False when it stopped where it could not be followed.

        ``positional``: the arguments it runs with (``$1``...); None: not known, so ``$1`` is
        unset (as bash has it without arguments) and ``"$@"`` is unknown, its problem ending
        with ``unknown_args_advice``.
        """
        at_args = Origin(self.display, 0)
        state = ShellState(self.inherited(environ, Origin(self.display, 0)),
                           [Field((lit_seg(a, at_args),)) for a in positional or ()], {}, self.cwd)
        interp = Interpreter(self, state, self.visitor)
        if positional is None:
            interp.unknown_script_args = state.positional
            interp.unknown_args_advice = unknown_args_advice
        try:
            tree = parse(text, source_origins(text, self.display))
            interp.run_list(tree)
        except ScriptExit:
            pass
        except ShellSyntaxError as exc:
            self.problems.add(exc.code, str(exc.origin), exc.message)
            return False
        except (RecursionError, FunctionReturn, LoopJump, ArithmeticError, ValueError, LookupError, TypeError) as exc:
            # a construct this reader follows badly: say where, never a traceback
            where = str(interp.current_line) if interp.current_line else self.display
            self.problems.add(UNSUPPORTED, where,
                              f"this tool cannot follow the script from here ({type(exc).__name__}: {exc})")
            return False
        return True

    def run_string(self, text: str, origins: list[Origin], environ: Mapping[str, str], positional: Sequence[str],
                   visitor: CommandVisitor) -> tuple[Problem, ...]:
        """Run a ``sh -c`` string (one origin per character) in ``environ``, telling ``visitor`` of
        each program it runs; ``positional``: ``$0 $1 ...``.  Returns the problems that stopped it."""
        problems: list[Problem] = []
        at = origins[0] if origins else Origin(self.display, 0)
        try:
            tree = parse(text, origins)
        except ShellSyntaxError as exc:
            return (Problem("shell-syntax-error", str(exc.origin), f"the sh -c string cannot be read: {exc.message}"),)
        pos_fields = [Field((lit_seg(p, at),)) for p in positional[1:]]
        state = ShellState(self.inherited(environ, at), pos_fields, {}, self.cwd)
        inner = Interpreter(self, state, visitor, nested=True)
        try:
            inner.run_list(tree)
        except ScriptExit:
            pass
        except ShellSyntaxError as exc:
            problems.append(Problem("shell-syntax-error", str(exc.origin), exc.message))
        return tuple(problems)

    def require_failure(self, cause: Cause) -> None:
        """``${VAR:?message}`` with VAR unset: bash would stop the script there."""
        self.problems.add(cause.code, f"{cause.origin} {cause.subject}", cause.message)

    def source(self, interp: Interpreter, target: Field, args: list[Field], node: Simple):
        if target.causes:
            self.missing_sources.append(f"`{target.text}` (sourced at {node.origin})")
            return None
        name = target.text
        candidates = []
        cwd = interp.state.cwd or self.cwd
        if "/" in name:
            candidates.append(name if os.path.isabs(name) else os.path.join(cwd, name))
        else:
            path_var = interp.state.vars.get("PATH")
            if path_var is not None and isinstance(path_var.value, tuple) and is_known(path_var.value):
                for directory in text_of(path_var.value).split(":"):
                    if directory:
                        candidates.append(os.path.join(directory, name))
            candidates.append(os.path.join(cwd, name))
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            self.missing_sources.append(f"`{name}` (sourced at {node.origin}, not found from {cwd})")
            return 1
        if self.source_depth >= 16:
            raise ShellSyntaxError(node.origin, "sourced files nest too deeply to follow", UNSUPPORTED)
        try:
            text = read_input_text(path, "script", errors="replace")
        except OSError as exc:
            self.missing_sources.append(f"`{name}` (sourced at {node.origin}: {exc.strerror})")
            return 1
        self.sourced_files.append(path)
        tree = self.parsed_sources.get((path, name, text))
        if tree is None:
            over = interp.state.budget.source(len(text))
            if over:
                raise ShellSyntaxError(node.origin, over, UNSUPPORTED)
            try:
                tree = parse(text, source_origins(text, name))
            except ShellSyntaxError as exc:     # bash: `.` fails with status 2; this reader stops here
                self.broken_sources.append(f"`{name}` (sourced at {node.origin}; {exc.origin}: {exc.message})")
                raise
            self.parsed_sources[(path, name, text)] = tree
        saved = interp.state.positional
        if args:
            interp.state.positional = list(args)
        self.source_depth += 1
        try:
            return interp.run_list(tree)
        except FunctionReturn as ret:
            return ret.status
        finally:
            self.source_depth -= 1
            if args:
                interp.state.positional = saved
