"""The entry script of a launch: which model family it trains, and the flags it adds.

Megatron-LM trains each model family through its own entry script (the top-level
``pretrain_*.py`` of each release and the ``examples/`` entry points): ``pretrain_gpt.py``
builds a GPT decoder, ``pretrain_hybrid.py`` (and ``pretrain_mamba.py``, its deprecated
wrapper on main; the Mamba script itself before) a hybrid Mamba model, ``pretrain_bert.py``
(``examples/bert/`` on main) BERT, ``pretrain_t5.py`` (``examples/t5/``) T5,
``pretrain_vlm.py`` and ``examples/multimodal/train.py`` LLaVA vision-language models,
``pretrain_vision_{classify,dino,inpaint}.py`` vision transformers, ``examples/mimo/`` MiMo,
``pretrain_retro.py`` RETRO and ``pretrain_ict.py`` the ICT biencoder.  ``model_family`` says
which family a launch trains: from the script's name, else (a custom script) from the
megatron-core model packages the script imports, else from the flags: a hybrid layer pattern
(``--hybrid-layer-pattern``, ``--hybrid-override-pattern``; arguments.py derives a hybrid
model's layers from it) makes a hybrid model, anything else a GPT model.

``read_entry_argv`` reads the Megatron flags after the script.  Flags that Megatron's parser
does not register may be the script's own (its ``extra_args_provider``): when the script
file can be read they are read from it (``inputs.script_flags``, with ``ast``; imported only
then) and parsed with their own arity, so a typo in one is still caught; when it cannot be
read, the unknown flags are reported once, together, naming the script and the setting that
accepts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Collection, Mapping, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.argv import ArgvReading, UnknownFlag, read_megatron_argv
from megatron_estimator.inputs.rawargs import RawArgs

MODELLED_FAMILIES = ("gpt", "hybrid")

# The setting that accepts an unreadable entry script's flags (settings.py ``accept-flags``).
ACCEPT_SETTING = ("to accept such flags, set accept-flags (--accept-flags=--a,--b, MEGATRON_ESTIMATOR_ACCEPT_FLAGS, "
                  "or accept-flags = [\"--a\", \"--b\"] in [tool.megatron-estimator])")
# How close a known flag must be to be named as the likely intended one in the grouped message
# (difflib ratio): a typo (--num-layer), not a flag that merely shares words.
TYPO_RATIO = 0.85

# Megatron-LM's entry scripts, by the end of their path: (family, what the script builds).
# Top-level scripts of the releases (core_v0.8.0 ... main d98e8a64) and examples/ entry points.
ENTRY_SCRIPTS: tuple[tuple[str, str, str], ...] = (
    ("pretrain_gpt.py", "gpt", "a GPT decoder"),
    ("pretrain_gpt_modelopt.py", "gpt", "a GPT decoder (ModelOpt distillation)"),
    ("detxoify_lm/finetune_gpt.py", "gpt", "a GPT decoder"),
    ("post_training/modelopt/finetune.py", "gpt", "a GPT decoder (ModelOpt fine-tuning)"),
    ("train_rl.py", "gpt", "a GPT decoder, or a hybrid model with a hybrid layer pattern"),
    ("pretrain_hybrid.py", "hybrid", "a hybrid Mamba model"),
    ("pretrain_hybrid_flex.py", "hybrid", "a hybrid Mamba model (elastic)"),
    ("pretrain_mamba.py", "hybrid", "a hybrid Mamba model"),
    ("pretrain_bert.py", "bert", "a BERT encoder"),
    ("tasks/main.py", "bert", "a BERT encoder fine-tuned on a downstream task (GLUE, RACE, ORQA)"),
    ("pretrain_t5.py", "t5", "a T5 encoder-decoder"),
    ("pretrain_vlm.py", "multimodal", "a LLaVA vision-language model"),
    ("multimodal/train.py", "multimodal", "a LLaVA vision-language model"),
    ("pretrain_vision_classify.py", "vision", "a vision transformer classifier"),
    ("pretrain_vision_dino.py", "vision", "a DINO vision transformer"),
    ("pretrain_vision_inpaint.py", "vision", "a vision transformer for inpainting"),
    ("tasks/vision/main.py", "vision", "a vision transformer fine-tuned on a downstream task"),
    ("mimo/train.py", "mimo", "a MiMo multimodal model"),
    ("mimo/pretrain_mimo.py", "mimo", "a MiMo multimodal model"),
    ("pretrain_retro.py", "retro", "a RETRO retrieval-augmented decoder"),
    ("pretrain_ict.py", "ict", "an ICT biencoder (two BERT towers)"),
)

# Scripts whose every flag is Megatron's own: no extra_args_provider, or one that adds only the
# nvidia-modelopt flags, which the flag table holds (pretrain_gpt.py, pretrain_hybrid.py; core_v0.8.0
# to main).  They are never read, and a flag unknown to Megatron after them is an error of its own.
MEGATRON_ONLY_FLAGS = ("pretrain_gpt.py", "pretrain_hybrid.py", "pretrain_mamba.py", "pretrain_bert.py",
                       "pretrain_t5.py", "pretrain_retro.py", "pretrain_ict.py", "pretrain_vision_classify.py",
                       "pretrain_vision_dino.py", "pretrain_vision_inpaint.py")

# megatron.core.models.<package> a custom script imports -> the family it builds (first wins:
# a multimodal model holds a GPT language model, so GPT comes last).
MODEL_PACKAGES = (("mimo", "mimo"), ("multimodal", "multimodal"), ("vision", "vision"), ("T5", "t5"),
                  ("bert", "bert"), ("retro", "retro"), ("hybrid", "hybrid"), ("mamba", "hybrid"), ("gpt", "gpt"))

HYBRID_PATTERN_DESTS = ("hybrid_layer_pattern", "hybrid_override_pattern")


@dataclass(frozen=True)
class EntryScript:
    """The entry script of a launch, as far as the launch names it and its file could be read."""

    script: str                                # as the launch names it (a path, or a module with -m)
    location: str                              # where the launch names it (file:line, or <command>)
    is_module: bool = False                    # run with -m (``script`` is a dotted module)
    path: str | None = None                    # the file found for it, if any
    unread_reason: str | None = None           # why its file could not be read (when it was needed)
    model_imports: tuple[str, ...] = ()        # megatron.core.models packages it imports (custom scripts)
    script_flag_count: int = 0                 # flags read from its extra_args_provider
    unread_flags: tuple[str, ...] = ()         # flags unknown to Megatron it may define (file not read)
    framework: str | None = None               # the framework whose entry program it is (inputs/frameworks)
    framework_flags: str | None = None         # where that framework's flags were read
    world_size: int | None = None              # the world size the framework computes from its flags
    world_size_source: str | None = None
    assumptions: tuple[str, ...] = ()          # what the framework's adapter assumed, in words
    environment: tuple[tuple[str, str], ...] = ()   # what the framework sets in its training processes


@dataclass(frozen=True)
class ModelFamily:
    """Which model family a launch trains, and how that was told."""

    name: str                                  # gpt | hybrid | bert | t5 | multimodal | vision | mimo | retro | ict
    source: str                                # how it was told, for the report
    entry: EntryScript | None = None

    @property
    def modelled(self) -> bool:
        return self.name in MODELLED_FAMILIES

    @property
    def entry_script(self) -> str | None:
        return self.entry.script if self.entry is not None else None

    def to_json(self) -> dict:
        return {"family": self.name, "family_source": self.source, "entry_script": self.entry_script}


def _script_path(script: str, is_module: bool) -> str:
    if is_module:
        return script.replace(".", "/") + ".py"
    return script.replace("\\", "/")


def known_script(script: str, is_module: bool = False) -> tuple[str, str, str] | None:
    """Megatron-LM's entry script that ``script`` names: (its table key, family, what it builds)."""
    path = "/" + _script_path(script, is_module).lstrip("./")
    for key, family, builds in ENTRY_SCRIPTS:
        if path.endswith("/" + key):
            return key, family, builds
    return None


def _hybrid_pattern(raw: RawArgs) -> str | None:
    for dest in HYBRID_PATTERN_DESTS:
        if raw.given(dest) and raw.value(dest) is not None:
            return "--" + dest.replace("_", "-")
    return None


def model_family(raw: RawArgs, entry: EntryScript | None = None) -> ModelFamily:
    """The model family of a launch of ``entry`` (None: no entry script, e.g. flags or a
    config file) with the settings ``raw``."""
    pattern = _hybrid_pattern(raw)
    if entry is not None:
        known = known_script(entry.script, entry.is_module)
        name = entry.script
        if known is not None:
            key, family, builds = known
            if family == "gpt" and pattern is not None and key != "pretrain_gpt.py":
                return ModelFamily("hybrid", f"the entry script {name} with {pattern}", entry)
            return ModelFamily(family, f"the entry script {name}, which builds {builds}", entry)
        for package, family in MODEL_PACKAGES:
            if package in entry.model_imports:
                if family == "gpt" and pattern is not None:
                    break
                return ModelFamily(family, f"the entry script {name} imports megatron.core.models.{package}", entry)
        if pattern is not None:
            return ModelFamily("hybrid", f"{pattern} (custom entry script {name})", entry)
        owner = f"{entry.framework}'s entry program" if entry.framework else "a custom entry script"
        return ModelFamily("gpt", f"{owner} ({name}); taken as building a GPT decoder", entry)
    if pattern is not None:
        return ModelFamily("hybrid", pattern, None)
    return ModelFamily("gpt", "no entry script named: Megatron's flags describe a GPT decoder", None)


def find_script_file(script: str, is_module: bool, base_dirs: Sequence[str]) -> str | None:
    """The file of the entry script: an absolute path as is, a relative one (or ``-m`` module)
    under the first of ``base_dirs`` (the working directory, the launch script's directory)
    that holds it."""
    relative = _script_path(script, is_module)
    if os.path.isabs(relative):
        return relative if os.path.isfile(relative) else None
    for base in base_dirs:
        candidate = os.path.join(base, relative)
        if os.path.isfile(candidate):
            return candidate
    return None


def read_entry_argv(argv: Sequence[str], *, script: str, script_location: str, is_module: bool = False,
                    base_dirs: Sequence[str] = (), locations: Sequence[str] | None = None,
                    source: str = "command line", accepted: Collection[str] = (), opaque: Collection[int] = (),
                    release: str, python_path: str = "") -> tuple[RawArgs, tuple[Problem, ...], EntryScript]:
    """The Megatron flags ``argv`` that follow the entry script ``script`` (named at
    ``script_location``): the settings, every problem, and what was learnt of the script.

    A script is read when a flag is unknown to Megatron (its flags then parse with their
    arity), and a custom script always (its imports tell the model family).  After a script of
    Megatron's own that adds no flags (``MEGATRON_ONLY_FLAGS``) an unknown flag is an error of
    its own whatever the reading finds (a modified copy's flags are still accepted); after any
    other, unknown flags the reading cannot rule out are grouped (``_unread``).  ``accepted``:
    option strings the settings accept as the script's own; ``release``: the label of the
    release whose flags Megatron's parser has; ``python_path``: the job's ``PYTHONPATH`` (where a
    framework's argument module may be found)."""
    known = known_script(script, is_module)
    entry = EntryScript(script, script_location, is_module)
    first = read_megatron_argv(argv, locations=locations, source=source, accepted=accepted, opaque=opaque,
                               release=release)
    if known is not None and not first.unknown:
        return first.raw, first.problems, entry
    megatron_only = known is not None and known[0] in MEGATRON_ONLY_FLAGS
    path = find_script_file(script, is_module, base_dirs)
    from megatron_estimator.inputs.frameworks.reading import read_framework_argv

    framework = read_framework_argv(argv, first, entry, path, base_dirs, locations=locations, source=source,
                                    accepted=accepted, opaque=opaque, megatron_script=known is not None,
                                    accept_setting=ACCEPT_SETTING, release=release, python_path=python_path)
    if framework is not None:
        return framework
    if path is None and megatron_only:
        return first.raw, first.problems, entry
    if path is None:
        entry = EntryScript(script, script_location, is_module, unread_reason="no such file"
                            + (f" under {', '.join(dict.fromkeys(base_dirs))}" if base_dirs else ""))
        return _unread(first, entry, known)
    from megatron_estimator.inputs.script_flags import read_script_flags

    found = read_script_flags(path, search_dirs=base_dirs)
    if megatron_only and (not found.readable or not found.specs):
        return first.raw, first.problems, entry
    if not found.readable:
        return _unread(first, EntryScript(script, script_location, is_module, path=path, unread_reason=found.error), known)
    entry = EntryScript(script, script_location, is_module, path=path, model_imports=found.model_imports,
                        script_flag_count=len(found.specs))
    if not first.unknown:
        return first.raw, first.problems, entry
    second = read_megatron_argv(argv, locations=locations, source=source, script_flags=found.specs, opaque=opaque,
                                accepted=accepted, release=release)
    if found.incomplete is not None and not megatron_only:
        # The rest may be flags the part not read registers: not typos for certain.
        return _unread(second, replace(entry, unread_reason=f"only in part: {found.incomplete}"), known)
    return second.raw, second.problems, entry


def _unread(reading: ArgvReading, entry: EntryScript, known: tuple[str, str, str] | None
            ) -> tuple[RawArgs, tuple[Problem, ...], EntryScript]:
    """The unknown flags of a launch whose entry script could not be read, as one problem; for
    a script of a family the estimator does not model, as none (``EntryScript.unread_flags``
    carries them into the one ``unsupported-model`` problem, config/family.py)."""
    if not reading.unknown:
        return reading.raw, reading.problems, entry
    unread = tuple(dict.fromkeys(u.spelled for u in reading.unknown))
    entry = replace(entry, unread_flags=unread)
    fold = known is not None and known[1] not in MODELLED_FAMILIES
    grouped = None if fold else unknown_flags_problem(reading.unknown, entry)
    dropped = {id(u.problem) for u in reading.unknown}
    problems: list[Problem] = []
    for problem in reading.problems:
        if id(problem) in dropped:
            if grouped is not None and grouped not in problems:
                problems.append(grouped)
            continue
        problems.append(problem)
    return reading.raw, tuple(problems), entry


def unknown_flags_problem(unknown: Sequence[UnknownFlag], entry: EntryScript) -> Problem:
    """One ``unknown-flag`` problem for every flag unknown to Megatron after an entry script
    that could not be read, located at the first of them."""
    import difflib

    spelled: dict[str, tuple[str, ...]] = {}
    for flag in unknown:
        normalized = "--" + flag.spelled.lstrip("-").replace("_", "-")
        spelled.setdefault(flag.spelled, tuple(
            s for s in flag.suggestions if difflib.SequenceMatcher(None, normalized, s).ratio() >= TYPO_RATIO))
    names = ", ".join(f"{flag} (did you mean {' or '.join(hint)}?)" if hint else flag
                      for flag, hint in spelled.items())
    count = len(spelled)
    why = entry.unread_reason or "unreadable"
    message = (f"{count} flag{'s' if count != 1 else ''} unknown to Megatron: {names}; "
               f"{'they' if count != 1 else 'it'} may belong to the entry script {os.path.basename(entry.script)}, "
               f"which could not be read ({why}); {ACCEPT_SETTING}")
    return Problem("unknown-flag", unknown[0].problem.location, message)


def entry_script_location(locations: Sequence[str] | None, index: int | None, script: str) -> str:
    """Where a launch names its entry script: its token's file:line, else the script as named."""
    if locations is not None and index is not None and 0 <= index < len(locations):
        return str(locations[index])
    return script


def base_directories(environ: Mapping[str, str], launch_file: str | None = None) -> tuple[str, ...]:
    """Where a relative entry script may be: the working directory (the process's, where ``run``
    execs the launch, then ``PWD`` where it differs), then the launch script's own directory."""
    dirs = [os.getcwd()]
    if environ.get("PWD") and os.path.isdir(environ["PWD"]):
        dirs.append(os.path.abspath(environ["PWD"]))
    if launch_file is not None:
        dirs.append(os.path.dirname(os.path.abspath(launch_file)))
    return tuple(dict.fromkeys(dirs))
