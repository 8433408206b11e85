"""The training launch of a bash launch script or sbatch file, resolved statically.

``load_launch_script(path)`` reads the script with the static shell reader (``inputs.bash``),
which runs it as bash would without running any program, and is told of each program the
script would execute.  A command that starts a training script (``launch.programs`` knows the
launchers and wrappers) is a candidate launch; it is taken apart by ``walk.parse_launch_command``
in the environment the script would give it (the caller's environment, the script's exports,
and -- where the caller's environment has none -- the ``SLURM_*`` variables that the file's
``#SBATCH`` headers would make Slurm set).  When several run, the one starting a
``pretrain*.py`` through a distributed launcher is the launch.

Each Megatron token keeps the ``file:line`` it was written at (``train.sh:14 --num-layers``);
a token that depends on what cannot be known statically is marked unresolved and a problem
names the ``file:line`` and the variable.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.core.resources import read_input_text
from megatron_estimator.inputs.bash.commands import CommandVisitor, ExecutedCommand
from megatron_estimator.inputs.bash.reader import ShellReader, start_directory
from megatron_estimator.inputs.bash.values import Cause, Field, Origin, causes_of, is_known, text_of
from megatron_estimator.inputs.launch.machine import gpu_count_probe
from megatron_estimator.inputs.launch.command import LaunchCommand
from megatron_estimator.inputs.launch.programs import is_launch_program
from megatron_estimator.inputs.launch.sbatch import SbatchHeaders, read_sbatch
from megatron_estimator.inputs.launch.shell_string import CommandCollector
from megatron_estimator.inputs.launch.walk import parse_launch_command

# The --script-arg option of ``check`` gives the script's arguments.
_SCRIPT_ARGS_ADVICE = "; give them with --script-arg"


def _located_text(segs, fallback: Origin) -> tuple[str, list[Origin]]:
    """Segments joined into one text with an origin per character (a segment without one per
    character lends its first, else ``fallback``, to all of its characters)."""
    chars: list[str] = []
    origins: list[Origin] = []
    for seg in segs:
        chars.append(seg.text)
        if len(seg.origins) == len(seg.text):
            origins.extend(seg.origins)
        else:
            origins.extend((seg.origins[0] if seg.origins else fallback,) * len(seg.text))
    return "".join(chars), origins


@dataclass(frozen=True)
class ScriptToken:
    """One token of the launch command, with where it was written."""

    text: str
    location: str                  # file:line of its first character (for a value: where the value was typed)
    word_location: str             # file:line of the shell word that produced it
    unresolved: str | None = None  # why it could not be resolved (a problem says so too); text is then the source spelling
    via: str | None = None         # the inherited variables it came through: 'SLURM_NNODES=4 from #SBATCH -N 4 (job:2)'
    empty_when_unset: bool = False  # an unquoted word of nothing but unset variables: bash drops it
    opaque: bool = False           # a flag value not known statically (reported or noticed): not converted

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
    notices: tuple[str, ...] = ()              # unknown values that did not stop the check, each with its file:line
    cwd: str | None = None                     # the working directory the launch runs in (the script's cd), if known
    # Variables of the caller's environment the launch does not get (the script unsets them).
    removed_environment: tuple[str, ...] = ()

    @property
    def megatron_argv(self) -> tuple[str, ...]:
        return tuple(t.text for t in self.megatron_tokens)

    @property
    def megatron_locations(self) -> tuple[str, ...]:
        return tuple(t.location for t in self.megatron_tokens)

    @property
    def opaque_indexes(self) -> frozenset[int]:
        """The Megatron tokens whose value is not known statically (reported or noticed already)."""
        return frozenset(i for i, t in enumerate(self.megatron_tokens) if t.opaque)

    @property
    def environment_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.environment if v.value is not None}

    @property
    def script(self) -> str | None:
        return self.command.script


@dataclass
class _Candidate:
    command: LaunchCommand
    problems: tuple
    tokens: tuple                  # ScriptToken per command.tokens entry
    origin: Origin
    conditions: tuple
    exports: dict                  # name -> Var, exported at the launch
    temp_env: dict                 # name -> (segs, origin): VAR=x on the launch line
    sbatch: SbatchHeaders | None = None  # the #SBATCH lines of the here-document sbatch reads it from
    cwd: str | None = None         # the working directory the launch runs in, as the walk knows it
    removed: tuple = ()            # the caller's environment variables the script unset before it


class _UnderLauncher(CommandVisitor):
    """The commands of a script that a launcher (``srun ... bash -s``) runs in each of its
    tasks: a command that starts a training script is the launcher's fields followed by its own
    (``srun -N 2 --ntasks-per-node 8`` + ``python pretrain_gpt.py ...``), each word where it is
    written; every other command and note goes to the loader unchanged."""

    def __init__(self, loader: "_Loader", prefix: Sequence[Field]):
        self.loader = loader
        self.prefix = tuple(prefix)

    def command(self, command: ExecutedCommand) -> None:
        fields = command.fields
        starts = command.resolved and fields and (
            is_launch_program(fields[0].text) or any(_ENTRY_NAME.match(os.path.basename(f.text)) for f in fields))
        self.loader.command(replace(command, fields=self.prefix + tuple(fields)) if starts else command)

    def note(self, origin: Origin, message: str) -> None:
        self.loader.note(origin, message)


@dataclass
class _Note:
    origin: Origin
    message: str


_ENTRY_NAME = re.compile(r"pretrain\w*\.py$")     # an entry script's name: pretrain_gpt.py


_DISTRIBUTED = frozenset({"torchrun", "torch.distributed.run", "torch.distributed.launch", "ft_launcher", "srun",
                          "mpirun", "mpiexec", "orterun", "prterun"})


class _Loader(CommandVisitor):
    """The launch side of one read: told of each command the script runs, it keeps those that
    start a training script (the candidates), then chooses the launch and builds the result."""

    def __init__(self, display: str, environ: Mapping[str, str], cwd: str):
        self.display = display
        self.environ = environ
        self.cwd = cwd
        self.candidates: list[_Candidate] = []
        self.notes: list[_Note] = []
        self.unresolved_launches: list = []
        self.problems = ProblemCollector()
        self.env_phrases: dict[str, str] = {}
        self.token_causes: dict[int, list[Cause]] = {}
        self.world_size_given = False      # the caller gives the world size: the launcher's need not resolve
        self.release = "main"              # the label of the release whose flags the launch passes
        self.notices: list[str] = []       # what could not be known and did not matter, file:line first
        self.reader = ShellReader(display, cwd, self, self.problems)
        self.last_command: ExecutedCommand | None = None
        # (command, the next one) where the next one's program is a flag: a line that lost its `\`
        self.flag_commands: list[tuple[ExecutedCommand, ExecutedCommand]] = []

    # ---- what the shell reader reports ---------------------------------------------------

    def note(self, origin: Origin, message: str) -> None:
        self.notes.append(_Note(origin, message))

    def command(self, command: ExecutedCommand) -> None:
        previous, self.last_command = self.last_command, command
        if previous is not None and command.fields and command.fields[0].text.startswith("--"):
            self.flag_commands.append((previous, command))     # bash: `--flag`: command not found
        if command.resolved:
            if command.stdin is not None and self.run_here_document(command):
                return
            self.consider_launch(command)
            return
        fields = command.fields
        if any(f.text.endswith(".py") for f in fields[1:]) or any(is_launch_program(f.text) for f in fields[1:]):
            cause = fields[0].causes[0]
            self.notes.append(_Note(command.origin, (
                f"the command at {command.origin} starts with `{fields[0].text}`, which cannot be resolved statically: "
                f"{cause.message}")))
            self.unresolved_launches.append((command.origin, cause, fields[0]))

    def run_here_document(self, command: ExecutedCommand) -> bool:
        """A here-document fed to a shell that reads its script from standard input (``bash``,
        ``sh``, ``bash -s``, ``srun ... bash -s``) or to ``sbatch`` without a script file: the body
        is that script, so it is read as one, each of its lines where it is written; for sbatch
        its ``#SBATCH`` lines are the job's (they make the ``SLURM_*`` variables the job starts
        with).  False: the command reads its standard input some other way."""
        argv = command.argv
        reader_at = _stdin_script_reader(argv)
        if reader_at is None:
            return False
        text, origins = _located_text(command.stdin, command.origin)
        env, _origins = self.launch_env(command)
        kind, index = reader_at
        positional = [argv[index]]
        if kind == "shell":
            positional += list(argv[index + 1:][_shell_options_end(argv[index + 1:]):])
        sbatch = None
        if kind == "sbatch":
            starts = [0] + [k + 1 for k, c in enumerate(text) if c == "\n" and k + 1 < len(text)]
            sbatch, problems = read_sbatch(text, self.display, [origins[k] for k in starts],
                                           (argv[1:], str(command.origin)))
            self.problems.extend(problems)
            for name, (value, phrase) in sbatch.slurm_environment().items():
                env[name] = value
                self.env_phrases[name] = phrase
        first = len(self.candidates)
        # ``srun ... bash -s``: srun starts its tasks, each running the body; a launch in the body
        # runs under srun's options (its world size), as if written after them.
        visitor = _UnderLauncher(self, command.fields[:index]) if kind == "shell" and index > 0 else self
        problems = self.reader.run_string(text, origins, env, positional, visitor)
        self.problems.extend(problems)
        if sbatch is not None:
            for k in range(first, len(self.candidates)):
                self.candidates[k] = replace(self.candidates[k], sbatch=sbatch)
        return True

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
        droppable = (f.uncertain and all(s.text == "" if s.cause is None else s.cause.fallback == "" for s in f.segs)) \
            or (f.text in ("$@", "$*") and bool(causes) and all(c.subject == f.text and c.fallback == "" for c in causes))
        token = ScriptToken(f.text, location, word_location, reason, via, droppable)
        if causes:
            self.token_causes[id(token)] = list(causes)
        return token

    def launch_env(self, command: ExecutedCommand) -> tuple[dict[str, str], dict[str, str]]:
        env: dict[str, str] = {}
        origins: dict[str, str] = {}
        for name, var in command.variables.items():
            if not var.exported or not isinstance(var.value, tuple) or not is_known(var.value):
                continue
            env[name] = text_of(var.value)
            if var.origin is not None:
                origins[name] = f"exported at {var.origin}"
            elif name in self.env_phrases:
                origins[name] = self.env_phrases[name]
        for name, (segs, origin) in command.assignments.items():
            if is_known(segs):
                env[name] = text_of(segs)
                origins[name] = f"set on the launch line at {origin}"
            else:
                env.pop(name, None)
        return env, origins

    def consider_launch(self, executed: ExecutedCommand) -> None:
        fields = executed.fields
        first = fields[0].text
        if not is_launch_program(first) and not any(_ENTRY_NAME.match(os.path.basename(f.text)) for f in fields):
            return
        tokens = [self.script_token(f) for f in fields]
        env, origins = self.launch_env(executed)
        splitter = self.make_splitter(executed)
        command, problems = parse_launch_command(
            [t.text for t in tokens], env, locations=tokens, env_origins=origins, split_command_string=splitter)
        if command.script is None:
            reason = next((p.message for p in problems if p.code == "no-training-script"), "")
            self.notes.append(_Note(executed.origin, f"the command at {executed.origin} starts no training script: {reason}"))
            return
        exports = {n: v for n, v in executed.variables.items() if v.exported and v.origin is not None}
        # Inside a here-document or sh -c string the shell starts from the known part of the
        # environment the outer script gave it: a variable missing there was unset by the script
        # (or made unknown by it: then the launch is not given the caller's stale value either).
        removed = executed.removed(n for n in self.environ if n not in executed.assignments)
        self.candidates.append(_Candidate(
            command, tuple(p for p in problems), tuple(command.locations or ()), executed.origin,
            tuple(executed.conditions), exports, dict(executed.assignments), cwd=executed.cwd, removed=removed))

    def make_splitter(self, executed: ExecutedCommand):
        """Reads a ``sh -c`` string of this command with the same reader, each character where it was written."""
        loader = self
        fields = executed.fields

        def split(string: str, env: Mapping[str, str], positional: Sequence[str], location):
            field_ = next((f for f in fields if f.text == string), None)
            if field_ is not None:
                text, text_origins = _located_text(field_.segs, Origin(loader.display, 0))
            else:
                at = executed.last_line or Origin(loader.display, 0)
                text, text_origins = string, [at] * len(string)
            collector = CommandCollector(loader.script_token, loader.note)
            problems = loader.reader.run_string(text, text_origins, env, positional, collector)
            return tuple(collector.commands), problems

        return split

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
            if self.reader.exit_note:
                details.insert(0, self.reader.exit_note + " before it reaches a launch")
            if details:
                message += "; " + "; ".join(details[:4])
            self.problems.add("no-launch-line", self.display, message)
            for _origin, cause, _field in self.unresolved_launches[:4]:
                self.problems.add(cause.code, f"{cause.origin} {cause.subject}", cause.message)
            return None

        def rank(c: _Candidate) -> tuple[bool, bool]:
            script = c.command.script or ""
            entry = bool(_ENTRY_NAME.match(os.path.basename(script))) or (c.command.script_is_module and "pretrain" in script)
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

    def judge_unknowns(self, megatron: Sequence[ScriptToken], script: str | None = None,
                       is_module: bool = False) -> tuple[ScriptToken, ...]:
        """The Megatron tokens as the launch passes them: each unknown part is a problem where
        it reaches a value that changes validation or memory, a notice elsewhere
        (``launch.unknowns``); an unset variable in the place of a flag is no word at all.  A
        framework's entry program ``script`` (inputs/frameworks) gives its own flags' arity."""
        from megatron_estimator.inputs.launch.unknowns import framework_specs, token_roles, why_irrelevant

        texts = [t.text for t in megatron]
        extra = framework_specs(script, is_module, texts, self.release) if script is not None and self.token_causes else ()
        own = {o for spec in extra for o in spec.option_strings}
        kept: list[ScriptToken] = []
        for token, role in zip(megatron, token_roles(texts, extra, self.release)):
            causes = self.token_causes.get(id(token), ())
            if not causes:
                kept.append(token)
                continue
            unset = all(c.fallback == "" for c in causes)
            if role.spec is not None and unset and token.empty_when_unset and role.spec.nargs in ("*", "+"):
                # One of a list of values: bash drops the empty word and the flag keeps the others.
                for cause in causes:
                    self.notice(cause, f"{role.option} at {token.word_location} gets no value from `{token.text}` "
                                       "(bash drops the empty word)")
                continue
            if role.spec is None and role.option is not None and not token.text.startswith("-"):
                for cause in causes:     # Megatron's validation and memory never read the script's own flags
                    self.notice(cause, f"{role.option} at {token.word_location}, a flag Megatron does not know "
                                       f"(the entry script's own), gets `{token.text}` from it; the check goes on "
                                       "without it")
                kept.append(replace(token, opaque=True) if role.option in own else token)
                continue
            if role.spec is None:
                if unset and token.empty_when_unset:
                    for cause in causes:
                        self.notice(cause, f"the launch at {token.word_location} gets no word from `{token.text}`")
                    continue
                for cause in causes:
                    self.cause_problem(cause, token, "token")
                kept.append(token)
                continue
            why = why_irrelevant(role.spec)
            if why is None:
                for cause in causes:
                    self.cause_problem(cause, token, "token")
            else:
                for cause in causes:
                    self.notice(cause, f"{role.option} at {token.word_location} gets `{token.text}` from it ({why}); "
                                       "the check goes on without it")
            kept.append(replace(token, opaque=True))
        return tuple(kept)

    def notice(self, cause: Cause, consequence: str) -> None:
        text = f"{cause.origin} {cause.subject}: {cause.message}; {consequence}"
        if text not in self.notices:
            self.notices.append(text)

    def continuation_problems(self, cand: _Candidate) -> None:
        """A command right after the launch whose program is a flag (``--num-layers 4`` on the
        line after one that lacks its trailing ``\\``): bash runs it on its own (command not found),
        so its words never reach the launch."""
        for previous, orphan in self.flag_commands:
            if previous.origin != cand.origin:
                continue
            at = orphan.origin
            self.problems.add("missing-continuation", str(at), (
                f"line {at.line} starts with a flag ({orphan.fields[0].text}): bash runs it as a command of its "
                f"own (command not found), so its {len(orphan.fields)} word(s) never reach the launch at "
                f"{cand.origin}; is the `\\` missing at the end of line {at.line - 1}?"))

    def build(self, cand: _Candidate, sbatch: SbatchHeaders) -> ScriptLaunch:
        command = cand.command
        tokens: tuple[ScriptToken, ...] = cand.tokens
        self.problems.extend(cand.problems)
        self.continuation_problems(cand)
        script_index = command.script_index
        megatron = self.judge_unknowns(tokens[script_index + 1:] if script_index is not None else (),
                                       command.script, command.script_is_module)
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
            if isinstance(var.value, tuple) and is_known(var.value):
                environment[name] = ScriptEnvVar(name, text_of(var.value), str(var.origin))
            else:
                reason = var.value.message if isinstance(var.value, Cause) else causes_of(var.value)[0].message if isinstance(var.value, tuple) else "an array cannot be exported"
                certain = _certain_path_entries(var.value) if name == "PYTHONPATH" else None
                environment[name] = ScriptEnvVar(name, certain, str(var.origin), reason)
        for name, (segs, origin) in cand.temp_env.items():
            if is_known(segs):
                environment[name] = ScriptEnvVar(name, text_of(segs), str(origin))
            else:
                environment[name] = ScriptEnvVar(name, None, str(origin), causes_of(segs)[0].message)
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
            notices=tuple(self.reader.assumed_guards) + tuple(self.notices),
            cwd=cand.cwd,
            removed_environment=tuple(n for n in cand.removed if n not in environment),
        )


def _certain_path_entries(value) -> str | None:
    """A search path the script exports with an unknown part (``export PYTHONPATH=$ROOT/x:$PYTHONPATH``
    with ``$PYTHONPATH`` unset here): the entries known whatever the job's environment adds,
    ':'-joined, or None when there is none.  An entry that holds an unknown is left out."""
    if not isinstance(value, tuple):
        return None
    entries, current, tainted = [], [], False
    for seg in value:
        pieces = [seg.text] if seg.cause is not None else seg.text.split(":")
        for k, piece in enumerate(pieces):
            if k:
                if current and not tainted:
                    entries.append("".join(current))
                current, tainted = [], False
            if seg.cause is not None:
                tainted = True
            else:
                current.append(piece)
    if current and not tainted:
        entries.append("".join(current))
    entries = [e for e in entries if e]
    return ":".join(entries) if entries else None


@dataclass
class SourcesRead:
    """The files a script sources (``load_launch_script(sources=)``): the paths followed, and in
    words those that could not be (not found, unreadable, a name not known statically, a syntax
    error: bash's ``.`` fails there and the script goes on without them)."""

    followed: list[str] = field(default_factory=list)
    unfollowed: list[str] = field(default_factory=list)


def load_launch_script(
    path: str | os.PathLike,
    environ: Mapping[str, str] | None = None,
    *,
    script_args: Sequence[str] | None = None,
    line: int | None = None,
    world_size_given: bool = False,
    release: str = "main",
    gpus_per_node: int | None = None,
    sources: SourcesRead | None = None,
) -> tuple[ScriptLaunch | None, tuple[Problem, ...]]:
    """Find and resolve the training launch in a bash launch script or sbatch file.

    ``environ``: the environment the script would start with (``os.environ`` when None).
    ``script_args``: the arguments the script would be run with (``$1``...); None: not known,
    so ``$1`` is unset (as bash has it without arguments) and ``"$@"`` is a problem where it
    reaches the launch.
    ``world_size_given``: the caller gives the world size, so the launcher's own process
    counts need not resolve.
    ``line``: the line of the launch command, when the script runs more than one.
    ``release``: the label of the Megatron release whose flags the launch passes.
    ``gpus_per_node``: the GPUs of the node the job runs on, what a command counting them prints
    (``launch.machine``); None: not known.
    ``sources``: when given, filled with the files the script sources (``SourcesRead``).
    The script starts in this process's working directory; ``environ``'s ``PWD`` is its ``$PWD``
    only where it names that directory, as bash has it (``bash.reader.start_directory``).
    Returns the launch (None when no launch could be found) and every problem found.
    """
    display = os.fspath(path)
    environ = dict(os.environ if environ is None else environ)
    try:
        text = read_input_text(display, "script", errors="replace")
    except OSError as exc:
        return None, (Problem("unreadable-file", display, f"cannot read the launch script: {exc.strerror or exc}"),)
    cwd = start_directory(environ.get("PWD"), os.getcwd())
    environ["PWD"] = cwd
    loader = _Loader(display, environ, cwd)
    loader.world_size_given = world_size_given
    loader.release = release
    loader.reader.machine_output = gpu_count_probe(gpus_per_node, loader.notices)
    sbatch, sbatch_problems = read_sbatch(text, display)
    loader.problems.extend(sbatch_problems)
    inherited = dict(environ)
    # Slurm sets SLURM_* in the job from the script's own #SBATCH headers: they describe the
    # job where the checking shell's SLURM_* (an salloc session, a CI runner) do not.
    for name, (value, phrase) in sbatch.slurm_environment().items():
        inherited[name] = value
        loader.env_phrases[name] = phrase
    finished = loader.reader.run_script(text, inherited, script_args, unknown_args_advice=_SCRIPT_ARGS_ADVICE)
    if sources is not None:
        reader = loader.reader
        sources.followed.extend(p for p in reader.sourced_files if p not in sources.followed)
        sources.unfollowed.extend(reader.missing_sources + reader.broken_sources)
    if not finished:
        return None, loader.problems.problems
    candidate = loader.choose(line)
    if candidate is None:
        return None, loader.problems.problems
    launch = loader.build(candidate, candidate.sbatch if candidate.sbatch is not None else sbatch)
    return launch, loader.problems.problems


_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})


def _shell_options_end(args: Sequence[str]) -> int:
    """Where a shell's options end (``-x``, ``-e``, ``-o pipefail``, ``--``); the rest are operands."""
    k = 0
    while k < len(args):
        arg = args[k]
        if arg == "--":
            return k + 1
        if not arg.startswith(("-", "+")) or arg in ("-", "+"):
            return k
        if arg in ("-o", "+o", "-O", "+O"):
            k += 1
        k += 1
    return k


def _stdin_script_reader(argv: Sequence[str]) -> tuple[str, int] | None:
    """("shell", i) when argv[i] is a shell that reads its script from standard input (no ``-c``,
    no script file, or ``-s``: bash(1)), reached directly or through ``srun``; ("sbatch", 0) for
    sbatch with no script file and no ``--wrap`` (sbatch(1) then reads the script from standard
    input); None otherwise."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name == "sbatch":
        args = argv[1:]
        k = 0
        while k < len(args):
            arg = args[k]
            if arg.startswith("--wrap"):
                return None
            if not arg.startswith("-"):
                previous = args[k - 1] if k else ""
                takes_value = previous.startswith("-") and "=" not in previous and (
                    len(previous) == 2 or previous.startswith("--"))
                if not takes_value:
                    return None             # a script file: the here-document is not its script
            k += 1
        return "sbatch", 0
    start = 0
    if name == "srun":
        start = next((k for k in range(1, len(argv)) if os.path.basename(argv[k]) in _SHELLS), None)
        if start is None:
            return None
    elif name not in _SHELLS:
        return None
    args = list(argv[start + 1:])
    end = _shell_options_end(args)
    options = args[:end]
    if any(o.startswith("-") and not o.startswith("--") and "c" in o[1:] for o in options if o not in ("-o", "-O")):
        return None
    if end < len(args) and not any(o.startswith("-") and not o.startswith("--") and "s" in o[1:] for o in options):
        return None                         # a script file is the script
    return "shell", start
