"""The file readers, by kind: ``detect.detect_format`` says what a file is, ``READERS`` how to read it.

Every front reads a file through ``read_file`` (and ``check --skip-unknown`` asks ``skip_reason``),
so adding a format is one ``register(FileFormat(kind, read))`` here, with its kind added to
``detect``.  A reader returns a ``FileInput``: raw Megatron settings, or -- for a launch -- the
Megatron flags still to be parsed (``flags``), with what the file says about the run.  Readers
import their modules when called, so choosing one never imports yaml or the shell reader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from megatron_estimator.core.problems import Problem
from megatron_estimator.core.resources import path_string, read_input_text, special_file
from megatron_estimator.inputs.detect import detect_format
from megatron_estimator.inputs.rawargs import RawArgs


@dataclass(frozen=True)
class ReadOptions:
    """What the caller knows about the run a file describes."""

    environ: Mapping[str, str]                 # the environment it would run in
    script_args: Sequence[str] | None = None   # a launch script's arguments (None: not known)
    world_size_given: bool = False             # the caller gives the world size
    release: str = "main"                      # the label of the Megatron release whose flags it holds
    gpus_per_node: int | None = None           # the GPUs of the node a launch script runs on (None: not known)


@dataclass(frozen=True)
class FileInput:
    """What a reader found in a file."""

    raw: RawArgs = field(default_factory=RawArgs)
    problems: tuple[Problem, ...] = ()
    # A launch: the Megatron flags it passes, still to be parsed (with --yaml-cfg honoured), and their file:line.
    flags: tuple[str, ...] | None = None
    flag_locations: tuple[str, ...] | None = None
    opaque_flags: frozenset[int] = frozenset()   # indexes of ``flags`` not known statically (noticed or reported)
    world_size: int | None = None
    world_size_source: str | None = None
    world_size_unknown: Problem | None = None  # the problem when the world size is needed and not known
    # What the job's environment adds to the caller's; None: the job lacks that variable of the
    # caller's (the script unsets it).
    environment: Mapping[str, str | None] = field(default_factory=dict)
    job_environment: bool = False              # the environment is the launched job's
    launch_location: str | None = None         # file:line of a script's launch
    notes: tuple[str, ...] = ()
    entry_script: str | None = None            # a launch's entry script (pretrain_gpt.py), as named
    entry_location: str | None = None          # file:line where the launch names it
    entry_is_module: bool = False              # run with -m
    entry_cwd: str | None = None               # the directory the launch runs in (the script's cd), if known


@dataclass(frozen=True)
class FileFormat:
    kind: str                                               # as detect_format names it
    read: Callable[[str | os.PathLike, ReadOptions], FileInput]
    # why ``check --skip-unknown`` passes over a file of this kind (None: check it)
    skip_reason: Callable[[str | os.PathLike], str | None] | None = None


READERS: dict[str, FileFormat] = {}


def register(fmt: FileFormat) -> FileFormat:
    READERS[fmt.kind] = fmt
    return fmt


_UNKNOWN = ("not a seed-format YAML (sections model:, parallelism:, training:, precision: holding mostly the "
            "seed format's keys), a Megatron --yaml-cfg YAML (top-level "
            "language_model: or model_parallel:), a Megatron-Bridge ConfigContainer YAML (model:, train:, "
            "optimizer:... sections), a launch script or a HuggingFace config.json (model_type or architectures)")


def read_file(path: str | os.PathLike, options: ReadOptions) -> FileInput:
    """Read an existing file (or HF config directory) with the reader of its kind."""
    name = str(path)
    special = special_file(path_string(path))
    if special is not None:
        return FileInput(problems=(Problem("not-a-file", name, special),))
    kind = detect_format(path)
    fmt = READERS.get(kind)
    if fmt is not None:
        return fmt.read(path, options)
    if os.path.isdir(path_string(path)):
        return FileInput(problems=(Problem(
            "unknown-format", name, "is a directory without a HuggingFace config.json; name a file"),))
    return FileInput(problems=(Problem("unknown-format", name, _UNKNOWN),))


def skip_reason(path: str | os.PathLike) -> str | None:
    """Why ``check --skip-unknown`` passes over this file, or None to check it.

    A file that is missing or unreadable is checked (and reported), never passed over."""
    if not os.path.exists(path_string(path)) or not os.access(path, os.R_OK):
        return None
    kind = detect_format(path)
    fmt = READERS.get(kind)
    if fmt is None:
        return None if kind != "unknown" else ("not a seed-format YAML, a Megatron --yaml-cfg YAML, a Megatron-Bridge "
                                               "config, a launch script or a HuggingFace config.json")
    return fmt.skip_reason(path) if fmt.skip_reason is not None else None


# ---- the readers ---------------------------------------------------------------------------


def _read_mixed_yaml(path, options: ReadOptions) -> FileInput:
    return FileInput(problems=(Problem(
        "mixed-format", str(path), "has top-level keys of both YAML formats: model: / parallelism: (the seed "
        "format) and language_model: / model_parallel: (Megatron's --yaml-cfg); a file is one or the other"),))


def _read_seed_yaml(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.seed_yaml import load_seed_yaml

    loaded = load_seed_yaml(path)
    return FileInput(loaded.raw, tuple(loaded.problems), world_size=loaded.world_size,
                     world_size_source=f"world_size in {loaded.world_size_location}"
                     if loaded.world_size is not None else None,
                     world_size_unknown=loaded.world_size_unknown, notes=loaded.notes)


def _read_megatron_yaml(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.megatron_yaml import load_megatron_yaml

    loaded = load_megatron_yaml(path, options.environ)
    return FileInput(loaded.raw, tuple(loaded.problems))


def _read_launch_script(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.launch.script import load_launch_script

    script, problems = load_launch_script(path, options.environ, script_args=options.script_args,
                                          world_size_given=options.world_size_given, release=options.release,
                                          gpus_per_node=options.gpus_per_node)
    if script is None or script.command is None or script.command.script is None:
        return FileInput(problems=tuple(problems))
    unknown = None
    if script.world_size is None:
        unknown = Problem("unknown-world-size", script.location,
                          f"the world size is not known ({script.world_size_source}); pass --world-size")
    return FileInput(problems=tuple(problems), flags=tuple(script.megatron_argv),
                     flag_locations=tuple(script.megatron_locations), opaque_flags=script.opaque_indexes,
                     notes=script.notices, world_size=script.world_size,
                     world_size_source=script.world_size_source, world_size_unknown=unknown,
                     environment={**script.environment_dict, **dict.fromkeys(script.removed_environment)},
                     job_environment=True, launch_location=script.location,
                     entry_script=script.command.script, entry_location=_entry_location(script),
                     entry_is_module=script.command.script_is_module, entry_cwd=script.cwd)


def _entry_location(launch) -> str:
    """Where a launch script names its entry script (file:line)."""
    index = launch.command.script_index
    if index is not None and 0 <= index < len(launch.launch_tokens):
        return launch.launch_tokens[index].location
    return launch.location


def _launch_script_skip_reason(path) -> str | None:
    """A fragment (Megatron flags for a script that sources it: no launcher, no program, no file
    sourced) is skipped; anything else is decided by the entry program it runs (``launch.purpose``)."""
    from megatron_estimator.inputs.launch.purpose import (fragment_reason, skip_reason as purpose, sources_files,
                                                          without_comments)

    code = without_comments(read_input_text(path, "script", errors="replace"))
    if not sources_files(code):
        fragment = fragment_reason(code)
        if fragment is not None:
            return fragment
    return purpose(path_string(path), code)


def _read_hf_config(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.hf import load_hf_config

    loaded = load_hf_config(path, options.release)
    return FileInput(loaded.raw, tuple(loaded.problems),
                     notes=tuple(f"{hf_key} -> {flag} {value}" for hf_key, flag, value in loaded.mapping))


register(FileFormat("mixed-yaml", _read_mixed_yaml))
register(FileFormat("seed-yaml", _read_seed_yaml))
register(FileFormat("megatron-yaml", _read_megatron_yaml))
register(FileFormat("shell", _read_launch_script, _launch_script_skip_reason))
def _read_megatron_log(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.megatron_log import read_megatron_log

    log = read_megatron_log(path, options.release)
    return FileInput(log.raw, log.problems, world_size=log.world_size, world_size_source=log.world_size_location,
                     notes=log.notes)


register(FileFormat("hf-config", _read_hf_config))


def _tree_input(reading) -> FileInput:
    return FileInput(reading.raw, reading.problems, world_size=reading.world_size,
                     world_size_source=reading.world_size_source, notes=reading.notes)


def _read_nemo_rl(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.trees.nemo_rl import read_nemo_rl

    return _tree_input(read_nemo_rl(path_string(path), release=options.release))


def _read_verl(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.inputs.trees.verl import read_verl

    return _tree_input(read_verl(path_string(path), release=options.release))


def _tree_skip_reason(read):
    def reason(path) -> str | None:
        """A config that trains no Megatron model (a DTensor policy, an FSDP actor) is passed over."""
        from megatron_estimator.inputs.trees.common import extra_problem

        if extra_problem(path_string(path), "it") is not None:
            return None
        return read(path_string(path)).skip
    return reason


def _nemo_rl_skip(path):
    from megatron_estimator.inputs.trees.nemo_rl import read_nemo_rl
    return read_nemo_rl(path)


def _verl_skip(path):
    from megatron_estimator.inputs.trees.verl import read_verl
    return read_verl(path)


register(FileFormat("nemo-rl-yaml", _read_nemo_rl, _tree_skip_reason(_nemo_rl_skip)))
register(FileFormat("verl-yaml", _read_verl, _tree_skip_reason(_verl_skip)))
register(FileFormat("megatron-log", _read_megatron_log))


def _read_bridge_yaml(path, options: ReadOptions) -> FileInput:
    from megatron_estimator.core.problems import Problem as _Problem
    from megatron_estimator.inputs.trees.bridge import load_bridge_yaml, skip_reason as bridge_skip

    name = str(path)
    text = read_input_text(path_string(path), "yaml", errors="replace")
    loaded = load_bridge_yaml(name, text, release=options.release)
    problems = loaded.problems
    if loaded.partial and not problems:
        problems = (_Problem("partial-config", f"{name}:1", bridge_skip(text).removeprefix("not checked: ")),)
    return FileInput(loaded.raw, tuple(problems), notes=loaded.notes + loaded.assumptions)


def _bridge_skip_reason(path) -> str | None:
    from megatron_estimator.inputs.trees.bridge import skip_reason as bridge_skip

    return bridge_skip(read_input_text(path_string(path), "yaml", errors="replace"))


register(FileFormat("bridge-yaml", _read_bridge_yaml, _bridge_skip_reason))
