"""Read a bash launch script (or an sbatch file) and resolve its training launch line statically.

``load_launch_script(path)`` runs the script the way bash would, without running any program:
it keeps variables (``VAR=value``, ``export``, ``declare``, ``local``, arrays built over many
lines and grown with ``+=``), expands words (``$VAR``, ``${VAR}``, ``${VAR:-default}``,
``${VAR:=default}``, ``${VAR#prefix}``..., ``"${ARGS[@]}"``, ``${ARGS[*]}``, ``$(( ... ))``),
follows ``if``/``case``/``&&``/``||`` whose conditions it can evaluate, ``for`` loops over known
words, functions, ``source``d files, ``eval`` and ``sh -c`` strings, and splits words as bash
does (unquoted expansions are split on whitespace, quoted ones are not, quotes inside values stay
literal).  Every character keeps the ``file:line`` it was written at, so each Megatron token can
be reported where it was written (``train.sh:14 --num-layers``).

The executed command that starts the training script is the launch; it is taken apart by
``megatron_estimator.inputs.launch.parse_launch_command`` in the environment the script would give it
(the caller's environment, the script's exports, and -- where the caller's environment has none
-- the ``SLURM_*`` variables that the file's ``#SBATCH`` headers would make Slurm set).

What cannot be known without running the script -- a ``$(command)`` whose output depends on the
machine, an unset variable with no default, a script argument not given, an array built in a
``while`` loop, a value decided by a condition such as ``[ -f file ]`` -- is never guessed: a
token that depends on it is marked unresolved and a problem names the ``file:line`` and the
variable.  A few commands with no side effects are evaluated inside ``$(...)``: ``dirname``,
``basename``, ``echo``, ``printf %s``, ``pwd`` and ``cd`` (``$(cd "$(dirname "$0")" && pwd)``).
Pathname expansion is not done: a word with ``*`` stays as written, as bash leaves it when no
file matches.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.launch import LaunchCommand, SplitCommand, is_launch_program, parse_launch_command

UNRESOLVED = "unresolved-variable"
UNSUPPORTED = "unsupported-shell-construct"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_LOOP_ITERATIONS = 10_000
_MAX_DEPTH = 64

# --------------------------------------------------------------------------------------
# Results.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptToken:
    """One token of the launch command, with where it was written."""

    text: str
    location: str                  # file:line of its first character (for a value: where the value was typed)
    word_location: str             # file:line of the shell word that produced it
    unresolved: str | None = None  # why it could not be resolved (a problem says so too); text is then the source spelling
    via: str | None = None         # the inherited variables it came through: 'SLURM_NNODES=4 from #SBATCH -N 4 (job:2)'

    def __str__(self) -> str:
        return self.location


@dataclass(frozen=True)
class ScriptEnvVar:
    """An environment variable the script gives the launch."""

    name: str
    value: str | None              # None when it cannot be resolved
    location: str                  # file:line where it was set
    unresolved: str | None = None


@dataclass(frozen=True)
class SbatchHeaders:
    """What the ``#SBATCH`` lines at the top of the file ask Slurm for."""

    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    gpus: int | None = None
    # option -> (value, file:line, as written), e.g. ('nodes', ('2', 'job.sbatch:3', '--nodes=2'))
    given: tuple[tuple[str, tuple[str, str, str]], ...] = ()

    @property
    def present(self) -> bool:
        return bool(self.given)

    def slurm_environment(self) -> dict[str, tuple[str, str]]:
        # Slurm's output environment variables (sbatch(1), OUTPUT ENVIRONMENT VARIABLES)
        """The SLURM_* variables a job with these headers starts with: name -> (value, phrase)."""
        given = dict(self.given)

        def spelled(*names: str) -> str:
            parts = [f"{given[n][2]} ({given[n][1]})" for n in names if n in given]
            return "from #SBATCH " + " ".join(parts)

        env: dict[str, tuple[str, str]] = {}
        if not self.present:
            return env
        nodes = self.nodes
        why = spelled("nodes")
        if "nodes" in given:
            pass                              # given (None when it was not a count: a problem says so)
        elif self.ntasks is not None and self.ntasks_per_node is not None:
            nodes = -(-self.ntasks // self.ntasks_per_node)
            why = spelled("ntasks", "ntasks-per-node")
        elif self.ntasks is None:
            nodes = 1                         # sbatch allocates one node unless asked for more
            why = "from the #SBATCH default of 1 node"
        if nodes is not None:
            env["SLURM_NNODES"] = (str(nodes), why)
            env["SLURM_JOB_NUM_NODES"] = (str(nodes), why)
        ntasks = self.ntasks
        if ntasks is None and self.ntasks_per_node is not None and nodes is not None:
            ntasks = nodes * self.ntasks_per_node
        if ntasks is not None:
            why = spelled("ntasks") if "ntasks" in given else spelled("nodes", "ntasks-per-node")
            env["SLURM_NTASKS"] = (str(ntasks), why)
            env["SLURM_NPROCS"] = (str(ntasks), why)
        if self.ntasks_per_node is not None:
            env["SLURM_NTASKS_PER_NODE"] = (str(self.ntasks_per_node), spelled("ntasks-per-node"))
            if nodes is not None:
                env["SLURM_TASKS_PER_NODE"] = (f"{self.ntasks_per_node}(x{nodes})",
                                               spelled("nodes", "ntasks-per-node"))
        if self.gpus_per_node is not None:
            key = "gpus-per-node" if "gpus-per-node" in given else "gres"
            env["SLURM_GPUS_PER_NODE"] = (str(self.gpus_per_node), spelled(key))
            env["SLURM_GPUS_ON_NODE"] = (str(self.gpus_per_node), spelled(key))
        return env


@dataclass(frozen=True)
class ScriptLaunch:
    """The training launch a script runs, resolved statically."""

    path: str
    location: str                              # file:line where the launch command starts
    command: LaunchCommand                     # the launch command as bash would run it
    megatron_tokens: tuple[ScriptToken, ...]   # the tokens after the training script
    world_size: int | None
    world_size_source: str
    environment: tuple[ScriptEnvVar, ...]      # what the script exports / sets for the launch
    sbatch: SbatchHeaders = SbatchHeaders()
    launch_tokens: tuple[ScriptToken, ...] = ()  # every token of the command, the launcher's too

    @property
    def megatron_argv(self) -> tuple[str, ...]:
        return tuple(t.text for t in self.megatron_tokens)

    @property
    def megatron_locations(self) -> tuple[str, ...]:
        return tuple(t.location for t in self.megatron_tokens)

    @property
    def environment_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.environment if v.value is not None}

    @property
    def script(self) -> str | None:
        return self.command.script


# --------------------------------------------------------------------------------------
# Located text and values.
# --------------------------------------------------------------------------------------


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
    via: str | None = None           # the inherited variable (environment, #SBATCH) it came from


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


def _known(segs: Iterable[Seg]) -> bool:
    return all(s.cause is None for s in segs)


def _text(segs: Iterable[Seg]) -> str:
    return "".join(s.text for s in segs)


def _fallback_text(segs: Iterable[Seg]) -> str | None:
    out = []
    for s in segs:
        if s.cause is None:
            out.append(s.text)
        elif s.cause.fallback is not None:
            out.append(s.cause.fallback)
        else:
            return None
    return "".join(out)


def _causes(segs: Iterable[Seg]) -> list[Cause]:
    return [s.cause for s in segs if s.cause is not None]


def _at_use(segs: tuple, origin: Origin, via: str | None = None) -> tuple:
    """Text that came from outside the script (the environment, the arguments), placed at its use."""
    return tuple(Seg(s.text, (origin,) * len(s.origins), s.cause, via or s.via) for s in segs)


def _lit(text: str, origin: Origin) -> Seg:
    return Seg(text, (origin,) * len(text))


def _unknown(cause: Cause, spelling: str, at: Origin) -> Seg:
    return Seg(spelling, (at,), cause)


def _value_key(value: object) -> object:
    """What decides whether two values are the same (origins do not)."""
    if isinstance(value, Cause):
        return ("cause", value.origin, value.subject)
    if isinstance(value, ArrayValue):
        return ("array", tuple((i, _text(f.segs), f.uncertain, tuple(c.subject for c in f.causes)) for i, f in value.elems))
    return ("scalar", _text(value), tuple(c.subject for c in _causes(value)))


# --------------------------------------------------------------------------------------
# Syntax tree.
# --------------------------------------------------------------------------------------


class ShellSyntaxError(Exception):
    def __init__(self, origin: Origin, message: str, code: str = "shell-syntax-error"):
        super().__init__(message)
        self.origin = origin
        self.message = message
        self.code = code


@dataclass
class Lit:
    text: str
    origins: tuple[Origin, ...]
    quoted: bool


@dataclass
class Param:
    name: str                       # NAME, a digit string, @, *, #, ?, $, !, 0
    origin: Origin
    spelling: str
    quoted: bool
    index: "Word | str | None" = None    # ${A[i]}: a word; '@' or '*'; None
    op: str | None = None           # ':-', '-', ':=', '=', ':+', '+', ':?', '?', '#', '##', '%', '%%',
                                    # '/', '//', '/#', '/%', '^', '^^', ',', ',,', 'len', 'substr', 'indirect'
    arg: "Word | None" = None
    arg2: "Word | None" = None      # ${x/pat/rep}: rep; ${x:off:len}: len


@dataclass
class Arith:
    expr: "Word"
    origin: Origin
    spelling: str
    quoted: bool


@dataclass
class CmdSub:
    source: tuple[str, tuple[Origin, ...]]
    origin: Origin
    spelling: str
    quoted: bool


@dataclass
class Word:
    parts: list
    origin: Origin
    raw: str

    def literal(self) -> str | None:
        """The word's text when it is one unquoted literal (reserved words, names)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Lit) and not self.parts[0].quoted:
            return self.parts[0].text
        if not self.parts:
            return None
        if all(isinstance(p, Lit) for p in self.parts):
            if any(p.quoted for p in self.parts):
                return None
            return "".join(p.text for p in self.parts)
        return None

    def plain(self) -> str | None:
        """The word's text when it has no expansions (quotes allowed)."""
        if all(isinstance(p, Lit) for p in self.parts):
            return "".join(p.text for p in self.parts)
        return None


@dataclass
class Assign:
    name: str
    origin: Origin
    append: bool = False
    index: Word | None = None
    value: Word | None = None
    array: list | None = None        # list of Word or (index Word, value Word)
    raw: str = ""


@dataclass
class Redirect:
    op: str
    target: Word | None
    origin: Origin


@dataclass
class Simple:
    assigns: list
    words: list
    redirects: list
    origin: Origin


@dataclass
class Pipeline:
    commands: list
    negate: bool
    origin: Origin
    raw: str = ""


@dataclass
class AndOr:
    first: Pipeline
    rest: list                       # [(op, Pipeline)]


@dataclass
class ListNode:
    items: list                      # [(AndOr, background: bool)]
    raw: str = ""


@dataclass
class If:
    clauses: list                    # [(cond ListNode, body ListNode, origin)]
    else_body: ListNode | None
    origin: Origin


@dataclass
class For:
    var: str
    words: list | None               # None: "$@"
    body: ListNode
    origin: Origin


@dataclass
class ArithFor:
    init: Word
    cond: Word
    step: Word
    body: ListNode
    origin: Origin


@dataclass
class While:
    cond: ListNode
    body: ListNode
    until: bool
    origin: Origin


@dataclass
class Case:
    word: Word
    items: list                      # [(patterns [Word], body ListNode, terminator)]
    origin: Origin


@dataclass
class Group:
    body: ListNode
    subshell: bool
    origin: Origin
    redirects: list = field(default_factory=list)


@dataclass
class FuncDef:
    name: str
    body: object
    origin: Origin


@dataclass
class CondCmd:
    tokens: list                     # Word or operator str
    origin: Origin


@dataclass
class ArithCmd:
    expr: Word
    origin: Origin


_EMPTY_PARENS = re.compile(r"\([ \t]*\)")
_METACHARS = frozenset(" \t\n;&|()<>")


class _Parser:
    """A recursive-descent parser for the bash a launch script is written in."""

    def __init__(self, text: str, origins: Sequence[Origin]):
        self.s = text
        self.o = list(origins)
        self.n = len(text)
        self.i = 0
        self.heredocs: list[tuple[str, bool]] = []
        if self.n and not self.o:
            raise ValueError("origins needed")
        self._end = origins[-1] if origins else Origin("<empty>", 1)

    # ---- character helpers ------------------------------------------------------------

    def origin(self, i: int | None = None) -> Origin:
        i = self.i if i is None else i
        if i < self.n:
            return self.o[i]
        return self._end

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < self.n else ""

    def startswith(self, text: str) -> bool:
        return self.s.startswith(text, self.i)

    def error(self, message: str, i: int | None = None) -> ShellSyntaxError:
        return ShellSyntaxError(self.origin(i), message)

    def skip_blanks(self) -> None:
        """Spaces, tabs, line continuations and comments (not newlines)."""
        while self.i < self.n:
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c == "#":
                while self.i < self.n and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def newline(self) -> bool:
        """Consume one newline (and the here-documents that start after it)."""
        if self.peek() != "\n":
            return False
        self.i += 1
        while self.heredocs:
            delimiter, strip = self.heredocs.pop(0)
            while self.i < self.n:
                end = self.s.find("\n", self.i)
                end = self.n if end < 0 else end
                line = self.s[self.i:end]
                self.i = min(end + 1, self.n)
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
            else:
                pass
        return True

    def skip_linebreaks(self) -> None:
        while True:
            self.skip_blanks()
            if not self.newline():
                return

    def op(self) -> str | None:
        """The control or redirection operator at the current position, if any."""
        self.skip_blanks()
        for candidate in (";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&",
                          ">|", "<>", ";", "&", "|", "(", ")", "<", ">", "\n"):
            if self.startswith(candidate):
                return candidate
        return None

    # ---- scripts and lists ------------------------------------------------------------

    def parse_script(self) -> ListNode:
        body = self.parse_list(set())
        self.skip_linebreaks()
        if self.i < self.n:
            raise self.error(f"unexpected {self.s[self.i:self.i + 10].split()[0] if self.s[self.i:].split() else self.s[self.i]!r}")
        return body

    def at_end_word(self, ends: set) -> bool:
        """Is the next word one of the reserved words ``ends`` (in command position)?"""
        self.skip_blanks()
        if not ends:
            return False
        for word in ends:
            if self.startswith(word):
                after = self.s[self.i + len(word):self.i + len(word) + 1]
                if word in (")", ";;", ";&", ";;&"):
                    return True
                if after == "" or after in _METACHARS:
                    return True
        return False

    def parse_list(self, ends: set) -> ListNode:
        self.skip_linebreaks()
        begin = self.i
        node = self._parse_list(ends)
        node.raw = self.s[begin:self.i].strip()
        return node

    def _parse_list(self, ends: set) -> ListNode:
        items = []
        while True:
            self.skip_linebreaks()
            if self.i >= self.n or self.at_end_word(ends):
                break
            if self.op() in (")", ";;", ";&", ";;&") and ")" not in ends and ";;" not in ends:
                raise self.error(f"unexpected {self.op()!r}")
            if self.op() in (")", ";;", ";&", ";;&"):
                break
            and_or = self.parse_and_or(ends)
            sep = self.op()
            background = False
            if sep == "&":
                self.i += 1
                background = True
            elif sep == ";":
                self.i += 1
            elif sep == "\n":
                pass
            items.append((and_or, background))
            if sep not in ("&", ";", "\n"):
                # the list ends here (a reserved word, ')' or ';;' follows, or the input ends)
                self.skip_blanks()
                if self.i < self.n and not (self.at_end_word(ends) or self.op() in (")", ";;", ";&", ";;&")):
                    raise self.error(f"unexpected {self.s[self.i:].split()[0]!r}")
                if self.i >= self.n or self.at_end_word(ends) or self.op() in (")", ";;", ";&", ";;&"):
                    break
        return ListNode(items)

    def parse_and_or(self, ends: set) -> AndOr:
        first = self.parse_pipeline(ends)
        rest = []
        while True:
            op = self.op()
            if op not in ("&&", "||"):
                break
            self.i += 2
            self.skip_linebreaks()
            rest.append((op, self.parse_pipeline(ends)))
        return AndOr(first, rest)

    def parse_pipeline(self, ends: set) -> Pipeline:
        self.skip_blanks()
        origin = self.origin()
        negate = False
        while True:
            self.skip_blanks()
            if self.startswith("!") and self.peek(1) in (" ", "\t"):
                negate = not negate
                self.i += 1
                continue
            if self.startswith("time") and (self.peek(4) in (" ", "\t")):
                # the `time` keyword times the pipeline; -p is its only option
                self.i += 4
                self.skip_blanks()
                if self.startswith("-p") and self.peek(2) in (" ", "\t"):
                    self.i += 2
                continue
            break
        begin = self.i
        commands = [self.parse_command(ends)]
        while self.op() in ("|", "|&"):
            self.i += 2 if self.startswith("|&") else 1
            self.skip_linebreaks()
            commands.append(self.parse_command(ends))
        return Pipeline(commands, negate, origin, self.s[begin:self.i].strip())

    # ---- commands ------------------------------------------------------------------

    def parse_command(self, ends: set):
        self.skip_blanks()
        origin = self.origin()
        start = self.i
        if self.op() == "(":
            if self.startswith("(("):
                return self.parse_arith_command()
            self.i += 1
            body = self.parse_list({")"})
            self.skip_linebreaks()
            if self.peek() != ")":
                raise self.error("a ( subshell is not closed with )", start)
            self.i += 1
            return Group(body, True, origin, self.parse_redirects())
        word = self.peek_word()
        if word == "{":
            self.i += 1
            body = self.parse_list({"}"})
            self.expect_word("}", start, "a { group is not closed with }")
            return Group(body, False, origin, self.parse_redirects())
        if word == "if":
            return self.parse_if()
        if word in ("while", "until"):
            return self.parse_while(word)
        if word == "for":
            return self.parse_for()
        if word == "case":
            return self.parse_case()
        if word == "function":
            return self.parse_function_keyword()
        if word == "[[":
            return self.parse_cond()
        if word in ("then", "elif", "else", "fi", "do", "done", "esac", "}"):
            raise self.error(f"unexpected {word!r}")
        # name() compound
        match = _NAME.match(self.s, self.i)
        if match:
            j = match.end()
            k = j
            while k < self.n and self.s[k] in " \t":
                k += 1
            empty_parens = _EMPTY_PARENS.match(self.s, k)
            if empty_parens:
                name = match.group(0)
                self.i = empty_parens.end()
                self.skip_linebreaks()
                body = self.parse_command(ends)
                return FuncDef(name, body, origin)
        return self.parse_simple()

    def peek_word(self) -> str | None:
        """The next word if it is a plain unquoted literal (for reserved words)."""
        self.skip_blanks()
        j = self.i
        while j < self.n and self.s[j] not in _METACHARS and self.s[j] not in "'\"\\$`":
            j += 1
        if j < self.n and self.s[j] not in _METACHARS:
            return None
        return self.s[self.i:j] or None

    def expect_word(self, word: str, start: int, message: str) -> None:
        self.skip_linebreaks()
        if self.peek_word() != word:
            raise self.error(message, start)
        self.i += len(word)

    def parse_if(self) -> If:
        start = self.i
        origin = self.origin()
        self.i += 2
        clauses = []
        else_body = None
        while True:
            cond = self.parse_list({"then"})
            self.expect_word("then", start, "`if` without `then`")
            body = self.parse_list({"elif", "else", "fi"})
            clauses.append((cond, body, origin))
            self.skip_linebreaks()
            word = self.peek_word()
            if word == "elif":
                origin = self.origin()
                self.i += 4
                continue
            if word == "else":
                self.i += 4
                else_body = self.parse_list({"fi"})
                self.expect_word("fi", start, "`if` without `fi`")
                break
            if word == "fi":
                self.i += 2
                break
            raise self.error("`if` without `fi`", start)
        return If(clauses, else_body, clauses[0][2])

    def parse_while(self, keyword: str) -> While:
        start = self.i
        origin = self.origin()
        self.i += len(keyword)
        cond = self.parse_list({"do"})
        self.expect_word("do", start, f"`{keyword}` without `do`")
        body = self.parse_list({"done"})
        self.expect_word("done", start, f"`{keyword}` without `done`")
        self.parse_redirects()
        return While(cond, body, keyword == "until", origin)

    def parse_for(self):
        start = self.i
        origin = self.origin()
        self.i += 3
        self.skip_blanks()
        if self.startswith("(("):
            self.i += 2
            end = self.s.find("))", self.i)
            if end < 0:
                raise self.error("`for ((` without `))`", start)
            inner = self.s[self.i:end]
            pieces = inner.split(";")
            if len(pieces) != 3:
                raise self.error("`for ((init; cond; step))` needs two semicolons", start)
            words = []
            offset = self.i
            for piece in pieces:
                words.append(self.word_from_range(offset, offset + len(piece)))
                offset += len(piece) + 1
            self.i = end + 2
            self.skip_blanks()
            if self.peek() == ";":
                self.i += 1
            self.skip_linebreaks()
            body = self.parse_do_body(start)
            return ArithFor(words[0], words[1], words[2], body, origin)
        match = _NAME.match(self.s, self.i)
        if not match:
            raise self.error("`for` needs a variable name", start)
        var = match.group(0)
        self.i = match.end()
        self.skip_linebreaks()
        words = None
        if self.peek_word() == "in":
            self.i += 2
            words = []
            while True:
                self.skip_blanks()
                op = self.op()
                if op in (";", "\n"):
                    self.i += 1
                    break
                if self.i >= self.n:
                    break
                words.append(self.parse_word())
        else:
            self.skip_blanks()
            if self.peek() == ";":
                self.i += 1
        self.skip_linebreaks()
        body = self.parse_do_body(start)
        return For(var, words, body, origin)

    def parse_do_body(self, start: int) -> ListNode:
        self.skip_linebreaks()
        word = self.peek_word()
        if word == "do":
            self.i += 2
            body = self.parse_list({"done"})
            self.expect_word("done", start, "`for` without `done`")
        elif word == "{":
            self.i += 1
            body = self.parse_list({"}"})
            self.expect_word("}", start, "`for` body not closed with }")
        else:
            raise self.error("`for` without `do`", start)
        self.parse_redirects()
        return body

    def parse_case(self) -> Case:
        start = self.i
        origin = self.origin()
        self.i += 4
        self.skip_blanks()
        word = self.parse_word()
        self.skip_linebreaks()
        if self.peek_word() != "in":
            raise self.error("`case` without `in`", start)
        self.i += 2
        items = []
        while True:
            self.skip_linebreaks()
            if self.peek_word() == "esac":
                self.i += 4
                break
            if self.i >= self.n:
                raise self.error("`case` without `esac`", start)
            self.skip_blanks()
            if self.peek() == "(":
                self.i += 1
            patterns = []
            while True:
                self.skip_blanks()
                patterns.append(self.parse_word(pattern=True))
                self.skip_blanks()
                if self.peek() == "|":
                    self.i += 1
                    continue
                if self.peek() == ")":
                    self.i += 1
                    break
                raise self.error("a `case` pattern must end with )")
            body = self.parse_list({"esac", ";;", ";&", ";;&"})
            self.skip_linebreaks()
            terminator = ";;"
            for candidate in (";;&", ";;", ";&"):
                if self.startswith(candidate):
                    terminator = candidate
                    self.i += len(candidate)
                    break
            items.append((patterns, body, terminator))
        return Case(word, items, origin)

    def parse_function_keyword(self) -> FuncDef:
        origin = self.origin()
        self.i += len("function")
        self.skip_blanks()
        match = _NAME.match(self.s, self.i) or re.compile(r"[^\s()]+").match(self.s, self.i)
        if not match:
            raise self.error("`function` needs a name")
        name = match.group(0)
        self.i = match.end()
        self.skip_blanks()
        if self.startswith("()"):
            self.i += 2
        self.skip_linebreaks()
        body = self.parse_command(set())
        return FuncDef(name, body, origin)

    def parse_cond(self) -> CondCmd:
        start = self.i
        origin = self.origin()
        self.i += 2
        tokens: list = []
        regex_next = False
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.newline()
                continue
            if self.i >= self.n:
                raise self.error("`[[` without `]]`", start)
            if self.peek_word() == "]]":
                self.i += 2
                break
            matched = None
            for candidate in ("&&", "||", "(", ")", "!", "<", ">"):
                if self.startswith(candidate) and not (candidate == "!" and self.peek(1) not in " \t"):
                    if candidate in ("<", ">") and tokens and tokens[-1] in ("(",):
                        pass
                    matched = candidate
                    break
            if matched and not regex_next:
                tokens.append(matched)
                self.i += len(matched)
                continue
            word = self.parse_word(regex=regex_next)
            regex_next = word.literal() == "=~"
            tokens.append(word)
        return CondCmd(tokens, origin)

    def parse_arith_command(self) -> ArithCmd:
        start = self.i
        origin = self.origin()
        self.i += 2
        depth = 0
        j = self.i
        while j < self.n:
            if self.s.startswith("))", j) and depth == 0:
                break
            if self.s[j] == "(":
                depth += 1
            elif self.s[j] == ")":
                depth -= 1
            j += 1
        else:
            raise self.error("`((` without `))`", start)
        word = self.word_from_range(self.i, j)
        self.i = j + 2
        return ArithCmd(word, origin)

    def word_from_range(self, begin: int, end: int) -> Word:
        """The text between ``begin`` and ``end`` read as the inside of double quotes."""
        sub = _Parser(self.s[begin:end] + "\x00", list(self.o[begin:end]) + [self.origin(end)])
        parts = sub.read_parts(stop="\x00", in_dquote=True)
        return Word(parts, self.origin(begin), self.s[begin:end])

    def parse_redirects(self) -> list:
        redirects = []
        while True:
            self.skip_blanks()
            save = self.i
            redirect = self.try_redirect()
            if redirect is None:
                self.i = save
                return redirects
            redirects.append(redirect)

    def try_redirect(self) -> Redirect | None:
        origin = self.origin()
        j = self.i
        while j < self.n and self.s[j].isdigit():
            j += 1
        if j < self.n and self.s[j] == "{":
            pass
        rest = self.s[j:j + 3]
        op = None
        for candidate in ("&>>", "&>", ">>", "<<<", "<<-", "<<", ">&", "<&", ">|", "<>", "<", ">"):
            if rest.startswith(candidate):
                op = candidate
                break
        if op is None or (j > self.i and op.startswith("&")):
            return None
        if op in ("<", ">") and self.s.startswith("(", j + 1):
            return None                      # <(...) / >(...): process substitution, a word
        self.i = j + len(op)
        self.skip_blanks()
        if op in ("<<", "<<-"):
            word = self.parse_word()
            delimiter = word.plain() if word.plain() is not None else word.raw
            delimiter = delimiter.replace("'", "").replace('"', "")
            self.heredocs.append((delimiter, op == "<<-"))
            return Redirect(op, None, origin)
        process_substitution = self.s.startswith("<(", self.i) or self.s.startswith(">(", self.i)
        if self.i >= self.n or (self.s[self.i] in "\n;&|()<>" and not process_substitution):
            raise self.error(f"redirection {op} without a target")
        return Redirect(op, self.parse_word(), origin)

    def parse_simple(self) -> Simple:
        origin = self.origin()
        assigns: list = []
        words: list = []
        redirects: list = []
        while True:
            self.skip_blanks()
            if self.i >= self.n:
                break
            c = self.s[self.i]
            if c in "\n;&|)" or (c == "(" and not words):
                if c == "(" and not words and not assigns:
                    raise self.error("unexpected (")
                break
            if c == "(":
                raise self.error("unexpected ( in a command")
            redirect = self.try_redirect()
            if redirect is not None:
                redirects.append(redirect)
                continue
            if c in "<>":
                raise self.error(f"bad redirection {c}")
            is_decl = bool(words) and words[0].literal() in ("declare", "typeset", "local", "export", "readonly")
            if not words or is_decl:
                assign = self.try_assignment()
                if assign is not None:
                    (words if is_decl else assigns).append(assign)
                    continue
            words.append(self.parse_word())
        if not words and not assigns and not redirects:
            raise self.error("expected a command")
        return Simple(assigns, words, redirects, origin)

    def try_assignment(self) -> Assign | None:
        match = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[)?").match(self.s, self.i)
        if not match:
            return None
        origin = self.origin()
        start = self.i
        name = match.group(1)
        j = match.end()
        index = None
        if match.group(2):
            depth = 1
            k = j
            while k < self.n and depth:
                if self.s[k] == "[":
                    depth += 1
                elif self.s[k] == "]":
                    depth -= 1
                k += 1
            if depth:
                return None
            index = self.word_from_range(j, k - 1)
            j = k
        append = False
        if self.s.startswith("+=", j):
            append = True
            j += 2
        elif self.s.startswith("=", j):
            j += 1
        else:
            return None
        self.i = j
        if self.peek() == "(" and index is None:
            self.i += 1
            elems = []
            while True:
                self.skip_blanks()
                if self.peek() == "\n":
                    self.newline()
                    continue
                if self.i >= self.n:
                    raise self.error(f"the array {name}=( is not closed with )", start)
                if self.peek() == ")":
                    self.i += 1
                    break
                sub = re.compile(r"\[([^\]]*)\]=").match(self.s, self.i)
                if sub:
                    key = self.word_from_range(self.i + 1, sub.end() - 2)
                    self.i = sub.end()
                    value = self.parse_word() if self.i < self.n and self.s[self.i] not in " \t\n)" else Word([], self.origin(), "")
                    elems.append((key, value))
                    continue
                elems.append(self.parse_word())
            return Assign(name, origin, append, None, None, elems, self.s[start:self.i])
        if self.i >= self.n or self.s[self.i] in " \t\n;&|)":
            value = Word([], origin, "")
        else:
            value = self.parse_word(assignment=True)
        return Assign(name, origin, append, index, value, None, self.s[start:self.i])

    # ---- words ---------------------------------------------------------------------

    def parse_word(self, pattern: bool = False, assignment: bool = False, regex: bool = False) -> Word:
        self.skip_blanks()
        start = self.i
        origin = self.origin()
        parts = self.read_parts(stop=None, in_dquote=False, pattern=pattern, regex=regex)
        if self.i == start:
            raise self.error(f"expected a word, found {self.peek()!r}")
        return Word(parts, origin, self.s[start:self.i])

    def read_parts(self, stop: str | None, in_dquote: bool, pattern: bool = False, regex: bool = False) -> list:
        """Read word parts up to an unquoted metacharacter (or ``stop``, for ${...} args)."""
        parts: list = []
        buf: list[str] = []
        buf_o: list[Origin] = []
        buf_quoted = in_dquote

        def flush() -> None:
            nonlocal buf, buf_o
            if buf:
                parts.append(Lit("".join(buf), tuple(buf_o), buf_quoted))
                buf, buf_o = [], []

        def add(ch: str, at: int, quoted: bool) -> None:
            nonlocal buf_quoted
            if buf and buf_quoted != quoted:
                flush()
            buf_quoted = quoted
            buf.append(ch)
            buf_o.append(self.o[at])

        depth = 0
        while self.i < self.n:
            c = self.s[self.i]
            if stop is not None and c == stop and (stop != "\x00") and depth == 0:
                break
            if stop == "\x00" and c == "\x00":
                break
            if stop is None and not in_dquote and c in "<>" and self.peek(1) == "(":
                flush()
                start = self.i
                end = self.matching(self.i + 2, "(", ")")
                source = (self.s[self.i + 2:end], tuple(self.o[self.i + 2:end]))
                self.i = end + 1
                parts.append(CmdSub(source, self.o[start], self.s[start:self.i], False))
                continue
            if stop is None and not in_dquote:
                if c in _METACHARS:
                    if regex and c in "()|":
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    if pattern and c == "(" and buf and buf[-1] in "@!?*+":
                        depth += 1        # extglob @(a|b)
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    if pattern and depth and c in "|)":
                        if c == ")":
                            depth -= 1
                        add(c, self.i, False)
                        self.i += 1
                        continue
                    break
            if stop == "}" and c == "{" and not in_dquote:
                pass
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    continue
                if in_dquote and stop != "}":
                    if nxt in "$`\"\\":
                        add(nxt, self.i + 1, True)
                        self.i += 2
                    else:
                        add("\\", self.i, True)
                        self.i += 1
                    continue
                if nxt == "":
                    add("\\", self.i, True)
                    self.i += 1
                    continue
                add(nxt, self.i + 1, True)
                self.i += 2
                continue
            if c == "'" and not in_dquote:
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a single quote is not closed")
                flush()
                parts.append(Lit(self.s[self.i + 1:end], tuple(self.o[self.i + 1:end]), True))
                self.i = end + 1
                continue
            if c == '"' and not in_dquote:
                flush()
                open_at = self.i
                self.i += 1
                inner = self.read_parts(stop='"', in_dquote=True)
                if self.peek() != '"':
                    raise self.error("a double quote is not closed", open_at)
                self.i += 1
                if not inner:
                    inner = [Lit("", (), True)]
                parts.extend(inner)
                continue
            if c == '"' and in_dquote and stop == '"':
                break
            if c == "$":
                nxt = self.peek(1)
                if nxt == "'" and not in_dquote:
                    flush()
                    parts.append(self.read_ansi_c())
                    continue
                if nxt == '"' and not in_dquote:
                    self.i += 1
                    continue
                part = self.read_dollar(in_dquote)
                if part is not None:
                    flush()
                    parts.append(part)
                    continue
                add("$", self.i, in_dquote)
                self.i += 1
                continue
            if c == "`":
                flush()
                parts.append(self.read_backtick(in_dquote))
                continue
            if stop == "}" and c == "}" and depth == 0:
                break
            if c == "~" and not in_dquote and not buf and not parts:
                add(c, self.i, False)
                self.i += 1
                continue
            add(c, self.i, in_dquote)
            self.i += 1
        flush()
        return parts

    def read_ansi_c(self) -> Lit:
        start = self.i
        self.i += 2
        out: list[str] = []
        outo: list[Origin] = []
        escapes = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
                   "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
        while self.i < self.n and self.s[self.i] != "'":
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < self.n:
                nxt = self.s[self.i + 1]
                if nxt in escapes:
                    out.append(escapes[nxt])
                    outo.append(self.o[self.i])
                    self.i += 2
                    continue
                m = re.compile(r"x([0-9A-Fa-f]{1,2})|([0-7]{1,3})").match(self.s, self.i + 1)
                if m:
                    out.append(chr(int(m.group(1), 16) if m.group(1) else int(m.group(2), 8)))
                    outo.append(self.o[self.i])
                    self.i = m.end()
                    continue
            out.append(c)
            outo.append(self.o[self.i])
            self.i += 1
        if self.i >= self.n:
            raise self.error("a $'...' string is not closed", start)
        self.i += 1
        return Lit("".join(out), tuple(outo), True)

    def read_backtick(self, in_dquote: bool) -> CmdSub:
        start = self.i
        self.i += 1
        chars: list[str] = []
        origins: list[Origin] = []
        while self.i < self.n and self.s[self.i] != "`":
            if self.s[self.i] == "\\" and self.peek(1) in "$`\\":
                self.i += 1
            chars.append(self.s[self.i])
            origins.append(self.o[self.i])
            self.i += 1
        if self.i >= self.n:
            raise self.error("a ` command substitution is not closed", start)
        self.i += 1
        return CmdSub(("".join(chars), tuple(origins)), self.o[start], self.s[start:self.i], in_dquote)

    def matching(self, start: int, open_: str, close: str) -> int:
        """Index of the ``close`` that balances the ``open_`` just before ``start``."""
        depth = 1
        j = start
        while j < self.n:
            c = self.s[j]
            if c == "\\":
                j += 2
                continue
            if c == "'" and open_ == "(":
                end = self.s.find("'", j + 1)
                j = (end if end >= 0 else self.n) + 1
                continue
            if c == '"':
                k = j + 1
                while k < self.n and self.s[k] != '"':
                    k += 2 if self.s[k] == "\\" else 1
                j = k + 1
                continue
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return j
            j += 1
        raise self.error(f"{open_} is not closed with {close}", start - 1)

    def read_dollar(self, in_dquote: bool):
        start = self.i
        origin = self.o[start]
        nxt = self.peek(1)
        if self.startswith("$(("):
            end = self.find_arith_end(self.i + 3)
            if end is not None:
                expr = self.word_from_range(self.i + 3, end)
                self.i = end + 2
                return Arith(expr, origin, self.s[start:self.i], in_dquote)
        if nxt == "(":
            end = self.matching(self.i + 2, "(", ")")
            source = (self.s[self.i + 2:end], tuple(self.o[self.i + 2:end]))
            self.i = end + 1
            return CmdSub(source, origin, self.s[start:self.i], in_dquote)
        if nxt == "[":
            end = self.matching(self.i + 2, "[", "]")
            expr = self.word_from_range(self.i + 2, end)
            self.i = end + 1
            return Arith(expr, origin, self.s[start:self.i], in_dquote)
        if nxt == "{":
            return self.read_brace_param(in_dquote)
        match = _NAME.match(self.s, self.i + 1)
        if match:
            self.i = match.end()
            return Param(match.group(0), origin, self.s[start:self.i], in_dquote)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.i += 2
            return Param(nxt, origin, self.s[start:self.i], in_dquote)
        return None

    def find_arith_end(self, j: int) -> int | None:
        depth = 0
        while j < self.n:
            if self.s[j] == "(":
                depth += 1
            elif self.s[j] == ")":
                if depth == 0:
                    return j if self.s.startswith("))", j) else None
                depth -= 1
            j += 1
        return None

    def read_brace_param(self, in_dquote: bool) -> Param:
        start = self.i
        origin = self.o[start]
        self.i += 2
        length = False
        indirect = False
        if self.peek() == "#" and self.peek(1) not in ("}", ""):
            length = True
            self.i += 1
        elif self.peek() == "!" and self.peek(1) not in ("}", ""):
            indirect = True
            self.i += 1
        match = _NAME.match(self.s, self.i) or re.compile(r"\d+|[@*#?$!-]").match(self.s, self.i)
        if not match:
            raise self.error("bad ${...} substitution", start)
        name = match.group(0)
        self.i = match.end()
        index: Word | str | None = None
        if self.peek() == "[":
            end = self.matching(self.i + 1, "[", "]")
            inner = self.s[self.i + 1:end]
            index = inner if inner in ("@", "*") else self.word_from_range(self.i + 1, end)
            self.i = end + 1
        param = Param(name, origin, "", in_dquote, index)
        if length:
            param.op = "len"
        elif indirect:
            param.op = "indirect"
        rest = self.s[self.i:self.i + 3]
        if self.peek() == "}":
            self.i += 1
        elif length or indirect:
            if indirect and self.peek() in "@*" and self.peek(1) == "}":
                self.i += 2
                param.op = "names"
            else:
                raise self.error("bad ${#...} or ${!...} substitution", start)
        else:
            op = None
            for candidate in (":-", ":=", ":+", ":?", "##", "%%", "//", "/#", "/%", "^^", ",,", "-", "=", "+", "?",
                              "#", "%", "/", "^", ",", "@", ":"):
                if rest.startswith(candidate):
                    op = candidate
                    break
            if op is None:
                raise self.error("bad ${...} substitution", start)
            self.i += len(op)
            if op == ":":
                param.op = "substr"
                param.arg = self.read_until_in_brace(":}")
                if self.peek() == ":":
                    self.i += 1
                    param.arg2 = self.read_until_in_brace("}")
            elif op in ("/", "//", "/#", "/%"):
                param.op = op
                param.arg = self.read_until_in_brace("/}")
                if self.peek() == "/":
                    self.i += 1
                    param.arg2 = self.read_until_in_brace("}")
            elif op == "@":
                param.op = "@" + self.peek()
                self.i += 1
            else:
                param.op = op
                param.arg = self.read_until_in_brace("}", in_dquote=in_dquote)
            if self.peek() != "}":
                raise self.error("a ${ substitution is not closed with }", start)
            self.i += 1
        param.spelling = self.s[start:self.i]
        return param

    def read_until_in_brace(self, stops: str, in_dquote: bool = False) -> Word:
        """A word inside ${...} up to one of ``stops`` (quotes and expansions allowed)."""
        origin = self.origin()
        start = self.i
        parts: list = []
        while self.i < self.n and self.s[self.i] not in stops:
            if self.s[self.i] in "'\"$`\\":
                if self.s[self.i] == "'" and in_dquote:
                    parts.append(Lit("'", (self.o[self.i],), True))
                    self.i += 1
                    continue
                sub_start = self.i
                sub_parts = self._one_unit(in_dquote)
                parts.extend(sub_parts)
                if self.i == sub_start:
                    self.i += 1
                continue
            if self.s[self.i] == "{":
                end = self.matching(self.i + 1, "{", "}")
                parts.append(Lit(self.s[self.i:end + 1], tuple(self.o[self.i:end + 1]), in_dquote))
                self.i = end + 1
                continue
            parts.append(Lit(self.s[self.i], (self.o[self.i],), in_dquote))
            self.i += 1
        return Word(parts, origin, self.s[start:self.i])

    def _one_unit(self, in_dquote: bool) -> list:
        """One quoted string, escape or expansion inside ${...}."""
        c = self.s[self.i]
        if c == "\\":
            nxt = self.peek(1)
            if nxt == "\n":
                self.i += 2
                return []
            self.i += 2
            return [Lit(nxt, (self.o[self.i - 1],), True)]
        if c == "'":
            end = self.s.find("'", self.i + 1)
            if end < 0:
                raise self.error("a single quote is not closed")
            lit = Lit(self.s[self.i + 1:end], tuple(self.o[self.i + 1:end]), True)
            self.i = end + 1
            return [lit]
        if c == '"':
            open_at = self.i
            self.i += 1
            inner = self.read_parts(stop='"', in_dquote=True)
            if self.peek() != '"':
                raise self.error("a double quote is not closed", open_at)
            self.i += 1
            return inner or [Lit("", (), True)]
        if c == "`":
            return [self.read_backtick(in_dquote)]
        if c == "$":
            part = self.read_dollar(in_dquote)
            if part is not None:
                return [part]
            self.i += 1
            return [Lit("$", (self.o[self.i - 1],), in_dquote)]
        self.i += 1
        return [Lit(c, (self.o[self.i - 1],), in_dquote)]


def _parse(text: str, origins: Sequence[Origin]) -> ListNode:
    return _Parser(text, origins).parse_script()


def _source_origins(text: str, file: str, first_line: int = 1) -> list[Origin]:
    origins: list[Origin] = []
    line = first_line
    current = Origin(file, line)
    for ch in text:
        origins.append(current)
        if ch == "\n":
            line += 1
            current = Origin(file, line)
    return origins


# --------------------------------------------------------------------------------------
# Arithmetic: $(( )), (( )), let, declare -i, array indices.
# --------------------------------------------------------------------------------------


class _ArithUnknown(Exception):
    def __init__(self, cause: Cause):
        self.cause = cause


class _ArithError(Exception):
    pass


_ARITH_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9A-Fa-f]+|\d+#[0-9A-Za-z@_]+|\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*=|<<=|>>=|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|\+=|-=|\*=|/=|%=|&=|\^=|\|=|[-+*/%<>=!~&^|?:(),\[\]]))"
)

_BINARY = {
    ",": 1, "=": 2, "+=": 2, "-=": 2, "*=": 2, "/=": 2, "%=": 2, "<<=": 2, ">>=": 2, "&=": 2, "^=": 2, "|=": 2,
    "**=": 2, "?": 3, "||": 4, "&&": 5, "|": 6, "^": 7, "&": 8, "==": 9, "!=": 9, "<": 10, "<=": 10, ">": 10,
    ">=": 10, "<<": 11, ">>": 11, "+": 12, "-": 12, "*": 13, "/": 13, "%": 13, "**": 14,
}
_RIGHT_ASSOC = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|=", "**=", "?", "**"}


class _Arith:
    """Evaluates a bash arithmetic expression over integers; names are variables."""

    def __init__(self, interp: "_Interp", text: str, origin: Origin, depth: int = 0):
        self.interp = interp
        self.origin = origin
        self.depth = depth
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _ARITH_TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise _ArithError(f"cannot read {text[pos:]!r} in arithmetic")
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.k = 0

    def run(self) -> int:
        if not self.tokens:
            return 0
        value = self.expr(0)
        if self.k != len(self.tokens):
            raise _ArithError(f"unexpected {self.tokens[self.k][1]!r} in arithmetic")
        return self.get(value)

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.k] if self.k < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise _ArithError("arithmetic expression ends too early")
        self.k += 1
        return token

    # values are ints or ('name', NAME) lvalues
    def get(self, value) -> int:
        if isinstance(value, tuple):
            return self.interp.arith_variable(value[1], self.origin, self.depth)
        return value

    def expr(self, min_prec: int):
        left = self.unary()
        while True:
            token = self.peek()
            if token is None or token[0] != "op" or token[1] not in _BINARY:
                return left
            op = token[1]
            prec = _BINARY[op]
            if prec < min_prec:
                return left
            self.k += 1
            if op == "?":
                then = self.expr(0)
                if self.take()[1] != ":":
                    raise _ArithError("`?` without `:` in arithmetic")
                other = self.expr(prec)
                left = self.get(then) if self.get(left) else self.get(other)
                continue
            right = self.expr(prec if op in _RIGHT_ASSOC else prec + 1)
            if prec == 2:
                if not isinstance(left, tuple):
                    raise _ArithError(f"{op} needs a variable on its left")
                value = self.get(right) if op == "=" else self.apply(op[:-1], self.get(left), self.get(right))
                self.interp.arith_assign(left[1], value, self.origin)
                left = value
                continue
            if op == ",":
                self.get(left)
                left = right
                continue
            left = self.apply(op, self.get(left), self.get(right))

    def apply(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%") and b == 0:
            raise _ArithError("division by zero in arithmetic")
        if op == "/":
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if op == "%":
            return a - b * self.apply("/", a, b)
        if op == "**":
            if b < 0:
                raise _ArithError("negative exponent in arithmetic")
            return a ** b
        ops = {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "<<": lambda: a << b, ">>": lambda: a >> b,
            "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b), ">=": lambda: int(a >= b),
            "==": lambda: int(a == b), "!=": lambda: int(a != b), "&": lambda: a & b, "^": lambda: a ^ b,
            "|": lambda: a | b, "&&": lambda: int(bool(a) and bool(b)), "||": lambda: int(bool(a) or bool(b)),
        }
        return ops[op]()

    def unary(self):
        kind, text = self.take()
        if kind == "num":
            return self.number(text)
        if kind == "name":
            token = self.peek()
            if token and token[1] == "[":
                self.k += 1
                index = self.get(self.expr(0))
                if self.take()[1] != "]":
                    raise _ArithError("`[` without `]` in arithmetic")
                return self.interp.arith_element(text, index, self.origin)
            if token and token[1] in ("++", "--"):
                self.k += 1
                old = self.get(("name", text))
                self.interp.arith_assign(text, old + (1 if token[1] == "++" else -1), self.origin)
                return old
            return ("name", text)
        if text == "(":
            value = self.get(self.expr(0))
            if self.take()[1] != ")":
                raise _ArithError("`(` without `)` in arithmetic")
            return value
        if text in ("++", "--"):
            kind2, name = self.take()
            if kind2 != "name":
                raise _ArithError(f"{text} needs a variable")
            value = self.get(("name", name)) + (1 if text == "++" else -1)
            self.interp.arith_assign(name, value, self.origin)
            return value
        if text == "-":
            return -self.get(self.unary())
        if text == "+":
            return self.get(self.unary())
        if text == "!":
            return int(not self.get(self.unary()))
        if text == "~":
            return ~self.get(self.unary())
        raise _ArithError(f"unexpected {text!r} in arithmetic")

    @staticmethod
    def number(text: str) -> int:
        if "#" in text:
            base, digits = text.split("#", 1)
            return int(digits, int(base))
        if text.lower().startswith("0x"):
            return int(text, 16)
        if len(text) > 1 and text.startswith("0"):
            return int(text, 8)
        return int(text)


# --------------------------------------------------------------------------------------
# The interpreter.
# --------------------------------------------------------------------------------------


class _Exit(Exception):
    def __init__(self, status):
        self.status = status


class _Return(Exception):
    def __init__(self, status):
        self.status = status


class _LoopJump(Exception):
    def __init__(self, kind: str, levels: int):
        self.kind = kind
        self.levels = levels


class _Impure(Exception):
    """A command inside $(...) whose output cannot be known without running it."""

    def __init__(self, command: str):
        self.command = command


@dataclass
class _State:
    vars: dict
    positional: object             # list[Field] or Cause
    functions: dict
    cwd: str | None
    allexport: bool = False
    status: int | None = 0

    def fork(self) -> "_State":
        return _State(dict(self.vars), list(self.positional) if isinstance(self.positional, list) else self.positional,
                      dict(self.functions), self.cwd, self.allexport, self.status)


@dataclass
class _Candidate:
    command: LaunchCommand
    problems: tuple
    tokens: tuple                  # ScriptToken per command.tokens entry
    origin: Origin
    conditions: tuple
    exports: dict                  # name -> Var, exported at the launch
    temp_env: dict                 # name -> (segs, origin): VAR=x on the launch line


@dataclass
class _Note:
    origin: Origin
    message: str


def _glob_to_regex(chunks: list[tuple[str, bool]]) -> str:
    """A bash pattern (text, quoted) chunks -> a regular expression (whole match)."""
    out: list[str] = []
    for text, quoted in chunks:
        if quoted:
            out.append(re.escape(text))
            continue
        i = 0
        while i < len(text):
            c = text[i]
            if c == "*":
                out.append(".*")
            elif c == "?":
                out.append(".")
            elif c == "[":
                end = text.find("]", i + 2 if text[i + 1:i + 2] in ("!", "^") else i + 1)
                if end < 0:
                    out.append(re.escape(c))
                else:
                    body = text[i + 1:end]
                    if body[:1] in ("!", "^"):
                        body = "^" + body[1:]
                    out.append("[" + body.replace("\\", "\\\\") + "]")
                    i = end
            elif c == "\\" and i + 1 < len(text):
                i += 1
                out.append(re.escape(text[i]))
            else:
                out.append(re.escape(c))
            i += 1
    return "".join(out)


class _Interp:
    def __init__(self, loader: "_Loader", state: _State, collect: list | None = None):
        self.loader = loader
        self.state = state
        self.conditions: list[str] = []
        self.depth = 0
        self.sandbox = 0           # > 0 inside $(...)
        self.capture: list[str] = []
        self.collect = collect     # sh -c mode: the simple commands run, as SplitCommands
        self.current_line: Origin | None = None
        self.func_depth = 0
        self.local_frames: list[dict] = []
        self.decided: list[str] = []     # the known conditions whose branch is running
        # The script's own arguments when the caller did not say them: "$@" of the script
        # (not of a function) cannot be known then.
        self.unknown_script_args: list | None = None
        self.loop_depth = 0

    # ---- values --------------------------------------------------------------------

    def lookup(self, name: str) -> Var | None:
        return self.state.vars.get(name)

    def set_var(self, name: str, value, origin: Origin | None, *, export: bool | None = None,
                integer: bool | None = None) -> None:
        old = self.state.vars.get(name)
        exported = old.exported if old else False
        if export is not None:
            exported = export or exported
        if self.state.allexport:
            exported = True
        self.state.vars[name] = Var(value, exported, old.integer if (old and integer is None) else bool(integer),
                                    origin)

    def unset_cause(self, name: str, at: Origin) -> Cause:
        if name.isdigit():
            return Cause(UNRESOLVED, at, f"${name}",
                         f"${name} is the script's argument {name}, which was not given "
                         "(bash would expand it to nothing)", "")
        message = f"{name} is not set in the script or the environment (bash would expand it to nothing)"
        if self.loader.missing_sources:
            message += "; it may come from " + ", ".join(self.loader.missing_sources) + ", which could not be read"
        return Cause(UNRESOLVED, at, name, message, "")

    def param_value(self, param: Param):
        """The raw value of a parameter: a Var-like value, or None when unset."""
        name = param.name
        if name.isdigit():
            n = int(name)
            if n == 0:
                return (_lit(self.loader.display, param.origin),)
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            return _at_use(pos[n - 1].segs, param.origin) if n <= len(pos) else None
        if name in ("@", "*"):
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            if pos is self.unknown_script_args:
                return Cause(UNRESOLVED, param.origin, f"${name}",
                             f"${name} passes on the arguments the script is run with, which are not known "
                             "here (bash would pass none when it runs without arguments); give them with "
                             "--script-arg", "")
            return ArrayValue(tuple(enumerate(pos)))
        if name == "#":
            pos = self.state.positional
            if isinstance(pos, Cause):
                return pos
            return (_lit(str(len(pos)), param.origin),)
        if name == "?":
            if self.state.status is None:
                return Cause(UNSUPPORTED, param.origin, "$?", "$? is the exit status of a command that was not run")
            return (_lit(str(self.state.status), param.origin),)
        if name in ("$", "!"):
            return Cause(UNSUPPORTED, param.origin, f"${name}", f"${name} is a process id, known only when the script runs")
        if name == "-":
            return (_lit("hB", param.origin),)
        if name == "RANDOM" or name == "SRANDOM":
            return Cause(UNSUPPORTED, param.origin, name, f"{name} is a random number")
        if name == "LINENO":
            return (_lit(str(param.origin.line), param.origin),)
        if name == "BASH_SOURCE" and name not in self.state.vars:
            return ArrayValue(((0, Field((_lit(self.loader.display, param.origin),))),))
        if name == "PWD" and name not in self.state.vars and self.state.cwd:
            return (_lit(self.state.cwd, param.origin),)
        var = self.state.vars.get(name)
        if var is None:
            return None
        if var.origin is None and isinstance(var.value, tuple):
            return _at_use(var.value, param.origin, name)      # inherited: it was written where it is used
        return var.value

    # ---- expansion -----------------------------------------------------------------

    def expand_fields(self, words: Sequence[Word], brace_check: bool = True) -> list[Field]:
        fields: list[Field] = []
        for word in words:
            fields.extend(self.word_fields(word, brace_check))
        return fields

    def word_fields(self, word: Word, brace_check: bool = True) -> list[Field]:
        chunks = self.word_chunks(word, tilde=True)
        fields = self.split(chunks, word.origin)
        if brace_check:
            literal = "".join(p.text for p in word.parts if isinstance(p, Lit) and not p.quoted)
            if re.search(r"\{[^{}\s]*(,|\.\.)[^{}\s]*\}", literal):
                cause = Cause(UNSUPPORTED, word.origin, word.raw,
                              f"`{word.raw}` uses brace expansion, which this tool does not do")
                return [Field((_unknown(cause, word.raw, word.origin),), True, word.origin)]
        return fields

    def expand_scalar(self, word: Word, tilde: bool = False) -> tuple:
        """A word expanded without splitting ("$@" joined with spaces), as in assignments."""
        segs: list[Seg] = []
        for chunk in self.word_chunks(word, tilde=tilde, join_arrays=True):
            if chunk[0] == "seg":
                segs.append(chunk[1])
            else:
                segs.append(_lit(" ", word.origin))
        return tuple(s for s in segs if s.text or s.cause)

    def pattern_chunks(self, word: Word) -> tuple[list[tuple[str, bool]], list[Cause]]:
        out: list[tuple[str, bool]] = []
        causes: list[Cause] = []
        for chunk in self.word_chunks(word, tilde=False, join_arrays=True):
            if chunk[0] != "seg":
                out.append((" ", True))
                continue
            seg = chunk[1]
            if seg.cause is not None:
                if seg.cause.fallback is not None:
                    out.append((seg.cause.fallback, True))
                else:
                    causes.append(seg.cause)
                continue
            out.append((seg.text, chunk[3]))
        return out, causes

    def word_chunks(self, word: Word, tilde: bool = False, join_arrays: bool = False) -> list:
        """Chunks: ('seg', Seg, splittable, quoted, literal) and ('break',)."""
        chunks: list = []
        for n, part in enumerate(word.parts):
            if isinstance(part, Lit):
                text = part.text
                if tilde and n == 0 and not part.quoted and text.startswith("~") and (len(text) == 1 or text[1] == "/"):
                    home = self.param_value(Param("HOME", part.origins[0] if part.origins else word.origin, "$HOME", False))
                    if isinstance(home, tuple) and _known(home):
                        chunks.append(("seg", Seg(_text(home), (part.origins[0],) * len(_text(home))), False, True, False))
                        text = text[1:]
                        origins = part.origins[1:]
                        if text:
                            chunks.append(("seg", Seg(text, tuple(origins)), False, part.quoted, True))
                        continue
                origins = part.origins if len(part.origins) == len(text) else (word.origin,) * len(text)
                chunks.append(("seg", Seg(text, tuple(origins)), False, part.quoted, True))
            elif isinstance(part, Param):
                chunks.extend(self.param_chunks(part, join_arrays))
            elif isinstance(part, Arith):
                seg = self.arith_seg(part)
                chunks.append(("seg", seg, not part.quoted, part.quoted, False))
            elif isinstance(part, CmdSub):
                seg = self.cmdsub_seg(part)
                chunks.append(("seg", seg, not part.quoted, part.quoted, False))
        return chunks

    def split(self, chunks: list, origin: Origin) -> list[Field]:
        ifs = self.ifs()
        fields: list[Field] = []
        current: list[Seg] = []
        started = False
        uncertain = False

        def emit() -> None:
            nonlocal current, started, uncertain
            if started or current:
                fields.append(Field(tuple(current), uncertain, origin))
            current, started, uncertain = [], False, False

        for chunk in chunks:
            if chunk[0] == "break":
                emit()
                continue
            _, seg, splittable, quoted, _literal = chunk
            if not splittable:
                current.append(seg)
                if quoted or seg.text or seg.cause:
                    started = True
                continue
            if seg.cause is not None:
                current.append(seg)
                started = True
                uncertain = True
                continue
            # split on IFS
            text = seg.text
            start = 0
            i = 0
            while i < len(text):
                if text[i] in ifs:
                    if i > start:
                        current.append(Seg(text[start:i], seg.origins[start:i], None, seg.via))
                        started = True
                    if text[i] not in " \t\n":
                        started = True
                    if started or current:
                        emit()
                    j = i + 1
                    while j < len(text) and text[j] in ifs and text[j] in " \t\n":
                        j += 1
                    i = j
                    start = j
                    continue
                i += 1
            if start < len(text):
                current.append(Seg(text[start:], seg.origins[start:], None, seg.via))
                started = True
        emit()
        return fields

    def ifs(self) -> str:
        var = self.state.vars.get("IFS")
        if var is None or not isinstance(var.value, tuple) or not _known(var.value):
            return " \t\n"
        return _text(var.value)

    def param_chunks(self, param: Param, join_arrays: bool) -> list:
        quoted = param.quoted
        value = self.param_value(param)
        index = param.index
        at = param.origin
        is_array_all = index in ("@", "*") or (param.name in ("@", "*") and index is None)
        star = index == "*" or (param.name == "*" and index is None)

        def unknown_chunk(cause: Cause, spelling: str | None = None) -> list:
            seg = _unknown(cause, spelling or param.spelling, at)
            return [("seg", seg, not quoted, quoted, False)]

        if isinstance(value, Cause):
            return unknown_chunk(value, param.spelling)

        # ${#...}
        if param.op == "len":
            if is_array_all:
                if value is None:
                    return [("seg", _lit("0", at), False, quoted, False)]
                elems = value.values() if isinstance(value, ArrayValue) else [Field(value)]
                if any(e.uncertain or e.causes for e in elems):
                    cause = next((c for e in elems for c in e.causes), None) or Cause(
                        UNSUPPORTED, at, param.name, f"the number of elements of {param.name} cannot be known statically")
                    return unknown_chunk(cause)
                return [("seg", _lit(str(len(elems)), at), False, quoted, False)]
            segs = self.select_scalar(value, param, at)
            if isinstance(segs, Cause):
                return unknown_chunk(segs)
            if segs is None:
                segs = ()
            if not _known(segs):
                return unknown_chunk(_causes(segs)[0])
            return [("seg", _lit(str(len(_text(segs))), at), False, quoted, False)]

        if param.op == "indirect":
            segs = self.select_scalar(value, param, at)
            if segs is None or isinstance(segs, Cause) or not _known(segs):
                cause = segs if isinstance(segs, Cause) else (
                    _causes(segs)[0] if segs else self.unset_cause(param.name, at))
                return unknown_chunk(cause)
            target = _text(segs)
            return self.param_chunks(Param(target, at, param.spelling, quoted), join_arrays)
        if param.op in ("names",) or (param.op or "").startswith("@"):
            return unknown_chunk(Cause(UNSUPPORTED, at, param.spelling,
                                       f"`{param.spelling}` is a substitution this tool does not evaluate"))

        if is_array_all:
            if value is None:
                elems = None
            elif isinstance(value, ArrayValue):
                elems = value.values()
            else:
                elems = [Field(value)]
            return self.array_chunks(param, elems, quoted, star, join_arrays)

        segs = self.select_scalar(value, param, at)
        if isinstance(segs, Cause):
            return unknown_chunk(segs)
        return self.scalar_op_chunks(param, segs, quoted)

    def select_scalar(self, value, param: Param, at: Origin):
        """The scalar a parameter names: ${A}, ${A[2]}; None when unset."""
        if value is None:
            return None
        if isinstance(value, Cause):
            return value
        index = param.index
        if isinstance(value, ArrayValue):
            if index is None:
                key = 0
            else:
                key = self.arith_index(index, at)
                if isinstance(key, Cause):
                    return key
                if key < 0 and value.elems:
                    key = value.elems[-1][0] + 1 + key
            field_ = value.as_dict().get(key)
            return None if field_ is None else field_.segs
        if index is not None:
            key = self.arith_index(index, at)
            if isinstance(key, Cause):
                return key
            return value if key in (0, -1) else None
        return value

    def arith_index(self, index, at: Origin):
        segs = self.expand_scalar(index) if isinstance(index, Word) else (_lit(index, at),)
        if not _known(segs):
            return _causes(segs)[0]
        try:
            return _Arith(self, _text(segs), at).run()
        except _ArithUnknown as exc:
            return exc.cause
        except _ArithError as exc:
            return Cause(UNSUPPORTED, at, _text(segs), f"bad array index: {exc}")

    def is_null(self, segs, colon: bool) -> bool | None:
        """Is a parameter unset (or, with ':', empty)?  None: cannot be known."""
        if segs is None:
            return True
        if not colon:
            return False
        if any(s.cause is None and s.text for s in segs):
            return False
        # what is left is empty text and unknown pieces; unset variables (fallback '') are empty
        if all(s.cause is None or s.cause.fallback == "" for s in segs):
            return True
        return None

    def scalar_op_chunks(self, param: Param, segs, quoted: bool) -> list:
        at = param.origin
        op = param.op

        def out(result_segs) -> list:
            return [("seg", s, not quoted, quoted, False) for s in result_segs] or (
                [("seg", Seg("", ()), False, quoted, False)] if quoted else [])

        def unknown(cause: Cause) -> list:
            return [("seg", _unknown(cause, param.spelling, at), not quoted, quoted, False)]

        if op is None:
            if segs is None:
                return unknown(self.unset_cause(param.name, at))
            return out(segs)
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            null = self.is_null(segs, op.startswith(":"))
            if null is None:
                causes = _causes(segs or ())
                return unknown(causes[0] if causes else self.unset_cause(param.name, at))
            if op in (":-", "-"):
                if null:
                    return self.default_chunks(param.arg, quoted)
                return out(segs)
            if op in (":=", "="):
                if null:
                    value = self.expand_scalar(param.arg, tilde=True) if param.arg else ()
                    if param.name.isdigit() or param.name in "@*#?$!-":
                        return unknown(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` assigns to a special parameter"))
                    self.set_var(param.name, value, at)
                    return out(value)
                return out(segs)
            if op in (":+", "+"):
                if null:
                    return [("seg", Seg("", ()), False, quoted, False)] if quoted else []
                return self.default_chunks(param.arg, quoted)
            # :? / ?
            if null:
                message = _text(self.expand_scalar(param.arg)) if param.arg else "parameter null or not set"
                cause = Cause(UNRESOLVED, at, param.name,
                              f"the script requires {param.name} (`{param.spelling}`: {message}) and it is not set; "
                              "bash would stop the script here")
                self.loader.require_failure(cause)
                return unknown(cause)
            return out(segs)
        if segs is None:
            return unknown(self.unset_cause(param.name, at))
        if not _known(segs):
            return unknown(_causes(segs)[0])
        text = _text(segs)
        origins = [o for s in segs for o in s.origins]
        origin0 = origins[0] if origins else at
        if op in ("#", "##", "%", "%%"):
            pattern, causes = self.pattern_chunks(param.arg) if param.arg else ([], [])
            if causes:
                return unknown(causes[0])
            regex = re.compile(_glob_to_regex(pattern), re.S)
            if op.startswith("#"):
                cuts = range(len(text) + 1) if op == "#" else range(len(text), -1, -1)
                for k in cuts:
                    if regex.fullmatch(text[:k]):
                        return out((Seg(text[k:], tuple(origins[k:])),))
            else:
                cuts = range(len(text), -1, -1) if op == "%" else range(len(text) + 1)
                for k in cuts:
                    if regex.fullmatch(text[k:]):
                        return out((Seg(text[:k], tuple(origins[:k])),))
            return out(segs)
        if op in ("/", "//", "/#", "/%"):
            pattern, causes = self.pattern_chunks(param.arg) if param.arg else ([], [])
            rep = self.expand_scalar(param.arg2) if param.arg2 is not None else ()
            if causes or not _known(rep):
                return unknown((causes or _causes(rep))[0])
            regex = _glob_to_regex(pattern)
            if not regex:
                return out(segs)
            replacement = _text(rep)
            if op == "/#":
                new = re.sub("^(?:" + regex + ")", lambda m: replacement, text, count=1, flags=re.S)
            elif op == "/%":
                m = None
                for k in range(len(text) + 1):
                    if re.fullmatch(regex, text[k:], re.S):
                        m = k
                        break
                new = text if m is None else text[:m] + replacement
            else:
                new = re.sub(regex, lambda m: replacement, text, count=0 if op == "//" else 1, flags=re.S)
            return out((_lit(new, origin0),))
        if op in ("^", "^^", ",", ",,"):
            if op == "^^":
                new = text.upper()
            elif op == ",,":
                new = text.lower()
            elif op == "^":
                new = text[:1].upper() + text[1:]
            else:
                new = text[:1].lower() + text[1:]
            return out((Seg(new, tuple(origins)),))
        if op == "substr":
            offset = self.arith_word(param.arg, at)
            length = self.arith_word(param.arg2, at) if param.arg2 is not None else None
            for value in (offset, length):
                if isinstance(value, Cause):
                    return unknown(value)
            if offset < 0:
                offset = max(0, len(text) + offset)
            end = len(text) if length is None else (offset + length if length >= 0 else len(text) + length)
            return out((Seg(text[offset:end], tuple(origins[offset:end])),))
        return unknown(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` is a substitution this tool does not evaluate"))

    def arith_word(self, word: Word | None, at: Origin):
        if word is None:
            return 0
        segs = self.expand_scalar(word)
        if not _known(segs):
            return _causes(segs)[0]
        try:
            return _Arith(self, _text(segs), at).run()
        except _ArithUnknown as exc:
            return exc.cause
        except _ArithError as exc:
            return Cause(UNSUPPORTED, at, _text(segs), f"bad arithmetic: {exc}")

    def default_chunks(self, word: Word | None, quoted: bool) -> list:
        if word is None:
            return [("seg", Seg("", ()), False, quoted, False)] if quoted else []
        chunks = []
        for chunk in self.word_chunks(word, tilde=not quoted):
            if chunk[0] == "seg":
                _, seg, _splittable, q, literal = chunk
                if quoted:
                    chunks.append(("seg", seg, False, True, literal))
                else:
                    # in an unquoted ${x:-word}, the word's own quoting decides what is split
                    chunks.append(("seg", seg, not q, q, literal))
            else:
                chunks.append(chunk)
        if not chunks and quoted:
            chunks.append(("seg", Seg("", ()), False, True, False))
        return chunks

    def array_chunks(self, param: Param, elems, quoted: bool, star: bool, join_arrays: bool) -> list:
        at = param.origin
        if elems is None:
            if param.op in (":-", "-"):
                return self.default_chunks(param.arg, quoted)
            if param.op in (":+", "+"):
                return []
            if param.name in ("@", "*"):
                return []
            return [("seg", _unknown(self.unset_cause(param.name, at), param.spelling, at), not quoted, quoted, False)]
        if param.op in (":-", "-") and not elems:
            return self.default_chunks(param.arg, quoted)
        if param.op in (":+", "+"):
            return self.default_chunks(param.arg, quoted) if elems else []
        if param.op == "substr":
            offset = self.arith_word(param.arg, at)
            length = self.arith_word(param.arg2, at) if param.arg2 is not None else None
            if isinstance(offset, Cause) or isinstance(length, Cause):
                cause = offset if isinstance(offset, Cause) else length
                return [("seg", _unknown(cause, param.spelling, at), not quoted, quoted, False)]
            if param.name in ("@", "*"):
                program = Field((_lit(self.loader.display, at),))
                elems = [program] + list(elems)
            if offset < 0:
                offset = max(0, len(elems) + offset)
            end = len(elems) if length is None else offset + length
            elems = elems[offset:end]
        elif param.op in ("#", "##", "%", "%%", "/", "//", "/#", "/%", "^", "^^", ",", ",,"):
            mapped = []
            for elem in elems:
                sub = self.scalar_op_chunks(Param(param.name, at, param.spelling, True, None, param.op, param.arg, param.arg2),
                                            elem.segs, True)
                mapped.append(Field(tuple(c[1] for c in sub if c[0] == "seg"), elem.uncertain))
            elems = mapped
        elif param.op is not None and param.op not in (":=", "=", ":?", "?"):
            return [("seg", _unknown(Cause(UNSUPPORTED, at, param.spelling, f"`{param.spelling}` is not supported"),
                                     param.spelling, at), not quoted, quoted, False)]
        chunks: list = []
        if quoted and (star or join_arrays):
            sep = self.ifs()[:1]
            for k, elem in enumerate(elems):
                if k:
                    chunks.append(("seg", _lit(sep, at), False, True, False))
                chunks.extend(self.elem_chunks(elem, True))
            if not chunks:
                chunks.append(("seg", Seg("", ()), False, True, False))
            return chunks
        for k, elem in enumerate(elems):
            if k:
                chunks.append(("break",) if not join_arrays else ("seg", _lit(" ", at), False, quoted, False))
            chunks.extend(self.elem_chunks(elem, quoted))
        return chunks

    def elem_chunks(self, elem: Field, quoted: bool) -> list:
        if not elem.segs:
            return [("seg", Seg("", ()), False, True, False)] if quoted else []
        out = []
        for seg in elem.segs:
            splittable = not quoted
            out.append(("seg", seg, splittable, quoted, False))
        if elem.uncertain and quoted:
            # an element that was itself an unknown number of words: it stays unknown
            out = [("seg", s, True if s.cause else False, quoted, False) for s in elem.segs]
        return out

    def arith_seg(self, part: Arith) -> Seg:
        segs = self.expand_scalar(part.expr)
        if not _known(segs):
            return _unknown(_causes(segs)[0], part.spelling, part.origin)
        try:
            value = _Arith(self, _text(segs), part.origin).run()
        except _ArithUnknown as exc:
            return _unknown(exc.cause, part.spelling, part.origin)
        except _ArithError as exc:
            cause = Cause(UNSUPPORTED, part.origin, part.spelling, f"`{part.spelling}` cannot be evaluated: {exc}")
            return _unknown(cause, part.spelling, part.origin)
        return _lit(str(value), part.origin)

    def arith_variable(self, name: str, origin: Origin, depth: int) -> int:
        var = self.state.vars.get(name)
        if var is None:
            value = self.param_value(Param(name, origin, name, False))
            if value is None:
                cause = self.unset_cause(name, origin)
                cause = replace(cause, message=f"{name} is not set in the script or the environment "
                                               "(bash would read it as 0 in arithmetic)", fallback="0")
                raise _ArithUnknown(cause)
        else:
            value = var.value
        if isinstance(value, Cause):
            raise _ArithUnknown(value)
        if isinstance(value, ArrayValue):
            elem = value.as_dict().get(0)
            value = elem.segs if elem else ()
        if not _known(value):
            raise _ArithUnknown(_causes(value)[0])
        text = _text(value).strip()
        if not text:
            return 0
        if depth > 16:
            raise _ArithError(f"{name} refers to itself in arithmetic")
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return _Arith(self, text, origin, depth + 1).run()

    def arith_element(self, name: str, index: int, origin: Origin) -> int:
        var = self.state.vars.get(name)
        if var is None:
            raise _ArithUnknown(replace(self.unset_cause(name, origin), fallback="0"))
        if isinstance(var.value, Cause):
            raise _ArithUnknown(var.value)
        if isinstance(var.value, ArrayValue):
            elem = var.value.as_dict().get(index)
            segs = elem.segs if elem else ()
        else:
            segs = var.value if index == 0 else ()
        if not _known(segs):
            raise _ArithUnknown(_causes(segs)[0])
        text = _text(segs).strip() or "0"
        return _Arith(self, text, origin, 1).run()

    def arith_assign(self, name: str, value: int, origin: Origin) -> None:
        self.set_var(name, (_lit(str(value), origin),), origin)

    def cmdsub_seg(self, part: CmdSub) -> Seg:
        text, origins = part.source
        spelling = part.spelling if len(part.spelling) <= 60 else part.spelling[:57] + "..."
        if part.spelling[:1] in "<>":
            cause = Cause(UNSUPPORTED, part.origin, spelling,
                          f"`{spelling}` is a process substitution, a file that exists only while the script runs")
            return _unknown(cause, part.spelling, part.origin)
        try:
            output = self.pure_output(text, origins)
        except _Impure as exc:
            cause = Cause(UNSUPPORTED, part.origin, spelling,
                          f"`{spelling}` runs {exc.command}; its output cannot be known without running it")
            return _unknown(cause, part.spelling, part.origin)
        except ShellSyntaxError as exc:
            cause = Cause(UNSUPPORTED, exc.origin, spelling, f"`{spelling}` cannot be read: {exc.message}")
            return _unknown(cause, part.spelling, part.origin)
        output = output.rstrip("\n")
        return _lit(output, part.origin)

    def pure_output(self, text: str, origins: Sequence[Origin]) -> str:
        if not text.strip():
            return ""
        if text.strip().startswith("<"):
            raise _Impure("a read of a file")       # $(< file)
        tree = _parse(text, origins)
        saved_state, saved_capture = self.state, self.capture
        self.state = self.state.fork()
        self.capture = []
        self.sandbox += 1
        try:
            try:
                self.run_list(tree)
            except _Exit:
                pass
            return "".join(self.capture)
        finally:
            self.sandbox -= 1
            self.state = saved_state
            self.capture = saved_capture

    # ---- branching ------------------------------------------------------------------

    def branch(self, paths: list, reason: str, origin: Origin):
        """Run each path (a callable) on its own copy of the state and merge what survives."""
        base = self.state
        alive: list[tuple[_State, int | None]] = []
        for path in paths:
            self.state = base.fork()
            self.conditions.append(reason)
            try:
                status = path()
                alive.append((self.state, status))
            except (_Exit, _Return, _LoopJump):
                pass
            finally:
                self.conditions.pop()
        self.state = base
        if not alive:
            raise _Exit(None)
        self.state = self.merge([s for s, _ in alive], reason, origin)
        statuses = {st for _, st in alive}
        status = statuses.pop() if len(statuses) == 1 else None
        self.state.status = status
        return status

    def merge(self, states: list[_State], reason: str, origin: Origin) -> _State:
        if len(states) == 1:
            return states[0]
        first = states[0]
        merged = first.fork()
        names = set()
        for st in states:
            names.update(st.vars)
        for name in names:
            values = [st.vars.get(name) for st in states]
            keys = {None if v is None else _value_key(v.value) for v in values}
            if len(keys) == 1:
                present = next((v for v in values if v is not None), None)
                if present is None:
                    merged.vars.pop(name, None)
                else:
                    exported = any(v is not None and v.exported for v in values)
                    merged.vars[name] = replace(present, exported=exported)
                continue
            origins = [v.origin for v in values if v is not None and v.origin is not None]
            cause = Cause(UNSUPPORTED, origin, name,
                          f"{name} is set differently depending on {reason}, which cannot be decided statically"
                          + (f" (set at {', '.join(str(o) for o in origins[:3])})" if origins else ""))
            exported = any(v is not None and v.exported for v in values)
            merged.vars[name] = Var(cause, exported, False, origins[0] if origins else origin)
        pos_keys = {(_value_key(ArrayValue(tuple(enumerate(st.positional)))) if isinstance(st.positional, list)
                     else ("cause",)) for st in states}
        if len(pos_keys) > 1:
            merged.positional = Cause(UNSUPPORTED, origin, "$@",
                                      f"the script's arguments depend on {reason}, which cannot be decided statically")
        for st in states[1:]:
            for fname, fdef in st.functions.items():
                merged.functions.setdefault(fname, fdef)
        if len({st.cwd for st in states}) > 1:
            merged.cwd = None
        merged.allexport = any(st.allexport for st in states)
        return merged

    def taint(self, before: _State, after: _State, reason: str, origin: Origin, what: str) -> None:
        """Variables a loop of unknown iterations changed become unknown."""
        for name, var in after.vars.items():
            old = before.vars.get(name)
            if old is not None and _value_key(old.value) == _value_key(var.value):
                continue
            cause = Cause(UNSUPPORTED, origin, name,
                          f"{name} is built in the {what} at {origin}, whose iterations cannot be known statically")
            self.state.vars[name] = Var(cause, var.exported or (old.exported if old else False), False, var.origin)

    # ---- running --------------------------------------------------------------------

    def run_list(self, node: ListNode):
        status = self.state.status
        for and_or, background in node.items:
            if background:
                saved = self.state
                self.state = saved.fork()
                try:
                    self.run_and_or(and_or)
                except (_Exit, _Return):
                    pass
                finally:
                    self.state = saved
                status = 0
                self.state.status = 0
            else:
                status = self.run_and_or(and_or)
        return status

    def run_and_or(self, node: AndOr):
        status = self.run_pipeline(node.first)
        for op, pipeline in node.rest:
            if status is None:
                def run_it(p=pipeline):
                    return self.run_pipeline(p)

                def skip(s=status):
                    return s
                reason = f"whether `{_describe(node.first)}` succeeds at {node.first.origin}"
                status = self.branch([run_it, skip], reason, pipeline.origin)
                continue
            if (op == "&&" and status == 0) or (op == "||" and status != 0):
                status = self.run_pipeline(pipeline)
        self.state.status = status
        return status

    def run_pipeline(self, node: Pipeline):
        if len(node.commands) == 1:
            status = self.run_command(node.commands[0])
        else:
            status = None
            for command in node.commands:
                saved = self.state
                self.state = saved.fork()
                try:
                    status = self.run_command(command)
                except (_Exit, _Return):
                    status = None
                finally:
                    self.state = saved
        if node.negate and status is not None:
            status = 0 if status else 1
        self.state.status = status
        return status

    def run_command(self, node):
        self.depth += 1
        if self.depth > _MAX_DEPTH * 4:
            self.depth -= 1
            raise ShellSyntaxError(getattr(node, "origin", Origin(self.loader.display, 0)),
                                   "the script nests calls too deeply to follow", UNSUPPORTED)
        try:
            if isinstance(node, Simple):
                status = self.run_simple(node)
            elif isinstance(node, If):
                status = self.run_if(node, 0)
            elif isinstance(node, For):
                status = self.run_for(node)
            elif isinstance(node, ArithFor):
                status = self.run_arith_for(node)
            elif isinstance(node, While):
                status = self.run_while(node)
            elif isinstance(node, Case):
                status = self.run_case(node)
            elif isinstance(node, Group):
                if node.subshell:
                    saved = self.state
                    self.state = saved.fork()
                    try:
                        status = self.run_list(node.body)
                    except _Exit as exc:
                        status = exc.status
                    finally:
                        self.state = saved
                else:
                    status = self.run_list(node.body)
            elif isinstance(node, FuncDef):
                self.state.functions[node.name] = node.body
                status = 0
            elif isinstance(node, CondCmd):
                status = self.run_cond(node)
            elif isinstance(node, ArithCmd):
                value = self.arith_word(node.expr, node.origin)
                status = None if isinstance(value, Cause) else (0 if value else 1)
            else:
                status = 0
        finally:
            self.depth -= 1
        self.state.status = status
        return status

    def run_if(self, node: If, k: int):
        if k >= len(node.clauses):
            if node.else_body is not None:
                return self.run_list(node.else_body)
            return 0
        cond, body, origin = node.clauses[k]
        status = self.run_list(cond)
        if status is None:
            reason = f"`{_describe(cond)}` at {origin}"
            return self.branch([lambda: self.run_list(body), lambda: self.run_if(node, k + 1)], reason, origin)
        if status == 0:
            self.decided.append(f"`{_describe(cond)}` at {origin} is true")
            try:
                return self.run_list(body)
            finally:
                self.decided.pop()
        return self.run_if(node, k + 1)

    def run_case(self, node: Case):
        word = self.expand_scalar(node.word, tilde=True)
        text = _fallback_text(word)
        items = node.items
        if text is None:
            reason = f"the value of `{node.word.raw}` at {node.origin}"
            paths = [lambda body=body: self.run_list(body) for _, body, _ in items] + [lambda: 0]
            return self.branch(paths, reason, node.origin)
        k = 0
        while k < len(items):
            patterns, body, terminator = items[k]
            matched = None
            for pattern in patterns:
                chunks, causes = self.pattern_chunks(pattern)
                if causes:
                    matched = None
                    reason = f"the pattern `{pattern.raw}` at {node.origin}"
                    rest = items[k:]
                    paths = [lambda body=b: self.run_list(body) for _, b, _ in rest] + [lambda: 0]
                    return self.branch(paths, reason, node.origin)
                if re.fullmatch(_glob_to_regex(chunks), text, re.S):
                    matched = True
                    break
            if matched:
                status = self.run_list(body)
                while terminator == ";&" and k + 1 < len(items):
                    k += 1
                    status = self.run_list(items[k][1])
                    terminator = items[k][2]
                return status
            k += 1
        return 0

    def run_for(self, node: For):
        self.loop_depth += 1
        try:
            return self._run_for(node)
        finally:
            self.loop_depth -= 1

    def _run_for(self, node: For):
        if node.words is None:
            pos = self.state.positional
            fields = None if isinstance(pos, Cause) else list(pos)
        else:
            fields = self.expand_fields(node.words)
            if any(f.uncertain or f.causes for f in fields):
                fields = None
        if fields is None:
            return self.abstract_loop(node.body, node.origin, f"`for {node.var}` loop", {node.var: Cause(
                UNSUPPORTED, node.origin, node.var, f"{node.var} takes values that cannot be known statically")})
        status = 0
        for n, item in enumerate(fields):
            if n >= _MAX_LOOP_ITERATIONS:
                break
            self.set_var(node.var, item.segs, node.origin)
            try:
                status = self.run_list(node.body)
            except _LoopJump as jump:
                if jump.levels > 1:
                    raise _LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    break
        return status

    def run_arith_for(self, node: ArithFor):
        self.loop_depth += 1
        try:
            return self._run_arith_for(node)
        finally:
            self.loop_depth -= 1

    def _run_arith_for(self, node: ArithFor):
        init = self.arith_word(node.init, node.origin)
        if isinstance(init, Cause):
            return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
        status = 0
        for _ in range(_MAX_LOOP_ITERATIONS):
            cond = self.arith_word(node.cond, node.origin) if node.cond.raw.strip() else 1
            if isinstance(cond, Cause):
                return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
            if not cond:
                return status
            try:
                status = self.run_list(node.body)
            except _LoopJump as jump:
                if jump.levels > 1:
                    raise _LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    return status
            step = self.arith_word(node.step, node.origin)
            if isinstance(step, Cause):
                return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})
        return self.abstract_loop(node.body, node.origin, "`for ((...))` loop", {})

    def run_while(self, node: While):
        self.loop_depth += 1
        try:
            return self._run_while(node)
        finally:
            self.loop_depth -= 1

    def _run_while(self, node: While):
        status = 0
        what = "`until` loop" if node.until else "`while` loop"
        for _ in range(_MAX_LOOP_ITERATIONS):
            cond = self.run_list(node.cond)
            if cond is None:
                return self.abstract_loop(node.body, node.origin, what, {})
            if (cond == 0) == node.until:
                return status
            try:
                status = self.run_list(node.body)
            except _LoopJump as jump:
                if jump.levels > 1:
                    raise _LoopJump(jump.kind, jump.levels - 1)
                if jump.kind == "break":
                    return status
        return self.abstract_loop(node.body, node.origin, what, {})

    def abstract_loop(self, body: ListNode, origin: Origin, what: str, unknown_vars: dict):
        """Run a loop body once on a copy; what it changes becomes unknown."""
        before = self.state
        self.state = before.fork()
        for name, cause in unknown_vars.items():
            self.set_var(name, cause, origin)
        self.conditions.append(f"the {what} at {origin}")
        try:
            self.run_list(body)
        except (_Exit, _Return, _LoopJump):
            pass
        finally:
            self.conditions.pop()
        after = self.state
        self.state = before
        self.taint(before, after, what, origin, what)
        for name in unknown_vars:
            self.state.vars[name] = Var(unknown_vars[name], False, False, origin)
        self.state.status = None
        return None

    # ---- simple commands ------------------------------------------------------------

    def run_simple(self, node: Simple):
        self.current_line = node.origin
        if not node.words:
            status = 0
            for assign in node.assigns:
                self.assign(assign, node.origin)
            return status
        head = node.words[0]
        if isinstance(head, Assign):
            return 0
        head_fields = self.word_fields(head)
        rest_words = node.words[1:]
        if head_fields and not head_fields[0].causes:
            name = head_fields[0].text
        else:
            name = None
        if name in ("declare", "typeset", "local", "export", "readonly") and len(head_fields) == 1:
            return self.declaration(name, rest_words, node)
        fields = head_fields + self.expand_fields([w for w in rest_words if isinstance(w, Word)])
        if not fields:
            for assign in node.assigns:
                self.assign(assign, node.origin)
            return 0
        if name is None:
            if fields[0].causes:
                if self.sandbox:
                    raise _Impure(f"`{head.raw}`")
                self.unknown_program(fields, node)
                return None
            name = fields[0].text
        temp_env: dict[str, tuple[tuple, Origin]] = {}
        for assign in node.assigns:
            if assign.array is None and assign.index is None:
                temp_env[assign.name] = (self.expand_scalar(assign.value, tilde=True) if assign.value else (), assign.origin)
        if name in self.state.functions:
            return self.call_function(name, fields, temp_env, node)
        handler = _BUILTINS.get(name)
        if handler is not None:
            return handler(self, fields, node, temp_env)
        return self.external(fields, temp_env, node)

    def external(self, fields: list[Field], temp_env: dict, node: Simple):
        name = os.path.basename(fields[0].text)
        if self.sandbox:
            return self.pure_command(name, fields)
        if self.collect is not None:
            self.collect.append(self.split_command(fields, temp_env))
            return None
        self.loader.consider_launch(self, fields, temp_env, node)
        return None

    def pure_command(self, name: str, fields: list[Field]):
        args = []
        for f in fields[1:]:
            text = _fallback_text(f.segs)
            if text is None or (f.uncertain and f.causes):
                raise _Impure(f"`{fields[0].text}` with an argument that cannot be known statically")
            args.append(text)
        if name == "dirname":
            paths = [a for a in args if not a.startswith("-")]
            if not paths:
                raise _Impure("`dirname` without a path")
            self.capture.append("".join(_dirname(p) + "\n" for p in paths))
            return 0
        if name in ("realpath", "readlink"):
            options = [a for a in args if a.startswith("-")]
            paths = [a for a in args if not a.startswith("-")]
            if name == "readlink" and not any(o.strip("-") in ("f", "e", "m", "canonicalize") for o in options):
                raise _Impure("`readlink` without -f")
            if not paths or self.state.cwd is None and not all(p.startswith("/") for p in paths):
                raise _Impure(f"`{name}` of a path relative to a directory that cannot be known statically")
            # the script being read is on this machine: its path resolves here as it would there
            self.capture.append("".join(os.path.realpath(os.path.join(self.state.cwd or "/", p)) + "\n" for p in paths))
            return 0
        if name == "basename":
            plain = [a for a in args if not a.startswith("-")]
            if not plain:
                raise _Impure("`basename` without a path")
            base = plain[0].rstrip("/").rsplit("/", 1)[-1] or "/"
            if len(plain) > 1 and base.endswith(plain[1]) and base != plain[1]:
                base = base[: -len(plain[1])]
            self.capture.append(base + "\n")
            return 0
        raise _Impure(f"`{fields[0].text}`")

    def split_command(self, fields: list[Field], temp_env: dict) -> SplitCommand:
        tokens = [self.loader.script_token(f) for f in fields]
        environment = []
        for var_name, var in self.state.vars.items():
            if var.exported and var.origin is not None and isinstance(var.value, tuple) and _known(var.value):
                environment.append((var_name, _text(var.value)))
        for var_name, (segs, _origin) in temp_env.items():
            if _known(segs):
                environment.append((var_name, _text(segs)))
        return SplitCommand(tuple(t.text for t in tokens), tuple(tokens), tuple(environment))

    def unknown_program(self, fields: list[Field], node: Simple) -> None:
        if self.collect is not None:
            self.collect.append(self.split_command(fields, {}))
            return
        if any(f.text.endswith(".py") for f in fields[1:]) or any(is_launch_program(f.text) for f in fields[1:]):
            cause = fields[0].causes[0]
            self.loader.notes.append(_Note(node.origin, (
                f"the command at {node.origin} starts with `{fields[0].text}`, which cannot be resolved statically: "
                f"{cause.message}")))
            self.loader.unresolved_launches.append((node.origin, cause, fields[0]))

    def call_function(self, name: str, fields: list[Field], temp_env: dict, node: Simple):
        body = self.state.functions[name]
        if self.func_depth >= _MAX_DEPTH:
            raise ShellSyntaxError(node.origin, f"function {name} calls itself too deeply to follow", UNSUPPORTED)
        saved_positional = self.state.positional
        self.state.positional = list(fields[1:])
        saved_vars = {}
        for var_name, (segs, origin) in temp_env.items():
            saved_vars[var_name] = self.state.vars.get(var_name)
            self.set_var(var_name, segs, origin, export=True)
        self.local_frames.append({})
        self.func_depth += 1
        try:
            status = self.run_command(body)
        except _Return as ret:
            status = ret.status
        finally:
            self.func_depth -= 1
            frame = self.local_frames.pop()
            for var_name, old in {**saved_vars, **frame}.items():
                if old is None:
                    self.state.vars.pop(var_name, None)
                else:
                    self.state.vars[var_name] = old
            self.state.positional = saved_positional
        return status

    def assign(self, a: Assign, origin: Origin, *, export: bool | None = None, integer: bool | None = None,
               as_array: bool = False) -> None:
        old = self.state.vars.get(a.name)
        if integer is None and old is not None:
            integer = old.integer
        if a.array is not None:
            if a.append and old is not None and isinstance(old.value, Cause):
                self.set_var(a.name, old.value, a.origin, export=export)
                return
            elems: dict[int, Field] = {}
            if a.append and old is not None:
                elems = old.value.as_dict() if isinstance(old.value, ArrayValue) else {0: Field(old.value)}
            next_index = (max(elems) + 1) if elems else 0
            for item in a.array:
                if isinstance(item, tuple):
                    key = self.arith_index(item[0], a.origin)
                    if isinstance(key, Cause):
                        self.set_var(a.name, key, a.origin, export=export)
                        return
                    elems[key] = Field(self.expand_scalar(item[1], tilde=True), False, item[1].origin)
                    next_index = key + 1
                    continue
                for f in self.word_fields(item):
                    elems[next_index] = f
                    next_index += 1
            self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
            return
        value = self.expand_scalar(a.value, tilde=True) if a.value is not None else ()
        if integer:
            result = self.arith_value(value, a.origin)
            value = result
        if a.index is not None:
            key = self.arith_index(a.index, a.origin)
            if isinstance(key, Cause) or (old is not None and isinstance(old.value, Cause)):
                self.set_var(a.name, key if isinstance(key, Cause) else old.value, a.origin, export=export)
                return
            elems = {}
            if old is not None:
                elems = old.value.as_dict() if isinstance(old.value, ArrayValue) else {0: Field(old.value)}
            if a.append and key in elems:
                value = tuple(elems[key].segs) + tuple(value)
            elems[key] = Field(tuple(value), False, a.origin)
            self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
            return
        if a.append and old is not None:
            if isinstance(old.value, Cause):
                value = old.value
            elif isinstance(old.value, ArrayValue):
                elems = old.value.as_dict()
                base = elems.get(0, Field(())).segs
                elems[0] = Field(tuple(base) + tuple(value), False, a.origin)
                self.set_var(a.name, ArrayValue.of(elems), a.origin, export=export, integer=integer)
                return
            elif integer:
                value = self.arith_value(tuple(old.value) + (_lit("+", a.origin),) + tuple(value), a.origin)
            else:
                value = tuple(old.value) + tuple(value)
        if as_array and not isinstance(value, Cause):
            value = ArrayValue.of({0: Field(tuple(value))})
        self.set_var(a.name, value, a.origin, export=export, integer=integer)

    def arith_value(self, segs, origin: Origin):
        if not _known(segs):
            return _causes(segs)[0]
        try:
            return (_lit(str(_Arith(self, _text(segs), origin).run()), origin),)
        except _ArithUnknown as exc:
            return exc.cause
        except _ArithError as exc:
            return Cause(UNSUPPORTED, origin, _text(segs), f"`{_text(segs)}` cannot be evaluated: {exc}")

    def declaration(self, builtin: str, words: list, node: Simple):
        flags: set[str] = set()
        unflags: set[str] = set()
        items = []
        for w in words:
            if isinstance(w, Word):
                lit = w.literal()
                if lit is not None and len(lit) > 1 and lit[0] in "-+" and not items:
                    (flags if lit[0] == "-" else unflags).update(lit[1:])
                    continue
            items.append(w)
        export = builtin == "export" or "x" in flags
        if builtin == "export" and "n" in flags:
            export = False
        integer = True if "i" in flags else None
        in_function = bool(self.local_frames)
        local = in_function and (builtin == "local" or (builtin in ("declare", "typeset") and "g" not in flags))
        if "f" in flags or "p" in flags and not items:
            return 0
        for item in items:
            if isinstance(item, Assign):
                if local:
                    self.local_frames[-1].setdefault(item.name, self.state.vars.get(item.name))
                if "A" in flags:
                    cause = Cause(UNSUPPORTED, item.origin, item.name,
                                  f"{item.name} is an associative array (declare -A), which this tool does not follow")
                    self.set_var(item.name, cause, item.origin, export=export)
                    continue
                self.assign(item, node.origin, export=export if export else None, integer=integer,
                            as_array="a" in flags)
                if builtin == "export" and "n" in flags:
                    var = self.state.vars[item.name]
                    self.state.vars[item.name] = replace(var, exported=False)
                continue
            for f in self.word_fields(item):
                text = _text(f.segs)
                if f.causes:
                    continue
                if "=" in text and _NAME.fullmatch(text.split("=", 1)[0].rstrip("+")):
                    var_name, _, value = text.partition("=")
                    seg_value = (_lit(value, f.segs[0].origins[0] if f.segs and f.segs[0].origins else node.origin),)
                    if local:
                        self.local_frames[-1].setdefault(var_name, self.state.vars.get(var_name))
                    self.set_var(var_name, seg_value, node.origin, export=export if export else None,
                                 integer=integer)
                    continue
                if not _NAME.fullmatch(text):
                    continue
                old = self.state.vars.get(text)
                if local:
                    self.local_frames[-1].setdefault(text, old)
                    if old is not None and builtin == "local":
                        self.state.vars.pop(text, None)
                        old = None
                if old is None:
                    if "a" in flags:
                        self.set_var(text, ArrayValue(), node.origin, export=export if export else None)
                    elif builtin == "export" or "x" in flags:
                        # exported but unset: nothing reaches the environment
                        pass
                    continue
                exported = old.exported
                if export:
                    exported = True
                if builtin == "export" and "n" in flags:
                    exported = False
                if "x" in unflags:
                    exported = False
                self.state.vars[text] = replace(old, exported=exported,
                                                origin=old.origin if old.origin is not None else (
                                                    node.origin if exported and not old.exported else None))
        return 0

    # ---- tests --------------------------------------------------------------------

    def run_cond(self, node: CondCmd):
        tokens = node.tokens
        self._cond_pos = 0
        try:
            value = self.cond_or(tokens)
        except _CondError:
            return None
        if self._cond_pos != len(tokens):
            return None
        if value is None:
            return None
        return 0 if value else 1

    def cond_or(self, tokens):
        left = self.cond_and(tokens)
        while self._cond_pos < len(tokens) and tokens[self._cond_pos] == "||":
            self._cond_pos += 1
            right = self.cond_and(tokens)
            left = True if (left is True or right is True) else (None if (left is None or right is None) else False)
        return left

    def cond_and(self, tokens):
        left = self.cond_not(tokens)
        while self._cond_pos < len(tokens) and tokens[self._cond_pos] == "&&":
            self._cond_pos += 1
            right = self.cond_not(tokens)
            left = False if (left is False or right is False) else (None if (left is None or right is None) else True)
        return left

    def cond_not(self, tokens):
        if self._cond_pos < len(tokens) and tokens[self._cond_pos] == "!":
            self._cond_pos += 1
            value = self.cond_not(tokens)
            return None if value is None else not value
        if self._cond_pos < len(tokens) and tokens[self._cond_pos] == "(":
            self._cond_pos += 1
            value = self.cond_or(tokens)
            if self._cond_pos >= len(tokens) or tokens[self._cond_pos] != ")":
                raise _CondError()
            self._cond_pos += 1
            return value
        return self.cond_primary(tokens)

    def cond_text(self, word) -> str | None:
        if isinstance(word, str):
            return word
        return _fallback_text(self.expand_scalar(word, tilde=True))

    def cond_primary(self, tokens):
        k = self._cond_pos
        if k >= len(tokens):
            raise _CondError()
        first = tokens[k]
        first_lit = first.literal() if isinstance(first, Word) else first
        nxt = tokens[k + 1] if k + 1 < len(tokens) else None
        nxt_lit = nxt.literal() if isinstance(nxt, Word) else nxt
        # binary
        if nxt_lit in _BINARY_TESTS or nxt_lit in ("<", ">", "=~"):
            if k + 2 >= len(tokens):
                raise _CondError()
            right = tokens[k + 2]
            self._cond_pos = k + 3
            left_text = self.cond_text(first)
            if nxt_lit in ("==", "=", "!="):
                if left_text is None:
                    return None
                chunks, causes = self.pattern_chunks(right) if isinstance(right, Word) else ([(right, True)], [])
                if causes:
                    return None
                matched = re.fullmatch(_glob_to_regex(chunks), left_text, re.S) is not None
                return matched if nxt_lit != "!=" else not matched
            if nxt_lit == "=~":
                if left_text is None or not isinstance(right, Word):
                    return None
                chunks, causes = self.pattern_chunks(right)
                if causes:
                    return None
                regex = "".join(re.escape(t) if q else t for t, q in chunks)
                try:
                    return re.search(regex, left_text) is not None
                except re.error:
                    return None
            right_text = self.cond_text(right)
            return _binary_test(nxt_lit, left_text, right_text, arith=lambda t: self.cond_arith(t, first))
        if isinstance(first, Word) and first_lit in _UNARY_TESTS and nxt is not None and nxt not in ("&&", "||", ")"):
            self._cond_pos = k + 2
            return self.unary_test(first_lit, self.cond_text(nxt))
        self._cond_pos = k + 1
        text = self.cond_text(first)
        return None if text is None else bool(text)

    def cond_arith(self, text: str, word) -> int | None:
        origin = word.origin if isinstance(word, Word) else self.current_line or Origin(self.loader.display, 0)
        try:
            return _Arith(self, text, origin).run()
        except (_ArithUnknown, _ArithError):
            return None

    def unary_test(self, op: str, operand: str | None):
        if operand is None:
            return None
        if op == "-z":
            return operand == ""
        if op == "-n":
            return operand != ""
        if op == "-v":
            name = operand.split("[", 1)[0]
            return name in self.state.vars
        return None       # file tests and shell options: known only on the machine that runs the script

    def test_builtin(self, fields: list[Field], closing: bool):
        args: list[str] = []
        for f in fields[1:]:
            if f.uncertain and all(c.fallback == "" for c in f.causes) and all(
                    s.cause is not None or s.text == "" for s in f.segs):
                continue          # an unquoted unset variable: bash drops the word
            text = _fallback_text(f.segs)
            if text is None or f.uncertain:
                return None
            args.append(text)
        if closing:
            if not args or args[-1] != "]":
                return 2
            args = args[:-1]
        try:
            value = _TestEval(self, args).run()
        except _CondError:
            return 2
        if value is None:
            return None
        return 0 if value else 1


class _CondError(Exception):
    pass


_BINARY_TESTS = frozenset({"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef"})
_UNARY_TESTS = frozenset({"-a", "-b", "-c", "-d", "-e", "-f", "-g", "-h", "-k", "-p", "-r", "-s", "-t", "-u", "-w",
                          "-x", "-G", "-L", "-N", "-O", "-S", "-z", "-n", "-v", "-o", "-R"})


def _binary_test(op: str, left: str | None, right: str | None, arith=None):
    if left is None or right is None:
        return None
    if op in ("=", "=="):
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right
    if op == ">":
        return left > right
    if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        if arith is not None:
            a, b = arith(left), arith(right)
        else:
            try:
                a, b = int(left.strip()), int(right.strip())
            except ValueError:
                raise _CondError()
        if a is None or b is None:
            return None
        return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
    return None      # -nt, -ot, -ef compare files


class _TestEval:
    """test / [ over already expanded arguments (POSIX rules, -a / -o / ! / parentheses)."""

    def __init__(self, interp: _Interp, args: list[str]):
        self.interp = interp
        self.args = args
        self.k = 0

    def run(self):
        if not self.args:
            return False
        if len(self.args) == 1:
            return self.args[0] != ""
        if len(self.args) == 2 and self.args[0] == "!":
            return self.args[1] == ""
        if len(self.args) == 3 and self.args[1] in _BINARY_TESTS:
            return _binary_test(self.args[1], self.args[0], self.args[2])
        value = self.or_()
        if self.k != len(self.args):
            raise _CondError()
        return value

    def or_(self):
        left = self.and_()
        while self.k < len(self.args) and self.args[self.k] == "-o":
            self.k += 1
            right = self.and_()
            left = True if (left is True or right is True) else (None if None in (left, right) else False)
        return left

    def and_(self):
        left = self.not_()
        while self.k < len(self.args) and self.args[self.k] == "-a":
            self.k += 1
            right = self.not_()
            left = False if (left is False or right is False) else (None if None in (left, right) else True)
        return left

    def not_(self):
        if self.k < len(self.args) and self.args[self.k] == "!":
            self.k += 1
            value = self.not_()
            return None if value is None else not value
        return self.primary()

    def primary(self):
        args = self.args
        k = self.k
        if k >= len(args):
            raise _CondError()
        if args[k] == "(":
            self.k += 1
            value = self.or_()
            if self.k >= len(args) or args[self.k] != ")":
                raise _CondError()
            self.k += 1
            return value
        if k + 2 < len(args) + 0 and k + 1 < len(args) and args[k + 1] in _BINARY_TESTS and k + 2 < len(args):
            self.k = k + 3
            return _binary_test(args[k + 1], args[k], args[k + 2])
        if args[k] in _UNARY_TESTS and k + 1 < len(args):
            self.k = k + 2
            return self.interp.unary_test(args[k], args[k + 1])
        self.k = k + 1
        return args[k] != ""


def _dirname(path: str) -> str:
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path.startswith("/") else "."
    if "/" not in stripped:
        return "."
    head = stripped.rsplit("/", 1)[0].rstrip("/")
    return head or "/"


def _describe(node) -> str:
    raw = getattr(node, "raw", "") or ""
    raw = " ".join(raw.split()).rstrip(";").rstrip()
    return raw if len(raw) <= 60 else raw[:57] + "..."


# ---- builtins ----------------------------------------------------------------------------


def _texts(interp: _Interp, fields: list[Field]) -> list[str | None]:
    return [None if f.causes else f.text for f in fields]


def _b_true(interp, fields, node, env):
    return 0


def _b_false(interp, fields, node, env):
    return 1


def _b_echo(interp, fields, node, env):
    if interp.sandbox:
        args = _texts(interp, fields[1:])
        if any(a is None for a in args):
            raise _Impure("`echo` of a value that cannot be known statically")
        newline = True
        while args and re.fullmatch(r"-[neE]+", args[0]):
            if "n" in args[0]:
                newline = False
            args = args[1:]
        interp.capture.append(" ".join(args) + ("\n" if newline else ""))
    return 0


def _printf_format(fmt: str, args: list[str]) -> str | None:
    out = []
    i = 0
    k = 0
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r"}
    while True:
        i = 0
        while i < len(fmt):
            c = fmt[i]
            if c == "\\" and i + 1 < len(fmt) and fmt[i + 1] in escapes:
                out.append(escapes[fmt[i + 1]])
                i += 2
                continue
            if c == "%":
                if fmt[i + 1:i + 2] == "%":
                    out.append("%")
                    i += 2
                    continue
                m = re.compile(r"%(-?\d*)([sdi])").match(fmt, i)
                if not m:
                    return None
                arg = args[k] if k < len(args) else ""
                k += 1
                if m.group(2) in "di":
                    try:
                        arg = str(int(arg or "0"))
                    except ValueError:
                        return None
                width = m.group(1)
                out.append(f"{arg:{'<' if width.startswith('-') else '>'}{width.lstrip('-')}}" if width else arg)
                i = m.end()
                continue
            out.append(c)
            i += 1
        if k == 0 or k >= len(args):
            break
    return "".join(out)


def _b_printf(interp, fields, node, env):
    args = _texts(interp, fields[1:])
    target = None
    if len(args) >= 2 and args[0] == "-v":
        target = args[1]
        args = args[2:]
    result = None
    if args and all(a is not None for a in args):
        result = _printf_format(args[0], args[1:])
    if target is not None:
        if result is None:
            interp.set_var(target, Cause(UNSUPPORTED, node.origin, target,
                                         f"{target} is set by a `printf -v` this tool cannot evaluate"), node.origin)
        else:
            interp.set_var(target, (_lit(result, node.origin),), node.origin)
        return 0
    if interp.sandbox:
        if result is None:
            raise _Impure("`printf` with a format this tool does not evaluate")
        interp.capture.append(result)
    return 0


def _b_pwd(interp, fields, node, env):
    if interp.sandbox:
        if interp.state.cwd is None:
            raise _Impure("`pwd` after a `cd` to a directory that cannot be known statically")
        interp.capture.append(interp.state.cwd + "\n")
    return 0


def _b_cd(interp, fields, node, env):
    args = [f for f in fields[1:] if f.text not in ("-L", "-P", "-e", "-@")]
    if not args:
        home = interp.state.vars.get("HOME")
        target = _text(home.value) if home and isinstance(home.value, tuple) and _known(home.value) else None
    else:
        target = None if args[0].causes else args[0].text
        if target == "-":
            target = None
    cwd = interp.state.cwd
    if target is None or (cwd is None and not target.startswith("/")):
        interp.state.cwd = None
    else:
        interp.state.cwd = os.path.normpath(os.path.join(cwd or "/", target))
    if interp.state.cwd is not None:
        old = interp.state.vars.get("PWD")
        # the shell keeps PWD itself: not a setting the script makes for the launch (origin None)
        interp.state.vars["PWD"] = Var((_lit(interp.state.cwd, node.origin),), old.exported if old else True, False,
                                       None)
    else:
        interp.state.vars["PWD"] = Var(Cause(UNSUPPORTED, node.origin, "PWD",
                                             f"the directory the script changes to at {node.origin} cannot be known statically"),
                                       True, False, None)
    return 0


def _b_popd(interp, fields, node, env):
    interp.state.cwd = None
    return 0


def _b_unset(interp, fields, node, env):
    functions = False
    for f in fields[1:]:
        text = f.text
        if text == "-f":
            functions = True
            continue
        if text in ("-v", "-n"):
            continue
        if f.causes:
            continue
        if functions:
            interp.state.functions.pop(text, None)
        else:
            name = text.split("[", 1)[0]
            if "[" in text and name in interp.state.vars and isinstance(interp.state.vars[name].value, ArrayValue):
                key = interp.arith_index(text[len(name) + 1:-1], node.origin)
                if isinstance(key, int):
                    elems = interp.state.vars[name].value.as_dict()
                    elems.pop(key, None)
                    interp.state.vars[name] = replace(interp.state.vars[name], value=ArrayValue.of(elems))
                continue
            interp.state.vars.pop(name, None)
    return 0


def _b_set(interp, fields, node, env):
    args = fields[1:]
    k = 0
    while k < len(args):
        text = args[k].text
        if text == "--":
            interp.state.positional = list(args[k + 1:])
            return 0
        if text in ("-o", "+o"):
            if k + 1 < len(args) and args[k + 1].text == "allexport":
                interp.state.allexport = text == "-o"
            k += 2
            continue
        if len(text) > 1 and text[0] in "-+":
            if "a" in text[1:]:
                interp.state.allexport = text[0] == "-"
            if "o" in text[1:]:
                if k + 1 < len(args) and args[k + 1].text == "allexport":
                    interp.state.allexport = text[0] == "-"
                k += 2
                continue
            k += 1
            continue
        interp.state.positional = list(args[k:])
        return 0
    return 0


def _b_shift(interp, fields, node, env):
    n = 1
    if len(fields) > 1:
        try:
            n = int(fields[1].text)
        except ValueError:
            return None
    pos = interp.state.positional
    if isinstance(pos, Cause):
        return None
    if n > len(pos):
        return 1
    interp.state.positional = pos[n:]
    return 0


def _b_exit(interp, fields, node, env):
    status = interp.state.status
    if len(fields) > 1:
        try:
            status = int(fields[1].text) & 255
        except ValueError:
            status = None
    if not interp.sandbox and not interp.conditions and interp.collect is None and interp.loader.exit_note is None:
        note = f"the script exits at {node.origin}"
        if interp.decided:
            note += f" (because {interp.decided[-1]} in this environment)"
        interp.loader.exit_note = note
    raise _Exit(status)


def _b_return(interp, fields, node, env):
    if not interp.func_depth and not interp.loader.source_depth:
        return 1        # bash: "can only `return' from a function or sourced script", and goes on
    status = interp.state.status
    if len(fields) > 1:
        try:
            status = int(fields[1].text)
        except ValueError:
            status = None
    raise _Return(status)


def _b_break(interp, fields, node, env, kind="break"):
    if not interp.loop_depth:
        return 0        # bash: "only meaningful in a `for', `while', or `until' loop", and goes on
    levels = 1
    if len(fields) > 1:
        try:
            levels = int(fields[1].text)
        except ValueError:
            levels = 1
    raise _LoopJump(kind, levels)


def _b_continue(interp, fields, node, env):
    return _b_break(interp, fields, node, env, "continue")


def _b_read(interp, fields, node, env):
    args = [f.text for f in fields[1:]]
    names = []
    array = None
    k = 0
    while k < len(args):
        a = args[k]
        if a.startswith("-") and len(a) > 1:
            letters = a[1:]
            for j, ch in enumerate(letters):
                if ch in "pdntuNi":
                    if j == len(letters) - 1:
                        k += 1
                    break
                if ch == "a":
                    array = letters[j + 1:] or (args[k + 1] if k + 1 < len(args) else None)
                    if not letters[j + 1:]:
                        k += 1
                    break
            k += 1
            continue
        names.append(a)
        k += 1
    if not names and array is None:
        names = ["REPLY"]
    for name in names + ([array] if array else []):
        if name and _NAME.fullmatch(name):
            interp.set_var(name, Cause(UNSUPPORTED, node.origin, name,
                                       f"{name} is read from input at {node.origin}, which cannot be known statically"),
                           node.origin)
    return None


def _b_mapfile(interp, fields, node, env):
    plain = [f.text for f in fields[1:] if not f.text.startswith("-")]
    name = plain[-1] if plain else "MAPFILE"
    if _NAME.fullmatch(name):
        interp.set_var(name, Cause(UNSUPPORTED, node.origin, name,
                                   f"{name} is read from input at {node.origin}, which cannot be known statically"),
                       node.origin)
    return None


def _b_let(interp, fields, node, env):
    status = 1
    for f in fields[1:]:
        value = interp.arith_value(f.segs, node.origin)
        if isinstance(value, Cause):
            return None
        status = 0 if _text(value) != "0" else 1
    return status


def _b_test(interp, fields, node, env):
    return interp.test_builtin(fields, closing=fields[0].text == "[")


def _b_source(interp, fields, node, env):
    if len(fields) < 2:
        return 2
    return interp.loader.source(interp, fields[1], fields[2:], node)


def _b_eval(interp, fields, node, env):
    if len(fields) < 2:
        return 0
    texts: list[str] = []
    origins: list[Origin] = []
    for k, f in enumerate(fields[1:]):
        if k:
            texts.append(" ")
            origins.append(node.origin)
        for seg in f.segs:
            if seg.cause is not None:
                cause = seg.cause
                interp.loader.notes.append(_Note(node.origin, f"`eval` at {node.origin} gets `{seg.text}`: {cause.message}"))
                return None
            texts.append(seg.text)
            origins.extend(seg.origins if len(seg.origins) == len(seg.text) else (node.origin,) * len(seg.text))
    tree = _parse("".join(texts), origins)
    return interp.run_list(tree)


def _b_exec(interp, fields, node, env):
    if len(fields) < 2:
        return 0
    interp.external(fields, env, node)
    raise _Exit(None)


def _b_command(interp, fields, node, env):
    rest = fields[1:]
    while rest and rest[0].text in ("-p", "-v", "-V", "--"):
        if rest[0].text in ("-v", "-V"):
            return None
        rest = rest[1:]
    if not rest:
        return 0
    handler = _BUILTINS.get(rest[0].text)
    if handler is not None:
        return handler(interp, rest, node, env)
    return interp.external(rest, env, node)


def _b_getopts(interp, fields, node, env):
    if len(fields) >= 3 and _NAME.fullmatch(fields[2].text):
        interp.set_var(fields[2].text, Cause(UNSUPPORTED, node.origin, fields[2].text,
                                             f"{fields[2].text} is set by getopts, which reads the script's arguments at run time"),
                       node.origin)
    return None


_BUILTINS = {
    ":": _b_true, "true": _b_true, "false": _b_false, "echo": _b_echo, "printf": _b_printf, "pwd": _b_pwd,
    "cd": _b_cd, "pushd": _b_cd, "popd": _b_popd, "unset": _b_unset, "set": _b_set, "shift": _b_shift,
    "exit": _b_exit, "return": _b_return, "break": _b_break, "continue": _b_continue, "read": _b_read,
    "mapfile": _b_mapfile, "readarray": _b_mapfile, "let": _b_let, "test": _b_test, "[": _b_test,
    "source": _b_source, ".": _b_source, "eval": _b_eval, "exec": _b_exec, "command": _b_command,
    "builtin": _b_command, "getopts": _b_getopts,
    "shopt": _b_true, "trap": _b_true, "wait": _b_true, "umask": _b_true, "ulimit": _b_true, "alias": _b_true,
    "unalias": _b_true, "hash": _b_true, "type": _b_true, "enable": _b_true, "complete": _b_true,
    "history": _b_true, "jobs": _b_true, "disown": _b_true, "times": _b_true, "caller": _b_true, "help": _b_true,
}


# --------------------------------------------------------------------------------------
# The loader: reading the file, #SBATCH headers, choosing the launch, building the result.
# --------------------------------------------------------------------------------------


_SBATCH_VALUE_OPTIONS = {"-N": "nodes", "--nodes": "nodes", "-n": "ntasks", "--ntasks": "ntasks",
                         "--ntasks-per-node": "ntasks-per-node", "--gpus-per-node": "gpus-per-node",
                         "--gres": "gres", "-G": "gpus", "--gpus": "gpus"}


def _read_sbatch(text: str, display: str) -> tuple[SbatchHeaders, list[Problem]]:
    """The #SBATCH lines before the first command (sbatch stops reading them there)."""
    import shlex

    problems: list[Problem] = []
    given: dict[str, tuple[str, str]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if lineno == 1 and stripped.startswith("#!"):
            continue
        if not stripped:
            continue
        if line.startswith("#SBATCH"):
            try:
                tokens = shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError:
                problems.append(Problem("invalid-launcher-option", f"{display}:{lineno}",
                                        "this #SBATCH line has an unclosed quote"))
                continue
            k = 0
            while k < len(tokens):
                tok = tokens[k]
                name, eq, value = tok.partition("=")
                if tok.startswith("--") and name in _SBATCH_VALUE_OPTIONS:
                    spelled = tok
                    if not eq:
                        value = tokens[k + 1] if k + 1 < len(tokens) else ""
                        spelled = f"{tok} {value}"
                        k += 1
                    given[_SBATCH_VALUE_OPTIONS[name]] = (value, f"{display}:{lineno}", spelled)
                elif not tok.startswith("--") and tok[:2] in _SBATCH_VALUE_OPTIONS:
                    value = tok[2:]
                    spelled = tok
                    if not value:
                        value = tokens[k + 1] if k + 1 < len(tokens) else ""
                        spelled = f"{tok} {value}"
                        k += 1
                    given[_SBATCH_VALUE_OPTIONS[tok[:2]]] = (value, f"{display}:{lineno}", spelled)
                k += 1
            continue
        if stripped.startswith("#"):
            continue
        break

    def count(key: str, allow_range: bool = False) -> int | None:
        if key not in given:
            return None
        raw, where, spelled = given[key]
        text_ = raw
        if allow_range:
            text_ = re.split(r"[-,]", raw, maxsplit=1)[0]
        if key in ("gpus-per-node", "gpus"):
            text_ = raw.rsplit(":", 1)[-1]
        if key == "gres":
            gpu = [g for g in raw.split(",") if g.split(":", 1)[0] == "gpu"]
            text_ = gpu[0].rsplit(":", 1)[-1] if gpu and ":" in gpu[0] else ""
            if not gpu:
                return None
        try:
            value = int(text_)
        except ValueError:
            value = None
        if value is None or value <= 0:
            problems.append(Problem("invalid-launcher-option", f"{where} {spelled.split('=')[0].split()[0]}",
                                    f"#SBATCH {spelled} is not a positive count"))
            return None
        return value

    gpn = count("gpus-per-node")
    if gpn is None and "gpus-per-node" not in given:
        gpn = count("gres")
    headers = SbatchHeaders(
        nodes=count("nodes", allow_range=True),
        ntasks=count("ntasks"),
        ntasks_per_node=count("ntasks-per-node"),
        gpus_per_node=gpn,
        gpus=count("gpus"),
        given=tuple(given.items()),
    )
    return headers, problems


_ENTRY = re.compile(r"^pretrain\w*\.py$")
_DISTRIBUTED = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch", "ft_launcher", "srun",
                          "mpirun", "mpiexec", "orterun", "prterun"})


class _Loader:
    def __init__(self, display: str, environ: Mapping[str, str], cwd: str):
        self.display = display
        self.environ = environ
        self.cwd = cwd
        self.candidates: list[_Candidate] = []
        self.notes: list[_Note] = []
        self.unresolved_launches: list = []
        self.problems = ProblemCollector()
        self.missing_sources: list[str] = []
        self.env_phrases: dict[str, str] = {}
        self.token_causes: dict[int, list[Cause]] = {}
        self.source_depth = 0
        self.exit_note: str | None = None
        self.world_size_given = False      # the caller gives the world size: the launcher's need not resolve

    def require_failure(self, cause: Cause) -> None:
        self.problems.add(cause.code, f"{cause.origin} {cause.subject}", cause.message)

    def script_token(self, f: Field) -> ScriptToken:
        first = next((s for s in f.segs if s.origins), None)
        location = str(first.origins[0]) if first else str(f.word_origin or Origin(self.display, 0))
        word_location = str(f.word_origin) if f.word_origin else location
        causes = f.causes
        reason = None
        if causes:
            reason = causes[0].message
        vias = []
        for seg in f.segs:
            if seg.via and seg.via not in vias:
                vias.append(seg.via)
        via = None
        phrases = [f"${name} {self.env_phrases[name]}" for name in vias if name in self.env_phrases]
        if phrases:
            via = "; ".join(phrases)
        token = ScriptToken(f.text, location, word_location, reason, via)
        if causes:
            self.token_causes[id(token)] = list(causes)
        return token

    def launch_env(self, interp: _Interp, temp_env: dict) -> tuple[dict[str, str], dict[str, str]]:
        env: dict[str, str] = {}
        origins: dict[str, str] = {}
        for name, var in interp.state.vars.items():
            if not var.exported or not isinstance(var.value, tuple) or not _known(var.value):
                continue
            env[name] = _text(var.value)
            if var.origin is not None:
                origins[name] = f"exported at {var.origin}"
            elif name in self.env_phrases:
                origins[name] = self.env_phrases[name]
        for name, (segs, origin) in temp_env.items():
            if _known(segs):
                env[name] = _text(segs)
                origins[name] = f"set on the launch line at {origin}"
            else:
                env.pop(name, None)
        return env, origins

    def consider_launch(self, interp: _Interp, fields: list[Field], temp_env: dict, node: Simple) -> None:
        first = fields[0].text
        if not is_launch_program(first) and not any(_ENTRY.match(os.path.basename(f.text)) for f in fields):
            return
        tokens = [self.script_token(f) for f in fields]
        env, origins = self.launch_env(interp, temp_env)
        splitter = self.make_splitter(interp, fields)
        command, problems = parse_launch_command(
            [t.text for t in tokens], env, locations=tokens, env_origins=origins, split_command_string=splitter)
        if command.script is None:
            reason = next((p.message for p in problems if p.code == "no-training-script"), "")
            self.notes.append(_Note(node.origin, f"the command at {node.origin} starts no training script: {reason}"))
            return
        exports = {n: v for n, v in interp.state.vars.items() if v.exported and v.origin is not None}
        self.candidates.append(_Candidate(
            command, tuple(p for p in problems), tuple(command.locations or ()), node.origin,
            tuple(interp.conditions), exports, dict(temp_env)))

    def make_splitter(self, interp: _Interp, fields: list[Field]):
        loader = self

        def split(string: str, env: Mapping[str, str], positional: Sequence[str], location):
            field_ = next((f for f in fields if f.text == string), None)
            if field_ is not None:
                chars: list[str] = []
                origins: list[Origin] = []
                for seg in field_.segs:
                    chars.append(seg.text)
                    if len(seg.origins) == len(seg.text):
                        origins.extend(seg.origins)
                    else:
                        origins.extend((seg.origins[0] if seg.origins else Origin(loader.display, 0),) * len(seg.text))
                text, text_origins = "".join(chars), origins
            else:
                at = interp.current_line or Origin(loader.display, 0)
                text, text_origins = string, [at] * len(string)
            return loader.run_command_string(text, text_origins, env, positional)

        return split

    def run_command_string(self, text: str, origins: list[Origin], env: Mapping[str, str], positional: Sequence[str]):
        problems: list[Problem] = []
        at = origins[0] if origins else Origin(self.display, 0)
        try:
            tree = _parse(text, origins)
        except ShellSyntaxError as exc:
            return (), (Problem("shell-syntax-error", str(exc.origin), f"the sh -c string cannot be read: {exc.message}"),)
        variables = {name: Var((_lit(value, at),), True, False, None) for name, value in env.items()}
        pos_fields = [Field((_lit(p, at),)) for p in positional[1:]]
        state = _State(variables, pos_fields, {}, self.cwd)
        collected: list[SplitCommand] = []
        inner = _Interp(self, state, collect=collected)
        try:
            inner.run_list(tree)
        except _Exit:
            pass
        except ShellSyntaxError as exc:
            problems.append(Problem("shell-syntax-error", str(exc.origin), exc.message))
        return tuple(collected), tuple(problems)

    def source(self, interp: _Interp, target: Field, args: list[Field], node: Simple):
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
            if path_var is not None and isinstance(path_var.value, tuple) and _known(path_var.value):
                for directory in _text(path_var.value).split(":"):
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
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError as exc:
            self.missing_sources.append(f"`{name}` (sourced at {node.origin}: {exc.strerror})")
            return 1
        tree = _parse(text, _source_origins(text, name))
        saved = interp.state.positional
        if args:
            interp.state.positional = list(args)
        self.source_depth += 1
        try:
            return interp.run_list(tree)
        except _Return as ret:
            return ret.status
        finally:
            self.source_depth -= 1
            if args:
                interp.state.positional = saved

    # ---- choosing and building the result ----------------------------------------------

    def choose(self, line: int | None) -> _Candidate | None:
        candidates = self.candidates
        if line is not None:
            candidates = [c for c in candidates if c.origin.line == line and c.origin.file == self.display]
            if not candidates:
                self.problems.add("no-launch-line", f"{self.display}:{line}",
                                  f"no command that starts a training script runs at {self.display}:{line}")
                return None
        if not candidates:
            message = "no command in the script starts a training script (torchrun, srun, mpirun or python with a *.py)"
            details = [n.message for n in self.notes]
            if self.exit_note:
                details.insert(0, self.exit_note + " before it reaches a launch")
            if details:
                message += "; " + "; ".join(details[:4])
            self.problems.add("no-launch-line", self.display, message)
            for _origin, cause, _field in self.unresolved_launches[:4]:
                self.problems.add(cause.code, f"{cause.origin} {cause.subject}", cause.message)
            return None

        def rank(c: _Candidate) -> tuple[bool, bool]:
            script = c.command.script or ""
            entry = bool(_ENTRY.match(os.path.basename(script))) or (c.command.script_is_module and "pretrain" in script)
            return entry, c.command.launcher in _DISTRIBUTED

        best = max(rank(c) for c in candidates)
        top = [c for c in candidates if rank(c) == best]
        distinct = {}
        for c in top:
            distinct.setdefault(tuple(t.text for t in c.tokens), c)
        if len(distinct) > 1:
            places = []
            for c in distinct.values():
                where = str(c.origin)
                if c.conditions:
                    where += f" (when {c.conditions[-1]})"
                places.append(where)
            self.problems.add("ambiguous-launch-line", self.display,
                              "more than one command starts the training script: " + "; ".join(places[:6])
                              + "; say which line is the launch")
        return top[0]

    def cause_problem(self, cause: Cause, token: ScriptToken, role: str) -> None:
        location = f"{cause.origin} {cause.subject}"
        message = cause.message
        if token.word_location != str(cause.origin) or role != "token":
            message += f"; the launch at {token.word_location} gets `{token.text}` from it"
            if role != "token":
                message += f" ({role})"
        if any(p.location == location for p in self.problems):
            return
        self.problems.add(cause.code, location, message)

    def build(self, cand: _Candidate, sbatch: SbatchHeaders) -> ScriptLaunch:
        command = cand.command
        tokens: tuple[ScriptToken, ...] = cand.tokens
        self.problems.extend(cand.problems)
        script_index = command.script_index
        megatron = tokens[script_index + 1:] if script_index is not None else ()
        for token in megatron:
            for cause in self.token_causes.get(id(token), ()):
                self.cause_problem(cause, token, "token")
        # An unknown "$@" stands for any number of words: reported above, it is no flag value.
        megatron = tuple(t for t in megatron if not (t.text in ("$@", "$*") and any(
            c.subject == t.text for c in self.token_causes.get(id(t), ()))))
        for index in () if self.world_size_given else command.world_size_tokens:
            if index < len(tokens):
                for cause in self.token_causes.get(id(tokens[index]), ()):
                    self.cause_problem(cause, tokens[index], "it decides the world size")
        if script_index is not None and script_index < len(tokens):
            script_token = tokens[script_index]
            causes = self.token_causes.get(id(script_token), ())
            base = script_token.text.rsplit("/", 1)[-1]
            if causes and any(c.subject in base or "$" in base for c in causes):
                for cause in causes:
                    self.cause_problem(cause, script_token, "the training script")
        environment: dict[str, ScriptEnvVar] = {}
        for name, var in cand.exports.items():
            if isinstance(var.value, tuple) and _known(var.value):
                environment[name] = ScriptEnvVar(name, _text(var.value), str(var.origin))
            else:
                reason = var.value.message if isinstance(var.value, Cause) else _causes(var.value)[0].message if isinstance(var.value, tuple) else "an array cannot be exported"
                environment[name] = ScriptEnvVar(name, None, str(var.origin), reason)
        for name, (segs, origin) in cand.temp_env.items():
            if _known(segs):
                environment[name] = ScriptEnvVar(name, _text(segs), str(origin))
            else:
                environment[name] = ScriptEnvVar(name, None, str(origin), _causes(segs)[0].message)
        for name, value in command.environment:
            environment[name] = ScriptEnvVar(name, value, str(cand.origin))
        public = replace(command, locations=tuple(t.location for t in tokens))
        return ScriptLaunch(
            path=self.display,
            location=str(cand.origin),
            command=public,
            megatron_tokens=tuple(megatron),
            world_size=command.world_size,
            world_size_source=command.world_size_source,
            environment=tuple(environment.values()),
            sbatch=sbatch,
            launch_tokens=tuple(tokens),
        )


def load_launch_script(
    path: str | os.PathLike,
    environ: Mapping[str, str] | None = None,
    *,
    script_args: Sequence[str] | None = None,
    line: int | None = None,
    world_size_given: bool = False,
) -> tuple[ScriptLaunch | None, tuple[Problem, ...]]:
    """Find and resolve the training launch in a bash launch script or sbatch file.

    ``environ``: the environment the script would start with (``os.environ`` when None).
    ``script_args``: the arguments the script would be run with (``$1``...); None: not known,
    so ``$1`` is unset (as bash has it without arguments) and ``"$@"`` is a problem where it
    reaches the launch.
    ``world_size_given``: the caller gives the world size, so the launcher's own process
    counts need not resolve.
    ``line``: the line of the launch command, when the script runs more than one.
    Returns the launch (None when no launch could be found) and every problem found.
    """
    display = os.fspath(path)
    environ = dict(os.environ if environ is None else environ)
    try:
        with open(display, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError as exc:
        return None, (Problem("unreadable-file", display, f"cannot read the launch script: {exc.strerror or exc}"),)
    cwd = environ.get("PWD") or os.getcwd()
    loader = _Loader(display, environ, cwd)
    loader.world_size_given = world_size_given
    sbatch, sbatch_problems = _read_sbatch(text, display)
    loader.problems.extend(sbatch_problems)
    variables = {name: Var((_lit(value, Origin(display, 0)),), True, False, None) for name, value in environ.items()}
    # Slurm sets SLURM_* in the job from the script's own #SBATCH headers: they describe the
    # job where the checking shell's SLURM_* (an salloc session, a CI runner) do not.
    for name, (value, phrase) in sbatch.slurm_environment().items():
        variables[name] = Var((_lit(value, Origin(display, 0)),), True, False, None)
        loader.env_phrases[name] = phrase
    at_args = Origin(display, 0)
    state = _State(variables, [Field((_lit(a, at_args),)) for a in script_args or ()], {}, cwd)
    interp = _Interp(loader, state)
    if script_args is None:
        interp.unknown_script_args = state.positional
    try:
        tree = _parse(text, _source_origins(text, display))
        interp.run_list(tree)
    except _Exit:
        pass
    except ShellSyntaxError as exc:
        loader.problems.add(exc.code, str(exc.origin), exc.message)
        return None, loader.problems.problems
    except (RecursionError, _Return, _LoopJump, ArithmeticError, ValueError, LookupError, TypeError) as exc:
        # a construct this reader follows badly: say where, never a traceback
        where = str(interp.current_line) if interp.current_line else display
        loader.problems.add(UNSUPPORTED, where,
                            f"this tool cannot follow the script from here ({type(exc).__name__}: {exc})")
        return None, loader.problems.problems
    candidate = loader.choose(line)
    if candidate is None:
        return None, loader.problems.problems
    launch = loader.build(candidate, sbatch)
    return launch, loader.problems.problems


def split_command_string(
    string: str,
    environ: Mapping[str, str],
    positional: Sequence[str] = (),
    location: str | None = None,
) -> tuple[tuple[SplitCommand, ...], tuple[Problem, ...]]:
    """The simple commands a ``sh -c STRING`` would run, expanded as bash would expand them.

    ``positional``: the words after the string (``$0``, ``$1``, ...).  Used by
    ``megatron_estimator.inputs.launch`` for ``bash -c`` / ``sh -c`` wrappers.
    """
    display = location or "sh -c"
    loader = _Loader(display, dict(environ), dict(environ).get("PWD") or os.getcwd())
    origin = Origin(display, 1)
    commands, problems = loader.run_command_string(string, [origin] * len(string), environ, positional)
    plain = tuple(SplitCommand(c.tokens, None, c.environment) for c in commands)
    return plain, problems
