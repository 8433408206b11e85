"""The walk through a launch command, from its first token to the training script.

``parse_launch_command(argv)`` (see ``command`` for what it reads) dispatches on each program:
python, wrappers that run the rest of the command (``env``, ``numactl``, ``nsys profile``,
``taskset``, ``nohup``, ``time``, ``timeout``, ``stdbuf``, ``nice``, ``uv run``,
``singularity exec``), ``sh -c`` strings, and the launchers of ``launchers``.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Mapping, Sequence

from megatron_estimator.inputs.launch.command import CommandStringSplitter

from megatron_estimator.core.problems import Problem, ProblemCollector
from megatron_estimator.inputs.launch.command import COMMAND_LOCATION, TORCHRUN_FAMILY, LaunchCommand
from megatron_estimator.inputs.launch.launchers import DistributedLaunchers
from megatron_estimator.inputs.launch.programs import (
    BASH_LONG_FLAGS, BASH_VALUE_OPTIONS, CONTAINER_EXEC, FT_LAUNCHER, MPI_NAMES, NSYS, PYTHON_FLAGS, PYTHON_LONG_FLAGS,
    PYTHON_NAME, RAY_JOB_SUBMIT, SHELLS, SIMPLE_WRAPPERS, TASKSET, TIMEOUT, TORCH_LAUNCH, TORCHRUN, UV_RUN, Opt, Options, ParsedOptions,
    is_known_program, program_name,
)


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")     # NAME=value (an ASCII name)


def parse_launch_command(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    locations: Sequence[object] | None = None,
    env_origins: Mapping[str, str] | None = None,
    split_command_string: CommandStringSplitter | None = None,
) -> tuple[LaunchCommand, tuple[Problem, ...]]:
    """Take a launch command apart (see the module docstring).

    ``environ`` is the environment the command would run in (``os.environ`` when None).
    ``locations`` (one per token) and ``env_origins`` (variable -> phrase such as
    ``from #SBATCH --nodes=2 (job.sbatch:3)``) make messages and sentences say where things
    were written.  A location is a string (``train.sh:14``) or any object whose ``str()`` is
    one; it is handed back untouched in ``LaunchCommand.locations``.  A location object with
    a true ``unresolved`` attribute (a reason) marks a token that is not known statically:
    it is never read as a count or a program; a ``via`` attribute (where the value was set)
    is added to the world-size sentence.  ``split_command_string`` reads ``sh -c`` strings;
    by default the static shell reader (``shell_string.split_command_string``), so the string
    means what bash would make of it.
    """
    argv = tuple(argv)
    if locations is not None and len(locations) != len(argv):
        raise ValueError("locations must have one entry per argv token")
    walk = _Walk(
        argv,
        tuple(locations) if locations is not None else None,
        dict(os.environ if environ is None else environ),
        dict(env_origins or {}),
        split_command_string,
    )
    return walk.run()


class _Walk(DistributedLaunchers):
    """Walks a command from its first token to the training script (the launchers that start
    processes, torchrun, srun and mpirun, are in ``DistributedLaunchers``)."""

    def __init__(self, argv, locations, env, env_origins, splitter):
        self.argv = argv
        self.tokens: list[str] = list(argv)
        self.locs: list | None = list(locations) if locations is not None else None
        self.env: dict[str, str] = env
        self.env_origins: dict[str, str] = env_origins
        self.assigned: dict[str, str] = {}        # set by the command itself
        self.assigned_by: dict[str, str] = {}     # variable -> the program that set it
        self.splitter = splitter
        self.chain: list[str] = []
        self.problems = ProblemCollector()
        # (kind, world size or None, sentence, token indices read) of every program that starts processes
        self.spawners: list[tuple[str, int | None, str, tuple[int, ...]]] = []
        self.read: list[int] = []      # token indices read by the world-size computation under way
        self.unknown_program: str | None = None
        self.script: str | None = None
        self.script_index: int | None = None
        self.is_module = False
        self.launcher: str | None = None
        self.failure: str | None = None          # why no script was found

    # ---- helpers ---------------------------------------------------------------------

    def loc(self, index: int | None) -> str:
        if self.locs is not None and index is not None and 0 <= index < len(self.locs):
            return str(self.locs[index] or "")
        return ""

    def where(self, index: int | None, spelled: str) -> str:
        """Problem location for an option: its spelling, prefixed by its file:line if known."""
        loc = self.loc(index)
        return f"{loc} {spelled}" if loc else spelled

    def at(self, index: int | None) -> str:
        """' (train.sh:14)' for a sentence, when token locations are known."""
        loc = self.loc(index)
        return f" ({loc})" if loc else ""

    def said(self, opt: "Opt") -> str:
        """An option as a sentence names it: '--nnodes 2 (train.sh:14)'; with where a value
        that came through a variable was set, when the location object says (its ``via``)."""
        loc = self.loc(opt.index)
        via = None
        if self.locs is not None and opt.value_index is not None and opt.value_index < len(self.locs):
            via = getattr(self.locs[opt.value_index], "via", None)
        where = ", ".join(x for x in (loc, via) if x)
        return f"{opt.spelled} {opt.value}" + (f" ({where})" if where else "")

    def unresolved(self, index: int | None) -> str | None:
        """Why token ``index`` is not known statically (from its location object), or None."""
        if self.locs is not None and index is not None and 0 <= index < len(self.locs):
            return getattr(self.locs[index], "unresolved", None) or None
        return None

    def set_env(self, name: str, value: str, by: str) -> None:
        self.env[name] = value
        self.assigned[name] = value
        self.assigned_by[name] = by

    def env_phrase(self, name: str) -> str:
        value = self.env[name]
        if name in self.assigned:
            return f"{name}={value} set by {self.assigned_by[name]} on the command"
        origin = self.env_origins.get(name)
        if origin:
            return f"{name}={value} {origin}"
        return f"{name}={value} in the environment"

    def env_int(self, name: str) -> int | None:
        """An integer environment variable; a problem when it is set but not a positive integer."""
        raw = self.env.get(name)
        if raw is None or raw.strip() == "":
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
        if value is None or value <= 0:
            self.problems.add("invalid-launch-environment", name,
                              f"{name}={raw!r} is not a positive integer")
            return None
        return value

    def fail(self, message: str) -> None:
        self.failure = message

    def parse_options(self, start: int, spec: Options, program: str) -> ParsedOptions:
        tokens = self.tokens
        options: list[Opt] = []
        unknown: list[tuple[int, str]] = []
        long_names = sorted(s for s in (*spec.values, *spec.flags, *spec.optional, *spec.pairs) if s.startswith("--"))
        i = start
        while i < len(tokens):
            tok = tokens[i]
            if tok == "--":
                return ParsedOptions(options, i + 1 if i + 1 < len(tokens) else None, unknown)
            if not tok.startswith("-") or tok == "-":
                return ParsedOptions(options, i, unknown)
            if tok.startswith("--") or (spec.single_dash_long and len(tok.partition("=")[0]) > 2):
                name, eq, glued = tok.partition("=")
                spelled = self._match_long(name, spec, long_names, i, program)
                if spelled is None:        # ambiguous: a problem was recorded; skip a value if one follows
                    if eq or i + 1 >= len(tokens) or is_known_program(tokens[i + 1]) or tokens[i + 1].startswith("-"):
                        i += 1
                    else:
                        i += 2
                    continue
                if spelled in spec.pairs:
                    vals = tokens[i + 1:i + 3]
                    if len(vals) < 2:
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} takes two values")
                        return ParsedOptions(options, None, unknown)
                    options.append(Opt(spelled.lstrip("-"), name, vals[1], i, i + 2, tuple(vals)))
                    i += 3
                    continue
                if spelled in spec.values:
                    canonical = spec.values[spelled]
                    if eq:
                        options.append(Opt(canonical, name, glued, i, i))
                        i += 1
                        continue
                    if i + 1 >= len(tokens):
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} needs a value and none follows")
                        return ParsedOptions(options, None, unknown)
                    options.append(Opt(canonical, name, tokens[i + 1], i, i + 1))
                    i += 2
                    continue
                if spelled in spec.flags or spelled in spec.optional:
                    canonical = spec.flags.get(spelled, spelled.lstrip("-"))
                    if eq and spelled not in spec.optional and spec.strict:
                        self.problems.add("invalid-launcher-option", self.where(i, name),
                                          f"{program} {name} is a switch and takes no value (got {glued!r})")
                    options.append(Opt(canonical, name, glued if eq else None, i, i if eq else None))
                    i += 1
                    continue
                # not in the table
                if spec.strict:
                    self.problems.add("invalid-launcher-option", self.where(i, name),
                                      f"{program} has no option {name}")
                unknown.append((i, name))
                if eq or i + 1 >= len(tokens) or is_known_program(tokens[i + 1]) or tokens[i + 1].startswith("-"):
                    i += 1
                else:
                    i += 2      # an unknown option followed by a word that is no program: its value
                continue
            # short options, getopt style: -N2, -lN 2, -uB
            j = 1
            while j < len(tok):
                spelled = "-" + tok[j]
                if spelled in spec.values:
                    rest = tok[j + 1:]
                    if spec.short_equals and rest.startswith("="):
                        rest = rest[1:]
                    if rest:
                        options.append(Opt(spec.values[spelled], spelled, rest, i, i))
                        i += 1
                    elif i + 1 < len(tokens):
                        options.append(Opt(spec.values[spelled], spelled, tokens[i + 1], i, i + 1))
                        i += 2
                    else:
                        self.problems.add("invalid-launcher-option", self.where(i, spelled),
                                          f"{program} {spelled} needs a value and none follows")
                        return ParsedOptions(options, None, unknown)
                    break
                if spelled in spec.flags:
                    options.append(Opt(spec.flags[spelled], spelled, None, i, None))
                elif spec.strict:
                    self.problems.add("invalid-launcher-option", self.where(i, spelled),
                                      f"{program} has no option {spelled}")
                else:
                    unknown.append((i, spelled))
                j += 1
            else:
                i += 1
        return ParsedOptions(options, None, unknown)

    def _match_long(self, name: str, spec: Options, long_names: list[str], index: int, program: str) -> str | None:
        known = (*spec.values, *spec.flags, *spec.optional, *spec.pairs)
        if name in known or not name.startswith("--") or not spec.abbreviations:
            return name
        matches = [n for n in long_names if n.startswith(name)]
        if not matches:
            return name
        canon = {spec.values.get(m) or spec.flags.get(m) or m for m in matches}
        # argparse (torchrun) accepts a prefix of exactly one option string, so `--nproc` (both
        # --nproc-per-node and --nproc_per_node) is ambiguous; getopt_long (srun, ...) accepts a
        # prefix whose matches all mean the same option.
        if len(matches) == 1 or (not spec.strict and len(canon) == 1):
            return matches[0]
        self.problems.add("invalid-launcher-option", self.where(index, name),
                          f"{program} {name} is ambiguous: it could be {', '.join(matches)}")
        return None

    # ---- the walk ----------------------------------------------------------------------

    def run(self) -> tuple[LaunchCommand, tuple[Problem, ...]]:
        if not self.tokens:
            self.fail("the command is empty")
        else:
            self.program(0)
        if self.script is None:
            seen = " ".join(self.tokens[:12]) + (" ..." if len(self.tokens) > 12 else "")
            reason = self.failure or "no training script was found"
            self.problems.add("no-training-script", COMMAND_LOCATION,
                              f"{reason} (the command was: {seen})" if self.tokens else reason)
        world_size, source, used = self.world_size()
        script_index = self.script_index
        command = LaunchCommand(
            argv=self.argv,
            launcher=self.launcher or (self.chain[-1] if self.chain else ""),
            script=self.script,
            script_index=script_index,
            megatron_argv=tuple(self.tokens[script_index + 1:]) if script_index is not None else (),
            world_size=world_size,
            world_size_source=source,
            script_is_module=self.is_module,
            tokens=tuple(self.tokens),
            locations=tuple(self.locs) if self.locs is not None else None,
            launchers=tuple(self.chain),
            environment=tuple(self.assigned.items()),
            world_size_tokens=used,
        )
        return command, self.problems.problems

    def world_size(self) -> tuple[int | None, str, tuple[int, ...]]:
        if self.script is None:
            return None, "no training script was found, so no launcher either", ()
        if self.unknown_program is not None:
            return None, (f"{self.unknown_program} is not a launcher this tool knows, so how many processes "
                          "it starts is unknown"), ()
        torchruns = [s for s in self.spawners if s[0] in TORCHRUN_FAMILY]
        if torchruns:
            return torchruns[-1][1], torchruns[-1][2], torchruns[-1][3]
        if self.spawners:
            return self.spawners[-1][1], self.spawners[-1][2], self.spawners[-1][3]
        # plain python / the script run directly: Megatron reads WORLD_SIZE
        # (megatron/training/arguments.py: int(os.getenv("WORLD_SIZE", '1')))
        size = self.env_int("WORLD_SIZE")
        if size is not None:
            return size, self.env_phrase("WORLD_SIZE"), ()
        if "WORLD_SIZE" in self.env and self.env["WORLD_SIZE"].strip():
            return None, f"WORLD_SIZE={self.env['WORLD_SIZE']!r} is not a positive integer", ()
        what = "plain python" if self.launcher == "python" else "the script run directly"
        return 1, f"{what}: 1 process", ()

    def spawned(self, kind: str, size: int | None, sentence: str) -> None:
        self.spawners.append((kind, size, sentence, tuple(self.read)))
        self.read = []

    def note_read(self, opt: "Opt | None") -> None:
        if opt is not None:
            self.read.append(opt.index)
            if opt.value_index is not None and opt.value_index != opt.index:
                self.read.append(opt.value_index)

    def opaque(self, opt: "Opt", program: str) -> str | None:
        """A sentence when the value of ``opt`` is not known statically, else None."""
        reason = self.unresolved(opt.value_index)
        if reason is None:
            return None
        return f"{program} {self.said(opt)} is not known statically: {reason}"

    def program(self, i: int) -> None:
        """Dispatch on the program at token ``i``."""
        if i is None or i >= len(self.tokens):
            last = self.chain[-1] if self.chain else "the command"
            self.fail(f"{last} is not followed by a program to run")
            return
        tok = self.tokens[i]
        name = program_name(tok)
        reason = self.unresolved(i)
        if reason is not None and not tok.endswith(".py"):
            self.fail(f"the program `{tok}`{self.at(i)} is not known statically: {reason}")
            return
        if tok.endswith(".py"):
            self.chain.append("script")
            self.launcher = self.launcher or "script"
            return self.found(i, module=False)
        if PYTHON_NAME.match(name):
            return self.python(i)
        if name in ("torchrun", "ft_launcher"):
            self.chain.append(name)
            spec = FT_LAUNCHER if name == "ft_launcher" else TORCHRUN
            return self.torchrun(i + 1, name, spec)
        if name == "srun":
            return self.srun(i)
        if name in MPI_NAMES:
            return self.mpirun(i, name)
        if name == "env":
            return self.env_wrapper(i)
        if name in SHELLS:
            return self.shell(i, name)
        if name == "nsys":
            return self.nsys(i)
        if name == "uv":
            return self.uv(i)
        if name == "ray":
            return self.ray(i)
        if name in ("singularity", "apptainer"):
            return self.container(i, name)
        if name in SIMPLE_WRAPPERS:
            return self.simple_wrapper(i, name)
        # A program this tool does not know (deepspeed, accelerate, a site wrapper): the first
        # *.py after it is taken as the script, but how many processes it starts is unknown.
        self.chain.append(name)
        for j in range(i + 1, len(self.tokens)):
            if self.tokens[j].endswith(".py") and not self.tokens[j].startswith("-"):
                self.unknown_program = name
                self.launcher = name
                return self.found(j, module=False)
        self.fail(f"{name} is not python, torchrun or a launcher this tool knows, and no *.py script follows it")

    def found(self, index: int, module: bool) -> None:
        self.script = self.tokens[index]
        self.script_index = index
        self.is_module = module

    # ---- python and torchrun --------------------------------------------------------

    def python(self, i: int) -> None:
        self.chain.append("python")
        tokens = self.tokens
        j = i + 1
        while j < len(tokens):
            tok = tokens[j]
            if tok == "-":
                return self.fail("python reads its program from standard input (-)")
            if tok.startswith("--"):
                name, eq, _ = tok.partition("=")
                if name == "--check-hash-based-pycs":
                    j += 1 if eq else 2
                    continue
                if name in PYTHON_LONG_FLAGS:
                    return self.fail(f"python {name} runs no script")
                return self.fail(f"python has no option {name}")
            if tok.startswith("-") and len(tok) > 1:
                k = 1
                advance = 1
                while k < len(tok):
                    ch = tok[k]
                    if ch in PYTHON_FLAGS:
                        k += 1
                        continue
                    if ch in "WX":
                        advance = 1 if k + 1 < len(tok) else 2
                        break
                    if ch == "c":
                        return self.fail("python -c runs a command string, not a training script")
                    if ch == "m":
                        if k + 1 < len(tok):
                            return self.module(tok[k + 1:], j, glued=True)
                        if j + 1 >= len(tokens):
                            return self.fail("python -m is not followed by a module")
                        return self.module(tokens[j + 1], j + 1, glued=False)
                    return self.fail(f"python has no option -{ch}")
                j += advance
                continue
            # the program file
            if program_name(tok) == "torchrun":
                self.chain.append("torchrun")
                return self.torchrun(j + 1, "torchrun", TORCHRUN)
            self.launcher = self.launcher or "python"
            return self.found(j, module=False)
        return self.fail("python is not given a script")

    def module(self, module: str, index: int, glued: bool) -> None:
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            self.chain.append(module)
            spec = TORCH_LAUNCH if module == "torch.distributed.launch" else TORCHRUN
            return self.torchrun(index + 1, module, spec)
        self.launcher = self.launcher or "python"
        if glued:
            # python -mpkg.mod: the module name shares the token with -m; point at that token
            self.script = module
            self.script_index = index
            self.is_module = True
            return
        return self.found(index, module=True)


    # ---- wrappers -----------------------------------------------------------------------

    def env_wrapper(self, i: int) -> None:
        self.chain.append("env")
        tokens = self.tokens
        parsed_end = i + 1
        j = i + 1
        while j < len(tokens):
            tok = tokens[j]
            if tok in ("-i", "--ignore-environment", "-"):
                for var in list(self.env):
                    del self.env[var]
                self.assigned.clear()
                self.chain[-1] = "env -i"
                j += 1
                continue
            if tok == "--":
                j += 1
                break
            if tok.startswith("-u") or tok.startswith("--unset"):
                if tok in ("-u", "--unset"):
                    var = tokens[j + 1] if j + 1 < len(tokens) else ""
                    j += 2
                else:
                    var = tok[2:] if tok.startswith("-u") and not tok.startswith("--") else tok.partition("=")[2]
                    j += 1
                self.env.pop(var, None)
                self.assigned.pop(var, None)
                continue
            if tok in ("-C", "--chdir"):
                j += 2
                continue
            if tok.startswith("--chdir=") or (tok.startswith("-C") and len(tok) > 2):
                j += 1
                continue
            if tok in ("-S", "--split-string") or tok.startswith("--split-string=") or (tok.startswith("-S") and len(tok) > 2):
                if tok in ("-S", "--split-string"):
                    text, consumed = (tokens[j + 1] if j + 1 < len(tokens) else ""), 2
                elif tok.startswith("--"):
                    text, consumed = tok.partition("=")[2], 1
                else:
                    text, consumed = tok[2:], 1

                pieces = shlex.split(text)
                loc = self.locs[j] if self.locs is not None else None
                self.tokens[j:j + consumed] = pieces
                if self.locs is not None:
                    self.locs[j:j + consumed] = [loc] * len(pieces)
                continue
            if tok.startswith("-") and len(tok) > 1:
                j += 1                 # -0, -v, --debug, --ignore-signal=...: no effect here
                continue
            break
        parsed_end = j
        while parsed_end < len(tokens) and _ASSIGNMENT.match(tokens[parsed_end]):
            var, _, value = tokens[parsed_end].partition("=")
            self.set_env(var, value, "env")
            parsed_end += 1
        if parsed_end >= len(tokens):
            return self.fail("env is not given a program")
        return self.program(parsed_end)

    def simple_wrapper(self, i: int, name: str) -> None:
        self.chain.append(name)
        tokens = self.tokens
        if name in ("nohup", "exec"):
            j = i + 1
            if name == "exec":
                while j < len(tokens) and tokens[j] in ("-c", "-l"):
                    j += 1
                if j < len(tokens) and tokens[j] == "-a":
                    j += 2
            if j < len(tokens) and tokens[j] == "--":
                j += 1
            return self.program(j)
        if name == "taskset":
            parsed = self.parse_options(i + 1, TASKSET, "taskset")
            if parsed.program is None:
                return self.fail("taskset is not given a CPU mask and a program")
            return self.program(parsed.program + 1)      # skip the mask / CPU list
        if name == "timeout":
            parsed = self.parse_options(i + 1, TIMEOUT, "timeout")
            if parsed.program is None:
                return self.fail("timeout is not given a duration and a program")
            return self.program(parsed.program + 1)      # skip the duration
        if name == "nice" and i + 1 < len(tokens) and re.fullmatch(r"-\d+", tokens[i + 1]):
            return self.program(i + 2)                   # nice -10 cmd (old form)
        spec = SIMPLE_WRAPPERS[name]
        parsed = self.parse_options(i + 1, spec, name)
        if parsed.program is None:
            return self.fail(f"{name} is not given a program")
        return self.program(parsed.program)

    def nsys(self, i: int) -> None:
        tokens = self.tokens
        sub = tokens[i + 1] if i + 1 < len(tokens) else ""
        if sub not in ("profile", "launch", "nvprof"):
            self.chain.append("nsys")
            return self.fail(f"nsys {sub} does not run a program (expected nsys profile or nsys launch)")
        self.chain.append(f"nsys {sub}")
        parsed = self.parse_options(i + 2, NSYS, f"nsys {sub}")
        for opt in parsed.all("env-var"):
            for item in (opt.value or "").split(","):
                if "=" in item:
                    var, _, val = item.partition("=")
                    self.set_env(var, val, "nsys --env-var")
        if parsed.program is None:
            return self.fail(f"nsys {sub} is not given a program")
        return self.program(parsed.program)

    def uv(self, i: int) -> None:
        tokens = self.tokens
        if i + 1 >= len(tokens) or tokens[i + 1] != "run":
            self.chain.append("uv")
            sub = tokens[i + 1] if i + 1 < len(tokens) else ""
            return self.fail(f"uv {sub} does not run a training script (expected uv run)".replace("  ", " "))
        self.chain.append("uv run")
        parsed = self.parse_options(i + 2, UV_RUN, "uv run")
        if parsed.program is None:
            return self.fail("uv run is not given a program")
        if parsed.last("module") is not None:
            self.launcher = self.launcher or "python"
            self.chain.append("python")
            return self.module(tokens[parsed.program], parsed.program, glued=False)
        if tokens[parsed.program].endswith(".py"):
            self.chain.append("python")            # uv run x.py runs it with the project's python
            self.launcher = self.launcher or "python"
            return self.found(parsed.program, module=False)
        return self.program(parsed.program)

    def ray(self, i: int) -> None:
        """``ray job submit [options] [--] ENTRYPOINT...``: the entrypoint runs once, as the job's
        driver, with the ``env_vars`` of ``--runtime-env-json`` in its environment; how many
        training processes it then starts is the entrypoint's business (a framework's)."""
        tokens = self.tokens
        if tokens[i + 1:i + 3] != ["job", "submit"]:
            self.chain.append("ray")
            sub = " ".join(tokens[i + 1:i + 3])
            return self.fail(f"ray {sub} does not run a training script (expected ray job submit)")
        self.chain.append("ray job submit")
        parsed = self.parse_options(i + 3, RAY_JOB_SUBMIT, "ray job submit")
        for opt in parsed.all("runtime-env-json"):
            self._ray_env_vars(opt)
        if parsed.program is None:
            return self.fail("ray job submit is not given an entrypoint")
        self.spawned("ray job submit", None, "ray job submit runs its entrypoint as one driver process; how many "
                     "training processes that starts is up to the program")
        self.launcher = "ray job submit"
        return self.program(parsed.program)

    def _ray_env_vars(self, opt: "Opt") -> None:
        import json

        by = "ray job submit --runtime-env-json"
        try:
            runtime_env = json.loads(opt.value or "")
        except ValueError as exc:
            if self.unresolved(opt.value_index) is None:
                self.problems.add("invalid-launcher-option", self.where(opt.index, opt.spelled),
                                  f"{by} is not JSON: {exc}")
            return
        env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
        if not isinstance(env_vars, dict):
            return
        opaque = self.unresolved(opt.value_index)
        for var, value in env_vars.items():
            if not isinstance(value, str):
                continue
            # The string holds a part not known statically (its spelling, ``$X``): only the
            # variables whose value shows no expansion are taken.
            if opaque and ("$" in value or "`" in value):
                self.env.pop(var, None)
                self.assigned.pop(var, None)
                continue
            self.set_env(var, value, by)

    def container(self, i: int, name: str) -> None:
        tokens = self.tokens
        sub = tokens[i + 1] if i + 1 < len(tokens) else ""
        if sub not in ("exec", "run"):
            self.chain.append(name)
            return self.fail(f"{name} {sub} does not run a program this tool can follow (expected {name} exec)")
        self.chain.append(f"{name} {sub}")
        parsed = self.parse_options(i + 2, CONTAINER_EXEC, f"{name} {sub}")
        for opt in parsed.all("env"):
            for item in (opt.value or "").split(","):
                if "=" in item:
                    var, _, val = item.partition("=")
                    self.set_env(var, val, f"{name} --env")
        if parsed.program is None or parsed.program + 1 >= len(tokens):
            return self.fail(f"{name} {sub} is not given an image and a program")
        return self.program(parsed.program + 1)         # skip the image

    def shell(self, i: int, name: str) -> None:
        tokens = self.tokens
        j = i + 1
        has_c = False
        while j < len(tokens):
            tok = tokens[j]
            if tok == "--":
                j += 1
                break
            if tok in BASH_VALUE_OPTIONS:
                j += 2
                continue
            if tok in BASH_LONG_FLAGS:
                j += 1
                continue
            if len(tok) > 1 and tok[0] in "-+" and not tok.startswith("--"):
                if "c" in tok[1:]:
                    has_c = True
                j += 1
                continue
            break
        if not has_c:
            self.chain.append(name)
            if j < len(tokens):
                return self.fail(f"{name} runs the shell script {tokens[j]}; read that file as a launch script")
            return self.fail(f"{name} is not given a command")
        if j >= len(tokens):
            self.chain.append(f"{name} -c")
            return self.fail(f"{name} -c is not given a command string")
        self.chain.append("sh -c")
        string = tokens[j]
        positional = tuple(tokens[j + 1:])
        splitter = self.splitter
        if splitter is None:
            from megatron_estimator.inputs.launch.shell_string import split_command_string as splitter  # the shell reader reads shell source
        string_loc = self.locs[j] if self.locs is not None else None
        commands, problems = splitter(string, dict(self.env), positional, str(string_loc) if string_loc else None)
        self.problems.extend(problems)
        seen = []
        for command in commands:
            if not command.tokens:
                continue
            seen.append(command.tokens[0])
            env = dict(self.env)
            env.update(command.environment)
            trial, _ = parse_launch_command(command.tokens, env, split_command_string=splitter)
            if trial.script is None:
                continue
            prefix = self.tokens[:j]
            self.tokens = prefix + list(command.tokens)
            if self.locs is not None:
                inner = list(command.locations) if command.locations is not None else [string_loc] * len(command.tokens)
                self.locs = self.locs[:j] + inner
            elif command.locations is not None:
                self.locs = [None] * j + list(command.locations)
            for var, value in command.environment:
                self.set_env(var, value, "sh -c")
            return self.program(j)
        if not seen:
            return self.fail(f"{name} -c starts no program, only shell builtins")
        return self.fail(f"{name} -c runs {', '.join(seen)}, and none of it starts a training script")
