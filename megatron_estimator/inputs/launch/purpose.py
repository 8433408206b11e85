"""Whether a launch script starts training, told by the entry program it runs (``check --skip-unknown``).

The pre-commit hook checks every shell file of a repository; one that starts no training
(a text generation server, an inference example, a checkpoint converter, an evaluation) is
skipped with the reason, never failed.  The decision is the entry program's, not the script's
name:

- the launch the script runs is found as ``check`` finds it (``script.load_launch_script``);
  where none is found (the script stops before it in this environment, or runs it in a way
  the reader cannot follow), the programs the script's commands name (``x.py``, ``-m pkg.mod``)
  stand for it;
- a Megatron-LM training entry script (``entry_script.ENTRY_SCRIPTS``, README "Model families
  and entry scripts") trains: the file is checked;
- one of Megatron-LM's programs that train nothing (``NON_TRAINING``, by the end of its path),
  or a readable script that imports Megatron's inference packages and never calls
  ``pretrain(``, trains nothing: the file is skipped, naming the program;
- a framework's training entry program (``inputs/frameworks``: slime's ``train.py`` with slime's
  flags, Pai-Megatron-Patch's ``examples/*/pretrain_*.py``, an NPU fork's) is checked, even
  where its model flags come from a file the reader cannot follow: ``check`` says why;
- any other program (a custom script) is checked, as ``check`` reads it;
- a script that names a training entry script but whose launch cannot be found (it exits
  before it in this environment) is checked, so ``check`` says why: a training launch is never
  passed over.
"""

from __future__ import annotations

import os
import re
from typing import Mapping
from megatron_estimator.core.resources import read_input_text

# Megatron-LM's programs that start no training, by the end of their path (core_v0.8.0 ... main
# d98e8a64; the tasks/ and detxoify_lm/ ones are of the older releases): what each does.
NON_TRAINING: tuple[tuple[str, str], ...] = (
    ("tools/run_text_generation_server.py", "a text generation server"),
    ("tools/run_hybrid_text_generation_server.py", "a text generation server (hybrid models)"),
    ("tools/run_mamba_text_generation_server.py", "a text generation server (Mamba models)"),
    ("tools/run_vlm_text_generation.py", "vision-language text generation"),
    ("tools/text_generation_cli.py", "a text generation client"),
    ("tools/checkpoint/convert.py", "a checkpoint converter"),
    ("tools/checkpoint/util.py", "a checkpoint converter"),
    ("tools/preprocess_data.py", "data preprocessing"),
    ("multimodal/run_text_generation.py", "multimodal text generation"),
    ("detxoify_lm/generate_samples_gpt.py", "text generation"),
    ("tasks/msdp/main.py", "MSDP prompting and evaluation"),
    ("post_training/modelopt/generate.py", "ModelOpt text generation"),
    ("post_training/modelopt/mmlu.py", "an MMLU evaluation"),
    ("post_training/modelopt/quantize.py", "ModelOpt quantization"),
    ("post_training/modelopt/export.py", "a ModelOpt checkpoint export"),
    ("post_training/modelopt/convert_model.py", "a ModelOpt checkpoint conversion"),
    ("post_training/modelopt/prune.py", "ModelOpt pruning"),
    ("post_training/modelopt/validate.py", "a ModelOpt validation"),
    ("post_training/modelopt/offline_feature_extract.py", "ModelOpt feature extraction"),
    ("examples/inference/", "an inference example"),
)

# The packages an inference program imports (megatron/core/inference, megatron/inference).
_INFERENCE_IMPORT = r"^\s*(?:from|import)\s+megatron(?:\.core)?\.inference\b"
_PRETRAIN_CALL = r"(?<![\w.])(?:\w+\.)*pretrain\s*\("
# A program a command names: a *.py path, or a module after -m (not the launchers' own).
_PROGRAM = r"(?:^|[\s\"'=;(])([^\s\"'=;()|&<>]*\.py)(?![\w.])|(?<![\w-])-m\s+([A-Za-z_][\w.]*)"
_LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "debugpy"})


def _path_of(program: str, is_module: bool) -> str:
    path = program.replace(".", "/") + ".py" if is_module else program.replace("\\", "/")
    return "/" + path.lstrip("./")


def _known_tail(path: str) -> str:
    """The part of a path after its last variable (``${SCRIPT_DIR}/finetune.py`` -> ``/finetune.py``)."""
    cut = max(path.rfind("}"), path.rfind("$"))
    if cut < 0:
        return path
    rest = path[cut + 1:]
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/" + rest


def _matches(tail: str, key: str) -> bool:
    key = "/" + key
    if key.endswith("/"):
        return key in tail + ("/" if not tail.endswith("/") else "")
    return tail.endswith(key) or key.endswith(tail)


def classify(program: str, is_module: bool = False, found: str | None = None) -> tuple[str, str]:
    """("training" | "none" | "unknown", what it is) for the entry program ``program`` (as the
    launch names it; ``found``: its file, when it could be found)."""
    from megatron_estimator.inputs.entry_script import ENTRY_SCRIPTS

    tail = _known_tail(_path_of(program, is_module))
    for key, _family, builds in ENTRY_SCRIPTS:
        if _matches(tail, key):
            return "training", f"it trains {builds}"
    for key, what in NON_TRAINING:
        if _matches(tail, key):
            return "none", what
    from megatron_estimator.inputs.frameworks import non_training_program

    theirs = non_training_program([p for p in (found, program if not is_module else None) if p])
    if theirs is not None:
        return "none", f"{theirs[1]} ({theirs[0].name})"
    if found is not None:
        try:
            source = read_input_text(found, "python", errors="replace")
        except OSError:
            return "unknown", "a script that could not be read"
        if re.search(_INFERENCE_IMPORT, source, re.MULTILINE) and not re.search(_PRETRAIN_CALL, source):
            return "none", "an inference program (it imports megatron's inference package and never calls pretrain())"
    return "unknown", "not a Megatron-LM training entry script"


def named_programs(code: str) -> list[tuple[str, bool]]:
    """The programs the commands of ``code`` (comments removed) name: (path or module, is_module)."""
    names: list[tuple[str, bool]] = []
    for match in re.finditer(_PROGRAM, code):
        if match.group(1):
            names.append((match.group(1), False))
        elif match.group(2) not in _LAUNCHER_MODULES:
            names.append((match.group(2), True))
    return list(dict.fromkeys(names))


# Flags every Megatron model needs (or --yaml-cfg, which carries them): a launch of a program
# that is not a training entry script trains a Megatron model only with them.
MODEL_FLAG = r"(?<![\w-])--(?:num-layers|hidden-size|num-attention-heads|yaml-cfg)(?![\w-])"
_MODEL_FLAGS = "--num-layers, --hidden-size, --num-attention-heads or --yaml-cfg"


# A word that starts a process that could be the training launch (a fragment has none).
_LAUNCH_WORD = (r"(?<![\w./-])(?:torchrun|srun|mpirun|mpiexec|deepspeed|ft_launcher|python[\d.]*|sbatch|"
                r"torch\.distributed\.run|bash|sh|exec|eval)(?![\w.-])")
# A `.` / `source` command (where a command starts): what the script runs may be in that file.
_SOURCE_COMMAND = r"(?m)(?:^|[;&|({]|\b(?:then|do|else)\b)\s*(?:\.|source)\s+[^\s=;&|)]"


def without_comments(text: str) -> str:
    """A script's text without its comment lines and trailing comments (they say nothing of what it runs)."""
    return "\n".join(line.split(" #", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("#"))


def sources_files(code: str) -> bool:
    """Whether the script (``code``: its text without comments) sources another file."""
    return re.search(_SOURCE_COMMAND, code) is not None


def fragment_reason(code: str, sourced: bool = False) -> str | None:
    """Why a script (``code``: without comments, with the files it sources when ``sourced``) is a
    fragment that launches nothing (no launcher, no python, no program), or None."""
    if re.search(_LAUNCH_WORD, code) is not None or named_programs(code):
        return None
    where = " (no launcher, python or program in it" + (" or in the files it sources)" if sourced else ")")
    if re.search(MODEL_FLAG, code) is not None:
        return "launches nothing: it sets Megatron flags for a script that sources it" + where
    return "launches nothing" + where


def skip_reason(path: str, code: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why ``check --skip-unknown`` passes over the launch script ``path`` (``code``: its text
    without comments), or None to check it.  Where no launch is found, the files the script
    sources count as its text; one that could not be followed (not found from this directory,
    a syntax error: an unfilled template) makes the script "not checked", never skipped."""
    from megatron_estimator.inputs.entry_script import base_directories, find_script_file
    from megatron_estimator.inputs.launch.script import SourcesRead, load_launch_script

    environ = os.environ if environ is None else environ
    sources = SourcesRead()
    launch, _problems = load_launch_script(path, environ, sources=sources)
    if launch is not None and launch.command.script is not None:
        command = launch.command
        dirs = ((launch.cwd,) if launch.cwd else ()) + base_directories(environ, path)
        found = find_script_file(command.script, command.script_is_module, dirs)
        kind, what = classify(command.script, command.script_is_module, found)
        program = f"-m {command.script}" if command.script_is_module else command.script
        if kind == "none":
            start = "starts no Megatron training" if "no Megatron" in what else "starts no training"
            return f"{start}: its launch at {launch.location} runs {program}, {what}"
        if kind == "training" and not sources.unfollowed \
                and not any(re.match(MODEL_FLAG, t) for t in launch.megatron_argv):
            # `python pretrain_gpt.py ${MEGATRON_PARAMS}` with the variable unset here: its caller
            # (a script that sources or submits this one) sets the flags; they are not seen here.
            # (A file sourced by a script argument, `conf/${1}.sh`, may set them: checked, so that
            # --script-arg reaches it.)
            unset = [m.group(1) for n in launch.notices for m in [re.search(r"gets no word from `([^`]+)`", n)] if m]
            if unset:
                return (f"not checked: its launch at {launch.location} runs {program} with none of {_MODEL_FLAGS}; "
                        f"its flags come from {', '.join(dict.fromkeys(unset))}, not set here (set by what runs "
                        "this script: check with it set, or check that script)")
        if kind == "unknown" and re.fullmatch(r"\$(?:\{\w+\}|\w+|[@*])", command.script):   # `python $*`: a wrapper
            return (f"not checked: its launch at {launch.location} runs `{program}`, a program named only when "
                    "it runs (give the script's arguments with --script-arg)")
        framework = _framework_program(command.script, command.script_is_module, found, launch.megatron_argv, dirs) \
            if kind == "unknown" else None
        if framework is not None:     # a framework's training entry program (inputs/frameworks): checked
            why = framework.not_checked(found) if framework.not_checked is not None else None
            if why is None and framework.launch_skip is not None:    # its config decides (verl, NeMo-RL)
                return framework.launch_skip(launch.megatron_argv, found, command.script, base_dirs=dirs)
            return f"not checked: {why}" if why is not None else None
        if kind == "unknown" and not any(re.match(MODEL_FLAG, token) for token in launch.megatron_argv):
            return (f"launches no Megatron training: its launch at {launch.location} runs {program}, {what}, "
                    f"with none of {_MODEL_FLAGS}")
        return None
    for sourced in sources.followed:
        try:
            code += "\n" + without_comments(read_input_text(sourced, "script", errors="replace"))
        except OSError:
            continue
    here = base_directories(environ, path)
    named = [(name, module, *classify(name, module, find_script_file(name, module, here)))
             for name, module in named_programs(code)]
    words = code.split()
    frameworks = [f for f in (_framework_program(n[0], n[1], None, words) for n in named) if f is not None]
    if frameworks and not any(n[2] == "training" for n in named):
        # a framework's launch the reader cannot reach; one it could not check here anyway is said so
        why = next((w for w in (f.not_checked(None) for f in frameworks if f.not_checked is not None) if w), None)
        return f"not checked: {why}" if why is not None else None
    if any(n[2] == "training" for n in named):
        return None       # a training launch the reader cannot reach: check reports why, never a silent pass
    if named and all(n[2] == "none" for n in named):
        return "starts no training: it runs " + "; ".join(f"{n[0]}, {n[3]}" for n in named)
    submitted = _scripts_run(code, base_directories(environ, path))
    if submitted:       # sbatch / bash / srun of another script, which the launch reader does not follow
        return "not checked: it runs " + "; ".join(submitted) + ", which this check does not follow from it"
    if sources.unfollowed:      # what it launches may be in them: said, never passed over
        return ("not checked: what it launches depends on files it sources that could not be followed here: "
                + "; ".join(sources.unfollowed) + " (run the check from the directory the script runs in, with "
                "the files it sources filled in)")
    fragment = fragment_reason(code, sourced=bool(sources.followed))
    if fragment is not None:
        return fragment
    if re.search(MODEL_FLAG, code) is None:
        return f"launches no Megatron training (no training entry script, and none of {_MODEL_FLAGS} in it)"
    return None


# A script another one runs as a program: sbatch / bash / sh / srun [options] FILE.sh.
_RUN_SCRIPT = re.compile(r"(?<![\w./-])(?:sbatch|bash|sh|srun)(?![\w.-])[^\n;|&]*?\s([^\s;|&<>\"'`$]+\.(?:sh|slurm|sbatch))(?![\w.])")

# bash / sh running a script whose name is a variable (`srun ... bash ${1}`).
_RUN_VARIABLE = re.compile(r"(?<![\w./-])(?:bash|sh)\s+\"?\$(?:\{\w+\}|\w+|[@*])\"?(?=\s|$)", re.MULTILINE)


def _scripts_run(code: str, dirs) -> list[str]:
    """The scripts ``code`` runs that launch training or could not be read, in words: a script
    it submits or runs (``sbatch ... SRUN.sh``) that names a Megatron-LM training entry script."""
    found: list[str] = [f"`{m.group(0).strip()}`, a script named only when it runs"
                        for m in _RUN_VARIABLE.finditer(code.replace("\\\n", " "))]
    for name in dict.fromkeys(m.group(1) for m in _RUN_SCRIPT.finditer(code.replace("\\\n", " "))):
        path = next((p for p in ((name,) if os.path.isabs(name) else tuple(os.path.join(d, name) for d in dirs))
                     if os.path.isfile(p)), None)
        if path is None:
            found.append(f"{name} (not found from {', '.join(dirs)})")
            continue
        try:
            text = without_comments(read_input_text(path, "script", errors="replace"))
        except OSError as exc:
            found.append(f"{name} ({exc.strerror or exc})")
            continue
        training = [n for n, module in named_programs(text) if classify(n, module)[0] == "training"]
        if training:
            found.append(f"{name}, which launches {', '.join(training)}")
    return found


def _framework_program(program: str, is_module: bool, found: str | None, argv, dirs=()):
    """The framework whose training entry program ``program`` is (slime's
    train.py with slime's flags, a Pai-Megatron-Patch pretrain script...; inputs/frameworks), or None."""
    from megatron_estimator.inputs.entry_script import known_script
    from megatron_estimator.inputs.frameworks import recognise

    return recognise(program, is_module, found, [w.strip("\"'") for w in argv],
                     known_script(program, is_module) is not None, dirs)

